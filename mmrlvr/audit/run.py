"""`mmrlvr audit-verifier`: metamorphic testing of a verifier or reward.

Seed idea: metamorphic testing of verifiers. A verifier's verdict on a gold answer's
meaning-preserving rewrites must be "accept" and on its near misses "reject"; neither needs a
labelled dataset, because `mmrlvr.audit.cases` builds both from each gold by construction (nine
answer families: integer, decimal, fraction, percent, expression, interval_set, choice, yesno,
text). Each (gold, prediction) case becomes a completion in one of the completion styles
(`wrap_completion`: `<answer>` tag, think + answer, a final `\\boxed{}`, "The answer is ..."; the
styles rotate over the cases, our choice), and the reward scores it against an `Example` whose
`answer` is the gold (and whose `choices` are the case's options).

Any reward mmrlvr can load is audited the same way: a registered one (`accuracy`), a user's
`path/file.py:function` in any convention `rewards.conventions` knows (loaded by `rewards.get`),
or `math-verify` (the optional package `math_verify`: the `<answer>` tag's text, else the whole
completion, and the gold, each through `parse`, then `verify`, with their signal timeouts off
since calls run on a worker thread). Every call runs isolated (`rewards.isolation.Isolated`, one
completion per call): a call that raises, returns a non-number or runs past `timeout_s` is an
*error*, counted apart from a rejection; once 8 calls hang at once the audit stops calling and
counts the cases left as errors (`not_run`) rather than pile up threads.

A case is accepted when the reward's `overall` is >= `threshold` (default 0.5, our choice: a
binary verifier's 1/0 either way). Reported: acceptance per family for rewrites and near misses
(with rejected and error counts), per rewrite / near-miss kind, the error kinds, and off-by-one
acceptance (near misses ±1 in the gold's last digit: integer ±1, decimal ±1 ulp, 2^n ± 1,
integer percent + 1) bucketed by the gold's magnitude: <10, <1e3, <1e6, >=1e6. Defaults: 20
golds per family, seed 0, timeout 5 s per call (our choices).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections import Counter, defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

from mmrlvr.audit.cases import (
    COMPLETION_STYLES,
    FAMILIES,
    Case,
    generate_cases,
    wrap_completion,
)
from mmrlvr.config import ConfigError

MATH_VERIFY = ("math-verify", "math_verify")
MAGNITUDES = (("<10", 10.0), ("<1e3", 1e3), ("<1e6", 1e6), (">=1e6", math.inf))
OFF_BY_ONE = {
    "integer": {"plus_one", "minus_one", "plus_one_thousands", "minus_one_boxed", "plus_one_frac",
                "plus_one_trailing_zero"},
    "decimal": {"last_digit_plus", "last_digit_minus", "plus_ulp_trailing_zero"},
    "expression": {"value_plus_one", "value_minus_one"},
    "percent": {"plus_one", "plus_one_plain"},
}
"""Near-miss kinds that differ from the gold by ±1 in its last digit (percent: integer golds)."""
OUTCOMES = ("accepted", "rejected", "error")
MAX_HUNG = 8
DESCRIPTION = """Metamorphic audit of a verifier or reward. Gold answers of nine families are
rewritten in meaning-preserving ways (must be accepted) and turned into near misses (must be
rejected); each becomes a model completion (<answer> tag, \\boxed{}, "The answer is ...") scored
against an example whose answer is the gold. Reported per family: rewrites and near misses
accepted, rejected, and errors (the verifier raised, returned a non-number or timed out: never
counted as a rejection), by completion style, and off-by-one near misses accepted by the gold's
magnitude. Markdown to stdout; --json and --plot for the full report."""
EXAMPLE = """examples:
  mmrlvr audit-verifier --reward accuracy
  mmrlvr audit-verifier --reward math-verify --n 10 --json mv.json --plot mv.png
  mmrlvr audit-verifier --reward my_rewards.py:accuracy_reward --families integer choice
"""


def off_by_one_magnitude(case: Case) -> float | None:
    """|gold| when `case` is a near miss ±1 in the gold's last digit, else None."""
    if case.expect or case.kind not in OFF_BY_ONE.get(case.family, ()):
        return None
    if case.family == "expression":                          # gold 2^{n}
        return float(2 ** int(re.fullmatch(r"2\^\{(\d+)\}", case.gold).group(1)))
    value = case.gold.removesuffix("\\%")
    if case.family == "percent" and "." in value:            # +1 moves the integer part
        return None
    return float(abs(Fraction(value)))


def bucket(magnitude: float) -> str:
    return next(name for name, bound in MAGNITUDES if magnitude < bound)


def _math_verify(example: Any, completion: str) -> float:
    from math_verify import parse, verify

    tagged = re.findall(r"<answer>(.*?)</answer>", completion, re.DOTALL)
    gold = parse(example.answer, parsing_timeout=None)
    pred = parse(tagged[-1] if tagged else completion, parsing_timeout=None)
    return float(verify(gold, pred, timeout_seconds=None))


def load_reward(spec: str, style: str | None = None, **options: Any) -> tuple[Any, str]:
    """The reward `spec` names, isolated (one call per completion, `timeout_s` set later), and
    its label."""
    import rewards
    from rewards.conventions import Group, UserReward, lift

    if spec in MATH_VERIFY:
        try:
            import math_verify  # noqa: F401
        except ImportError:
            raise ConfigError(f"--reward {spec}: the optional package math-verify is not "
                              "installed (pip install math-verify); audit `accuracy` (mmrlvr's "
                              "own verifier) or a file.py:function instead") from None
        return lift(_math_verify, "math-verify", **options), "math-verify"
    reward = rewards.get(spec, style=style, **options)
    label = spec.rpartition(":")[2]
    return (reward if isinstance(reward, UserReward) else Group(reward, label)), label


def _tally() -> dict[str, int]:
    return {"n": 0, **dict.fromkeys(OUTCOMES, 0)}


def audit(reward_spec: str, n_per_family: int = 20, seed: int = 0, timeout_s: float = 5.0,
          families: list[str] | None = None, styles: list[str] | None = None,
          threshold: float = 0.5, style: str | None = None, options: dict | None = None,
          progress: bool = True) -> dict[str, Any]:
    """Put every generated case through the reward named by `reward_spec`; the report dict
    (`settings`, `totals`, `families`, `kinds`, `styles`, `off_by_one`, `errors`, `misjudged`)."""
    from tqdm.auto import tqdm

    from mmrlvr.data import Example
    from rewards.isolation import FAILURE_KINDS, Isolated, RewardError

    families = list(families or FAMILIES)
    styles = list(styles or COMPLETION_STYLES)
    for what, given, known in (("family", families, FAMILIES),
                               ("style", styles, COMPLETION_STYLES)):
        unknown = [x for x in given if x not in known]
        if unknown:
            raise ConfigError(f"audit-verifier: unknown {what} {unknown}; "
                              f"choose from {list(known)}")
    if n_per_family < 1:
        raise ConfigError(f"audit-verifier: n_per_family must be >= 1, got {n_per_family}")
    user, label = load_reward(reward_spec, style, **(options or {}))
    isolated = Isolated(user, label, timeout_s=timeout_s, max_hung=MAX_HUNG)
    cases = generate_cases(n_per_family=n_per_family, seed=seed, families=families)
    rows, aborted, start = [], None, time.perf_counter()
    for i, case in enumerate(tqdm(cases, desc=f"audit {label}", unit="case", disable=not progress)):
        text = wrap_completion(case.pred, styles[i % len(styles)])
        row: dict[str, Any] = {"family": case.family, "kind": case.kind, "expect": case.expect,
                               "style": styles[i % len(styles)], "gold": case.gold,
                               "pred": case.pred}
        if aborted is None:
            choices = list(case.choices) if case.choices else None
            example = Example(id=f"{case.family}-{i}", prompt=f"({case.family} question)",
                              answer=case.gold, choices=choices)
            try:
                scored = isolated.score(example, [text])[0]
            except RewardError as err:           # this call timed out too, and is the last one
                aborted, scored = str(err), "timeout"
        else:
            scored = "not_run"
        if isinstance(scored, str):
            row.update(outcome="error", error=scored, score=None)
        elif scored["failed"]:
            kind = next(k for k in FAILURE_KINDS if scored[f"failed_{k}"])
            row.update(outcome="error", error=kind, score=None)
        else:
            row.update(score=scored["overall"],
                       outcome="accepted" if scored["overall"] >= threshold else "rejected")
        rows.append(row)
    report = summarize(cases, rows)
    report["settings"] = {"reward": reward_spec, "label": label, "n_per_family": n_per_family,
                          "seed": seed, "timeout_s": timeout_s, "threshold": threshold,
                          "families": families, "styles": styles, "style": style,
                          "options": options or {}, "cases": len(cases),
                          "seconds": round(time.perf_counter() - start, 2), "aborted": aborted}
    return report


def summarize(cases: list[Case], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per family and side, per kind, per completion style, off-by-one per magnitude
    bucket, and error kinds."""
    totals = {"rewrite": _tally(), "near": _tally()}
    fams: dict[str, dict[str, dict[str, int]]] = {}
    kinds: dict[str, dict[str, int]] = defaultdict(_tally)
    obo = {name: _tally() for name, _ in MAGNITUDES}
    by_style: dict[str, dict[str, dict[str, int]]] = {}
    errors: Counter[str] = Counter()
    for case, row in zip(cases, rows):
        side = "rewrite" if case.expect else "near"
        fam = fams.setdefault(case.family, {"rewrite": _tally(), "near": _tally()})
        st = by_style.setdefault(row["style"], {"rewrite": _tally(), "near": _tally()})
        tallies = [totals[side], fam[side], kinds[case.group], st[side]]
        if (mag := off_by_one_magnitude(case)) is not None:
            tallies.append(obo[bucket(mag)])
        for t in tallies:
            t["n"] += 1
            t[row["outcome"]] += 1
        if row["outcome"] == "error":
            errors[row["error"]] += 1
    misjudged = [r for r in rows if r["outcome"] == "error"
                 or (r["outcome"] == "accepted") is not r["expect"]]
    return {"totals": totals, "families": fams, "kinds": dict(sorted(kinds.items())),
            "styles": by_style, "off_by_one": obo, "errors": dict(errors),
            "misjudged": misjudged[:200], "misjudged_total": len(misjudged)}


def _rate(t: dict[str, int], key: str = "accepted") -> str:
    return f"{100.0 * t[key] / t['n']:.1f} %" if t["n"] else "-"


def markdown(report: dict[str, Any], worst: int = 10) -> str:
    """The report as Markdown: per-family table, off-by-one by magnitude, worst kinds."""
    s = report["settings"]
    head = (f"Verifier audit of `{s['reward']}`: {s['cases']} cases ({s['n_per_family']} golds "
            f"per family, seed {s['seed']}, timeout {s['timeout_s']:g} s, accepted when score "
            f">= {s['threshold']:g}), {s['seconds']:.1f} s")
    columns = ("| family | rewrites | accepted | rejected | errors | near misses | accepted | "
               "rejected | errors |")
    lines = [head, "", columns, "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for name, fam in [*report["families"].items(), ("**all**", report["totals"])]:
        r, n = fam["rewrite"], fam["near"]
        lines.append(f"| {name} | {r['n']} | {_rate(r)} | {r['rejected']} | {r['error']} | "
                     f"{n['n']} | {_rate(n)} | {n['rejected']} | {n['error']} |")
    lines += ["", "By completion style (extraction and matching together):", "",
              "| style | rewrites accepted | near misses accepted | errors |", "|---|--:|--:|--:|"]
    for name, st in report["styles"].items():
        lines.append(f"| {name} | {_rate(st['rewrite'])} | {_rate(st['near'])} | "
                     f"{st['rewrite']['error'] + st['near']['error']} |")
    obo_title = ("Off-by-one near misses (±1 in the gold's last digit) accepted, by the gold's "
                 "magnitude:")
    lines += ["", obo_title, "", "| magnitude | cases | accepted | errors |", "|---|--:|--:|--:|"]
    for name, t in report["off_by_one"].items():
        lines.append(f"| {name} | {t['n']} | {_rate(t)} | {t['error']} |")
    if report["errors"]:
        lines += ["", "Errors (not rejections) by kind: " + ", ".join(
            f"{k} {v}" for k, v in sorted(report["errors"].items()))]
    if s.get("aborted"):
        lines += ["", f"Stopped calling the reward: {s['aborted'].splitlines()[0]}"]
    for title, side, miss in (("Near misses accepted", "/near/", "accepted"),
                              ("Rewrites rejected or failed", "/rewrite/", "missed")):
        worst_kinds = sorted(((t["accepted"] if miss == "accepted" else t["n"] - t["accepted"])
                              / t["n"], g, t) for g, t in report["kinds"].items() if side in g)
        worst_kinds = [(share, g, t) for share, g, t in reversed(worst_kinds) if share > 0][:worst]
        if worst_kinds:
            lines += ["", f"{title}, worst kinds first (up to {worst}):", "",
                      "| kind | cases | accepted | errors |", "|---|--:|--:|--:|"]
            lines += [f"| {g} | {t['n']} | {_rate(t)} | {t['error']} |" for _, g, t in worst_kinds]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str | Path) -> Path:
    """Bars: acceptance of rewrites and of near misses per family; off-by-one by magnitude."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(report["families"])
    share = {side: [100.0 * report["families"][f][side]["accepted"]
                    / max(report["families"][f][side]["n"], 1) for f in fams]
             for side in ("rewrite", "near")}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4), width_ratios=[3, 1])
    x = range(len(fams))
    ax.bar([i - 0.2 for i in x], share["rewrite"], 0.4, label="rewrites (should be 100 %)",
           color="tab:green")
    ax.bar([i + 0.2 for i in x], share["near"], 0.4, label="near misses (should be 0 %)",
           color="tab:red")
    ax.set_xticks(list(x), fams, rotation=30, ha="right")
    ax.set_ylabel("accepted (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"Verifier audit: {report['settings']['reward']}")
    ax.legend(loc="center right")
    obo = report["off_by_one"]
    ax2.bar(list(obo), [100.0 * t["accepted"] / max(t["n"], 1) for t in obo.values()],
            color="tab:orange")
    ax2.set_ylim(0, 105)
    ax2.set_title("off-by-one accepted (%) by |gold|")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _option(text: str) -> tuple[str, Any]:
    import yaml

    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"--option wants KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def cmd_audit_verifier(args: argparse.Namespace) -> int:
    report = audit(args.reward, n_per_family=args.n, seed=args.seed, timeout_s=args.timeout_s,
                   families=args.families, styles=args.styles, threshold=args.threshold,
                   style=args.style, options=dict(args.option or []), progress=not args.no_progress)
    print(markdown(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, ensure_ascii=False))
        print(f"\nwrote {args.json}")
    if args.plot:
        print(f"wrote {plot(report, args.plot)}")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The `audit-verifier` subcommand on the CLI's subparsers."""
    a = sub.add_parser(
        "audit-verifier", help="metamorphic audit of a reward or verifier: rewrites of gold "
        "answers must be accepted, near misses rejected", epilog=EXAMPLE,
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--reward", required=True, metavar="SPEC",
                   help="a registered reward (accuracy), math-verify, or path/file.py:function "
                   "in any convention mmrlvr accepts (mmrlvr, TRL, EasyR1, ms-swift)")
    a.add_argument("--style", help="the user reward's calling convention, when its signature "
                   "does not tell (native, trl, easyr1, ...)")
    a.add_argument("--option", "-o", action="append", type=_option, metavar="KEY=VALUE",
                   help="an option for the reward (YAML value); repeatable")
    a.add_argument("--n", type=int, default=20, help=(
        "gold answers per family (each gives ~10-30 cases; integer gold i has magnitude "
        "10^(i mod 31))"))
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--timeout-s", type=float, default=5.0, help="per call; past it: an error")
    a.add_argument("--threshold", type=float, default=0.5, help="score that counts as accepted")
    a.add_argument("--families", nargs="+", choices=FAMILIES, metavar="FAMILY",
                   help=f"answer families (default: all): {', '.join(FAMILIES)}")
    a.add_argument("--styles", nargs="+", choices=list(COMPLETION_STYLES), metavar="STYLE",
                   help="completion styles, rotated over the cases (default: all): "
                   f"{', '.join(COMPLETION_STYLES)}")
    a.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    a.add_argument("--plot", metavar="FILE.png", help="bar chart of acceptance by family")
    a.add_argument("--no-progress", action="store_true", help="no progress bar")
    a.set_defaults(fn=cmd_audit_verifier)
    return a
