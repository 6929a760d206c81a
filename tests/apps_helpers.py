"""Test helpers for the demo: free ports, WAV files, run dirs laid out as the trainer writes
them, and the audio fixtures two test modules share (import them by name)."""
from __future__ import annotations

import json
import socket
import wave
from pathlib import Path

import numpy as np
import pytest
import yaml

FORMAT = ("Output the thinking process in <think> </think> and the final answer in "
          "<answer> </answer> tags.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_wav(path: Path, seconds: float = 1.0, rate: int = 16000) -> Path:
    tone = (np.sin(np.arange(int(seconds * rate)) / 5) * 8000).astype(np.int16)
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(rate)
        fh.writeframes(tone.tobytes())
    return path


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


def link_model(src: Path, dst: Path, checkpoint: bool = False) -> Path:
    """`dst` as a model dir whose files link to `src`'s (plus the marker and trainer state of a
    complete checkpoint)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        (dst / f.name).symlink_to(f.resolve())
    if checkpoint:
        (dst / "trainer_state.pt").write_bytes(b"")
        (dst / "COMPLETE").write_text("")
    return dst


def write_model_run(run_dir: Path, trained: Path, base: Path, data: Path, *,
                    modality: str = "vision", kind: str = "grpo", steps: int = 6) -> Path:
    """A finished run dir as `mmrlvr train` (or `sft`) leaves it: config.yaml naming its starting
    model `base` and its eval data `data`, metrics with eval rows, summary.json, `final/`
    (`trained`) and a complete `checkpoints/step-N` (`base` again, so switching shows)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = {"model": {"path": str(base), "modality": modality, "min_pixels": 3136,
                     "max_pixels": 12544},
           "data": {"train": str(data), "eval": str(data), "format_prompt": FORMAT},
           "rewards": [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1}],
           "train": {"steps": steps, "eval_every": steps // 2, "out_dir": str(run_dir)},
           "sft": {"init": str(base), "steps": steps * 3,
                   "out_dir": str(run_dir if kind == "sft" else run_dir.parent / "sft")}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    rng = np.random.default_rng(0)
    rows = []
    for s in range(0, steps + 1):
        row: dict = {"step": s}
        if kind == "sft" and s:
            row.update({"sft/loss": 2.0 / s + 0.1 * rng.random(), "optim/grad_norm": 1.0,
                        "optim/lr": 1e-3})
        elif s:
            row.update({"reward/mean": 0.3 + 0.05 * s + 0.1 * rng.random(),
                        "reward/accuracy": 0.3 + 0.05 * s, "response/length_mean": 30.0 + s})
        if s % (steps // 2) == 0:
            row["eval/accuracy"] = 0.25 + 0.05 * s
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "summary.json").write_text(json.dumps(
        {"steps": steps, "model": str(base), "accuracy_start": rows[0]["eval/accuracy"],
         "accuracy_end": rows[-1]["eval/accuracy"]}))
    link_model(trained, run_dir / "final")
    link_model(base, run_dir / "checkpoints" / f"step-{steps // 2}", checkpoint=True)
    return run_dir


@pytest.fixture(scope="module")
def tiny_audio(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("qwen2-audio", tmp_path_factory.mktemp("tiny-qwen2audio"))


@pytest.fixture(scope="module")
def tones_run(tmp_path_factory, tiny_audio):
    """A finished audio run on 10 tones clips; its trained and base models are the same tiny
    weights in two dirs (greedy answers agree)."""
    from mmrlvr.tasks.tones import make_tones

    root = tmp_path_factory.mktemp("tones-run")
    make_tones(root / "tones", n_train=0, n_test=10, seed=0)
    return write_model_run(root / "run", tiny_audio, tiny_audio, root / "tones" / "test.jsonl",
                           modality="audio")
