"""The Audio QA and Image translation tabs on tiny real models (random weights).

Audio: a tiny Qwen2-Audio loaded as `mmrlvr demo --model DIR` would (the adapter inferred from
the model); translation: the tiny Qwen2.5-VL loaded with `--modality image_translation`.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from PIL import Image, ImageDraw

from apps import audio_tab, translation_tab
from mmrlvr.data import Example
from tests.test_apps import free_port, write_wav

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
def tiny_audio(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("qwen2-audio", tmp_path_factory.mktemp("tiny-qwen2audio"))


@pytest.fixture(scope="module")
def actx(tiny_audio):
    import torch

    from apps.launcher import load_context

    torch.manual_seed(0)
    ctx = load_context(str(tiny_audio), device="cpu")        # no run config: inferred `audio`
    assert ctx.policy.adapter.name == "audio"
    return ctx


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
    assert first[3].startswith("Generating…") and "1.50 s at 16000 Hz" in first[3]
    assert "Acoustic evidence" in first[1] and "sounds (onsets): 3" in first[1]  # before the text
    text, evidence_md, rows, status = updates[-1]
    assert status.startswith("✓ done") and "greedy" in status and "static rubric reward" in status
    assert evidence_md == first[1]
    grown = [u[0] for u in updates[1:-1]]
    assert all(b.startswith(a) for a, b in itertools.pairwise(grown))
    assert rows[0][0].startswith("rubric reward") and len(rows) >= 3
    assert any("3 distinct sounds" in r[0] for r in rows)              # the count rubric
    assert {r[3] for r in rows[1:]} <= {"✓", "✗", "—"}
    assert sum(r[2] for r in rows[1:]) == pytest.approx(1.0, abs=0.01)
    # the streamed text is what the hf rollout engine generates greedily for the same prompt
    rate, samples = audio_tab.check_audio(clip)
    example = Example(id="demo", prompt="How many beeps are there?", answer="-",
                      audios=[(samples, rate)])
    batch = actx.policy.adapter.encode([example], actx.policy.processor)
    greedy = make_engine("hf", actx.policy).generate(
        batch, SamplingParams(max_new_tokens=10, greedy=True))
    assert text == greedy.texts[0]
    assert not actx.lock.locked()


def test_audio_file_upload_long_clip_and_bad_files(actx, tmp_path):
    wav = write_wav(tmp_path / "tone.wav", seconds=4.0, rate=8000)       # longer than 3 s window
    *_, last = audio_tab.answer(actx, str(wav), "Is it high or low?", max_new_tokens=4)
    assert last[3].startswith("✓ done") and "cut to the model's 3 s window" in last[3]
    assert "duration: 4.0 s" in last[1]
    fake = tmp_path / "notes.wav"
    fake.write_text("this is not audio")
    (only,) = audio_tab.answer(actx, str(fake), "What?")
    assert only[3].startswith("⚠") and "notes.wav cannot be used as audio" in only[3]
    (only,) = audio_tab.answer(actx, str(tmp_path / "missing.wav"), "What?")
    assert "file not found" in only[3]
    silent = tmp_path / "silent.wav"
    import soundfile as sf

    sf.write(silent, np.zeros(RATE, np.float32), RATE)
    (only,) = audio_tab.answer(actx, str(silent), "What?")
    assert "silent" in only[3]
    (only,) = audio_tab.answer(actx, (RATE, np.tile(beeps()[1], 21)), "What?")
    assert "32 s long" in only[3]


def test_audio_failure_inside_generate_is_shown_not_raised(actx, monkeypatch):
    def boom(**_):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(actx.policy.model, "generate", boom)
    with pytest.warns(UserWarning, match="simulated"):
        *_, last = audio_tab.answer(actx, beeps(), "How many?")
    assert last[3].startswith("✗ RuntimeError") and "Acoustic evidence" in last[1]
    assert not actx.lock.locked()


def test_audio_model_tabs_say_why_for_vision_and_translation(actx, sign):
    from apps import vision_tab

    assert "needs a model loaded with the `vision` adapter" in \
        list(vision_tab.answer(actx, [sign], "q"))[-1][4]
    assert "`image_translation` adapter" in translation_tab.translate(actx, sign, "German")[3]


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
    from apps import vision_tab

    answer = ('<answer><div class="patch" style="width:96px;height:48px">'
              '<div style="left:4px;top:12px;width:88px;height:24px;font-size:16px;'
              'color:#c00000">AUSVERKAUF</div></div></answer>')
    seen = {}

    def fake_stream(policy, example, **kwargs):
        seen["prompt"], seen["kwargs"] = example.prompt, kwargs
        yield answer[:20], 3
        yield answer, 40

    monkeypatch.setattr(vision_tab, "stream_completion", fake_stream)
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

def test_client_audio_answer_and_bad_file(actx, tmp_path):
    from gradio_client import Client, handle_file

    from apps.launcher import build_demo, launch

    demo = build_demo(actx)
    url = launch(demo, port=free_port(), block=False)
    try:
        client = Client(url, verbose=False)
        wav = write_wav(tmp_path / "tone.wav", seconds=1.0)
        _, evidence_md, rows, status = client.predict(
            handle_file(str(wav)), "What do you hear?", False, 1.0, 8, api_name="/audio_answer")
        assert status.startswith("✓ done") and "Acoustic evidence" in evidence_md
        assert rows["data"][0][0].startswith("rubric reward")
        fake = tmp_path / "fake.wav"
        fake.write_text("hello")
        status = client.predict(handle_file(str(fake)), "What?", False, 1.0, 8,
                                api_name="/audio_answer")[3]
        assert status.startswith("⚠") and "cannot be used as audio" in status
        notes = tmp_path / "notes.txt"
        notes.write_text("hello")
        status = client.predict(handle_file(str(notes)), "What?", False, 1.0, 8,
                                api_name="/audio_answer")[3]
        assert status.startswith("⚠") and "notes" in status
        status = client.predict(handle_file(str(wav)), "What?", False, 1.0, 8,
                                api_name="/audio_answer")[3]
        assert status.startswith("✓ done")                               # still serving
    finally:
        demo.close()
