"""The tool tasks' before/after figure (docs/tools.md): held-out greedy accuracy of each arm after
its warm start (GRPO step 0) and after GRPO, overall and per question family, one dot per run and
the mean of the arm's runs as a bar.

    python bench/tool_plot.py zoom --arm "without tools=runs/zcmp/plain-s0,runs/zcmp/plain-s1" \
        --arm "with zoom=runs/zcmp/tools-s0,runs/zcmp/tools-s1" --png docs/img/zoom_tools.png
    python bench/tool_plot.py clip --arm "without tools=runs/ccmp/plain-s0" \
        --arm "with clip=runs/ccmp/tools-s0" --png docs/img/clip_tools.png

The task names the panels (its question families) and the chance line.
"""
from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

TASKS = {
    "zoom": ([("eval/accuracy", "all questions"), ("eval/family/count", "count"),
              ("eval/family/color", "colour")], 25),            # 4 answers a family
    "clip": ([("eval/accuracy", "all questions"), ("eval/family/pitch", "pitch (low / high)"),
              ("eval/family/loudness", "loudness (quiet / loud)")], 50),   # 2 answers a family
}
"""task: (panels as (metric, title), chance in %)."""


def evals(run: Path) -> tuple[dict, dict]:
    """The first and last held-out evaluation of a GRPO run (after SFT, after GRPO)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "eval/accuracy" in r]
    if not rows:
        raise SystemExit(f"{run / 'metrics.jsonl'}: no held-out evaluation logged (eval/accuracy)")
    return rows[0], rows[-1]


def metric(row: dict, key: str, run: Path) -> float:
    if key not in row:
        raise SystemExit(f"{run / 'metrics.jsonl'}: its evaluation logged no {key} (is it a run "
                         "of this task?)")
    return row[key]


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task", choices=sorted(TASKS))
    ap.add_argument("--arm", action="append", required=True, help="NAME=RUN[,RUN...]")
    ap.add_argument("--png", required=True)
    args = ap.parse_args()
    panels, chance = TASKS[args.task]
    arms = [(name, [Path(r) for r in runs.split(",")])
            for name, _, runs in (a.partition("=") for a in args.arm)]
    fig, axes = plt.subplots(1, len(panels), figsize=(10.5, 3.5), sharey=True)
    for ax, (key, title) in zip(axes, panels):
        x, ticks, labels = 0.0, [], []
        for j, (name, runs) in enumerate(arms):
            for phase, label in ((0, "after SFT"), (1, "after GRPO")):
                vals = [100 * metric(evals(r)[phase], key, r) for r in runs]
                ax.bar(x, sum(vals) / len(vals), color=f"C{j}", alpha=0.45 if phase == 0 else 0.9,
                       width=0.8)
                ax.scatter([x] * len(vals), vals, color="black", s=12, zorder=3)
                ticks.append(x)
                labels.append(f"{textwrap.fill(name, 10)}\n{label}")   # no overlap
                x += 1
            x += 0.5
        ax.axhline(chance, ls="--", lw=0.8, color="gray")
        ax.set_xticks(ticks, labels, fontsize=7)
        runs_per_arm = sorted({len(runs) for _, runs in arms})
        ax.set_title(f"{title}, held-out ({'/'.join(map(str, runs_per_arm))} runs an arm)",
                     fontsize=9)
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("greedy accuracy (%), dashed: chance")
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
