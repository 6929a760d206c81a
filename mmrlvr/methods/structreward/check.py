"""StructReward's mechanism check (`mmrlvr check-method structreward`): can the reference
reasoning reach a high step score under the step matcher?

It runs the data-load check (`reference_check.reference_report`) on the rows of `--data` and
reads its per-family figures: `refs_self` (the reference steps scored against themselves) and
`reasoning` (the gold reasoning against its steps). Inactive when no row has reference steps, or
when any family is under the check's own `WARN_BELOW` on either: there the step reward cannot pay
a policy that reasons as the warm start taught it, so what the reward trains is not the method's
premise (`reference_check.warnings_of` says the same at a run's start). Data only: no model is loaded.
"""
from __future__ import annotations

from mmrlvr.core.method_check import CheckContext, CheckResult
from mmrlvr.methods.structreward.reference_check import MAX_ROWS, WARN_BELOW, reference_report


def figures_of(report: dict[str, dict[str, float]]) -> dict[str, float]:
    """The report flattened (`FAMILY/refs_self`, ...) with the row-weighted means over families."""
    out: dict[str, float] = {}
    for family, row in report.items():
        out.update({f"{family}/{k}": round(v, 4) for k, v in row.items()})
    rows = sum(row["rows"] for row in report.values())
    out["rows"] = float(rows)
    for key in ("refs_self", "reasoning"):
        have = [(row["rows"], row[key]) for row in report.values() if key in row]
        if have:
            out[key] = round(sum(n * v for n, v in have) / sum(n for n, _ in have), 4)
    return out


def verdict(report: dict[str, dict[str, float]]) -> tuple[str, str]:
    """(`active`/`inactive`, why) from `reference_report`'s per-family figures."""
    if not report:
        return "inactive", "no row has reference `steps`: the step reward pays nothing"
    weak = {f"{family} {key} {row[key]:.2f}": key for family, row in report.items()
            for key in ("refs_self", "reasoning") if row.get(key, 1.0) < WARN_BELOW}
    if weak:
        fix = {"refs_self": "write one self-contained step per item of `steps`",
               "reasoning": "write `reasoning` one reference step per sentence or line"}
        todo = "; ".join(fix[k] for k in ("refs_self", "reasoning") if k in weak.values())
        return "inactive", (f"step agreement under {WARN_BELOW} ({', '.join(weak)}): no completion "
                            "written as the data teaches can reach a high step score; " + todo)
    return "active", (f"every family's reference steps and gold reasoning reach >= {WARN_BELOW} "
                      "step agreement")


def check(ctx: CheckContext) -> CheckResult:
    report = reference_report(ctx.rows(MAX_ROWS))
    state, why = verdict(report)
    return CheckResult("structreward", state, why, figures_of(report),
                       {"refs_self": WARN_BELOW, "reasoning": WARN_BELOW})
