"""Training monitor: a run dir's curves (reward, accuracy, length, KL), refreshed while it trains.

Reads `metrics.jsonl` through `mmrlvr.train.logger.read_metrics` (a line cut short by a running writer
is dropped, so reading during training is safe) every few seconds via `gr.Timer`.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from apps.common import explain
from mmrlvr.train.logger import read_metrics

PANELS: list[tuple[str, list[str]]] = [
    ("reward", ["reward/mean"]),
    ("accuracy", ["reward/accuracy", "eval/accuracy"]),
    ("length", ["response/length_mean"]),
    ("KL", ["loss/kl"]),
]
"""Each plot's title and the metrics.jsonl keys drawn on it (one line per key)."""
REFRESH_S = 2.0
COLUMNS = ["step", "value", "series"]


def curves(rows: list[dict[str, Any]], keys: list[str]) -> pd.DataFrame:
    """Long-format frame (step, value, series) of `keys` over the steps that logged them."""
    data = [(r["step"], float(r[k]), k) for r in rows for k in keys
            if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
            and "step" in r]
    return pd.DataFrame(data, columns=COLUMNS)


def _planned_steps(run_dir: Path) -> int | None:
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        return int(cfg["train"]["steps"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def refresh(run_dir: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, str]:
    """The Training monitor handler: one frame per panel, then a status line; never raises."""
    empty = [pd.DataFrame(columns=COLUMNS) for _ in PANELS]
    run_dir = (run_dir or "").strip()
    if not run_dir:
        return (*empty, ("Give a run dir (e.g. `runs/quickstart`), or start the demo with "
                         "`--run RUN_DIR`."))
    try:
        path = Path(run_dir).expanduser()
        if not path.is_dir():
            return (*empty, f"⚠ Run dir `{run_dir}` does not exist (yet).")
        rows = read_metrics(path / "metrics.jsonl")
        if not rows:
            return (*empty, (f"Waiting for the first step: `{run_dir}` has no metrics.jsonl "
                             "rows yet."))
        frames = [curves(rows, keys) for _, keys in PANELS]
        last = rows[-1]
        planned = _planned_steps(path)
        step = f"step {last.get('step')}" + (f" / {planned}" if planned else "")
        state = "finished" if (path / "summary.json").is_file() else "training"
        latest = {k: f.loc[f.series == k, "value"].iloc[-1] for f in frames
                  for k in f.series.unique()}
        figures = ", ".join(f"{k} {_fmt(float(v))}" for k, v in latest.items())
        missing = [title for (title, _), f in zip(PANELS, frames) if f.empty]
        note = f" Not logged: {', '.join(missing)}." if missing else ""
        if "KL" in missing:
            note += " (KL is logged when algo.beta > 0.)"
        figures = f": {figures} (latest)" if figures else ""
        status = (f"`{run_dir}`: {state}, {step} ({len(rows)} rows){figures}.{note} "
                  f"Updated {time.strftime('%H:%M:%S')}.")
        return (*frames, status)
    except Exception as err:  # noqa: BLE001 — a bad file must not stop the refresh timer
        return (*empty, explain(err))


def build(run_dir: str) -> None:
    import gradio as gr

    with gr.Row():
        path = gr.Textbox(label="run dir", value=run_dir, scale=4, elem_id="monitor-run")
        live = gr.Checkbox(label=f"refresh every {REFRESH_S:g} s", value=True, scale=1)
        button = gr.Button("Refresh", scale=1)
    status = gr.Markdown(elem_id="monitor-status")
    plots = []
    with gr.Row():
        for title, _ in PANELS[:2]:
            plots.append(gr.LinePlot(x="step", y="value", color="series", title=title,
                                     height=260))
    with gr.Row():
        for title, _ in PANELS[2:]:
            plots.append(gr.LinePlot(x="step", y="value", color="series", title=title,
                                     height=260))
    outputs = [*plots, status]
    timer = gr.Timer(REFRESH_S, active=True)
    timer.tick(refresh, path, outputs, api_name="monitor_tick", show_progress="hidden")
    live.change(lambda on: gr.Timer(active=on), live, timer, api_name="monitor_live")
    button.click(refresh, path, outputs, api_name="monitor")
    path.submit(refresh, path, outputs, api_name="monitor_enter")
