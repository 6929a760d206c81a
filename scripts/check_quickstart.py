"""Does the quickstart print the README's figures? Reads the README's quickstart table (GRPO step,
held-out accuracy, then one column per task family) and compares every cell with the run's own
eval records in RUN/metrics.jsonl (`eval/accuracy`, `eval/family/<name>`), to the 3 decimals the
README shows. Exit 0 when every cell matches, 1 with each mismatch named otherwise.

    python scripts/check_quickstart.py [--readme README.md] [--run runs/quickstart]

scripts/check_quickstart.sh runs the quickstart and then this; `.ci/run` runs that after the
suite, so a change of figures (a package version, a change to the step) fails CI until the
README says what the quickstart now prints."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FAMILY = {"count (1–5)": "count", "kind (3-way)": "kind"}
"""README column header -> the `meta.family` its rows carry."""


def readme_table(readme: Path) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the first table under '## CPU quickstart' whose first column is
    'GRPO step'."""
    text = readme.read_text()
    section = text.split("## CPU quickstart", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in section.splitlines()]
    start = next((i for i, ln in enumerate(lines) if ln.startswith("| GRPO step")), None)
    if start is None:
        sys.exit(f"{readme}: no table starting '| GRPO step' under '## CPU quickstart'")
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(_cells(ln))
    return _cells(lines[start]), rows


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def run_evals(run: Path) -> dict[int, dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        sys.exit(f"{path}: missing; run the quickstart first (bash scripts/quickstart.sh)")
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("eval/accuracy") is not None:
            out[int(row["step"])] = row
    return out


def mismatches(header: list[str], rows: list[list[str]], evals: dict[int, dict]) -> list[str]:
    keys = ["eval/accuracy"] + [f"eval/family/{FAMILY.get(h, h)}" for h in header[2:]]
    wrong = []
    for row in rows:
        step = int(row[0])
        if step not in evals:
            wrong.append(f"step {step}: the README has figures, the run has no eval there")
            continue
        for head, key, want in zip(header[1:], keys, row[1:]):
            got = evals[step].get(key)
            shown = "missing" if got is None else f"{got:.3f}"
            if shown != want:
                wrong.append(f"step {step}, {head}: README {want}, run {shown} ({key})")
    return wrong


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readme", type=Path, default=Path("README.md"))
    ap.add_argument("--run", type=Path, default=Path("runs/quickstart"))
    args = ap.parse_args(argv)
    header, rows = readme_table(args.readme)
    wrong = mismatches(header, rows, run_evals(args.run))
    if wrong:
        print("the quickstart did not print the README's figures:\n  " + "\n  ".join(wrong))
        return 1
    print(f"the quickstart printed the README's figures ({len(rows)} evals × {len(header) - 1} "
          "columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
