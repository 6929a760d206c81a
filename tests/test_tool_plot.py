"""bench/tool_plot.py, the tool tasks' before/after figure: it draws from real metrics files and
names a run that logged no held-out evaluation."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, name: str, evals: list[dict]) -> Path:
    run = tmp_path / name
    run.mkdir()
    rows = [{"step": 0, **evals[0]}, {"step": 1, "loss": 0.1}, {"step": 2, **evals[-1]}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _plot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "tool_plot.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_the_figure_is_drawn_for_each_task_and_a_run_without_eval_is_named(tmp_path):
    first = {"eval/accuracy": 0.3, "eval/family/pitch": 0.5, "eval/family/loudness": 0.1}
    last = {"eval/accuracy": 0.6, "eval/family/pitch": 0.9, "eval/family/loudness": 0.3}
    a, b = _run(tmp_path, "a", [first, last]), _run(tmp_path, "b", [first, first])
    png = tmp_path / "clip.png"
    out = _plot("clip", "--arm", f"without tools={a}", "--arm", f"with clip={a},{b}",
                "--png", str(png))
    assert out.returncode == 0, out.stderr
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    # the zoom task's panels read other metrics: a clip run does not have them
    out = _plot("zoom", "--arm", f"x={a}", "--png", str(tmp_path / "zoom.png"))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"{a / 'metrics.jsonl'}: its evaluation logged no eval/family/count" in out.stderr
    (b / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.1}) + "\n")
    out = _plot("clip", "--arm", f"x={b}", "--png", str(tmp_path / "none.png"))
    assert out.returncode != 0 and f"{b / 'metrics.jsonl'}: no held-out evaluation" in out.stderr
