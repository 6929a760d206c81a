"""The clip task's before/after figure (docs/tools.md, "The clip task"): held-out greedy accuracy
of each run after its warm start (GRPO step 0) and after GRPO, overall and per question family.

    python bench/clip_plot.py --arm "without tools=runs/ccmp/plain-s0" \
        --arm "with clip=runs/ccmp/tools-s0" --png docs/img/clip_tools.png

Each `--arm NAME=RUN[,RUN...]` is a bar per phase (the mean of its runs, one dot per run).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

PANELS = [("eval/accuracy", "all questions"), ("eval/family/pitch", "pitch (low / high)"),
          ("eval/family/loudness", "loudness (quiet / loud)")]
CHANCE = 50
"""Two answers per family."""


def evals(run: Path) -> tuple[dict, dict]:
    """The first and last held-out evaluation of a GRPO run (after SFT, after GRPO)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "eval/accuracy" in r]
    return rows[0], rows[-1]


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", action="append", required=True, help="NAME=RUN[,RUN...]")
    ap.add_argument("--png", required=True)
    args = ap.parse_args()
    arms = [(name, [Path(r) for r in runs.split(",")])
            for name, _, runs in (a.partition("=") for a in args.arm)]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(10, 3.4), sharey=True)
    for ax, (key, title) in zip(axes, PANELS):
        x, ticks, labels = 0.0, [], []
        for j, (name, runs) in enumerate(arms):
            for phase, label in ((0, "after SFT"), (1, "after GRPO")):
                vals = [100 * evals(r)[phase][key] for r in runs]
                ax.bar(x, sum(vals) / len(vals), color=f"C{j}", alpha=0.45 if phase == 0 else 0.9,
                       width=0.8)
                ax.scatter([x] * len(vals), vals, color="black", s=12, zorder=3)
                ticks.append(x)
                labels.append(f"{name}\n{label}")
                x += 1
            x += 0.5
        ax.axhline(CHANCE, ls="--", lw=0.8, color="gray")
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_title(f"{title}, held-out", fontsize=9)
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("greedy accuracy (%), dashed: chance")
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
