"""The scripts of examples/ run as a user runs them (`python examples/X.py --model M --out O
--steps N`), on tiny models built here, with budgets of a step or two: each trains through the
Python API and writes the run dir the CLI would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmrlvr.train.logger import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, model: Path, out: Path, steps: int = 1) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--model", str(model),
                           "--out", str(out), "--steps", str(steps)], cwd=out.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "reward/mean" in r] == \
        list(range(1, steps + 1))
    return done.stdout


@pytest.mark.filterwarnings("ignore::mmrlvr.data.DataWarning")
def test_the_ported_trl_script_trains_and_evaluates(tmp_path, tiny_vl):
    out = _run("trl_grpo.py", tiny_vl, tmp_path / "run", steps=1)
    assert "evaluate: {'eval/n': 4" in out
    names = [r["name"] for r in json.loads(json.dumps(
        __import__("yaml").safe_load((tmp_path / "run" / "config.yaml").read_text())["rewards"]))]
    assert [n.rpartition(":")[2] for n in names] == ["accuracy_reward", "format_reward"]
    assert all(n.startswith(str(ROOT / "examples" / "trl_grpo.py")) for n in names)


def test_the_easyr1_compute_score_runs_with_its_options(tmp_path, tiny_vl):
    _run("easyr1_reward.py", tiny_vl, tmp_path / "run")
    row = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert {"reward/compute_score/format", "reward/compute_score/accuracy"} <= set(row)


def test_the_audio_script_trains_a_tiny_qwen2_audio(tmp_path, tiny_dirs):
    _run("audio_tones.py", tiny_dirs("qwen2-audio"), tmp_path / "run")
    wavs = list((tmp_path / "run" / "data" / "media").glob("*.wav"))
    assert len(wavs) == 12
