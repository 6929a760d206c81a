"""The zoom comparison's before/after figure (bench/zoom_compare.sh): held-out accuracy of each
arm after its warm start (GRPO step 0) and after GRPO, overall and per question family, one dot
per seed and the mean as a bar.

    python bench/zoom_plot.py runs/zcmp --seeds "0 1 2" --png docs/img/zoom_tools.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ARMS = {"plain": "without tools", "tools": "with zoom"}
PANELS = [("eval/accuracy", "all questions"), ("eval/family/count", "count"),
          ("eval/family/color", "colour")]


def evals(run: Path) -> tuple[dict, dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "eval/accuracy" in r]
    return rows[0], rows[-1]


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seeds", default="0 1 2")
    ap.add_argument("--png", required=True)
    args = ap.parse_args()
    seeds = args.seeds.split()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 3.6), sharey=True)
    for ax, (key, title) in zip(axes, PANELS):
        x = 0
        ticks, labels = [], []
        for arm, name in ARMS.items():
            for phase, label in ((0, "after SFT"), (1, "after GRPO")):
                vals = [100 * evals(Path(args.out) / f"{arm}-s{s}")[phase][key] for s in seeds]
                ax.bar(x, sum(vals) / len(vals), color="tab:blue" if arm == "plain" else
                       "tab:orange", alpha=0.45 if phase == 0 else 0.9, width=0.8)
                ax.scatter([x] * len(vals), vals, color="black", s=12, zorder=3)
                ticks.append(x)
                labels.append(f"{name}\n{label}")
                x += 1
            x += 0.5
        ax.axhline(25, ls="--", lw=0.8, color="gray")           # chance: 4 answers a family
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_title(f"{title} (held-out, {len(seeds)} seeds)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("greedy accuracy (%), dashed: chance")
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
