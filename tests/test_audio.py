"""The audio modality on tiny real Qwen2-Audio and Qwen2.5-Omni thinker models: build, logprobs,
encode-once, mixed batches, bad audio, audio stress operators."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import soundfile as sf
import torch

import modalities
from mmrlvr.config import ModelConfig
from mmrlvr.data import DataError, Example
from mmrlvr.train.policy import Policy
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.data import AudioWarning, read_audio
from mmrlvr.core.types import select

SR = 16000


def _tone(freq, seconds, amp=0.5, sr=SR):
    t = np.arange(int(sr * seconds)) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.fixture(scope="module", params=["qwen2-audio", "qwen2.5-omni"])
def tiny_audio(request, tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny(request.param, tmp_path_factory.mktemp(request.param.replace(".", "_")))


@pytest.fixture(scope="module")
def apolicy(tiny_audio):
    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(tiny_audio), modality="audio"), modalities.get("audio"),
                       torch.device("cpu"))


def _is_omni(policy):
    return type(policy.model).__name__.startswith("Qwen2_5Omni")


def _count_clips(policy, calls):
    """Record how many clips each audio-encoder call encodes (Omni takes them flattened)."""
    def hook(module, args, kwargs, out):
        calls.append(len(kwargs["feature_lens"]) if "feature_lens" in kwargs else args[0].shape[0])
    return policy.model.model.audio_tower.register_forward_hook(hook, with_kwargs=True)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    sf.write(d / "a.wav", _tone(440, 1.0), SR)
    sf.write(d / "b.flac", _tone(880, 2.2), SR)
    sf.write(d / "c.ogg", _tone(660, 0.6), SR)
    return d


@pytest.fixture()
def mixed(clips):
    """0, 1 and 2 clips of different lengths (25 and 55+25 audio tokens), different prompts."""
    return [
        Example(id="none", prompt="What is 2 + 3?", answer="5"),
        Example(id="one", prompt="How many beeps?", answer="1", audios=[str(clips / "a.wav")]),
        Example(id="two", prompt="Which clip is higher, the first or the second one?", answer="B",
                audios=[str(clips / "b.flac"), str(clips / "a.wav")]),
    ]


def _completions(policy, widths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, len(policy.tokenizer) - 20, (len(widths), max(widths)), generator=gen)
    mask = torch.zeros_like(ids)
    for i, w in enumerate(widths):
        mask[i, :w] = 1
    return torch.where(mask.bool(), ids, torch.full_like(ids, policy.pad_id)), mask


def _logprobs(policy, batch, rows, ids, mask, media=None):
    inputs, _ = select(batch, rows)
    with torch.no_grad():
        return policy.completion_logprobs(inputs, ids, mask, media=media)[0]


def test_tiny_audio_models_are_the_real_classes_with_a_short_window(tiny_audio, apolicy):
    from transformers import AutoProcessor

    cfg = json.loads((tiny_audio / "config.json").read_text())
    omni = _is_omni(apolicy)
    assert cfg["architectures"] == ["Qwen2_5OmniThinkerForConditionalGeneration" if omni
                                    else "Qwen2AudioForConditionalGeneration"]
    assert cfg["audio_config"]["max_source_positions"] == 150           # 50 x the 3 s window
    processor = AutoProcessor.from_pretrained(tiny_audio)
    assert type(processor).__name__ == ("Qwen2_5OmniProcessor" if omni else "Qwen2AudioProcessor")
    assert processor.feature_extractor.chunk_length == 3
    tok = processor.tokenizer
    assert apolicy.model.config.text_config.vocab_size == len(tok)
    assert apolicy.model.config.audio_token_index == tok.convert_tokens_to_ids("<|AUDIO|>")
    assert len(apolicy.placeholder_ids) == 3
    assert "random" in (tiny_audio / "TINY.md").read_text()


def test_media_rows_are_per_audio_and_mixed_batches_work(apolicy, mixed):
    batch = apolicy.adapter.encode(mixed, apolicy.processor)
    assert batch.inputs["input_features"].shape[:2] == (3, 128)        # 0 + 1 + 2 clips
    assert batch.media_rows == [{}, {"input_features": (0, 1), "feature_attention_mask": (0, 1)},
                                {"input_features": (1, 3), "feature_attention_mask": (1, 3)}]
    audio_id = apolicy.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    assert (batch.inputs["input_ids"] == audio_id).sum(1).tolist() == [0, 25, 55 + 25]
    rep, _ = select(batch, [2, 0, 1, 2])
    torch.testing.assert_close(rep["input_features"][:2], batch.inputs["input_features"][1:3])
    assert "input_features" not in select(batch, [0, 0])[0]


def test_padded_batch_logprobs_equal_each_alone(apolicy, mixed):
    batch = apolicy.adapter.encode(mixed, apolicy.processor)
    ids, mask = _completions(apolicy, [5, 9, 2])
    together = _logprobs(apolicy, batch, [0, 1, 2], ids, mask)
    shared = _logprobs(apolicy, batch, [0, 1, 2], ids, mask, media=apolicy.adapter.shared_media(
        apolicy.model, batch, [0, 1, 2], apolicy.device, apolicy.dtype))
    for i in range(3):
        alone_batch = apolicy.adapter.encode([mixed[i]], apolicy.processor)
        w = int(mask[i].sum())
        alone = _logprobs(apolicy, alone_batch, [0], ids[i:i + 1, :w], mask[i:i + 1, :w])
        torch.testing.assert_close(together[i, :w], alone[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(shared[i, :w], alone[0], atol=2e-5, rtol=1e-4)


def test_shared_audio_features_give_the_same_logprobs_and_gradients(apolicy, mixed):
    batch = apolicy.adapter.encode(mixed, apolicy.processor)
    rows = [2, 2, 1, 0, 1, 2]
    ids, mask = _completions(apolicy, [4, 6, 3, 5, 2, 6])
    inputs, _ = select(batch, rows)
    calls = []
    hook = _count_clips(apolicy, calls)
    results = []
    try:
        for shared in (False, True):
            apolicy.model.zero_grad()
            calls.clear()
            media = apolicy.adapter.shared_media(apolicy.model, batch, rows, apolicy.device,
                                                 apolicy.dtype) if shared else None
            logp, _ = apolicy.completion_logprobs(inputs, ids, mask, media=media)
            (logp * mask).sum().backward()
            grad = apolicy.model.model.audio_tower.conv1.weight.grad.clone()
            results.append((logp.detach(), grad, list(calls)))
    finally:
        hook.remove()
        apolicy.model.zero_grad()
    (lp_raw, g_raw, calls_raw), (lp_shared, g_shared, calls_shared) = results
    assert calls_raw == [2 + 2 + 1 + 1 + 2] and calls_shared == [3]      # clips encoded: 8 vs 3
    torch.testing.assert_close(lp_raw * mask, lp_shared * mask, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(g_raw, g_shared, atol=1e-5, rtol=1e-4)


def test_rollouts_encode_each_prompt_once_and_rows_belong_to_their_prompt(apolicy, mixed):
    engine = make_engine("hf", apolicy)       # several clips a prompt: the Omni thinker too
    batch = apolicy.adapter.encode(mixed, apolicy.processor)
    n_clips = batch.inputs["input_features"].shape[0]
    calls = []
    hook = _count_clips(apolicy, calls)
    G = 4
    torch.manual_seed(0)
    try:
        roll = engine.generate(batch, SamplingParams(n=G, max_new_tokens=8, temperature=1.0))
    finally:
        hook.remove()
    assert calls == [n_clips]                    # each clip once, not G times
    assert not torch.isin(roll.completion_ids, torch.tensor(apolicy.placeholder_ids)).any()
    for row in range(3 * G):
        own = row // G
        m = roll.completion_mask[row:row + 1]
        w = int(m.sum())
        cid = roll.completion_ids[row:row + 1, :w]
        right = _logprobs(apolicy, batch, [own], cid, m[:, :w])[0]
        wrong = _logprobs(apolicy, batch, [(own + 1) % 3], cid, m[:, :w])[0]
        sampled = roll.sample_logprobs[row, :w]
        assert (right - sampled).abs().max() < 1e-4
        assert (wrong - sampled).abs().max() > 1e-3
        assert roll.example_of(row).id == mixed[own].id


def test_audio_token_mismatch_names_the_sample(apolicy, clips):
    bad = Example(id="row-9", prompt="Listen: <|AUDIO|> what is it?", answer="x",
                  audios=[str(clips / "a.wav")])
    with pytest.raises(DataError, match="row-9"):
        apolicy.adapter.encode([bad], apolicy.processor)


def test_corrupt_missing_empty_audio_are_errors_naming_sample_and_file(apolicy, tmp_path):
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF not really a wav file")
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, dtype=np.float32), SR)
    cases = (("s-1", broken, "cannot decode"), ("s-2", tmp_path / "nowhere.mp3", "not found"),
             ("s-3", empty, "empty"))
    for ex_id, path, what in cases:
        with pytest.raises(DataError, match=rf"{ex_id}.*{path.name}.*{what}"):
            apolicy.adapter.encode([Example(id=ex_id, prompt="q", answer="a", audios=[str(path)])],
                                   apolicy.processor)
    with pytest.raises(DataError, match="NaN"):
        read_audio((np.array([0.1, np.nan], dtype=np.float32), SR), SR, sample="s-4")


def test_silent_upsampled_and_overlong_audio_warn_naming_the_file(tmp_path):
    silent, low, long = tmp_path / "silent.wav", tmp_path / "low.wav", tmp_path / "long.wav"
    sf.write(silent, np.zeros(SR, dtype=np.float32), SR)
    sf.write(low, _tone(300, 1.0, sr=8000), 8000)
    sf.write(long, _tone(500, 7.5), SR)
    adapter = modalities.get("audio")
    ex = Example(id="w-1", prompt="q", answer="a")
    with pytest.warns(AudioWarning, match=r"silent\.wav.*silent"):
        adapter.load_audio(str(silent), ex, SR, 3 * SR)
    with pytest.warns(AudioWarning, match=r"low\.wav.*upsampled from 8000 Hz"):
        wave = adapter.load_audio(str(low), ex, SR, 3 * SR)[0]
    assert len(wave) == SR                                       # resampled to 16 kHz
    with pytest.warns(AudioWarning, match=r"long\.wav lasts 7\.50 s.*cut to the first 3 s"):
        assert [len(c) for c in adapter.load_audio(str(long), ex, SR, 3 * SR)] == [3 * SR]
    chunker = modalities.get("audio", long_audio="chunk")
    with pytest.warns(AudioWarning, match=r"long\.wav.*split into 3 windows"):
        clips = chunker.load_audio(str(long), ex, SR, 3 * SR)
    assert [len(c) for c in clips] == [3 * SR, 3 * SR, 3 * SR // 2]
    stereo = np.stack([_tone(440, 0.5), _tone(440, 0.5)], axis=1)       # [frames, 2]
    sf.write(tmp_path / "stereo.wav", stereo, SR)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_audio(str(tmp_path / "stereo.wav"), SR).ndim == 1


def test_chunked_long_clip_becomes_several_audio_entries(tiny_audio, tmp_path):
    from mmrlvr.train.policy import load_processor

    sf.write(tmp_path / "long.wav", _tone(500, 7.5), SR)
    processor = load_processor(str(tiny_audio))
    ex = Example(id="c-1", prompt="Describe it.", answer="a", audios=[str(tmp_path / "long.wav")])
    with pytest.warns(AudioWarning):
        batch = modalities.get("audio", long_audio="chunk").encode([ex], processor)
    assert batch.inputs["input_features"].shape[0] == 3
    assert batch.prompt_texts[0].count("<|audio_bos|>") == 3


def test_audio_stress_operators_corrupt_the_clip_and_keep_the_gold(clips):
    from mmrlvr.stress import OPERATORS, apply
    from mmrlvr.stress.ops import gold_preserved

    ex = Example(id="t-1", prompt="Which is higher?\nA. first\nB. second", answer="B",
                 choices=["first", "second"], audios=[str(clips / "a.wav")])
    audio_ops = [n for n, op in OPERATORS.items() if op.kind == "audio"]
    assert audio_ops == ["noise_snr", "clipping", "resample", "time_shift", "loudness"]
    clean = read_audio(str(clips / "a.wav"), SR)
    for name in audio_ops:
        variant = apply(OPERATORS[name], ex, "", seed=0)
        wave, sr = variant.example.audios[0]
        assert sr == SR and wave.shape == clean.shape and gold_preserved(ex, variant.example)
        assert not np.allclose(wave, clean, atol=1e-3), name
    noisy = apply(OPERATORS["noise_snr"], ex, "", seed=0).example.audios[0][0]
    snr = 10 * np.log10(np.mean(clean ** 2) / np.mean((noisy - clean) ** 2))
    assert abs(snr - 20) < 0.5
    quiet = apply(OPERATORS["loudness"], ex, "", seed=0).example.audios[0][0]
    assert np.abs(quiet).max() == pytest.approx(np.abs(clean).max() * 10 ** (-12 / 20), rel=1e-4)
    assert apply(OPERATORS["noise_snr"], Example(id="x", prompt="q", answer="a"), "", 0) is None


def test_wav_flac_ogg_mp3_decode_to_the_same_mono_clip(clips, tmp_path):
    sf.write(tmp_path / "d.mp3", _tone(660, 0.6), SR, format="MP3")
    ref = _tone(660, 0.6)
    for path in (clips / "c.ogg", tmp_path / "d.mp3"):
        wave = read_audio(str(path), SR)
        assert abs(len(wave) - len(ref)) < 0.05 * SR, path.name    # codecs pad a little
        assert 0.4 < np.abs(wave).max() < 0.6
    assert np.allclose(read_audio(str(clips / "a.wav"), SR), _tone(440, 1.0), atol=1e-4)


def test_a_shared_prompt_gives_the_logprobs_and_gradients_of_whole_rows(apolicy, mixed):
    from tests.test_policy import shared_prompt_check

    batch = apolicy.adapter.encode(mixed, apolicy.processor)
    rows = [2, 2, 1, 0, 1, 2]
    ids, mask = _completions(apolicy, [4, 6, 3, 5, 2, 6])
    tower = next(n for n, _ in apolicy.model.named_parameters() if "audio_tower.conv1.weight" in n)
    shared_prompt_check(apolicy, batch, rows, ids, mask, tower)


def test_packed_groups_give_the_logprobs_and_gradients_of_padded_rows(apolicy, mixed):
    """`train.packing` on the audio families (1-D positions; Omni's M-RoPE by clip length)."""
    from mmrlvr.train.packing import Layout, prompt_lengths
    from tests.test_packing import packing_check

    batch = apolicy.adapter.encode(mixed, apolicy.processor)
    rows, widths = [0, 0, 0, 1, 2, 2, 1], [66, 66, 66, 3, 2, 4, 1]
    packs = Layout(rows, widths, prompt_lengths(batch, rows))
    assert packs.rows == 2 and packs.row_of[1] == packs.row_of[2]   # both clips' prompts in a row
    ids, mask = _completions(apolicy, widths)
    tower = next(n for n, _ in apolicy.model.named_parameters() if "audio_tower.conv1.weight" in n)
    packing_check(apolicy, batch, rows, ids, mask, tower)
