"""bench/method_compare.sh end to end on a tiny model (issue "evidence", items 2 and 3): the
mechanism check runs before any arm trains and an inactive arm is reported, not trained; the
positive control (the baseline at a weakened lr) and the placebo (the baseline on other seeds)
are trained beside the baseline and compared like any arm."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_checks_come_first_and_the_controls_are_compared(tmp_path, tiny_vl, shapes_dir):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": {"path": str(tiny_vl)},
        "data": {"train": str(shapes_dir / "train.jsonl"), "eval": str(shapes_dir / "test.jsonl"),
                 "eval_limit": 4},
        "rollout": {"group_size": 2, "max_new_tokens": 6},
        "train": {"batch_prompts": 2, "micro_batch": 4, "eval_batch": 4, "threads": 1}}))
    out = tmp_path / "cmp"
    noise = f"noise={cfg}|rollout.branching.kind=latent_noise|rollout.branching.alpha=0"
    proc = subprocess.run(
        ["bash", str(ROOT / "bench/method_compare.sh"), "--steps", "1", "--seeds", "0 1",
         "--samples", "0", "--out", str(out), "--controls", "--check", "noise=ncgrpo",
         f"plain={cfg}", noise],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    first_train = next(i for i, ln in enumerate(lines) if ln.startswith("== plain seed 0"))
    assert lines.index("== mechanism check: noise (ncgrpo) on " + str(cfg)) < first_train
    assert "   noise: mechanism inactive: not trained (--train-inactive trains it anyway)" in lines
    check = json.loads((out / "checks" / "noise.json").read_text())
    assert check["verdict"] == "inactive" and check["method"] == "ncgrpo"
    assert not list(out.glob("noise-s*"))                        # never trained
    assert sorted(p.name for p in out.glob("control-placebo-s*") if p.is_dir()) == [
        "control-placebo-s0", "control-placebo-s1"]
    placebo = yaml.safe_load((out / "control-placebo-s1" / "config.yaml").read_text())
    weak = yaml.safe_load((out / "control-weak-s0" / "config.yaml").read_text())
    assert placebo["train"]["seed"] == 1001 and weak["optim"]["lr"] == 1e-6
    report = json.loads((out / "compare.json").read_text())
    arms = [r["arm"] for r in report["sets"]["eval"]["rows"]]
    assert arms == ["plain", "control-weak", "control-placebo"]
    assert report["not_run"][0]["arm"] == "noise"
    assert "- noise: not run; ncgrpo mechanism inactive" in (out / "compare.md").read_text()
