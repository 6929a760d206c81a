"""The Gradio demo: Vision QA, the shared pieces and the launcher as plain functions, then the app
through gradio_client (a real server, the tiny Qwen2.5-VL trained model beside a tiny Qwen2-VL
base model, a run dir laid out as the trainer writes it)."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from PIL import Image

from apps import common, translation_tab, vision_tab
from apps.common import DemoContext
from apps.generate import split_completion
from apps.verdicts import DEFAULT_REWARDS, listed_choices, reward_rows, verdict
from mmrlvr.data import Example
from tests.apps_helpers import free_port, write_model_run, write_wav

# gradio's own queue code trips pandas 3 deprecation warnings; they are not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:::gradio.queueing")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ctx(policy, tiny_vl):
    return DemoContext(policy=policy, model_path=str(tiny_vl))


@pytest.fixture(scope="module")
def image(shapes_dir) -> str:
    return str(min((shapes_dir / "images").glob("*.png")))


@pytest.fixture(scope="module")
def model_run(tmp_path_factory, tiny_vl, tiny_qwen2vl, shapes_dir) -> Path:
    """GRPO run: trained `final/` = tiny Qwen2.5-VL, started from the tiny Qwen2-VL."""
    return write_model_run(tmp_path_factory.mktemp("model-run") / "run", tiny_vl, tiny_qwen2vl,
                           shapes_dir / "test.jsonl")


@pytest.fixture(scope="module")
def run_ctx(model_run):
    from apps.launcher import load_context

    return load_context(str(model_run / "final"), str(model_run), device="cpu")


# ---------------------------------------------------------------- Vision QA, as plain functions

def test_vision_answer_streams_token_by_token_and_equals_the_rollout_engine(ctx, image):
    from mmrlvr.rollout import SamplingParams, make_engine

    updates = list(vision_tab.answer(ctx, [image], "How many shapes are in the image?",
                                     max_new_tokens=12))
    assert updates[0][-1].startswith("Generating with the trained model…")
    *_, rows, status = updates[-1]
    assert status.startswith("✓ done: trained 12 tokens, greedy (image 1: 56×56)")
    assert rows == [] and "Type a gold answer" in status          # no gold: no scoring
    raws = [u[3] for u in updates[1:]]
    assert all(b.startswith(a) for a, b in itertools.pairwise(raws))   # the text only grows
    assert len({len(r) for r in raws}) >= 10                     # one update per token
    example = Example(id="demo", prompt="How many shapes are in the image?", answer="-",
                      images=[ctx.policy.adapter.load_image(Image.open(image).convert("RGB"),
                                                            None)])
    batch = ctx.policy.adapter.encode([example], ctx.policy.processor)
    greedy = make_engine("hf", ctx.policy).generate(
        batch, SamplingParams(max_new_tokens=12, greedy=True))
    assert raws[-1] == greedy.texts[0]
    assert updates[-1][4:8] == ["", "", "", ""]                    # no base model: empty panel


def test_vision_answer_with_gold_gives_the_verdict_and_explained_rewards(ctx, image):
    *_, last = vision_tab.answer(ctx, [image], "How many shapes?", gold="3", sample=True,
                                 temperature=1.0, max_new_tokens=8)
    answer_md, verdict_md, _, raw, *_, rows, status = last
    assert status.startswith("✓ done") and "sampled" in status
    assert int(status.split("trained ")[1].split(" tokens")[0]) <= 8
    assert "`3`" in verdict_md and verdict_md == verdict(Example(id="d", prompt="q", answer="3"),
                                                         raw)
    assert [r[0] for r in rows] == ["overall (weighted sum)", "accuracy",
                                    "accuracy/parsed (not added)",
                                    "accuracy/too_complex (not added)", "format"]
    assert {r[0]: r[1] for r in rows}["accuracy"] == 0.9 and all(r[-1] for r in rows)
    assert len(rows[0]) == len(vision_tab.reward_headers(ctx)) == 4


def test_completion_is_split_into_reasoning_and_final_answer():
    assert split_completion("<think>two and one</think><answer>3</answer>") == ("two and one", "3")
    assert split_completion("<think>still think") == ("still think", "")       # mid-stream
    assert split_completion("<think>a</think><answer>squ") == ("a", "squ")
    assert split_completion("I count them. The answer is 4.") == ("I count them. The answer is 4.",
                                                                  "4")
    assert split_completion("just words") == ("just words", "")


def test_verdicts_and_reward_rows_for_correct_wrong_and_missing_answers():
    ex = Example(id="x", prompt="How many?", answer="3")
    texts = ["<think>two and one</think><answer>3</answer>",
             "<think>hmm</think><answer>4</answer>", "I am not sure"]
    assert verdict(ex, texts[0]).startswith("✓ **Correct**")
    assert verdict(ex, texts[1]).startswith("✗ **Wrong**") and "`4`" in verdict(ex, texts[1])
    assert "No answer found" in verdict(ex, texts[2])
    rows = {r[0]: r[2:5] for r in reward_rows(ex, texts, DEFAULT_REWARDS)}
    assert rows["overall (weighted sum)"] == pytest.approx([1.0, 0.1, 0.0])
    assert rows["accuracy/parsed (not added)"] == [1.0, 1.0, 0.0]
    rows = reward_rows(ex, [texts[0], None], DEFAULT_REWARDS)       # the base was not asked
    assert rows[0][2:4] == [1.0, "—"]
    mc = "Which half is louder?\nA. the first half\nB. the second half"
    assert listed_choices(mc) == ["the first half", "the second half"]
    assert listed_choices("How many?") is None
    assert verdict(Example(id="m", prompt=mc, answer="B", choices=listed_choices(mc)),
                   "<answer>the second half</answer>").startswith("✓")


@pytest.mark.parametrize("files, question, expected", [
    ("IMAGE", "   ", "Type a question first"),
    (None, "How many?", "Upload an image or a video first"),
    ("EMPTY", "How many?", "Upload an image or a video first"),
    ("TEXT", "How many?", "is not an image file"),
    ("NINE", "How many?", "at most 8"),
])
def test_vision_bad_input_is_a_message(ctx, image, tmp_path, files, question, expected):
    text_file = tmp_path / "notes.png"
    text_file.write_text("not an image")
    files = {"IMAGE": [image], "TEXT": [str(text_file)], "NINE": [image] * 9,
             "EMPTY": []}.get(files, files)
    updates = list(vision_tab.answer(ctx, files, question))
    assert len(updates) == 1 and updates[0][-1].startswith("⚠") and expected in updates[0][-1]


def test_vision_huge_image_is_resized_and_a_giant_one_refused(ctx, tmp_path, monkeypatch):
    big = tmp_path / "big.png"
    Image.new("RGB", (1200, 900), (200, 30, 30)).save(big)
    *_, last = vision_tab.answer(ctx, [str(big)], "What colour?", max_new_tokens=4)
    assert "image 1: 1200×900 → 112×84" in last[-1]                # max_pixels 112*112
    monkeypatch.setattr(common, "MAX_SOURCE_PIXELS", 1000 * 800)
    (only,) = vision_tab.answer(ctx, [str(big)], "What colour?")
    assert "1200×900" in only[-1] and "downscale it first" in only[-1]
    thin = tmp_path / "thin.png"
    Image.new("RGB", (4000, 10)).save(thin)
    (only,) = vision_tab.answer(ctx, [str(thin)], "What colour?")
    assert only[-1].startswith("⚠") and "aspect ratio" in only[-1]


def test_vision_failure_inside_generate_is_shown_not_raised(ctx, image, monkeypatch):
    def boom(**_):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(ctx.policy.model, "generate", boom)
    with pytest.warns(UserWarning, match="simulated"):
        *_, last = vision_tab.answer(ctx, [image], "How many?")
    assert last[-1].startswith("✗ RuntimeError") and "keeps running" in last[-1]
    assert ctx.lock.acquire(blocking=False)                         # the model lock was released
    ctx.lock.release()


def test_closing_the_page_mid_answer_stops_generation_and_frees_the_model(ctx, image):
    import threading

    updates = vision_tab.answer(ctx, [image], "How many?", sample=True, max_new_tokens=2000)
    for _, _update in zip(range(4), updates):
        pass
    updates.close()                                                 # what Gradio does on leave
    assert not ctx.lock.locked()
    assert "demo-generate" not in {t.name for t in threading.enumerate()}


# ---------------------------------------------------------------- tabs the model cannot serve

def test_tabs_without_a_suitable_model_name_the_command_that_loads_one(ctx, image):
    from apps import robustness_tab

    empty = DemoContext()
    quickstart = "`mmrlvr demo --model runs/quickstart/final --run runs/quickstart`"
    for message in (list(vision_tab.answer(empty, [image], "q"))[-1][-1],
                    list(robustness_tab.run(empty, image, "q"))[-1][2]):
        assert message.startswith("No model is loaded.") and quickstart in message
    assert "`mmrlvr demo --model runs/banners-grpo/final --run runs/banners-grpo`" in \
        translation_tab.translate(empty, image, "French")[3]
    audio = ctx.unavailable("audio", "Audio QA")
    assert audio.startswith("Audio QA needs an audio-language model (the `audio` adapter)")
    assert "`mmrlvr demo --model runs/tones_grpo/final --run runs/tones_grpo`" in audio
    assert "configs/tones_cpu.yaml" in audio                        # how to train one


def test_suggested_run_dirs_are_the_ones_the_shipped_configs_write():
    for modality, config in [("vision", "quickstart"), ("audio", "tones_cpu"),
                             ("image_translation", "banners_cpu")]:
        cfg = yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text())
        assert common.SUGGESTED[modality][0] == cfg["train"]["out_dir"]
        assert cfg.get("model", {}).get("modality", "vision") == modality


# ---------------------------------------------------------------- the run, read and loaded

def test_run_is_read_for_its_start_model_examples_checkpoints_and_figures(model_run,
                                                                         tiny_qwen2vl):
    from apps.runinfo import read_run, run_line, task_line

    info = read_run(model_run)
    assert info.kind == "grpo" and info.start_model == str(tiny_qwen2vl)
    assert info.task == "shapes" and len(info.examples) == 8
    families = [ex.meta["family"] for ex in info.examples]
    assert len(set(families)) >= 6                                  # spread over the families
    assert all(Path(ex.images[0]).is_file() for ex in info.examples)
    assert [label for label, _ in info.checkpoints()] == ["final", "step-3"]
    assert "**shapes** — counting, colour and kind questions" in task_line(info)
    assert "GRPO (6 steps; rewards: accuracy 0.9, format 0.1)" in run_line(info)
    assert "0.250 → **0.550** (+30.0 points)" in run_line(info)
    assert read_run(None, model_run / "final").run_dir == model_run   # found above the model
    assert read_run(None, model_run / "final", "audio").examples == []  # no clips in it


def test_sft_run_dir_starts_from_sft_init(tmp_path, tiny_vl, tiny_qwen2vl, shapes_dir):
    from apps.runinfo import read_run, run_line

    run = write_model_run(tmp_path / "sft", tiny_vl, tiny_qwen2vl, shapes_dir / "test.jsonl",
                          kind="sft")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["path"] = "runs/elsewhere/final"                  # GRPO's start, not SFT's
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    info = read_run(run)
    assert info.kind == "sft" and info.start_model == str(tiny_qwen2vl)
    assert run_line(info).startswith(f"Run `{run}`: SFT warm start (6 steps)")


def test_load_context_compares_with_the_run_start_model(run_ctx, model_run, tiny_qwen2vl,
                                                        tiny_vl):
    from apps.launcher import header, load_context
    from mmrlvr.cli import build_parser, cmd_demo
    from mmrlvr.train.policy import PolicyError

    assert run_ctx.base is not None and run_ctx.base_path == str(tiny_qwen2vl)
    assert run_ctx.format_prompt.startswith("Output the thinking process")
    assert run_ctx.policy.adapter.max_pixels == 12544
    assert "compared with the base model" in header(run_ctx) and "0.550" in header(run_ctx)
    assert load_context(str(model_run / "final"), str(model_run), "cpu", compare="none").base \
        is None
    explicit = load_context(str(tiny_qwen2vl), device="cpu", compare=str(tiny_vl))
    assert explicit.base_path == str(tiny_vl) and explicit.info.run_dir is None
    with pytest.raises(PolicyError, match="no such model dir"):
        load_context(str(tiny_vl), device="cpu", compare=str(model_run / "nope"))
    assert load_context(run=str(model_run)).policy is None
    moved = write_model_run(model_run.parent / "moved", tiny_vl, tiny_qwen2vl,
                            Path(run_ctx.info.data_file))
    cfg = yaml.safe_load((moved / "config.yaml").read_text())
    cfg["model"]["path"] = "runs/gone-sft/final"                   # trained on another machine
    (moved / "config.yaml").write_text(yaml.safe_dump(cfg))
    alone = load_context(str(moved / "final"), str(moved), "cpu")
    assert alone.base is None and "`runs/gone-sft/final` is not on this machine" in header(alone)
    with pytest.raises(PolicyError, match="does not exist"):
        load_context(str(model_run / "no-such-model"))
    args = build_parser().parse_args(["demo", "--run", str(model_run), "--compare", "none"])
    assert args.fn is cmd_demo and args.model is None and args.compare == "none"
    assert build_parser().parse_args(["demo"]).compare is None


# ---------------------------------------------------------------- the launched app, via the client

EXPECTED_APIS = {"vision_answer", "vision_answer_enter", "vision_preview", "vision_example",
                 "checkpoint", "audio_answer", "audio_answer_enter", "audio_cleared",
                 "translate", "robustness", "robustness_enter", "robustness_example",
                 "monitor", "monitor_enter", "monitor_tick", "monitor_live", "monitor_smooth",
                 "tools_run", "tools_run_enter", "tools_example"}


@pytest.fixture(scope="module")
def served(run_ctx):
    from apps.launcher import build_demo, launch, media_files

    demo = build_demo(run_ctx)
    url = launch(demo, port=free_port(), block=False, allowed=media_files(run_ctx))  # as serve()
    yield demo, url
    demo.close()


def test_every_event_has_an_api_name(served):
    demo, _ = served
    names = {fn.api_name for fn in demo.fns.values()}
    assert None not in names and names == EXPECTED_APIS


def test_client_clicks_an_example_and_compares_trained_with_base(served, run_ctx):
    from gradio_client import Client, handle_file

    _, url = served
    client = Client(url, verbose=False)
    files, question, gold, *_, status = client.predict(2, api_name="/vision_example")
    files = [handle_file(f) for f in files]
    example = run_ctx.info.examples[2]
    assert (question, gold) == (example.prompt, example.answer) and "Example" in status
    trained_md, trained_verdict, _, trained_raw, base_md, base_verdict, _, base_raw, rewards, \
        status = client.predict(files, question, gold, True, 1.0, 8,
                                run_ctx.format_prompt, True, api_name="/vision_answer")
    assert status.startswith("✓ done: trained ") and ", base " in status
    for verdict_md in (trained_verdict, base_verdict):
        assert f"`{gold}`" in verdict_md
    assert rewards["headers"] == ["reward", "weight", "trained", "base", "what it counts"]
    assert trained_raw and base_raw
    *_, base_only, _, rewards, status = client.predict(
        files, question, gold, False, 1.0, 8, run_ctx.format_prompt, False,
        api_name="/vision_answer")
    assert ", base" not in status and base_only == "" and rewards["data"][0][3] == "—"


def test_client_switches_to_a_checkpoint_and_back(served, run_ctx, model_run):
    from gradio_client import Client

    from apps.launcher import switch_checkpoint

    _, url = served
    client = Client(url, verbose=False)
    final = run_ctx.policy
    assert "step-3" in client.predict("step-3", api_name="/checkpoint")
    assert run_ctx.model_path.endswith("step-3") and run_ctx.policy is not final
    assert "No checkpoint `step-9`" in switch_checkpoint(run_ctx, "step-9")
    assert "(final)" in client.predict("final", api_name="/checkpoint")
    assert run_ctx.model_path == str(model_run / "final")


def test_client_calls_every_tab_and_bad_input_gets_a_message(served, run_ctx, image,
                                                              tmp_path):
    from gradio_client import Client, handle_file

    _, url = served
    client = Client(url, verbose=False)
    table, gallery, status = client.predict(handle_file(image), "How many shapes?", "", "", 8,
                                            api_name="/robustness")
    # clean + 6 image ops + template_swap, format_instruction, irrelevant_context
    assert len(table["data"]) == 10 and len(gallery) == 7 and status.startswith("✓ 9 operators")
    plot, figures, status = client.predict(run_ctx.run_dir, 0.5, api_name="/monitor")
    assert "step 6 / 6" in status and "0.250 → 0.550" in figures and plot
    assert "needs an audio-language model" in client.predict(
        handle_file(str(write_wav(tmp_path / "tone.wav"))), "What is it?", "", False, 1.0, 8,
        True, api_name="/audio_answer")[-1]
    assert "image-translation" in client.predict(handle_file(image), "French",
                                                 api_name="/translate")[3]
    assert client.predict([handle_file(image)], "", "", False, 1.0, 8, "", True,
                          api_name="/vision_answer")[-1] == "⚠ Type a question first."
    fake = tmp_path / "fake.png"
    fake.write_text("hello")
    status = client.predict([handle_file(str(fake))], "How many?", "", False, 1.0, 8, "", True,
                            api_name="/vision_answer")[-1]
    assert "not an image file" in status
    status = client.predict([handle_file(image)], "How many?", "", False, 1.0, 8, "", False,
                            api_name="/vision_answer")[-1]
    assert status.startswith("✓ done")                              # still serving


# ---------------------------------------------------------------- inputs, leaving clients, files

def test_every_text_input_is_capped_before_anything_is_tokenised(ctx, image, tmp_path):
    """A 1 M-character format prompt held the vision tab for over 2 minutes; only the question
    was capped."""
    from apps import audio_tab, monitor_tab, robustness_tab

    huge = "x" * 1_000_000
    cases = [(list(vision_tab.answer(ctx, [image], "How many?", format_prompt=huge)),
              "The format prompt is 1,000,000 characters long; keep it under 2,000."),
             (list(vision_tab.answer(ctx, [image], "q" * 4001)),
              "The question is 4,001 characters long; keep it under 4,000."),
             (list(vision_tab.answer(ctx, [image], "How many?", gold=huge)),
              "The gold answer is 1,000,000 characters long; keep it under 1,000."),
             (list(robustness_tab.run(ctx, image, "Which?", "A", 8, huge)),
              "The option list is 1,000,000 characters long; keep it under 4,000."),
             (list(robustness_tab.run(ctx, image, "Which?", huge)),
              "The gold answer is 1,000,000 characters long"),
             (list(audio_tab.answer(DemoContext(), str(write_wav(tmp_path / "t.wav")), "Which?",
                                    huge)), "The gold answer is 1,000,000 characters long"),
             ([translation_tab.translate(DemoContext(), image, huge)],
              "The target language is 1,000,000 characters long; keep it under 64.")]
    for updates, message in cases:
        assert len(updates) == 1 and updates[0][-1].startswith("⚠") and \
            message in updates[0][-1], (message, updates[0][-1])
    assert "run dirs under" in monitor_tab.refresh(huge, root=str(tmp_path))[-1]
    own = DemoContext(policy=ctx.policy, format_prompt="Answer in <answer></answer>. " * 100)
    *_, last = vision_tab.answer(own, [image], "How many?", max_new_tokens=2,
                                 format_prompt=own.format_prompt)      # a run's own: 2,900 chars
    assert last[-1].startswith("✓ done")


LEAVER = """
import sys
from gradio_client import Client, handle_file
client = Client(sys.argv[1], verbose=False)
image = handle_file(sys.argv[3])
if sys.argv[2] == "/vision_answer":
    job = client.submit([image], "How many shapes?", "", False, 1.0, 2048, "", False,
                        api_name="/vision_answer")
else:
    job = client.submit(image, "How many shapes?", "", "", 1024, api_name="/robustness")
for update in job:
    if "tokens" in update[-1] or "Running" in update[-1]:
        print("streaming", flush=True)
"""


@pytest.mark.parametrize("api", ["/vision_answer", "/robustness"])
def test_a_client_that_leaves_mid_answer_stops_it_and_the_next_is_served(served, run_ctx, image,
                                                                          tmp_path, monkeypatch,
                                                                          api):
    """Generation ran on after its client left and queued the next request behind it (the
    robustness table answered each operator whole: up to 1,024 tokens, ten times). Here an
    answer that would take 1,024 or more slowed steps (over 50 s) loses its client (a process
    killed with SIGKILL) as it starts."""
    import functools
    import subprocess
    import sys
    import threading
    import time

    from gradio_client import Client, handle_file

    _, url = served
    model = run_ctx.policy.model
    steps, forward = [], model.forward

    @functools.wraps(forward)                     # generate reads forward's signature
    def slow(*args, **kwargs):
        steps.append(1)
        time.sleep(0.05)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", slow)
    # a stop id that is never sampled (a suppressed placeholder): answers run to max_new_tokens
    monkeypatch.setattr(run_ctx.policy, "eos_ids", run_ctx.policy.placeholder_ids[:1])
    (tmp_path / "leaver.py").write_text(LEAVER)
    leaver = subprocess.Popen([sys.executable, str(tmp_path / "leaver.py"), url, api, image],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert leaver.stdout.readline().strip() == "streaming"
        assert run_ctx.lock.locked()                                 # generating for it
    finally:
        leaver.kill()
        leaver.wait()
    deadline = time.monotonic() + 60
    while run_ctx.lock.locked() and time.monotonic() < deadline:
        time.sleep(0.1)
    stopped_at = len(steps)
    assert not run_ctx.lock.locked() and stopped_at < 400            # not the 1,024+ it asked
    assert "demo-generate" not in {t.name for t in threading.enumerate()}
    monkeypatch.undo()
    status = Client(url, verbose=False).predict(
        [handle_file(image)], "How many?", "", False, 1.0, 8, "", False,
        api_name="/vision_answer")[-1]
    assert status.startswith("✓ done: trained ")                     # served, not queued
    assert len(steps) == stopped_at                                  # the dead answer stayed dead


def test_the_demo_serves_only_its_examples_media_and_the_monitor_only_its_run(
        served, run_ctx, model_run, tmp_path):
    """Every file under the examples' media dir was served (a secret, the data with its gold
    answers); /monitor read any directory and told whether a path existed."""
    import urllib.error
    import urllib.request

    from gradio_client import Client

    _, url = served

    def status(path: Path) -> int:
        try:
            with urllib.request.urlopen(f"{url}gradio_api/file={path}") as reply:
                return reply.status
        except urllib.error.HTTPError as err:
            return err.code

    image = Path(run_ctx.info.examples[0].images[0])
    secret = image.parent / "secret.txt"
    secret.write_text("the admin password\n")
    try:
        assert status(image) == 200
        assert status(secret) == 403 and status(run_ctx.info.data_file) == 403
        assert status(image.parent / ".." / run_ctx.info.data_file.name) == 403
    finally:
        secret.unlink()

    client = Client(url, verbose=False)
    refused = f"⚠ The monitor reads run dirs under `{run_ctx.run_dir}` only"
    (tmp_path / "elsewhere").mkdir()
    (model_run / "outside").symlink_to(tmp_path / "elsewhere")
    try:
        for path in ("/etc", str(tmp_path / "elsewhere"), str(tmp_path / "no-such-dir"),
                     f"{model_run}/../{model_run.name}-not", str(model_run / "outside")):
            plot, figures, message = client.predict(path, 0.5, api_name="/monitor")
            assert message.startswith(refused) and plot is None and figures == "", path
    finally:
        (model_run / "outside").unlink()
    assert "Waiting for the first step" in client.predict(
        str(model_run / "checkpoints"), 0.5, api_name="/monitor")[-1]       # a dir inside it
    assert "step 6 / 6" in client.predict(str(model_run), 0.5, api_name="/monitor")[-1]
