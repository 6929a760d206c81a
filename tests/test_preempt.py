"""Preemption: SIGTERM (SLURM's and Kubernetes' notice) or Ctrl-C mid-run lets the step finish,
saves it as a checkpoint and ends the run cleanly (exit 0, no final model, the summary says
so), and `--resume` goes on from that step."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mmrlvr.train.preempt import Preemption
from tests.test_faults import config


def test_sigterm_mid_run_saves_the_step_and_resume_goes_on(tmp_path, tiny_vl, shapes_dir):
    sig = signal.SIGTERM
    cfg = config(tmp_path, tiny_vl, shapes_dir, "run", None,
                 train={"steps": 200, "save_every": 0})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "mmrlvr.cli", "train", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    name = signal.Signals(sig).name
    summary = json.loads(out[out.index("{"):])
    step = summary["preempted"]["step"]
    assert summary["preempted"]["signal"] == name and 1 <= step < 200
    assert f"{name}: stopped after step {step} of 200" in err
    assert (tmp_path / "run" / "checkpoints" / f"step-{step}").is_dir()
    assert not (tmp_path / "run" / "final").exists()
    done = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "train", "--resume",
                           str(tmp_path / "run"), f"train.steps={step + 1}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r][-2:] == [step, step + 1]
    assert (tmp_path / "run" / "final").is_dir()


def test_ctrl_c_asks_to_stop_and_a_second_one_stops_at_once():
    class One:                                  # a one-process run's gather
        def gather(self, value):
            return [value]

    before = signal.signal(signal.SIGINT, signal.default_int_handler)   # a background job ignores it
    try:
        _two_ctrl_c(One())
    finally:
        signal.signal(signal.SIGINT, before)


def _two_ctrl_c(one) -> None:
    with Preemption() as stop:
        assert stop.asked(one) is None
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.asked(one) == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler    # handlers restored
