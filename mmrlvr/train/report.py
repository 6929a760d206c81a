"""End-of-run report: PNG curves under `plots/`, a `report.md` that shows them, and
`summary.json`; each file written whole or not at all (`mmrlvr.train.writes.write_atomic`)."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from mmrlvr.train.logger import read_metrics
from mmrlvr.train.writes import write_atomic

PANELS = [
    ("reward", ["reward/mean", "eval/reward"], "mean reward (train batch, held-out)"),
    ("accuracy", ["reward/accuracy", "eval/accuracy"], "accuracy (train batch, held-out)"),
    ("length", ["response/length_mean"], "response length (tokens)"),
    ("kl_clip", ["loss/kl", "loss/clip_frac", "rollout/logprob_gap"], "KL, clip fraction, logprob gap"),
    ("entropy", ["policy/entropy"], "entropy"),
    ("zero_spread", ["reward/zero_spread_frac"], "groups with zero reward spread"),
]


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        if r.get(key) is not None:
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


def make_plots(run_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(exist_ok=True)
    written = []
    for name, keys, title in PANELS:
        series = [(k, *_series(rows, k)) for k in keys]
        series = [s for s in series if s[1]]
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key, xs, ys in series:
            if key.startswith("eval/"):
                ax.plot(xs, ys, "o-", label=key)
            else:
                ax.plot(xs, ys, alpha=0.3, color="C0" if len(series) == 1 else None)
                ax.plot(xs, _smooth(ys, 10), label=f"{key} (avg 10)")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        plt.close(fig)
        write_atomic(path, png.getvalue(), run_dir=Path(run_dir))
        written.append(path)
    return written


def write_report(run_dir: Path, summary: dict[str, Any], title: str = "mmrlvr run") -> Path:
    run_dir = Path(run_dir)
    plots = make_plots(run_dir)
    lines = [f"# {title}", "", f"Run dir: `{run_dir}`", "", "## Summary", "",
             "| figure | value |", "|---|---|"]
    for k, v in summary.items():
        if isinstance(v, float):
            v = f"{v:.4f}"
        lines.append(f"| {k} | {v} |")
    lines += ["", "## Curves", ""]
    lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
    lines += ["", "Per-step figures: `metrics.jsonl`; TensorBoard: `tensorboard --logdir "
              f"{run_dir / 'tb'}`.", ""]
    path = run_dir / "report.md"
    write_atomic(path, "\n".join(lines), run_dir=run_dir)
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n", run_dir=run_dir)
    return path
