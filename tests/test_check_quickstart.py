"""scripts/check_quickstart.py, which CI runs after the quickstart: it passes the run whose eval
records show the README's table, and fails, naming the cell, one that differs by a unit in the
third decimal or lacks an eval."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_quickstart", ROOT / "scripts" / "check_quickstart.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def write_run(run: Path, header: list[str], rows: list[list[str]], nudge: float = 0.0) -> None:
    run.mkdir(parents=True)
    lines = []
    for i, row in enumerate(rows):
        rec = {"step": int(row[0]), "eval/accuracy": float(row[1]) + (nudge if i == 1 else 0.0)}
        for head, cell in zip(header[2:], row[2:]):
            rec[f"eval/family/{check.FAMILY[head]}"] = float(cell)
        lines.append(json.dumps({"step": int(row[0]), "reward/mean": 0.5}))   # a train row
        lines.append(json.dumps(rec))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_the_readmes_own_table_is_read_whole():
    header, rows = check.readme_table(ROOT / "README.md")
    assert header[:2] == ["GRPO step", "held-out accuracy"]
    assert all(h in check.FAMILY for h in header[2:])
    assert rows[0][0] == "0" and len(rows) >= 2
    assert all(len(r) == len(header) for r in rows)


def test_a_run_with_the_readmes_figures_passes_and_one_unit_off_fails(tmp_path, capsys):
    header, rows = check.readme_table(ROOT / "README.md")
    write_run(tmp_path / "same", header, rows)
    assert check.main(["--run", str(tmp_path / "same")]) == 0
    write_run(tmp_path / "off", header, rows, nudge=0.001)
    assert check.main(["--run", str(tmp_path / "off")]) == 1
    out = capsys.readouterr().out
    assert f"step {rows[1][0]}, held-out accuracy: README {rows[1][1]}" in out


def test_a_run_missing_an_eval_step_fails(tmp_path, capsys):
    header, rows = check.readme_table(ROOT / "README.md")
    write_run(tmp_path / "short", header, rows[:-1])
    assert check.main(["--run", str(tmp_path / "short")]) == 1
    assert f"step {rows[-1][0]}: the README has figures" in capsys.readouterr().out


def test_with_a_tolerance_a_near_run_passes_a_far_one_or_one_that_stops_learning_fails(
        tmp_path, capsys):
    """--tolerance binds on held-out accuracy within T of the README's and a gain of at least
    --min-gain; the exact mismatches are printed either way."""
    header, rows = check.readme_table(ROOT / "README.md")
    write_run(tmp_path / "near", header, rows, nudge=0.02)
    assert check.main(["--run", str(tmp_path / "near"), "--tolerance", "0.03"]) == 0
    out = capsys.readouterr().out
    assert "did not print the README's figures exactly" in out and "within tolerance" in out
    write_run(tmp_path / "far", header, rows, nudge=0.05)
    assert check.main(["--run", str(tmp_path / "far"), "--tolerance", "0.03"]) == 1
    assert f"step {rows[1][0]}: held-out accuracy" in capsys.readouterr().out
    flat = [[r[0], rows[0][1], *r[2:]] for r in rows]           # every eval at the start's figure
    write_run(tmp_path / "flat", header, flat)
    assert check.main(["--run", str(tmp_path / "flat"), "--tolerance", "1",
                       "--min-gain", "0.05"]) == 1
    assert "GRPO raised held-out accuracy by +0.000" in capsys.readouterr().out
