"""The clip task (mmrlvr/tasks/clip.py) on a tiny Qwen2-Audio: the prompt's audio, cut to the
model's 3 s window, holds none of the asked segment; the gold `clip(t0, t1)` call returns that
segment whole and what it holds is the answer (measured from the samples, not read from meta);
SFT on a clip trajectory trains the call and the answer, not the tool's audio; and after that
warm start GRPO's own rollouts call `clip` and get audio back (nothing scripted)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from mmrlvr.core.trajectory import parse_call
from mmrlvr.data import AudioWarning
from modalities.audio import WARN_FIRST
from mmrlvr.tasks.clip import PEAK_DB, PITCH_HZ, SEGMENTS, WINDOW_S, make_clip
from mmrlvr.tasks.tones import SR
from mmrlvr.tools.builtin import clip

pytestmark = pytest.mark.filterwarnings("ignore::mmrlvr.data.AudioWarning")


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("clip")
    make_clip(out, n_train=24, n_test=8, seed=0)
    return out


def rows(data_dir: Path, split: str = "train"):
    from mmrlvr.data.loading import load_jsonl

    return load_jsonl(data_dir / f"{split}.jsonl")


def loud_span(wave: np.ndarray, floor: float = 0.005) -> tuple[int, int] | None:
    """First and last sample of the 10 ms frames whose RMS is above `floor` (None: silence)."""
    frames = wave[:len(wave) // 160 * 160].reshape(-1, 160)
    on = np.nonzero(np.sqrt((frames ** 2).mean(axis=1)) > floor)[0]
    return None if not len(on) else (int(on[0]) * 160, int(on[-1] + 1) * 160)


def peak_hz(wave: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave))))
    return float(np.fft.rfftfreq(len(wave), 1 / SR)[spectrum.argmax()])


def test_the_prompt_hears_the_first_window_only_and_the_asked_tone_lies_after_it(
        clip_dir, tiny_dirs):
    import modalities
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_dirs("qwen2-audio"))
    assert processor.feature_extractor.chunk_length == WINDOW_S
    examples = rows(clip_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adapter = modalities.get("audio")
        batch = adapter.encode(examples, processor)
    cut = [w for w in caught if issubclass(w.category, AudioWarning)]
    assert adapter.cut == len(examples) > WARN_FIRST                  # every recording cut ...
    assert len(cut) == WARN_FIRST and "cut to the first 3 s" in str(cut[0].message)  # ... 3 named
    assert "without a warning (counted in the adapter's `cut`)" in str(cut[-1].message)
    frames = batch.inputs["feature_attention_mask"].sum(-1)
    assert frames.tolist() == [WINDOW_S * 100] * len(examples)      # 10 ms frames: 3 s heard
    same = 0
    for ex in examples:
        seg, tones = ex.meta["segment"], ex.meta["tones"]
        assert seg["t0"] >= WINDOW_S and seg["t1"] - seg["t0"] == WINDOW_S
        assert ex.meta["recording_s"] == SEGMENTS * WINDOW_S
        inside = [t for t in tones if seg["t0"] <= t["start_s"] < seg["t1"]]
        assert len(inside) == 1 and inside[0]["end_s"] <= seg["t1"]     # the asked tone, whole
        assert all(t["end_s"] <= WINDOW_S or t["start_s"] >= WINDOW_S for t in tones)
        attribute = "pitch" if ex.meta["family"] == "pitch" else "loudness"
        same += tones[0][attribute] == ex.answer       # the heard tone: drawn independently
    assert 0 < same < len(examples)


def test_the_gold_call_parses_and_its_clip_holds_the_answer(clip_dir):
    families = set()
    for ex in rows(clip_dir) + rows(clip_dir, "test"):
        turns = ex.meta["trajectory"]
        call, why = parse_call(turns[0]["text"])
        assert call is not None and not why and call.name == "clip" and len(turns) == 2
        assert call.arguments == ex.meta["segment"]
        assert parse_call(turns[1]["text"]) == (None, "")
        assert turns[1]["text"].endswith(f"<answer>{ex.answer}</answer>")
        wave, rate = clip(ex, **call.arguments)
        assert rate == SR and len(wave) == WINDOW_S * SR            # one window, read whole
        span = loud_span(wave)
        assert span is not None                                     # one tone, where meta says
        ev = ex.meta["evidence"]
        assert abs(span[0] / SR - ev["start_s"]) < 0.03 and abs(span[1] / SR - ev["end_s"]) < 0.03
        tone = wave[span[0]:span[1]]
        family = ex.meta["family"]
        families.add(family)
        if family == "pitch":
            lo, hi = PITCH_HZ[ex.answer]
            assert lo - 5 <= peak_hz(tone) <= hi + 5, ex.id
        else:
            lo, hi = PEAK_DB[ex.answer]
            assert lo - 1 <= 20 * np.log10(np.abs(tone).max()) <= hi + 1, ex.id
    assert families == {"pitch", "loudness"}


def test_the_task_is_registered_dealt_evenly_and_repeatable(tmp_path):
    from mmrlvr.tasks import TASKS, TaskOptions

    task = TASKS.get("clip")
    info = task.make(tmp_path / "a", TaskOptions(n_train=8, n_test=2, seed=1))
    task.make(tmp_path / "b", TaskOptions(n_train=8, n_test=2, seed=1))
    assert info["recording_s"] == SEGMENTS * WINDOW_S and info["counts"]["train"] == \
        {"pitch": 4, "loudness": 4}
    for name in ("train.jsonl", "test.jsonl", "audio/train-000007.wav", "audio/test-000001.wav"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    answers = sorted(ex.answer for ex in rows(tmp_path / "a"))
    assert answers == ["high", "high", "loud", "loud", "low", "low", "quiet", "quiet"]
    with pytest.raises(ValueError, match="unknown clip families"):
        make_clip(tmp_path / "c", n_train=1, n_test=1, families=["tempo"])


def audio_policy(model_dir):
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.train.policy import Policy

    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(model_dir), modality="audio"), modalities.get("audio"),
                       torch.device("cpu"))


def test_sft_on_a_clip_trajectory_trains_the_call_and_the_answer_not_the_clip(
        clip_dir, tiny_dirs):
    from mmrlvr.core.types import select
    from mmrlvr.tools import build_runner
    from mmrlvr.train.sft_tools import trajectory_targets

    policy = audio_policy(tiny_dirs("qwen2-audio"))
    examples = rows(clip_dir)[:3]
    prompts = policy.adapter.encode(examples, policy.processor)
    batch, ids, mask, train = trajectory_targets(policy, examples, prompts,
                                                 build_runner([{"name": "clip"}]))
    tok = policy.tokenizer
    audio = tok.convert_tokens_to_ids("<|AUDIO|>")
    for i, ex in enumerate(examples):
        n = int(mask[i].sum())
        row, keep = ids[i, :n], train[i, :n].bool()
        assert int((row == audio).sum()) == 75                 # the 3 s clip: 25 tokens a second
        assert not bool(keep[row == audio].any())              # ... none of them trained
        call, answer = (t["text"] for t in ex.meta["trajectory"])
        assert tok.decode(row[keep]) == call + answer + tok.decode([policy.eos_ids[0]])
        tool_turn = tok.decode(row[~keep])
        assert tool_turn.startswith("<|im_end|>\n<|im_start|>tool\n")
        assert tool_turn.endswith("<|im_start|>assistant\n")
    # every row's prompt carries its own (cut) recording and the clip: the forward places both
    assert batch.inputs["input_features"].shape[0] == 2 * len(examples)
    inputs, _ = select(batch, list(range(len(examples))))
    logp, _ = policy.completion_logprobs(inputs, ids, mask)
    assert torch.isfinite(logp[train.bool()]).all()


def test_grpo_with_clip_after_the_warm_start_calls_it_unscripted(tmp_path):
    """SFT on two rows' gold trajectories teaches the call; GRPO's rollouts then make it, and
    the clips come back as audio turns."""
    from tests.tool_warm_start import grpo_tool_steps, warm_start

    data = tmp_path / "clip"
    make_clip(data, n_train=2, n_test=2, seed=0, families=["pitch"])
    common = ["model.modality=audio", "model.freeze_audio=true",
              f"data.train={data / 'train.jsonl'}", "rollout.backend=hf", "rollout.max_turns=2",
              "rollout.tools=[{name: clip}]", "rollout.max_trajectory_tokens=200",
              "rollout.max_new_tokens=40", "train.seed=0", "train.threads=1",
              "rewards=[{name: accuracy, weight: 0.9}, {name: turn_format, weight: 0.1}]"]
    model, sft_log = warm_start(tmp_path, "qwen2-audio", data, common)
    assert sft_log[-1]["sft/loss"] < 0.1 * sft_log[1]["sft/loss"]
    steps = grpo_tool_steps(tmp_path, model, common)
    assert len(steps) == 2
    assert sum(r["tools/calls_per_rollout"] for r in steps) > 0       # the policy's own calls
    assert sum(r.get("tools/results_audio", 0) for r in steps) > 0    # ... that gave clips
    assert sum(r.get("tools/errors_bad_args", 0) for r in steps) == 0
