"""bench/method_compare.sh end to end on a tiny model (issue "evidence", items 2 to 4): the
mechanism check runs before any arm trains and an inactive arm is reported, not trained; the
positive control (the baseline at a weakened lr) and the placebo (the baseline on other seeds)
are trained beside the baseline and compared like any arm, two at a time (`--jobs 2`); a second
call keeps what is done; bench/evidence.py writes its page from those runs."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _evidence_module(monkeypatch):
    spec = importlib.util.spec_from_file_location("evidence", ROOT / "bench/evidence.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "evidence", module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def _harness(command: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_checks_come_first_and_the_controls_are_compared(tmp_path, tiny_vl, shapes_dir,
                                                          monkeypatch):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": {"path": str(tiny_vl)},
        "data": {"train": str(shapes_dir / "train.jsonl"), "eval": str(shapes_dir / "test.jsonl"),
                 "eval_limit": 4},
        "rollout": {"group_size": 2, "max_new_tokens": 6},
        "train": {"batch_prompts": 2, "micro_batch": 4, "eval_batch": 4, "threads": 1}}))
    out = tmp_path / "cmp"
    noise = f"{cfg}|rollout.branching.kind=latent_noise|rollout.branching.alpha=0"
    command = ["bash", str(ROOT / "bench/method_compare.sh"), "--steps", "1", "--seeds", "0 1",
               "--samples", "0", "--jobs", "2", "--out", str(out), "--controls",
               "--check", "noise=ncgrpo", f"plain={cfg}", f"noise={noise}"]
    lines = _harness(command).stdout.splitlines()
    first_train = next(i for i, ln in enumerate(lines) if ln.startswith("== plain seed 0"))
    assert lines.index("== mechanism check: noise (ncgrpo) on " + str(cfg)) < first_train
    assert "   noise: mechanism inactive: not trained (--train-inactive trains it anyway)" in lines
    check = json.loads((out / "checks" / "noise.json").read_text())
    assert check["verdict"] == "inactive" and check["method"] == "ncgrpo"
    assert not list(out.glob("noise-s*"))                        # never trained
    trained = sorted(p.name for p in out.iterdir() if (p / "summary.json").exists())
    assert trained == [f"{a}-s{s}" for a in ("control-placebo", "control-weak", "plain") for s in (0, 1)]
    placebo = yaml.safe_load((out / "control-placebo-s1" / "config.yaml").read_text())
    weak = yaml.safe_load((out / "control-weak-s0" / "config.yaml").read_text())
    assert placebo["train"]["seed"] == 1001 and weak["optim"]["lr"] == 1e-6
    walls = {p.stem: int(p.read_text()) for p in out.glob("*.wall")}
    assert sorted(walls) == trained and all(w >= 0 for w in walls.values())
    report = json.loads((out / "compare.json").read_text())
    rows = {r["arm"]: r for r in report["sets"]["eval"]["rows"]}
    assert list(rows) == ["plain", "control-weak", "control-placebo"]
    assert report["not_run"][0]["arm"] == "noise"
    table = (out / "compare.md").read_text()
    assert "- noise: not run; ncgrpo mechanism inactive" in table

    again = _harness(command).stdout                             # a second call: all kept
    assert f"== mechanism check: noise (ncgrpo): kept {out}/checks/noise.json" in again
    assert " seed " not in again

    evidence = _evidence_module(monkeypatch)
    study = evidence.Study("cmp", "a tiny study", 1, str(cfg), (
        evidence.Method("noise", noise, "noise helps", "ncgrpo"),
        evidence.Method("later", str(cfg), "not trained yet")))
    monkeypatch.setattr(evidence, "OUT", tmp_path)
    monkeypatch.setattr(evidence, "STUDIES", (study,))
    evidence.write_page([0, 1, 2], tmp_path / "page.md")
    page = (tmp_path / "page.md").read_text()
    assert (f"| cmp | noise (noise helps) | inactive: {check['why']} | 0 of 3 | "
            "mechanism inactive: not trained, not compared |") in page
    assert "| cmp | later (not trained yet) | no check | 0 of 3 | not trained yet |" in page
    for arm in ("control-weak", "control-placebo"):       # the harness's figures, seeds lacking
        run = rows[arm]["run_level"]
        lo, hi = run["diff_ci95"]
        assert (f"| 2 of 3 | {rows[arm]['diff_points']:+.1f} [{lo:+.1f}, {hi:+.1f}]; "
                f"{run['verdict']} |") in page
    assert f"Wall time of its runs: {sum(walls.values()) / 60:.0f} min" in page
    assert table.split("\n")[3] in page                          # the harness's own table row


def test_evidence_checks_only_prepares_and_checks_but_trains_nothing(tmp_path, monkeypatch,
                                                                     capsys):
    evidence = _evidence_module(monkeypatch)
    made = tmp_path / "made.txt"
    study = evidence.Study("cmp", "a tiny study", 1, "base.yaml", (
        evidence.Method("noise", "noise.yaml|rollout.branching.alpha=1.0", "noise helps", "ncgrpo"),
        evidence.Method("later", "later.yaml", "not trained yet")),
        ((str(made), f"touch {made}"),))
    monkeypatch.setattr(evidence, "OUT", tmp_path / "evidence")
    monkeypatch.setattr(evidence, "STUDIES", (study,))
    evidence.main(["--checks-only", "--dry-run"])
    printed = capsys.readouterr().out
    assert f"+ touch {made}" in printed                        # the missing warm start, first
    assert ("check-method ncgrpo --config noise.yaml --set rollout.branching.alpha=1.0 --json "
            f"{tmp_path / 'evidence' / 'cmp' / 'checks' / 'noise.json'}") in printed
    assert "method_compare.sh" not in printed                  # and no arm trains
    evidence.main(["--dry-run"])
    assert "bench/method_compare.sh --steps 1" in capsys.readouterr().out
