"""`mmrlvr compare`: paired comparisons of runs on the same held-out questions.

An arm is one run, or several runs of the same method with different seeds
(`--arm NAME=RUN,RUN,RUN`). The first arm is the baseline. A run is a run dir (its last eval,
`eval/step-N.jsonl`, one record per question, written by `mmrlvr train` and `mmrlvr sft`; an eval
set of its own lives in `eval/<set>/`) or an `mmrlvr eval --out` JSON file. For each eval set and
each other arm:

    accuracy      the arm's mean (over seeds: mean ± 95 % t interval of the seeds' accuracies)
    diff          mean over questions of (arm − baseline) correctness, in points, with a 95 %
                  paired bootstrap interval (questions resampled; with several seeds, each
                  question's correctness is first averaged over the arm's seeds)
    McNemar p     exact, on the discordant questions; with several seeds, seed k of the arm is
                  paired with seed k of the baseline and the discordant counts are pooled
                  (a stratified test, Mantel–Haenszel style; stated, not hidden)
    reward diff   the same bootstrap on the graded reward (`reward`), where the records have it
    pass@k        where every record carries its sampled outcome (`passed`: any of the k samples
                  `train.eval_samples` drew is correct), the same mean, bootstrap and McNemar on
                  pass/fail instead of greedy correct/wrong

With more than one eval set in common, an "all sets" block pools the questions of every set
(each question once, keyed by set and id): one bootstrap over the pooled questions and McNemar
on the pooled discordant counts — a test of the pooled question population, stated as such,
not a per-set correction.

Rows are paired by question id; questions not in every run are left out and counted. Output: a
Markdown table (stdout), `--json FILE`, and `--plot FILE.png` (differences with intervals).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmrlvr.core.stats import mcnemar_exact, mean_interval, paired_bootstrap


class CompareError(ValueError):
    """Runs that cannot be compared; the message names the run and what is missing."""


def load_records(source: str | Path, step: int | None = None) -> dict[str, dict[str, list[dict]]]:
    """{eval set: records} of one run dir's eval at `step` (default: its last), or of an
    `mmrlvr eval --out` file (one set, `eval`)."""
    path = Path(source)
    if path.is_file():
        data = json.loads(path.read_text())
        if "predictions" not in data or data["predictions"] is None:
            raise CompareError(f"{path}: no per-question predictions (run `mmrlvr eval ... --out`)")
        return {"eval": data["predictions"]}
    if not path.is_dir():
        raise CompareError(f"{path}: no such run dir or eval file")
    sets = {"eval": path / "eval"} if list((path / "eval").glob("step-*.jsonl")) else {}
    sets.update({d.name: d for d in sorted((path / "eval").glob("*")) if d.is_dir()})
    if not sets:
        raise CompareError(f"{path}: no per-question eval records (eval/step-N.jsonl); runs "
                           "write them at every eval (data.eval set)")
    out = {}
    for name, folder in sets.items():
        files = {int(f.stem.split("-")[1]): f for f in folder.glob("step-*.jsonl")}
        chosen = max(files) if step is None else step
        if chosen not in files:
            raise CompareError(f"{path}: no eval at step {chosen} in {folder} (have {sorted(files)})")
        out[name] = [json.loads(line) for line in files[chosen].read_text().splitlines() if line]
    return out


@dataclass
class Arm:
    name: str
    runs: list[str]
    sets: list[dict[str, list[dict]]] = field(default_factory=list)


def parse_arms(runs: list[str], arms: list[str]) -> list[Arm]:
    out = [Arm(Path(r).name or r, [r]) for r in runs]
    for spec in arms:
        name, sep, paths = spec.partition("=")
        if not sep or not paths:
            raise CompareError(f"--arm {spec!r}: write NAME=RUN[,RUN...]")
        out.append(Arm(name, paths.split(",")))
    if len(out) < 2:
        raise CompareError("compare needs at least two runs or arms (the first is the baseline)")
    return out


def _matrix(arm: Arm, parts: list[tuple[str, list[str]]], key: str) -> np.ndarray:
    """[seeds, questions] of `key` over the (eval set, ids) `parts`, concatenated (missing
    values: NaN)."""
    rows = []
    for sets in arm.sets:
        row = []
        for set_name, ids in parts:
            by_id = {str(r["id"]): r for r in sets[set_name]}
            row += [float(by_id[i].get(key, np.nan)) for i in ids]
        rows.append(row)
    return np.asarray(rows)


def _rows(arms: list[Arm], parts: list[tuple[str, list[str]]], key: str, n_boot: int, seed: int,
          with_reward: bool) -> list[dict[str, Any]]:
    """One row per arm: the mean of `key` (correct / passed) and, against the baseline, the
    paired bootstrap difference and McNemar on the discordant questions."""
    base = arms[0]
    base_acc = _matrix(base, parts, key)                                 # [S0, n]
    rows = []
    for arm in arms:
        acc = _matrix(arm, parts, key)                                   # [S, n]
        mean, half = mean_interval(acc.mean(axis=1).tolist())
        row = {"arm": arm.name, "seeds": len(arm.runs), "accuracy": mean,
               "accuracy_ci95_half": half}
        if arm is not base:
            diff, ci = paired_bootstrap(base_acc.mean(axis=0), acc.mean(axis=0), n_boot, seed)
            pairs = range(min(len(acc), len(base_acc)))
            b = int(sum(((base_acc[k] == 1) & (acc[k] == 0)).sum() for k in pairs))
            c = int(sum(((base_acc[k] == 0) & (acc[k] == 1)).sum() for k in pairs))
            row.update(diff_points=100 * diff, diff_ci95=[100 * ci[0], 100 * ci[1]],
                       mcnemar_p=mcnemar_exact(b, c), worse=b, better=c)
            base_rw, rw = _matrix(base, parts, "reward"), _matrix(arm, parts, "reward")
            if with_reward and not np.isnan(base_rw).any() and not np.isnan(rw).any():
                d, ci = paired_bootstrap(base_rw.mean(axis=0), rw.mean(axis=0), n_boot, seed)
                row.update(reward=float(rw.mean()), reward_diff=d, reward_diff_ci95=list(ci))
        rows.append(row)
    return rows


def _block(arms: list[Arm], parts: list[tuple[str, list[str]]], n_boot: int, seed: int
           ) -> dict[str, Any]:
    """Accuracy rows and, where every record has its sampled outcome (`passed`, written with
    `train.eval_samples` = k > 0), the same rows for pass@k."""
    block: dict[str, Any] = {"questions": sum(len(ids) for _, ids in parts),
                             "rows": _rows(arms, parts, "correct", n_boot, seed, True)}
    wanted = [(name, set(ids)) for name, ids in parts]
    records = [r for arm in arms for sets in arm.sets for name, ids in wanted
               for r in sets[name] if str(r["id"]) in ids]
    if records and all("passed" in r for r in records):
        ks = sorted({r["k"] for r in records if r.get("k") is not None})  # older evals: no k
        block["pass"] = {"k": ks[0] if len(ks) == 1 else None, "k_known": bool(ks),
                         "rows": _rows(arms, parts, "passed", n_boot, seed, False)}
    return block


def compare(arms: list[Arm], step: int | None = None, n_boot: int = 2000, seed: int = 0
            ) -> dict[str, Any]:
    for arm in arms:
        arm.sets = [load_records(r, step) for r in arm.runs]
    common_sets = set.intersection(*[set(s) for arm in arms for s in arm.sets])
    if not common_sets:
        raise CompareError("the runs share no eval set")
    report: dict[str, Any] = {"baseline": arms[0].name, "sets": {}}
    parts = []
    for set_name in sorted(common_sets, key=lambda n: (n != "eval", n)):   # the first set first
        ids_per_run = [{str(r["id"]) for r in s[set_name]} for arm in arms for s in arm.sets]
        ids = sorted(set.intersection(*ids_per_run))
        dropped = max(len(x) for x in ids_per_run) - len(ids)
        if not ids:
            raise CompareError(f"eval set {set_name!r}: no question is in every run")
        report["sets"][set_name] = {**_block(arms, [(set_name, ids)], n_boot, seed),
                                    "left_out": dropped}
        parts.append((set_name, ids))
    if len(parts) > 1:      # every set's questions pooled: one bootstrap, pooled McNemar counts
        report["pooled"] = {**_block(arms, parts, n_boot, seed), "left_out": 0,
                            "sets": [name for name, _ in parts]}
    return report


def _table(title: str, rows: list[dict[str, Any]], what: str) -> list[str]:
    out = [title, f"| arm | seeds | {what} | diff (points) | 95 % CI | McNemar p | reward diff |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = f"{r['accuracy']:.3f}" + (f" ± {r['accuracy_ci95_half']:.3f}" if r["seeds"] > 1 else "")
        if "diff_points" not in r:
            out.append(f"| {r['arm']} (baseline) | {r['seeds']} | {acc} | | | | |")
            continue
        lo, hi = r["diff_ci95"]
        rw = (f"{r['reward_diff']:+.4f} [{r['reward_diff_ci95'][0]:+.4f}, "
              f"{r['reward_diff_ci95'][1]:+.4f}]") if "reward_diff" in r else ""
        out.append(f"| {r['arm']} | {r['seeds']} | {acc} | {r['diff_points']:+.1f} | "
                   f"[{lo:+.1f}, {hi:+.1f}] | {r['mcnemar_p']:.3g} | {rw} |")
    return out + [""]


def markdown(report: dict[str, Any]) -> str:
    out = []
    blocks = list(report["sets"].items())
    if "pooled" in report:
        blocks.append(("all sets", report["pooled"]))
    for set_name, block in blocks:
        if set_name == "all sets":
            title = (f"### all sets (pooled: the {block['questions']} questions of "
                     f"{', '.join(block['sets'])}; one bootstrap over them, McNemar on the pooled "
                     f"discordant counts)\n")
        else:
            title = (f"### {set_name} ({block['questions']} questions in every run"
                     + (f"; {block['left_out']} left out" if block["left_out"] else "") + ")\n")
        out += _table(title, block["rows"], "accuracy")
        if "pass" in block:
            k = block["pass"]["k"]
            name = f"pass@{k}" if k else "pass@k"
            out += _table(f"{set_name}, {name} (a question passes when any of its k sampled "
                          f"completions is correct)"
                          f"{'' if k else '; k differs between runs' if block['pass']['k_known'] else '; k not recorded'}\n",
                          block["pass"]["rows"], name)
    return "\n".join(out)


def plot(report: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, diffs, lows, highs = [], [], [], []
    for set_name, block in report["sets"].items():
        for r in block["rows"]:
            if "diff_points" in r:
                labels.append(f"{r['arm']}\n{set_name}")
                diffs.append(r["diff_points"])
                lows.append(r["diff_points"] - r["diff_ci95"][0])
                highs.append(r["diff_ci95"][1] - r["diff_points"])
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(labels)), 3.2))
    ax.errorbar(range(len(labels)), diffs, yerr=[lows, highs], fmt="o", capsize=4)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(f"accuracy − {report['baseline']} (points)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(runs: list[str], arms: list[str], *, step: int | None = None, n_boot: int = 2000,
        seed: int = 0, json_out: str | None = None, plot_out: str | None = None) -> str:
    report = compare(parse_arms(runs, arms), step, n_boot, seed)
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n")
    if plot_out:
        plot(report, plot_out)
    return markdown(report)
