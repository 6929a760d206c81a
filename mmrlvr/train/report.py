"""End-of-run report: PNG curves under `plots/`, a `report.md` that shows them, and
`summary.json`; each file written whole or not at all (`mmrlvr.train.writes.write_atomic`).

A panel draws the metrics it names that the run logged (docs/metrics.md says what each means),
on one y axis with one unit; its title names what is drawn, so a run that logged no held-out
reward gets a reward plot titled for the training batch only. Steps are whole numbers on the x
axis, however short the run. GRPO runs (and the PWSD stage, which runs on the GRPO trainer) use
`GRPO_PANELS`, SFT runs `SFT_PANELS`; every auxiliary objective a run logged
(`objective/<name>`) gets a panel of its own loss.
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrlvr.train.logger import read_metrics
from mmrlvr.train.writes import write_atomic

SMOOTH = 10
"""Steps in the moving average drawn over a training-batch curve (only when it has 2x as many)."""


@dataclass(frozen=True)
class Panel:
    """One plot: `name` (its file, plots/<name>.png), `subject` (the title's start), `ylabel`
    (with its unit) and the series it draws as (metric key, what that series is)."""

    name: str
    subject: str
    ylabel: str
    series: tuple[tuple[str, str], ...]

    def title(self, drawn: list[str]) -> str:
        """The title for the series actually drawn: `subject: what and what`."""
        return f"{self.subject}: {' and '.join(label for key, label in self.series if key in drawn)}"


GRPO_PANELS = (
    Panel("reward", "Mean total reward", "reward (weighted sum)",
          (("reward/mean", "training batch"), ("eval/reward", "greedy held-out"))),
    Panel("accuracy", "Accuracy", "accuracy (fraction correct)",
          (("reward/accuracy", "sampled training batch"), ("eval/accuracy", "greedy held-out"))),
    Panel("length", "Completion length", "length (tokens)",
          (("response/length_mean", "mean"), ("response/length_max", "longest"))),
    Panel("kl", "Divergence per token", "nats per token",
          (("loss/kl", "KL to the reference"),
           ("rollout/logprob_gap", "rollout vs trainer logprob gap"))),
    Panel("clip", "Clipped tokens", "fraction of completion tokens", (("loss/clip_frac", "PPO clip"),)),
    Panel("entropy", "Policy entropy", "entropy (nats per token)",
          (("policy/entropy", "trained completion tokens"),)),
    Panel("zero_spread", "Groups without reward spread", "fraction of groups",
          (("reward/zero_spread_frac", "training batch"),)),
)
"""The panels of a GRPO run's report (and of a PWSD stage's)."""

SFT_PANELS = (
    Panel("sft_loss", "SFT loss", "negative log-likelihood (nats per token)",
          (("sft/loss", "training batch"),)),
    Panel("accuracy", "Accuracy", "accuracy (fraction correct)",
          (("eval/accuracy", "greedy held-out"),)),
    Panel("reward", "Mean total reward", "reward (weighted sum)",
          (("eval/reward", "greedy held-out"),)),
    Panel("lr", "Learning rate", "learning rate", (("optim/lr", "schedule"),)),
)
"""The panels of an SFT run's report."""


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool):
            xs.append(r["step"])
            ys.append(r[key])
    return xs, ys


def _smooth(ys: list[float], k: int) -> list[float]:
    out, acc = [], []
    for y in ys:
        acc.append(y)
        acc = acc[-k:]
        out.append(sum(acc) / len(acc))
    return out


def objective_panels(rows: list[dict[str, Any]]) -> list[Panel]:
    """One panel per auxiliary objective the run logged (`objective/<name>`)."""
    names = sorted({m.group(1) for r in rows for k in r
                    if (m := re.fullmatch(r"objective/([^/]+)", k))})
    return [Panel(f"objective_{n}", f"Objective {n}", "loss (before its weight)",
                  ((f"objective/{n}", "training batch"),)) for n in names]


def figure(panel: Panel, rows: list[dict[str, Any]], xlabel: str = "step"):
    """The matplotlib figure of `panel` over metrics `rows`, or None when the run logged none
    of its series. Held-out series are drawn as points joined by lines; a training series
    raw, with its moving average over `SMOOTH` steps when it is long enough to need one."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    series = [(key, label, *_series(rows, key)) for key, label in panel.series]
    series = [s for s in series if s[2]]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (key, label, xs, ys) in enumerate(series):
        color = f"C{i}"
        if key.startswith("eval/") or len(xs) < 2 * SMOOTH:
            ax.plot(xs, ys, "o-", color=color, markersize=3, label=f"{label} ({key})")
        else:
            ax.plot(xs, ys, color=color, alpha=0.3, label=f"{label} ({key})")
            ax.plot(xs, _smooth(ys, SMOOTH), color=color, label=f"{label} ({SMOOTH}-step mean)")
    ax.set_title(panel.title([s[0] for s in series]), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))     # no step 0.5 on short runs
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def make_plots(run_dir: Path, panels: tuple[Panel, ...] = GRPO_PANELS,
               xlabel: str = "step") -> list[Path]:
    """Write plots/<panel>.png for each panel (and objective) with data; returns their paths."""
    import matplotlib.pyplot as plt

    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(exist_ok=True)
    written = []
    for panel in (*panels, *objective_panels(rows)):
        fig = figure(panel, rows, xlabel)
        if fig is None:
            continue
        path = out_dir / f"{panel.name}.png"
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        plt.close(fig)
        write_atomic(path, png.getvalue(), run_dir=Path(run_dir))
        written.append(path)
    return written


def write_report(run_dir: Path, summary: dict[str, Any], title: str = "mmrlvr run",
                 panels: tuple[Panel, ...] = GRPO_PANELS, xlabel: str = "step") -> Path:
    run_dir = Path(run_dir)
    plots = make_plots(run_dir, panels, xlabel)
    lines = [f"# {title}", "", f"Run dir: `{run_dir}`", "", "## Summary", "",
             "| figure | value |", "|---|---|"]
    for k, v in summary.items():
        if isinstance(v, float):
            v = f"{v:.4f}"
        elif isinstance(v, dict):               # a stage's own summary (SFT's `pwsd`)
            v = f"see its run dir's report.md ({len(v)} figures)"
        lines.append(f"| {k} | {v} |")
    lines += ["", "## Curves", ""]
    lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
    lines += ["", "Per-step figures: `metrics.jsonl` (each key: docs/metrics.md); TensorBoard: "
              f"`tensorboard --logdir {run_dir / 'tb'}`.", ""]
    path = run_dir / "report.md"
    write_atomic(path, "\n".join(lines), run_dir=run_dir)
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n", run_dir=run_dir)
    return path
