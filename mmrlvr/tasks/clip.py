"""Clip: a question about a stretch of a recording the prompt never lets the model hear, and a
`clip(t0, t1)` call that plays it (docs/tools.md, "The clip task").

An audio model reads a prompt's clip through its feature extractor's window (`chunk_length`:
30 s for Qwen2-Audio, 3 s for `mmrlvr tiny qwen2-audio`); the audio adapter cuts a longer clip to
the window's first stretch (`long_audio: truncate`, the default, with a warning naming the file).
Each recording here lasts `SEGMENTS` windows (12 s for the 3 s window) and holds one pure tone per
window-long segment; a question names one segment after the first by its seconds, so what the
prompt's audio becomes holds none of it (the first segment's tone is drawn independently of the
asked one). `clip(t0, t1)` of the segment returns exactly one window of audio, which the
processor reads whole: the asked tone alone. Two families, each answer dealt evenly:

    pitch     Is the tone between 6 s and 9 s low or high?     -> low (200-350 Hz) / high (1.2-2 kHz)
    loudness  Is the tone between 3 s and 6 s loud or quiet?   -> loud (-9..-4 dBFS peak) /
                                                                   quiet (-34..-28 dBFS peak)

Every segment's tone has a random pitch band, level, length (0.5-1.2 s) and place, so neither the
prompt's window nor the recording's length tells the answer. Every row carries its gold
trajectory (`meta.trajectory`: the clip call of the named segment, then the answer), which
`mmrlvr sft` trains on when the config has `rollout.tools` (`mmrlvr.train.sft_tools`), and the
tones as made (`meta.tones`: start, end, frequency, peak amplitude per segment, in seconds of the
recording; `meta.evidence`: the asked one, in seconds of the clip). The same arguments give
byte-identical files.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from mmrlvr.core.trajectory import format_call
from mmrlvr.data import Example
from mmrlvr.tasks import Task
from mmrlvr.tasks.tones import SR, _tone, write_rows

WINDOW_S = 3
"""The prompt's audio window in seconds (`mmrlvr tiny qwen2-audio`'s `audio_window`): each
segment lasts one window, so a clip of one segment is read whole."""
SEGMENTS = 4
"""Segments per recording: the prompt hears the first, questions ask about the others."""
FAMILIES = ("pitch", "loudness")
ANSWERS = {"pitch": ("low", "high"), "loudness": ("quiet", "loud")}
"""Each family's answers (dealt evenly)."""
PITCH_HZ = {"low": (200.0, 350.0), "high": (1200.0, 2000.0)}
PEAK_DB = {"quiet": (-34.0, -28.0), "loud": (-9.0, -4.0)}
"""Peak level of a tone in dB full scale (20 dB at least between the bands)."""
TONE_S = (0.5, 1.2)
MARGIN_S = 0.2
"""A tone starts and ends at least this far inside its segment (a clip of it holds it whole)."""
NOISE = 0.001
"""The faint noise floor under every recording (as the tones task's)."""


def segment_of(index: int, window_s: float = WINDOW_S) -> dict[str, float]:
    """The clip arguments of segment `index` (0-based): seconds `t0` to `t1` of the recording."""
    return {"t0": index * window_s, "t1": (index + 1) * window_s}


def _draw_tone(rng: random.Random, pitch: str, loud: str, t0: float, window_s: float
               ) -> dict[str, Any]:
    seconds = rng.uniform(*TONE_S)
    start = t0 + MARGIN_S + rng.uniform(0.0, window_s - 2 * MARGIN_S - seconds)
    return {"start_s": round(start, 3), "end_s": round(start + seconds, 3),
            "freq_hz": round(rng.uniform(*PITCH_HZ[pitch]), 1), "pitch": pitch,
            "peak": round(10 ** (rng.uniform(*PEAK_DB[loud]) / 20), 5), "loudness": loud}


def _recording(family: str, rng: random.Random, answer: str, window_s: float) -> dict[str, Any]:
    """One recording's tones (one per segment) with the asked segment's attribute fixed."""
    asked = rng.randrange(1, SEGMENTS)
    tones = []
    for k in range(SEGMENTS):
        pitch, loud = rng.choice(ANSWERS["pitch"]), rng.choice(ANSWERS["loudness"])
        if k == asked:
            pitch, loud = (answer, loud) if family == "pitch" else (pitch, answer)
        tones.append(_draw_tone(rng, pitch, loud, k * window_s, window_s))
    return {"asked": asked, "tones": tones}


def render(tones: list[dict[str, Any]], seconds: float, seed: int) -> np.ndarray:
    """The recording: each tone (10 ms fades) over faint noise, float32 in [-1, 1]."""
    canvas = np.zeros(int(round(seconds * SR)))
    for t in tones:
        wave = _tone(t["freq_hz"], t["end_s"] - t["start_s"], t["peak"])
        start = int(round(t["start_s"] * SR))
        canvas[start:start + len(wave)] += wave
    canvas += np.random.default_rng(seed).normal(0.0, NOISE, len(canvas))
    return np.clip(canvas, -1, 1).astype(np.float32)


def question(family: str, seg: dict[str, float]) -> str:
    where = f"the tone between {seg['t0']:g} s and {seg['t1']:g} s"
    return (f"Is {where} low or high in pitch?" if family == "pitch" else
            f"Is {where} loud or quiet?")


def gold_trajectory(seg: dict[str, float], reasoning: str, answer: str) -> list[dict[str, str]]:
    """The turns of the reference trajectory: the clip call, then the final answer."""
    return [{"text": format_call("clip", t0=seg["t0"], t1=seg["t1"])},
            {"text": f"<think>{reasoning}</think><answer>{answer}</answer>"}]


def make_example(family: str, rng: random.Random, path: Path, answer: str,
                 window_s: float) -> Example:
    import soundfile as sf

    rec = _recording(family, rng, answer, window_s)
    wave = render(rec["tones"], SEGMENTS * window_s, rng.randrange(2 ** 32))
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), wave, SR, subtype="PCM_16")
    seg = segment_of(rec["asked"], window_s)
    tone = rec["tones"][rec["asked"]]
    reasoning = f"The clip from {seg['t0']:g} s to {seg['t1']:g} s holds a {answer} tone."
    evidence = {k: tone[k] for k in ("freq_hz", "peak", "pitch", "loudness")}
    evidence.update(start_s=round(tone["start_s"] - seg["t0"], 3),
                    end_s=round(tone["end_s"] - seg["t0"], 3))
    meta = {"family": family, "segment": seg, "window_s": window_s,
            "recording_s": SEGMENTS * window_s, "tones": rec["tones"], "evidence": evidence,
            "answer_set": list(ANSWERS[family]),
            "trajectory": gold_trajectory(seg, reasoning, answer)}
    return Example(id=path.stem, prompt=question(family, seg), answer=answer,
                   audios=[f"audio/{path.name}"], reasoning=reasoning, meta=meta)


def _split(out_dir: Path, split: str, n: int, rng: random.Random, families: list[str],
           window_s: float) -> tuple[list[Example], dict[str, int]]:
    order = []
    for j, f in enumerate(families):
        k = n // len(families) + (j < n % len(families))
        offset = rng.randrange(2)
        order += [(f, ANSWERS[f][(offset + i) % 2]) for i in range(k)]
    rng.shuffle(order)
    examples = [make_example(f, rng, out_dir / "audio" / f"{split}-{i:06d}.wav", a, window_s)
                for i, (f, a) in enumerate(order)]
    return examples, {f: sum(1 for g, _ in order if g == f) for f in families}


def make_clip(out_dir: str | Path, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
              families: list[str] | None = None, window_s: float = WINDOW_S) -> dict[str, Any]:
    """Write `audio/*.wav`, `train.jsonl`, `test.jsonl` (audio paths relative to the file) and
    `info.json`; returns the info. `window_s` is the model's audio window in seconds (3 for the
    tiny Qwen2-Audio, 30 for the released Qwen2-Audio): recordings last 4 of them."""
    families = list(dict.fromkeys(families or FAMILIES))
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown clip families {unknown}; known: {list(FAMILIES)}")
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train}, {n_test}")
    if window_s < TONE_S[1] + 2 * MARGIN_S:
        raise ValueError(f"window_s {window_s} is too short for a tone of up to {TONE_S[1]} s "
                         f"with {MARGIN_S} s margins; give window_s >= {TONE_S[1] + 2 * MARGIN_S}")
    out_dir = Path(out_dir)
    train, train_counts = _split(out_dir, "train", n_train, random.Random(f"clip-train-{seed}"),
                                 families, window_s)
    test, test_counts = _split(out_dir, "test", n_test, random.Random(f"clip-test-{seed}"),
                               families, window_s)
    write_rows(train, out_dir / "train.jsonl")        # audio paths relative to the file
    write_rows(test, out_dir / "test.jsonl")
    info = {"task": "clip", "seed": seed, "sample_rate": SR, "window_s": window_s,
            "segments": SEGMENTS, "recording_s": SEGMENTS * window_s, "families": families,
            "n_train": n_train, "n_test": n_test,
            "counts": {"train": train_counts, "test": test_counts},
            "files": {"train": "train.jsonl", "test": "test.jsonl", "audio": "audio"}}
    (out_dir / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


TASK = Task(
    "a tone in one 3 s segment of a 12 s recording the prompt hears only the first 3 s of: its "
    "pitch or loudness, with clip(t0, t1) (audio, multi-turn tools)",
    lambda out, o: make_clip(out, n_train=o.n_train, n_test=o.n_test, seed=o.seed,
                             families=o.families))
