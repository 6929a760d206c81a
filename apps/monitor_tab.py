"""Training monitor: a run dir's curves, its start → end figures, refreshed while it trains.

Reads `metrics.jsonl` through `mmrlvr.train.logger.read_metrics` (a line cut short by a running
writer is dropped, so reading during training is safe) every few seconds via `gr.Timer`, and
redraws only when the file changed. A GRPO run shows reward, accuracy, completion length and KL;
an SFT run (its dir is the config's `sft.out_dir`, or it logs `sft/loss`) shows the SFT loss,
accuracy, gradient norm and learning rate, against `sft.steps`. Per-step curves can be smoothed
(an exponential moving average; the raw curve stays drawn faintly); held-out evaluations are
drawn as marked points, and the summary's start → end figures are written above the plots.

The run dir box reads only the run dir the demo was started with (`--run`, or the run above
`--model`) and the dirs below it (`allowed_run`): any other path, existing or not, gets the same
refusal, so the page neither reads another directory nor tells whether a path exists.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from apps.common import MAX_PATH_CHARS, explain
from apps.runinfo import load_json, load_yaml, run_kind
from mmrlvr.train.logger import read_metrics

Panel = tuple[str, list[str], str]
"""A plot's title, the metrics.jsonl keys drawn on it (one line each), its y-axis label."""
PANELS: dict[str, list[Panel]] = {
    "grpo": [("reward", ["reward/mean"], "mean reward of the rollouts (0–1)"),
             ("accuracy", ["reward/accuracy", "eval/accuracy"], "accuracy (fraction correct)"),
             ("completion length", ["response/length_mean"], "mean length (tokens)"),
             ("KL to the reference", ["loss/kl"], "KL (nats per token)")],
    "sft": [("SFT loss", ["sft/loss"], "cross-entropy (nats per token)"),
            ("accuracy", ["eval/accuracy"], "held-out accuracy (fraction correct)"),
            ("gradient norm", ["optim/grad_norm"], "L2 norm before clipping"),
            ("learning rate", ["optim/lr"], "learning rate")],
}
NAMES = {"reward/mean": "rollouts (training batch)", "reward/accuracy": "rollouts (training batch)",
         "eval/accuracy": "held-out eval (greedy)", "response/length_mean": "rollouts",
         "loss/kl": "policy vs reference", "sft/loss": "training batch",
         "optim/grad_norm": "training batch", "optim/lr": "schedule"}
"""Legend names: what each curve is measured on (the metrics.jsonl key follows in brackets)."""
UNSMOOTHED = {"optim/lr"}
"""Curves that are no noisy measurement (a schedule): drawn as they are."""
X_LABEL = {"grpo": "GRPO step (one batch of prompts × group)", "sft": "SFT step (one batch)"}
REFRESH_S = 2.0
COLUMNS = ["step", "value", "series"]


def curves(rows: list[dict[str, Any]], keys: list[str]) -> pd.DataFrame:
    """Long-format frame (step, value, series) of `keys` over the steps that logged them."""
    data = [(r["step"], float(r[k]), k) for r in rows for k in keys
            if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
            and "step" in r]
    return pd.DataFrame(data, columns=COLUMNS)


def smooth(values: list[float], weight: float) -> list[float]:
    """Exponential moving average (TensorBoard's, debiased): weight 0 leaves the curve as is."""
    out, avg = [], 0.0
    for n, v in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight ** n) if weight > 0 else v)
    return out


def planned_steps(run_dir: Path, kind: str) -> int | None:
    cfg = load_yaml(run_dir / "config.yaml")
    try:
        return int((cfg.get("sft" if kind == "sft" else "train") or {})["steps"])
    except (KeyError, TypeError, ValueError):
        return None


def start_end(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """The held-out figures from the first evaluation to the last (the summary's, when the run
    finished), as markdown."""
    evals = [r for r in rows if isinstance(r.get("eval/accuracy"), (int, float))]
    figures = []
    for key in ("accuracy", "reward"):
        start, end = summary.get(f"{key}_start"), summary.get(f"{key}_end")
        where = "(summary.json)"
        if start is None and [r for r in evals if f"eval/{key}" in r]:
            got = [r for r in evals if f"eval/{key}" in r]
            start, end = got[0][f"eval/{key}"], got[-1][f"eval/{key}"]
            where = f"(step {got[0]['step']} → step {got[-1]['step']}, so far)"
        if start is not None and end is not None:
            figures.append(f"held-out {key} **{start:.3f} → {end:.3f}** "
                           f"({100 * (end - start):+.1f} points) {where}")
    return "; ".join(figures).capitalize() + "." if figures else \
        "No held-out evaluation yet (`train.eval_every` sets how often it runs)."


def figure(rows: list[dict[str, Any]], kind: str, smoothing: float = 0.0) -> Any:
    """The run's 2×2 panels as a matplotlib figure (no pyplot state: safe in server threads)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 6.4), dpi=80, layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    for ax, (title, keys, ylabel) in zip(axes, PANELS[kind]):
        frame = curves(rows, keys)
        for key, part in frame.groupby("series", sort=False):
            steps, values = part["step"].tolist(), part["value"].tolist()
            color = f"C{keys.index(key)}"
            if key.startswith("eval/"):
                ax.plot(steps, values, "o-", color=color, label=f"{NAMES.get(key, key)} [{key}]",
                        ms=6)
                for s, v in ((steps[0], values[0]), (steps[-1], values[-1])):
                    ax.annotate(f"{v:.2f}", (s, v), textcoords="offset points", xytext=(0, 7),
                                ha="center", fontsize=9, color=color)
            elif smoothing > 0 and len(values) > 2 and key not in UNSMOOTHED:
                ax.plot(steps, values, color=color, alpha=0.25, lw=1)
                ax.plot(steps, smooth(values, smoothing), color=color, lw=2,
                        label=f"{NAMES.get(key, key)} [{key}], smoothed {smoothing:g}")
            else:
                ax.plot(steps, values, color=color, lw=1.5, label=f"{NAMES.get(key, key)} [{key}]")
        if frame.empty:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(X_LABEL[kind], fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        ax.margins(y=0.12)                     # room for the labels of the eval points
        if not frame.empty:
            ax.legend(fontsize=8, loc="best")
    return fig


def allowed_run(run_dir: str, root: str) -> Path | None:
    """`run_dir` resolved (`..` and links followed), when it is `root` or a dir below it; else
    None, whether or not it exists."""
    if not root or not run_dir or len(run_dir) > MAX_PATH_CHARS:
        return None
    try:
        top = Path(root).expanduser().resolve()
        path = Path(run_dir).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):     # a link loop, a NUL byte
        return None
    return path if path == top or path.is_relative_to(top) else None


def refused(root: str) -> str:
    if not root:
        return ("⚠ The monitor reads the run the demo was started with, and it was started "
                "without one: start it with `--run RUN_DIR`.")
    return (f"⚠ The monitor reads run dirs under `{root}` only (the run the demo was started "
            "with).")


def refresh(run_dir: str, smoothing: float = 0.0, *, root: str) -> tuple[Any, str, str]:
    """The Training monitor handler for run dirs under `root`: (figure, start → end markdown,
    status); never raises."""
    run_dir = (run_dir or "").strip()
    if not run_dir:
        return None, "", (f"Give a run dir (e.g. `{root}`)." if root else refused(root))
    path = allowed_run(run_dir, root)
    if path is None:
        return None, "", refused(root)
    try:
        if not path.is_dir():
            return None, "", f"⚠ Run dir `{run_dir}` does not exist (yet)."
        rows = read_metrics(path / "metrics.jsonl")
        if not rows:
            return None, "", (f"Waiting for the first step: `{run_dir}` has no metrics.jsonl "
                              "rows yet.")
        kind = run_kind(path, load_yaml(path / "config.yaml"))
        summary = load_json(path / "summary.json")
        planned = planned_steps(path, kind)
        last = rows[-1]
        step = f"step {last.get('step')}" + (f" / {planned}" if planned else "")
        state = "finished" if summary else "training"
        frames = {key: curves(rows, [key]) for _, keys, _ in PANELS[kind] for key in keys}
        latest = {k: f["value"].iloc[-1] for k, f in frames.items() if not f.empty}
        figures = ", ".join(f"{k} {v:.3g}" for k, v in latest.items())
        missing = [title for title, keys, _ in PANELS[kind]
                   if all(frames[k].empty for k in keys)]
        note = f" Not logged: {', '.join(missing)}." if missing else ""
        if "KL to the reference" in missing:
            note += " (KL is logged when algo.beta > 0.)"
        figures = f": {figures} (latest)" if figures else ""
        status = (f"`{run_dir}` ({'SFT' if kind == 'sft' else 'GRPO'} run): {state}, {step} "
                  f"({len(rows)} rows){figures}.{note} Updated {time.strftime('%H:%M:%S')}.")
        return figure(rows, kind, float(smoothing)), start_end(rows, summary), status
    except Exception as err:  # noqa: BLE001 — a bad file must not stop the refresh timer
        return None, "", explain(err)


def signature(run_dir: str, smoothing: float, root: str) -> str:
    """What the plots depend on: the files' sizes and times, and the smoothing (a path
    `allowed_run` refuses is never looked at)."""
    path = allowed_run((run_dir or "").strip(), root)
    if path is None:
        return f"refused|{hash(run_dir)}|{smoothing}"
    stamps = []
    for name in ("metrics.jsonl", "summary.json", "config.yaml"):
        try:
            st = (path / name).stat()
            stamps.append(f"{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            stamps.append("-")
    return f"{path}|{smoothing}|{'|'.join(stamps)}"


def build(run_dir: str) -> None:
    import gradio as gr

    with gr.Row(equal_height=True):
        path = gr.Textbox(label=f"run dir under {run_dir} (Enter loads)" if run_dir else
                          "run dir (start the demo with --run RUN_DIR)", value=run_dir, scale=4,
                          elem_id="monitor-run", max_length=MAX_PATH_CHARS)
        smoothing = gr.Slider(0.0, 0.99, value=0.8, step=0.01, scale=2, elem_id="monitor-smooth",
                              label="smoothing of per-step curves (0: raw)")
        live = gr.Checkbox(label=f"refresh every {REFRESH_S:g} s", value=True, scale=1)
        button = gr.Button("Refresh", scale=1)
    status = gr.Markdown(elem_id="monitor-status", elem_classes=["status"])
    figures = gr.Markdown(elem_id="monitor-start-end")
    plot = gr.Plot(show_label=False, elem_id="monitor-plot", format="png")
    seen = gr.State("")
    outputs = [plot, figures, status]

    def tick(path: str, smoothing: float, last: str):
        now = signature(path, smoothing, run_dir)
        if now == last:
            return gr.skip(), gr.skip(), gr.skip(), last
        return (*refresh(path, smoothing, root=run_dir), now)

    def load(path: str, smoothing: float):
        return refresh(path, smoothing, root=run_dir)

    timer = gr.Timer(REFRESH_S, active=True)
    timer.tick(tick, [path, smoothing, seen], [*outputs, seen], api_name="monitor_tick",
               show_progress="hidden")
    live.change(lambda on: gr.Timer(active=on), live, timer, api_name="monitor_live")
    button.click(load, [path, smoothing], outputs, api_name="monitor")
    path.submit(load, [path, smoothing], outputs, api_name="monitor_enter")
    smoothing.release(load, [path, smoothing], outputs, api_name="monitor_smooth",
                      show_progress="hidden")
