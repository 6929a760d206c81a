"""At data load: can the reference reasoning reach a high step score under the step matcher?

StructReward pays `λ·acc·r_proc` for the share of reference steps a completion's reasoning
matches (steps.py). Two things can keep that share low whatever the policy learns, and both
are visible before the first step, so `struct_steps` checks the training rows when a run starts
(the `rewards.DATA_CHECKS` hook) and reports, per task family (`meta.family`, else `all`):

  * `refs_self`: the reference steps written one per line and scored against themselves. Below
    1 the segmenter or matcher splits or misses the references' own steps (a matcher bug or a
    reference step the matcher cannot read), and no completion can score 1 either;
  * `reasoning`: the row's gold `reasoning` (the warm start's `<think>` text) against its steps.
    When the warm start writes several reference steps in one sentence ("I see 2 red circles
    and 1 blue square." for two "There is …" steps), a policy that reasons as it was taught
    scores low, and the step reward then pays for leaving the warm start's style rather than
    for right steps (measured on shapes `count` rows: 0.42, 22 % reach 1).

A family whose mean is below `WARN_BELOW` on either gets a warning naming it, its figures and
what to do; the whole report goes to `RUN_DIR/struct_steps_reference.json` and is returned.
At most `MAX_ROWS` rows with reference steps are read (a big split is sampled from its start).
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmrlvr.methods.structreward.steps import MAX_STEPS, align, reference_steps, split_steps

WARN_BELOW = 0.8
"""A family's mean step agreement under which its rows cannot reach a high step score (our choice)."""
MAX_ROWS = 2000
"""Rows with reference steps read at most (the check costs one alignment per row)."""


def agreement(reasoning: str, refs: list[str]) -> float:
    """r_proc of a reasoning text against reference steps, as `struct_steps` scores it."""
    if not refs:
        return 0.0
    return len(align(split_steps(reasoning)[:MAX_STEPS], refs)) / len(refs)


def reference_report(examples: Sequence) -> dict[str, dict[str, float]]:
    """Per family: rows, mean `refs_self` and share at 1, and the same for the gold `reasoning`
    (over the rows that have one)."""
    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"self": [], "reasoning": []})
    read = 0
    for i in range(len(examples)):
        if read >= MAX_ROWS:
            break
        ex = examples[i]
        refs = reference_steps(ex.steps)
        if not refs:
            continue
        read += 1
        family = str((ex.meta or {}).get("family", "all"))
        found[family]["self"].append(agreement("\n".join(refs), refs))
        if ex.reasoning:
            found[family]["reasoning"].append(agreement(ex.reasoning, refs))
    report = {}
    for family, got in sorted(found.items()):
        row: dict[str, float] = {"rows": float(len(got["self"]))}
        for key, values in (("refs_self", got["self"]), ("reasoning", got["reasoning"])):
            if values:
                row[key] = sum(values) / len(values)
                row[f"{key}_full_frac"] = sum(v == 1.0 for v in values) / len(values)
        report[family] = row
    return report


def warnings_of(report: dict[str, dict[str, float]]) -> list[str]:
    out = []
    for family, row in report.items():
        if row.get("refs_self", 1.0) < WARN_BELOW:
            out.append(
                f"struct_steps: the reference steps of the {int(row['rows'])} '{family}' rows "
                f"match themselves at {row['refs_self']:.2f} ({row['refs_self_full_frac']:.0%} "
                "reach 1) under the step matcher: the segmenter merges or the matcher cannot "
                "read some reference steps, so no completion can reach a full step score; write "
                "one self-contained step per item of `steps`")
        if row.get("reasoning", 1.0) < WARN_BELOW:
            out.append(
                f"struct_steps: the gold reasoning of the '{family}' rows scores "
                f"{row['reasoning']:.2f} step agreement with their own steps "
                f"({row['reasoning_full_frac']:.0%} reach 1): a policy that reasons as the warm "
                "start taught it cannot reach a high step score, and the step reward pays for "
                "leaving that style. Write `reasoning` one reference step per sentence or line, "
                "or lower the reward's lam")
    return out


def check_reference_steps(examples: Sequence, spec: dict[str, Any] | None = None,
                          run_dir: str | Path | None = None) -> dict[str, dict[str, float]]:
    """The `rewards.DATA_CHECKS` hook for `struct_steps`: report, warn, write the JSON."""
    report = reference_report(examples)
    for line in warnings_of(report):
        print(f"warning: {line}", file=sys.stderr)
    if report:
        print("struct_steps reference agreement: " + "; ".join(
            f"{family} {row.get('refs_self', 0):.2f} self, {row['reasoning']:.2f} reasoning"
            if "reasoning" in row else f"{family} {row.get('refs_self', 0):.2f} self"
            for family, row in report.items()), file=sys.stderr)
    if run_dir is not None:
        path = Path(run_dir) / "struct_steps_reference.json"
        path.write_text(json.dumps({"warn_below": WARN_BELOW, "families": report,
                                    "warnings": warnings_of(report)}, indent=1) + "\n")
    return report
