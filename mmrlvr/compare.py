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

The intervals above resample questions only: they treat the arm's seeds as fixed, so they leave
out how much a method's result moves from seed to seed. Beside them, with 2+ runs in both arms,
each row has run-level figures (the training run as the unit):

    run-level CI  95 % hierarchical bootstrap of the difference: each replicate resamples the
                  runs of each arm (with replacement, within the arm), then the questions (one
                  resample shared by every run, so the pairing by question stays)
    Welch p       Welch's t test on the per-run means (unequal variances). Chosen over a
                  permutation test of the run labels because with 3 seeds per arm that test's
                  smallest possible p is 2/C(6, 3) = 0.1: it could never show an effect. A run's
                  mean averages hundreds of questions, so the t test's normal shape is a fair
                  assumption; it is an assumption, and it is stated.
    verdict       "effect shown" when Welch p < 0.05 and the run-level interval excludes 0
                  (the percentile bootstrap is narrow with few runs, so it is not trusted alone);
                  otherwise "no effect at MDE X": the smallest difference (points) a t test on
                  this many seeds finds 80 % of the time at alpha 0.05, given the pooled
                  run-to-run SD (`min_detectable_effect`)

With one run in an arm the run-level figures cannot be computed, and the row says so. `--power
EFFECT` adds how many seeds per arm EFFECT points would need at each row's run-to-run SD; with
`--sd SD` and no runs it answers for that SD alone (`power_report`).

`--mechanism NAME=CHECK.json` (an `mmrlvr check-method --json` file) puts the arm's mechanism
check beside its verdict: an arm whose mechanism is inactive is reported as such ("mechanism
inactive: not compared") whatever its difference; one named with no runs is listed as not run.

Rows are paired by question id; questions not in every run are left out and counted. Output: a
Markdown table (stdout), `--json FILE`, and `--plot FILE.png` (differences with both intervals).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmrlvr.core.stats import mcnemar_exact, mean_interval, paired_bootstrap


class CompareError(ValueError):
    """Runs that cannot be compared; the message names the run and what is missing."""


ALPHA, POWER = 0.05, 0.8     # the MDE's and the power helper's test level and power
MAX_SEEDS = 10_000           # the power helper's search stops here


def hierarchical_bootstrap(base: np.ndarray, arm: np.ndarray, n_boot: int = 2000, seed: int = 0
                           ) -> tuple[float, tuple[float, float]]:
    """mean(arm) − mean(base) and its 95 % percentile interval over `n_boot` replicates, each
    resampling the runs within each arm, then the questions (the same questions for every run).

    base [Sa, n], arm [Sb, n]: per-run, per-question values of the same n questions.
    """
    rng = np.random.default_rng(seed)
    (sa, n), sb = base.shape, len(arm)
    wa = rng.multinomial(sa, np.full(sa, 1 / sa), size=n_boot) / sa     # [B, Sa] run weights
    wb = rng.multinomial(sb, np.full(sb, 1 / sb), size=n_boot) / sb     # [B, Sb]
    wq = rng.multinomial(n, np.full(n, 1 / n), size=n_boot) / n         # [B, n] question weights
    means = ((wb @ arm - wa @ base) * wq).sum(axis=1)                   # [B]
    return (float(arm.mean() - base.mean()),
            (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))))


def welch_t(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Welch's t test of mean(b) − mean(a) on per-run values: (t, df, two-sided p), with
    t = (b̄ − ā) / √(s_a²/n_a + s_b²/n_b) and Welch–Satterthwaite df. NaNs when neither arm
    varies (no spread to test against)."""
    from scipy.stats import t as t_dist

    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    if va + vb == 0:
        return math.nan, math.nan, math.nan
    t = (np.mean(b) - np.mean(a)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(t), float(df), float(2 * t_dist.sf(abs(t), df))


def pooled_sd(a: np.ndarray, b: np.ndarray) -> float:
    """The run-to-run SD of both arms pooled: √(((n_a−1)s_a² + (n_b−1)s_b²) / (n_a+n_b−2))."""
    ss = (len(a) - 1) * np.var(a, ddof=1) + (len(b) - 1) * np.var(b, ddof=1)
    return float(math.sqrt(ss / (len(a) + len(b) - 2)))


def min_detectable_effect(sd: float, n_a: int | np.ndarray, n_b: int | np.ndarray
                          ) -> float | np.ndarray:
    """The smallest true difference a two-sided t test on per-run means finds with probability
    POWER at level ALPHA: (t_{1−α/2, df} + t_{power, df}) · sd · √(1/n_a + 1/n_b), df = n_a+n_b−2.
    The usual approximation of the noncentral t: at 3 seeds per arm its exact power is 0.79.
    Seed counts may be arrays (one MDE each)."""
    from scipy.stats import t as t_dist

    df = np.add(n_a, n_b) - 2
    return (t_dist.ppf(1 - ALPHA / 2, df) + t_dist.ppf(POWER, df)) * sd * np.sqrt(
        np.divide(1, n_a) + np.divide(1, n_b))


def seeds_needed(effect: float, sd: float) -> int | None:
    """The fewest seeds per arm (2 or more) whose MDE at `sd` is at most `effect`; None past
    MAX_SEEDS."""
    if effect <= 0 or sd <= 0:
        raise CompareError(f"the power helper needs a positive effect and SD, got {effect}, {sd}")
    n = np.arange(2, MAX_SEEDS + 1)                                     # [N] seeds per arm
    enough = np.flatnonzero(min_detectable_effect(sd, n, n) <= effect)
    return int(n[enough[0]]) if len(enough) else None


def power_report(effect: float, sd: float) -> str:
    """How many seeds per arm an `effect` (points) needs at a run-to-run SD of `sd` (points),
    and the MDE at a few seed counts."""
    n = seeds_needed(effect, sd)
    need = f"needs {n} seeds per arm" if n else f"needs more than {MAX_SEEDS} seeds per arm"
    mdes = ", ".join(f"{k}: {min_detectable_effect(sd, k, k):.1f}" for k in (2, 3, 5, 10, 20))
    return (f"A {effect:g}-point difference at a run-to-run SD of {sd:g} points {need} "
            f"(two-sided t test on per-run means, alpha {ALPHA}, power {POWER}).\n"
            f"MDE (points) by seeds per arm: {mdes}")


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


def _verdict(diff: float, p: float, ci: tuple[float, float], mde: float) -> str:
    if math.isnan(p):
        return "cannot test: every run of each arm scored the same (no run-to-run spread)"
    if p < ALPHA and (ci[0] > 0 or ci[1] < 0):
        return f"effect shown ({'better' if diff > 0 else 'worse'})"
    return f"no effect at MDE {100 * mde:.1f}"


def _run_level(base: Arm, arm: Arm, base_acc: np.ndarray, acc: np.ndarray, n_boot: int,
               seed: int, effect: float | None) -> dict[str, Any]:
    """The row's run-level figures (see the module docstring), or why there are none."""
    single = [f"{a.name!r} has 1 run" for a in (base, arm) if len(a.runs) < 2]
    if single:
        return {"unavailable": f"{' and '.join(single)}; the run level needs 2+ per arm"}
    ra, rb = base_acc.mean(axis=1), acc.mean(axis=1)                    # [Sa], [Sb] run means
    diff, ci = hierarchical_bootstrap(base_acc, acc, n_boot, seed)
    t, df, p = welch_t(ra, rb)
    sd = pooled_sd(ra, rb)
    mde = float(min_detectable_effect(sd, len(ra), len(rb)))
    out = {"diff_ci95": [100 * ci[0], 100 * ci[1]], "welch_t": None if math.isnan(t) else t,
           "welch_df": None if math.isnan(df) else df, "welch_p": None if math.isnan(p) else p,
           "sd_points": 100 * sd, "mde_points": 100 * mde,
           "verdict": _verdict(diff, p, ci, mde)}
    if effect is not None and sd > 0:
        out["effect_points"], out["seeds_for_effect"] = effect, seeds_needed(effect, 100 * sd)
    return out


def _rows(arms: list[Arm], parts: list[tuple[str, list[str]]], key: str, n_boot: int, seed: int,
          with_reward: bool, effect: float | None) -> list[dict[str, Any]]:
    """One row per arm: the mean of `key` (correct / passed) and, against the baseline, the
    paired bootstrap difference, McNemar on the discordant questions and the run-level
    figures."""
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
                       mcnemar_p=mcnemar_exact(b, c), worse=b, better=c,
                       run_level=_run_level(base, arm, base_acc, acc, n_boot, seed, effect))
            base_rw, rw = _matrix(base, parts, "reward"), _matrix(arm, parts, "reward")
            if with_reward and not np.isnan(base_rw).any() and not np.isnan(rw).any():
                d, ci = paired_bootstrap(base_rw.mean(axis=0), rw.mean(axis=0), n_boot, seed)
                row.update(reward=float(rw.mean()), reward_diff=d, reward_diff_ci95=list(ci))
        rows.append(row)
    return rows


def _block(arms: list[Arm], parts: list[tuple[str, list[str]]], n_boot: int, seed: int,
           effect: float | None) -> dict[str, Any]:
    """Accuracy rows and, where every record has its sampled outcome (`passed`, written with
    `train.eval_samples` = k > 0), the same rows for pass@k."""
    block: dict[str, Any] = {"questions": sum(len(ids) for _, ids in parts),
                             "rows": _rows(arms, parts, "correct", n_boot, seed, True, effect)}
    wanted = [(name, set(ids)) for name, ids in parts]
    records = [r for arm in arms for sets in arm.sets for name, ids in wanted
               for r in sets[name] if str(r["id"]) in ids]
    if records and all("passed" in r for r in records):
        ks = sorted({r["k"] for r in records if r.get("k") is not None})  # older evals: no k
        block["pass"] = {"k": ks[0] if len(ks) == 1 else None, "k_known": bool(ks),
                         "rows": _rows(arms, parts, "passed", n_boot, seed, False, effect)}
    return block


def compare(arms: list[Arm], step: int | None = None, n_boot: int = 2000, seed: int = 0,
            effect: float | None = None) -> dict[str, Any]:
    """The report: per eval set (and pooled), the rows of `_block`. `effect` (points): also say
    how many seeds per arm it needs at each row's run-to-run SD."""
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
        report["sets"][set_name] = {**_block(arms, [(set_name, ids)], n_boot, seed, effect),
                                    "left_out": dropped}
        parts.append((set_name, ids))
    if len(parts) > 1:      # every set's questions pooled: one bootstrap, pooled McNemar counts
        report["pooled"] = {**_block(arms, parts, n_boot, seed, effect), "left_out": 0,
                            "sets": [name for name, _ in parts]}
    return report


def load_mechanisms(specs: list[str]) -> dict[str, dict[str, Any]]:
    """`NAME=CHECK.json` -> {arm: the check's method, verdict and why}."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise CompareError(f"--mechanism {spec!r}: write it as ARM=CHECK.json (from mmrlvr "
                               "check-method --json)")
        try:
            check = json.loads(Path(path).read_text())
            out[name] = {key: check[key] for key in ("method", "verdict", "why")}
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CompareError(f"--mechanism {name}: {path} is not an mmrlvr check-method --json "
                               f"file ({type(err).__name__}: {err})") from None
    return out


def add_mechanisms(report: dict[str, Any], mechanisms: dict[str, dict[str, Any]]) -> None:
    """Each arm's check beside its rows; an inactive mechanism's verdict is that, not a
    comparison. Checked arms with no runs go to `report["not_run"]`."""
    blocks = [*report["sets"].values(), *([report["pooled"]] if "pooled" in report else [])]
    rows = [r for b in blocks for r in [*b["rows"], *b.get("pass", {}).get("rows", [])]]
    for row in rows:
        check = mechanisms.get(row["arm"])
        if check is None or "run_level" not in row:
            continue
        row["mechanism"] = check
        run = row["run_level"]
        if check["verdict"] == "inactive":
            run.pop("unavailable", None)          # its figures stay; its verdict is the check's
            run["verdict"] = f"mechanism inactive ({check['why']}): not compared"
        elif "verdict" in run:
            run["verdict"] += f" · {check['method']} mechanism active"
    compared = {r["arm"] for r in rows}
    report["not_run"] = [{"arm": a, **c} for a, c in mechanisms.items() if a not in compared]


def _run_cells(run: dict[str, Any]) -> str:
    """The run-level CI, Welch p and verdict cells of one row."""
    if "unavailable" in run:
        return f"cannot be computed | | no run-level verdict: {run['unavailable']}"
    if "diff_ci95" not in run:                      # an inactive mechanism, one run an arm
        return f" | | {run['verdict']}"
    lo, hi = run["diff_ci95"]
    p = "" if run["welch_p"] is None else f"{run['welch_p']:.3g}"
    verdict = run["verdict"]
    if "seeds_for_effect" in run:
        n = run["seeds_for_effect"]
        verdict += (f"; {run['effect_points']:g} points needs "
                    + (f"{n} seeds per arm" if n else f"over {MAX_SEEDS} seeds per arm"))
    return f"[{lo:+.1f}, {hi:+.1f}] | {p} | {verdict}"


def _table(title: str, rows: list[dict[str, Any]], what: str) -> list[str]:
    head = (f"| arm | seeds | {what} | diff (points) | question-level 95 % CI | McNemar p | "
            "run-level 95 % CI | Welch p | verdict | reward diff |")
    out = [title, head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = f"{r['accuracy']:.3f}" + (f" ± {r['accuracy_ci95_half']:.3f}" if r["seeds"] > 1 else "")
        if "diff_points" not in r:
            out.append(f"| {r['arm']} (baseline) | {r['seeds']} | {acc} | | | | | | | |")
            continue
        lo, hi = r["diff_ci95"]
        rw = (f"{r['reward_diff']:+.4f} [{r['reward_diff_ci95'][0]:+.4f}, "
              f"{r['reward_diff_ci95'][1]:+.4f}]") if "reward_diff" in r else ""
        out.append(f"| {r['arm']} | {r['seeds']} | {acc} | {r['diff_points']:+.1f} | "
                   f"[{lo:+.1f}, {hi:+.1f}] | {r['mcnemar_p']:.3g} | {_run_cells(r['run_level'])} | "
                   f"{rw} |")
    return out + [""]


LEGEND = ("Question-level CI: the questions resampled, each question's correctness averaged over "
          "the arm's seeds (seed-to-seed variance left out). Run-level CI: the runs resampled "
          "within each arm, then the questions. Welch p: t test on the per-run means. Verdict "
          f"(run level): effect shown when Welch p < {ALPHA} and the run-level CI excludes 0, "
          f"else the MDE (points; alpha {ALPHA}, power {POWER}, the pooled run-to-run SD).")


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
    for arm in report.get("not_run", []):
        out.append(f"- {arm['arm']}: not run; {arm['method']} mechanism {arm['verdict']} "
                   f"({arm['why']})")
    return "\n".join(out + ([""] if report.get("not_run") else []) + [LEGEND])


def _short_verdict(run: dict[str, Any]) -> str:
    if "unavailable" in run:
        return "run level: n/a"
    return run["verdict"].split(":")[0]


def plot(report: dict[str, Any], path: str | Path) -> None:
    """Each arm's difference with its question-level and (where computed) run-level interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{r['arm']}\n{set_name}\n{_short_verdict(r['run_level'])}", r)
            for set_name, block in report["sets"].items() for r in block["rows"]
            if "diff_points" in r]
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(rows)), 3.6))
    for offset, key, label in ((-0.1, None, "question-level 95 % CI"),
                               (0.1, "run_level", "run-level 95 % CI")):
        xs, ds, err = [], [], [[], []]
        for x, (_, r) in enumerate(rows):
            ci = r["diff_ci95"] if key is None else r[key].get("diff_ci95")
            if ci is not None:
                xs.append(x + offset)
                ds.append(r["diff_points"])
                err[0].append(r["diff_points"] - ci[0])
                err[1].append(ci[1] - r["diff_points"])
        if xs:
            ax.errorbar(xs, ds, yerr=err, fmt="o", capsize=4, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_xticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.set_ylabel(f"accuracy − {report['baseline']} (points)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(runs: list[str], arms: list[str], *, step: int | None = None, n_boot: int = 2000,
        seed: int = 0, json_out: str | None = None, plot_out: str | None = None,
        effect: float | None = None, mechanisms: list[str] = ()) -> str:
    if effect is not None and effect <= 0:
        raise CompareError(f"--power {effect:g}: the effect must be a positive number of points")
    checks = load_mechanisms(list(mechanisms))      # a bad file: before any run is read
    report = compare(parse_arms(runs, arms), step, n_boot, seed, effect)
    add_mechanisms(report, checks)
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n")
    if plot_out:
        plot(report, plot_out)
    return markdown(report)
