"""The Audio QA and Image translation tabs on tiny real models (random weights).

Audio: a tiny Qwen2-Audio loaded as `mmrlvr demo --model DIR` would (the adapter inferred from
the model), and as a run's trained model beside its base model on tones data; translation: the
tiny Qwen2.5-VL loaded with `--modality image_translation`.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from PIL import Image, ImageDraw

from apps import audio_tab, translation_tab
from mmrlvr.data import Example
from modalities.image_translation import language_name
from tests.apps_helpers import free_port, tiny_audio, tones_run, write_wav  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:::gradio.queueing")

RATE = 16000


def beeps(n: int = 3, seconds: float = 1.5, rate: int = RATE) -> tuple[int, np.ndarray]:
    """`n` short tones separated by silence, as Gradio's (rate, int16 samples)."""
    wave = np.zeros(int(seconds * rate), np.float32)
    t = np.arange(int(0.15 * rate)) / rate
    for k in range(n):
        start = int((0.1 + k * 0.45) * rate)
        wave[start:start + len(t)] = 0.5 * np.sin(2 * np.pi * (440 + 220 * k) * t)
    return rate, (wave * 32767).astype(np.int16)


@pytest.fixture(scope="module")
def actx(tiny_audio):
    import torch

    from apps.launcher import load_context

    torch.manual_seed(0)
    ctx = load_context(str(tiny_audio), device="cpu")        # no run config: inferred `audio`
    assert ctx.policy.adapter.name == "audio"
    return ctx


@pytest.fixture(scope="module")
def rctx(tones_run):
    from apps.launcher import load_context

    return load_context(str(tones_run / "final"), str(tones_run), device="cpu")


@pytest.fixture(scope="module")
def tctx(tiny_vl):
    from apps.launcher import load_context

    ctx = load_context(str(tiny_vl), device="cpu", modality="image_translation")
    assert ctx.policy.adapter.name == "image_translation"
    return ctx


@pytest.fixture(scope="module")
def sign(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("sign") / "sign.png"
    img = Image.new("RGB", (96, 48), (240, 240, 230))
    ImageDraw.Draw(img).text((10, 16), "SALE", fill=(20, 20, 20))
    img.save(path)
    return str(path)


# ---------------------------------------------------------------- Audio QA

def test_audio_answer_streams_shows_evidence_and_rubrics(actx):
    from mmrlvr.rollout import SamplingParams, make_engine

    clip = beeps()
    updates = list(audio_tab.answer(actx, clip, "How many beeps are there?", max_new_tokens=10))
    first = updates[0]
    assert first[-1].startswith("Generating…") and "1.50 s at 16000 Hz" in first[-1]
    assert "Acoustic evidence" in first[8] and "sounds (onsets): 3" in first[8]  # before the text
    *_, evidence_md, rows, status = updates[-1]
    assert status.startswith("✓ done: trained 10 tokens, greedy") and "rubric reward" in status
    assert evidence_md == first[8]
    raws = [u[3] for u in updates[1:]]
    assert all(b.startswith(a) for a, b in itertools.pairwise(raws))
    assert len({len(r) for r in raws}) >= 8                          # streamed token by token
    assert rows[0][0].startswith("rubric reward") and len(rows) >= 3
    assert any("3 distinct sounds" in r[0] for r in rows)              # the count rubric
    assert {r[3] for r in rows[1:]} <= {"✓", "✗", "—"} and len(rows[0]) == 4
    assert sum(r[2] for r in rows[1:]) == pytest.approx(1.0, abs=0.01)
    rate, samples = audio_tab.check_audio(clip)
    example = Example(id="demo", prompt="How many beeps are there?", answer="-",
                      audios=[(samples, rate)])
    batch = actx.policy.adapter.encode([example], actx.policy.processor)
    greedy = make_engine("hf", actx.policy).generate(
        batch, SamplingParams(max_new_tokens=10, greedy=True))
    assert raws[-1] == greedy.texts[0]
    assert not actx.lock.locked()


def test_multiple_choice_clip_gets_verdicts_for_trained_and_base(rctx, tones_run):
    example = rctx.info.examples[0]
    assert len(rctx.info.examples) == 8 and example.choices and rctx.base is not None
    path, question, gold = audio_tab.pick_example(rctx, 0)
    assert path == example.audios[0] and question == example.prompt and gold == example.answer
    *_, last = audio_tab.answer(rctx, path, question, gold, max_new_tokens=6)
    trained, base, rows, status = last[:4], last[4:8], last[9], last[10]
    assert status.startswith("✓ done: trained 6 tokens, base 6") and "(base " in status
    for panel in (trained, base):
        assert f"old: `{gold}`" in panel[1] or f"the gold `{gold}`" in panel[1]   # the verdict
    assert trained[3] == base[3]                                       # same weights, greedy
    assert audio_tab.rubric_headers(rctx)[-2:] == ["trained", "base"]
    assert all(len(r) == 5 for r in rows) and rows[0][3] == rows[0][4]
    *_, last = audio_tab.answer(rctx, path, question, "", max_new_tokens=6, compare=False)
    assert "Type a gold answer" in last[-1] and last[1] == "Type a gold answer (or click an " \
        "example) to see the verdict." and last[4:8] == ["", "", "", ""]
    assert {r[4] for r in last[9]} == {"—"}                            # the base was not asked


def test_clearing_the_clip_clears_the_results():
    cleared = audio_tab.cleared(None)
    assert cleared[:-1] == ["", "", "", "", "", "", "", "", "", []]
    assert cleared[-1].startswith("Clip cleared")
    assert audio_tab.cleared("clip.wav")[-1].startswith("Clip ready")


def test_audio_file_upload_long_clip_and_bad_files(actx, tmp_path):
    wav = write_wav(tmp_path / "tone.wav", seconds=4.0, rate=8000)       # longer than 3 s window
    *_, last = audio_tab.answer(actx, str(wav), "Is it high or low?", max_new_tokens=4)
    assert last[-1].startswith("✓ done") and "cut to the model's 3 s window" in last[-1]
    assert "duration: 4.0 s" in last[8]
    fake = tmp_path / "notes.wav"
    fake.write_text("this is not audio")
    (only,) = audio_tab.answer(actx, str(fake), "What?")
    assert only[-1].startswith("⚠") and "notes.wav cannot be used as audio" in only[-1]
    (only,) = audio_tab.answer(actx, str(tmp_path / "missing.wav"), "What?")
    assert "file not found" in only[-1]
    silent = tmp_path / "silent.wav"
    import soundfile as sf

    sf.write(silent, np.zeros(RATE, np.float32), RATE)
    (only,) = audio_tab.answer(actx, str(silent), "What?")
    assert "silent" in only[-1]
    (only,) = audio_tab.answer(actx, (RATE, np.tile(beeps()[1], 21)), "What?")
    assert "32 s long" in only[-1]
    for audio, expected in [(None, "Upload or record"), ((RATE, beeps()[1][:0]), "empty")]:
        assert expected in list(audio_tab.answer(actx, audio, "What?"))[-1][-1]
    assert "Type a question" in list(audio_tab.answer(actx, beeps(), " "))[-1][-1]


def test_audio_failure_inside_generate_is_shown_not_raised(actx, monkeypatch):
    def boom(**_):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(actx.policy.model, "generate", boom)
    with pytest.warns(UserWarning, match="simulated"):
        *_, last = audio_tab.answer(actx, beeps(), "How many?")
    assert last[-1].startswith("✗ RuntimeError") and "Acoustic evidence" in last[8]
    assert not actx.lock.locked()


def test_audio_model_tabs_say_why_for_vision_and_translation(actx, sign):
    from apps import vision_tab

    assert "needs a vision-language model (the `vision` adapter)" in \
        list(vision_tab.answer(actx, [sign], "q"))[-1][-1]
    assert "runs/banners-grpo" in translation_tab.translate(actx, sign, "German")[3]


def test_robustness_of_an_audio_model_runs_the_audio_operators(rctx):
    from apps import robustness_tab
    from mmrlvr.stress import OPERATORS

    path, question, gold, options = robustness_tab.pick_example(rctx, 0)
    assert options and "\nA." not in question                        # stem and options apart
    rows, gallery, status = list(robustness_tab.run(rctx, path, question, gold, 8, options))[-1]
    kinds = {r[1] for r in rows[1:]}
    assert kinds == {"text", "audio", "task-altering"} and gallery == []
    assert [r[0] for r in rows if r[1] == "audio"] == [n for n, op in OPERATORS.items()
                                                       if op.kind == "audio"]
    assert "Listen to the clip" in rows[[r[0] for r in rows].index("template_swap")][2] or \
        "recording" in rows[[r[0] for r in rows].index("template_swap")][2]
    assert status.startswith("✓") and "blur" not in status


# ---------------------------------------------------------------- Image translation

def test_translation_random_model_gives_a_message_and_the_original_image(tctx, sign):
    erased, patch, rendered, status = translation_tab.translate(tctx, sign, "German",
                                                                max_new_tokens=16)
    original = Image.open(sign).convert("RGB")
    assert isinstance(erased, Image.Image) and isinstance(rendered, Image.Image)
    assert erased.size == rendered.size == original.size
    if status.startswith("⚠"):                     # random weights: no valid patch (the usual)
        assert "not a valid HTML patch" in status and "original" in status
        assert patch.startswith("<!-- the model's completion is not a valid HTML patch")
        assert np.array_equal(np.asarray(rendered), np.asarray(original))
    else:
        assert status.startswith("✓ done")
    assert not tctx.lock.locked()


def test_translation_with_a_valid_patch_erases_and_renders(tctx, sign, monkeypatch):
    from apps import generate

    answer = ('<answer><div class="patch" style="width:96px;height:48px">'
              '<div style="left:4px;top:12px;width:88px;height:24px;font-size:16px;'
              'color:#c00000">AUSVERKAUF</div></div></answer>')
    seen = {}

    def fake_stream(policy, example, **kwargs):
        seen["prompt"], seen["kwargs"] = example.prompt, kwargs
        yield answer[:20], 3
        yield answer, 40

    monkeypatch.setattr(generate, "stream_completion", fake_stream)
    erased, patch, rendered, status = translation_tab.translate(tctx, sign, "German")
    assert status.startswith("✓ done: 1 text box translated into German")
    assert "into German" in seen["prompt"] and seen["kwargs"]["sample"] is False
    assert "AUSVERKAUF" in patch and "left:4px" in patch
    original = np.asarray(Image.open(sign).convert("RGB"), dtype=int)
    assert np.abs(np.asarray(erased, dtype=int) - original).sum() > 0     # the text was erased
    assert (np.asarray(rendered, dtype=int)[..., 0] - np.asarray(rendered, dtype=int)[..., 1]
            ).max() > 100                                                  # red text drawn


def test_translation_bad_input(tctx, tmp_path):
    bad = tmp_path / "x.png"
    bad.write_text("not an image")
    assert "not an image file" in translation_tab.translate(tctx, str(bad), "French")[3]
    ok = tmp_path / "ok.png"
    Image.new("RGB", (40, 40), "white").save(ok)
    assert "Pick a target language" in translation_tab.translate(tctx, str(ok), " ")[3]
    assert translation_tab.language_code("German") == "de"
    assert translation_tab.language_code("Chinese") == "Chinese"


# ---------------------------------------------------------------- via the client

def test_client_audio_example_answer_and_bad_file(rctx, tmp_path):
    from gradio_client import Client, handle_file

    from apps.launcher import build_demo, launch

    demo = build_demo(rctx)
    url = launch(demo, port=free_port(), block=False)
    try:
        client = Client(url, verbose=False)
        clip, question, gold = client.predict(1, api_name="/audio_example")
        out = client.predict(handle_file(clip), question, gold, False, 1.0, 8, True,
                             api_name="/audio_answer")
        assert out[-1].startswith("✓ done") and "Acoustic evidence" in out[8]
        assert f"`{gold}`" in out[1] and f"`{gold}`" in out[5]
        assert out[9]["headers"] == ["rubric", "category", "weight", "trained", "base"]
        assert client.predict(None, api_name="/audio_cleared")[-1].startswith("Clip cleared")
        fake = tmp_path / "fake.wav"
        fake.write_text("hello")
        status = client.predict(handle_file(str(fake)), "What?", "", False, 1.0, 8, True,
                                api_name="/audio_answer")[-1]
        assert status.startswith("⚠") and "cannot be used as audio" in status
        notes = tmp_path / "notes.txt"
        notes.write_text("hello")
        status = client.predict(handle_file(str(notes)), "What?", "", False, 1.0, 8, False,
                                api_name="/audio_answer")[-1]
        assert status.startswith("⚠") and "notes" in status
        wav = write_wav(tmp_path / "tone.wav", seconds=1.0)
        status = client.predict(handle_file(str(wav)), "What?", "", False, 1.0, 8, False,
                                api_name="/audio_answer")[-1]
        assert status.startswith("✓ done")                               # still serving
    finally:
        demo.close()


def test_translation_examples_come_from_the_run_data(tctx, tmp_path):
    from apps.common import DemoContext
    from apps.runinfo import RunInfo, load_examples
    from mmrlvr.tasks.banners import make_banners

    make_banners(tmp_path / "banners", n_train=0, n_test=4, seed=0)
    data = tmp_path / "banners" / "test.jsonl"
    examples = load_examples(data, "image_translation")
    ctx = DemoContext(policy=tctx.policy, info=RunInfo(data_file=data, examples=examples,
                                                       examples_for="image_translation"))
    image, language, note = translation_tab.pick_example(ctx, 1)
    assert image == examples[1].images[0] and language in translation_tab.LANGUAGES
    assert language_name(examples[1].meta["target_lang"]) == language and "Translate" in note
