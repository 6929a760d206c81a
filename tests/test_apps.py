"""The Gradio demo: each tab's handler as a plain function, then the app via gradio_client."""
from __future__ import annotations

import itertools
import json
import socket
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from apps import audio_tab, common, monitor_tab, robustness_tab, translation_tab, vision_tab
from apps.common import NO_MODEL, DemoContext
from mmrlvr.data import Example

# gradio's own queue code trips pandas 3 deprecation warnings; they are not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:::gradio.queueing")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ctx(policy, tiny_vl):
    return DemoContext(policy=policy, model_path=str(tiny_vl))


@pytest.fixture(scope="module")
def image(shapes_dir) -> str:
    return str(min((shapes_dir / "images").glob("*.png")))


def write_run(run_dir: Path, steps: int = 6, kl: bool = True, partial: bool = True) -> Path:
    """A tiny run dir: config.yaml and metrics.jsonl as the trainer writes them."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(
        f"train:\n  steps: {steps * 2}\n"
        "data:\n  format_prompt: Put the answer in <answer></answer>.\n"
        "model:\n  max_pixels: 3136\n")
    rows = [{"step": 0, "eval/accuracy": 0.2}]
    for s in range(1, steps + 1):
        row = {"step": s, "reward/mean": 0.1 * s, "reward/accuracy": 0.05 * s,
               "response/length_mean": 40.0 - s}
        if kl:
            row["loss/kl"] = 0.01 * s
        rows.append(row)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if partial:
        text += '{"step": 99, "reward/me'      # a line the running trainer is still writing
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


# ---------------------------------------------------------------- Vision QA, as plain functions

def test_vision_answer_streams_and_equals_the_rollout_engine(ctx, image):
    from mmrlvr.rollout import SamplingParams, make_engine

    updates = list(vision_tab.answer(ctx, [image], "How many shapes are in the image?",
                                     max_new_tokens=12))
    assert updates[0][4].startswith("Generating…") and len(updates) >= 3  # status, then tokens
    text, extracted, verdict_md, rows, status = updates[-1]
    assert status.startswith("✓ done") and "greedy" in status and "image 1: 56×56" in status
    assert extracted == "(no answer extracted)" and rows == []    # no gold: no scoring
    assert "gold answer" in verdict_md
    grown = [u[0] for u in updates[1:]]
    assert all(b.startswith(a) for a, b in itertools.pairwise(grown))  # the text only grows
    example = Example(id="demo", prompt="How many shapes are in the image?", answer="-",
                      images=[ctx.policy.adapter.load_image(Image.open(image).convert("RGB"),
                                                            None)])
    batch = ctx.policy.adapter.encode([example], ctx.policy.processor)
    greedy = make_engine("hf", ctx.policy).generate(
        batch, SamplingParams(max_new_tokens=12, greedy=True))
    assert text == greedy.texts[0]


def test_vision_answer_with_gold_gives_verdict_and_reward_breakdown(ctx, image):
    *_, (_, _, verdict_md, rows, status) = vision_tab.answer(
        ctx, [image], "How many shapes?", gold="3", sample=True, temperature=1.0,
        max_new_tokens=8)
    assert status.startswith("✓ done") and "sampled" in status
    assert int(status.split("done: ")[1].split(" tokens")[0]) <= 8
    names = [r[0] for r in rows]
    assert names[0].startswith("overall") and {"accuracy", "format"} <= set(names)
    assert {r[0]: r[1] for r in rows}["accuracy"] == 0.9
    assert "`3`" in verdict_md


def test_verdict_scores_correct_wrong_and_missing_answers():
    ex = Example(id="x", prompt="How many?", answer="3")
    md, rows = vision_tab.verdict(ex, "<think>two and one</think><answer>3</answer>")
    scores = {r[0]: r[2] for r in rows}
    assert md.startswith("✓") and scores["overall (weighted sum)"] == pytest.approx(1.0)
    assert scores["accuracy"] == 1.0 and scores["format"] == 1.0
    md, rows = vision_tab.verdict(ex, "<think>hmm</think><answer>4</answer>")
    assert md.startswith("✗") and "`4`" in md
    assert {r[0]: r[2] for r in rows}["overall (weighted sum)"] == pytest.approx(0.1)
    md, rows = vision_tab.verdict(ex, "I am not sure")
    assert "No answer found" in md and {r[0]: r[2] for r in rows}["accuracy/parsed"] == 0.0


@pytest.mark.parametrize("files, question, expected", [
    ("IMAGE", "   ", "Type a question first"),
    (None, "How many?", "Upload an image first"),
    ("EMPTY", "How many?", "Upload an image first"),
    ("TEXT", "How many?", "is not an image file"),
    ("NINE", "How many?", "at most 8"),
])
def test_vision_bad_input_is_a_message(ctx, image, tmp_path, files, question, expected):
    text_file = tmp_path / "notes.png"
    text_file.write_text("not an image")
    files = {"IMAGE": [image], "TEXT": [str(text_file)], "NINE": [image] * 9,
             "EMPTY": []}.get(files, files)
    updates = list(vision_tab.answer(ctx, files, question))
    assert len(updates) == 1 and updates[0][4].startswith("⚠") and expected in updates[0][4]


def test_vision_huge_image_is_resized_and_a_giant_one_refused(ctx, tmp_path, monkeypatch):
    big = tmp_path / "big.png"
    Image.new("RGB", (1200, 900), (200, 30, 30)).save(big)
    *_, last = vision_tab.answer(ctx, [str(big)], "What colour?", max_new_tokens=4)
    assert "image 1: 1200×900 → 112×84" in last[4]                 # max_pixels 112*112
    monkeypatch.setattr(common, "MAX_SOURCE_PIXELS", 1000 * 800)
    (only,) = vision_tab.answer(ctx, [str(big)], "What colour?")
    assert "1200×900" in only[4] and "downscale it first" in only[4]
    thin = tmp_path / "thin.png"
    Image.new("RGB", (4000, 10)).save(thin)
    (only,) = vision_tab.answer(ctx, [str(thin)], "What colour?")
    assert only[4].startswith("⚠") and "aspect ratio" in only[4]


def test_vision_failure_inside_generate_is_shown_not_raised(ctx, image, monkeypatch):
    def boom(**_):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(ctx.policy.model, "generate", boom)
    with pytest.warns(UserWarning, match="simulated"):
        *_, last = vision_tab.answer(ctx, [image], "How many?")
    assert last[4].startswith("✗ RuntimeError") and "keeps running" in last[4]
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


def test_tabs_without_a_model_say_why(image):
    empty = DemoContext()
    assert list(vision_tab.answer(empty, [image], "q"))[-1][4] == NO_MODEL
    assert robustness_tab.run(empty, image, "q")[2] == NO_MODEL
    silent_free = (16000, (np.sin(np.arange(16000) / 5) * 8000).astype(np.int16))
    assert list(audio_tab.answer(empty, silent_free, "What is it?"))[-1][3] == NO_MODEL
    assert translation_tab.translate(empty, image, "French")[3] == NO_MODEL


# ---------------------------------------------------------------- the other tabs' handlers

def test_audio_input_checks(ctx):
    rate = 16000
    tone = (np.sin(np.arange(rate) / 5) * 8000).astype(np.int16)
    assert audio_tab.check_audio((rate, tone))[1].dtype == np.float32
    cases = [(None, "Upload or record"), ((rate, np.zeros(rate, np.int16)), "silent"),
             ((rate, np.tile(tone, 31)), "31 s long"), ((rate, tone[:0]), "empty")]
    for audio, expected in cases:
        (only,) = audio_tab.answer(ctx, audio, "What is it?")
        assert expected in only[3]
    assert "Type a question" in list(audio_tab.answer(ctx, (rate, tone), " "))[-1][3]
    assert "needs a model loaded with the `audio` adapter" in \
        list(audio_tab.answer(ctx, (rate, tone), "What?"))[-1][3]


def test_translation_checks_the_image_then_says_why(ctx, image, tmp_path):
    bad = tmp_path / "x.jpg"
    bad.write_bytes(b"\x00" * 10)
    assert "not an image file" in translation_tab.translate(ctx, str(bad), "French")[3]
    assert "Upload an image" in translation_tab.translate(ctx, None, "French")[3]
    assert "needs a model loaded with the `image_translation` adapter" in \
        translation_tab.translate(ctx, image, "French")[3]


def test_robustness_runs_every_applicable_operator_in_one_table(ctx, image):
    from mmrlvr.stress import OPERATORS

    rows, gallery, status = robustness_tab.run(ctx, image, "How many shapes are in the image?",
                                               gold="2", max_new_tokens=8)
    names = [r[0] for r in rows]
    image_ops = [n for n, op in OPERATORS.items() if op.kind == "image"]
    # an image but no options: every image op and the option-free text ops; no option, audio or
    # task-altering op, and no rule paraphrases this question
    expected = [n for n, op in OPERATORS.items() if op.kind == "image" or n in
                ("template_swap", "format_instruction", "irrelevant_context")]
    assert names == ["clean", *[n for n in OPERATORS if n in expected]]
    assert len(rows[0]) == len(robustness_tab.TABLE_HEADERS)
    assert status.startswith(f"✓ {len(expected)} operators")
    assert f"{len(OPERATORS) - len(expected)} did not apply" in status
    assert {r[4] for r in rows} <= {"✓", "✗"}
    assert {r[1] for r in rows[1:]} == {"text", "image"}
    assert rows[0][2] == "How many shapes are in the image?"
    assert "[format instruction:" in rows[names.index("format_instruction")][2]
    assert rows[names.index("irrelevant_context")][2].endswith("How many shapes are in the image?")
    assert [c for _, c in gallery] == ["clean", *image_ops]
    assert all(img.size == gallery[0][0].size for img, _ in gallery)
    assert not np.array_equal(np.asarray(gallery[0][0]), np.asarray(gallery[1][0]))
    flips = int(status.split(", ")[1].split()[0])
    assert flips == sum(r[5] == "⚠ flip" for r in rows)
    assert "Type a question" in robustness_tab.run(ctx, image, "")[2]
    assert "Upload an image" in robustness_tab.run(ctx, None, "How many?")[2]


def test_robustness_with_options_runs_the_option_and_task_altering_operators(ctx, image):
    from mmrlvr.stress import OPERATORS

    rows, gallery, status = robustness_tab.run(
        ctx, image, "Which shape is shown?", gold="B", max_new_tokens=8,
        choices="A. circle\nB. square\nC. triangle")
    names = [r[0] for r in rows]
    assert names == ["clean", *[n for n, op in OPERATORS.items()
                                if op.kind != "audio" and n != "paraphrase"]]
    assert rows[0][2] == "Which shape is shown?\nA. circle\nB. square\nC. triangle"
    kinds = dict(zip(names, (r[1] for r in rows)))
    assert kinds["mc_to_open"] == "task-altering" and kinds["option_shuffle"] == "text"
    assert rows[names.index("mc_to_open")][2] == "Which shape is shown?"
    assert "1 task-altering" in status and len(gallery) == 7
    for bad, why in [("only one", "at least two options"), ("A. x\nB. y", "gold answer")]:
        assert why in robustness_tab.run(ctx, image, "Which?", gold="Q", choices=bad)[2]


def test_robustness_table_marks_flips_against_the_clean_answer():
    from mmrlvr.stress import OPERATORS, Variant, apply

    ex = Example(id="t", prompt="q", answer="3")
    cases = [("clean", "-", Variant(ex, "")), ("blur", "image", Variant(ex, "")),
             ("crop", "image", Variant(ex, "")), ("format_instruction", "text", Variant(ex, "F"))]
    texts = ["<answer>3</answer>", "<answer>3.0</answer>", "<answer>4</answer>", "no idea"]
    rows, flips = robustness_tab.table(cases, texts, gold="3")
    assert flips == 2
    assert [r[5] for r in rows] == ["", "", "⚠ flip", "⚠ flip"]
    assert [r[4] for r in rows] == ["✓", "✓", "✗", "✗"]
    assert rows[3][3] == "(none)" and rows[3][2] == "q\n[format instruction: F]"
    # the flip is against the clean answer, not the gold: a wrong clean answer kept is no flip
    rows, flips = robustness_tab.table(cases, ["<answer>4</answer>"] * 4, gold="3")
    assert flips == 0 and [r[4] for r in rows] == ["✗"] * 4
    # with options, the chosen option counts, not its letter: a shuffle that moves the option
    # the model keeps choosing is no flip, and a letter kept after the shuffle is one
    mc = Example(id="m", prompt=robustness_tab.with_options("Which?", ["cat", "dog", "cow"]),
                 answer="A", choices=["cat", "dog", "cow"])
    shuffled = apply(OPERATORS["option_shuffle"], mc, "")
    new_letter = chr(65 + shuffled.example.choices.index("cat"))
    cases = [("clean", "-", Variant(mc, "")), ("option_shuffle", "text", shuffled),
             ("option_shuffle", "text", shuffled)]
    rows, flips = robustness_tab.table(
        cases, ["<answer>A</answer>", f"<answer>{new_letter}</answer>", "<answer>A</answer>"],
        gold="A")
    assert flips == 1 and [r[5] for r in rows] == ["", "", "⚠ flip"]
    assert [r[4] for r in rows] == ["✓", "✓", "✗"]


def test_robustness_uses_the_library_operators_only_where_they_apply():
    img = Image.new("RGB", (56, 56), (120, 120, 120))
    assert not hasattr(robustness_tab, "IMAGE_OPS") and not hasattr(robustness_tab, "TEXT_OPS")
    ex = robustness_tab.make_example([img], "How many shapes are there?")
    cases = robustness_tab.variants(ex, "Put the answer in <answer></answer>.")
    kinds = {name: kind for name, kind, _ in cases}
    assert "option_shuffle" not in kinds and "mc_to_open" not in kinds and "noise_snr" not in kinds
    assert all(v.example.images[0].size == img.size for _, _, v in cases)
    again = robustness_tab.variants(ex, "Put the answer in <answer></answer>.")
    assert [v.example.prompt for *_, v in cases] == [v.example.prompt for *_, v in again]
    no_image = robustness_tab.variants(robustness_tab.make_example([], "How many?"))
    assert {kind for _, kind, _ in no_image} == {"-", "text"}
    assert robustness_tab.parse_choices("A. cat\n\n(B) dog\nE. coli") == ["cat", "dog", "E. coli"]
    assert robustness_tab.parse_choices("  \n") is None


def test_monitor_reads_curves_while_the_run_writes(tmp_path):
    run = write_run(tmp_path / "run")
    reward, accuracy, length, kl, status = monitor_tab.refresh(str(run))
    assert reward["value"].tolist() == pytest.approx([0.1 * s for s in range(1, 7)])
    assert set(accuracy["series"]) == {"reward/accuracy", "eval/accuracy"}
    assert length["step"].tolist() == [1, 2, 3, 4, 5, 6] and len(kl) == 6
    assert "training, step 6 / 12" in status and "reward/mean 0.600" in status
    (run / "summary.json").write_text("{}")
    assert "finished" in monitor_tab.refresh(str(run))[-1]


def test_monitor_says_what_is_missing(tmp_path):
    run = write_run(tmp_path / "nokl", kl=False, partial=False)
    *frames, status = monitor_tab.refresh(str(run))
    assert frames[3].empty and "Not logged: KL" in status and "algo.beta" in status
    assert "does not exist" in monitor_tab.refresh(str(tmp_path / "nope"))[-1]
    (tmp_path / "fresh").mkdir()
    assert "Waiting for the first step" in monitor_tab.refresh(str(tmp_path / "fresh"))[-1]
    assert "Give a run dir" in monitor_tab.refresh("")[-1]


def test_load_context_takes_prompts_and_pixels_from_the_run(tiny_vl, tmp_path):
    from apps.launcher import load_context
    from mmrlvr.cli import build_parser, cmd_demo
    from mmrlvr.train.policy import PolicyError

    run = write_run(tmp_path / "run")
    ctx = load_context(str(tiny_vl), str(run), device="cpu")
    assert ctx.format_prompt == "Put the answer in <answer></answer>."
    assert ctx.policy.adapter.max_pixels == 3136
    assert load_context(run=str(run)).policy is None
    with pytest.raises(PolicyError, match="does not exist"):
        load_context(str(tmp_path / "no-such-model"))
    args = build_parser().parse_args(["demo", "--run", str(run), "--port", "0"])
    assert args.fn is cmd_demo and args.model is None and args.port == 0 and args.modality is None
    args = build_parser().parse_args(["demo", "--model", str(tiny_vl), "--modality",
                                      "image_translation"])
    assert args.modality == "image_translation"


def test_run_config_is_found_above_a_checkpoint(tmp_path):
    run = write_run(tmp_path / "run")
    ckpt = run / "checkpoints" / "step-4"
    ckpt.mkdir(parents=True)
    assert common.run_config(None, ckpt)["train"]["steps"] == 12
    assert common.run_config(None, tmp_path / "elsewhere") == {}


# ---------------------------------------------------------------- the launched app, via the client

EXPECTED_APIS = {"vision_answer", "vision_answer_enter", "vision_preview", "audio_answer",
                 "translate", "robustness", "monitor", "monitor_enter", "monitor_tick",
                 "monitor_live"}


@pytest.fixture(scope="module")
def served(ctx, tmp_path_factory):
    from apps.launcher import build_demo, launch

    run = write_run(tmp_path_factory.mktemp("served") / "run")
    ctx.run_dir = str(run)
    demo = build_demo(ctx)
    url = launch(demo, port=free_port(), block=False)
    yield demo, url, run
    demo.close()
    ctx.run_dir = ""


def test_every_event_has_an_api_name(served):
    demo, _, _ = served
    names = {fn.api_name for fn in demo.fns.values()}
    assert None not in names and names == EXPECTED_APIS


def write_wav(path: Path, seconds: float = 1.0, rate: int = 16000) -> Path:
    import wave

    tone = (np.sin(np.arange(int(seconds * rate)) / 5) * 8000).astype(np.int16)
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(rate)
        fh.writeframes(tone.tobytes())
    return path


def test_client_calls_every_tab(served, image, tmp_path):
    from gradio_client import Client, handle_file

    _, url, run = served
    client = Client(url, verbose=False)
    _, extracted, verdict_md, breakdown, status = client.predict(
        [handle_file(image)], "How many shapes?", "3", False, 1.0, 8, "",
        api_name="/vision_answer")
    assert status.startswith("✓ done") and extracted == "(no answer extracted)"
    assert "Gold: `3`" in verdict_md
    assert [r[0] for r in breakdown["data"]][:2] == ["overall (weighted sum)", "accuracy"]
    assert len(client.predict([handle_file(image)], api_name="/vision_preview")) == 1
    table, gallery, status = client.predict(handle_file(image), "How many shapes?", "", "", 8,
                                            api_name="/robustness")
    # clean + 6 image ops + template_swap, format_instruction, irrelevant_context
    assert len(table["data"]) == 10 and len(gallery) == 7 and status.startswith("✓ 9 operators")
    *plots, status = client.predict(str(run), api_name="/monitor")
    assert "step 6 / 12" in status and len(plots) == 4
    assert "needs a model loaded with the `audio` adapter" in client.predict(
        handle_file(str(write_wav(tmp_path / "tone.wav"))), "What is it?",
        api_name="/audio_answer")[3]
    assert "`image_translation` adapter" in client.predict(handle_file(image), "French",
                                                 api_name="/translate")[3]


def test_client_bad_input_gets_a_message_and_the_server_keeps_serving(served, image, tmp_path):
    from gradio_client import Client, handle_file

    _, url, _ = served
    client = Client(url, verbose=False)
    assert client.predict([handle_file(image)], "", "", False, 1.0, 8, "",
                          api_name="/vision_answer")[4] == "⚠ Type a question first."
    fake = tmp_path / "fake.png"
    fake.write_text("hello")
    status = client.predict([handle_file(str(fake))], "How many?", "", False, 1.0, 8, "",
                            api_name="/vision_answer")[4]
    assert "not an image file" in status
    status = client.predict([handle_file(image)], "How many?", "", False, 1.0, 8, "",
                            api_name="/vision_answer")[4]
    assert status.startswith("✓ done")
