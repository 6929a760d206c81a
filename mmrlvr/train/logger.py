"""Run logging: `metrics.jsonl` (one object per step, always written, each row whole: a full
disk stops the run with one line and leaves no half row, `mmrlvr.train.writes`) and the trackers
`train.report_to` names, through accelerate's (`accelerate.tracking`): TensorBoard scalars under
RUN/tb, wandb, mlflow, trackio.

A tracker never stops or stalls a run. One whose package is missing, that fails to start, or that
fails to log gets one warning naming it, and the run goes on with the others and metrics.jsonl.
Each runs offline unless told otherwise: wandb logs offline under RUN/wandb (`wandb sync` uploads
it later) unless WANDB_MODE is set or an API key is (WANDB_API_KEY, or `wandb login`); mlflow
writes to RUN/mlruns unless MLFLOW_TRACKING_URI is set; trackio keeps its local store.
"""
from __future__ import annotations

import importlib.util
import json
import math
import netrc
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmrlvr.train.writes import append_line, write_atomic

TRACKER_PACKAGES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb",
                                    "mlflow": "mlflow", "trackio": "trackio"}
"""The package each tracker of `train.report_to` needs."""


def _warn(message: str) -> None:
    print(f"warning: train.report_to: {message}", file=sys.stderr)


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _make_tracker(name: str, run_dir: Path, resume_step: int | None):
    """accelerate's tracker `name`, set up for this run dir (not yet started)."""
    from accelerate import PartialState, tracking

    # accelerate's trackers log through its process-aware logger, which needs its state; made
    # after this run set up its processes, it only reads them (one process: no side effects)
    PartialState()

    if name == "tensorboard":                # RUN/tb, as before trackers were pluggable
        return tracking.TensorBoardTracker(
            "tb", str(run_dir), purge_step=None if resume_step is None else resume_step + 1)
    if name == "wandb":
        options: dict[str, Any] = {"dir": str(run_dir), "name": run_dir.name}
        if "WANDB_MODE" not in os.environ and not _wandb_logged_in():
            options["mode"] = "offline"
            _warn(f"wandb has no API key here, so it logs offline under {run_dir}/wandb "
                  "(`wandb sync` uploads it; set WANDB_MODE to choose)")
        return tracking.WandBTracker(os.environ.get("WANDB_PROJECT", "mmrlvr"), **options)
    if name == "mlflow":
        if "MLFLOW_TRACKING_URI" not in os.environ:
            import mlflow

            mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        return tracking.MLflowTracker(os.environ.get("MLFLOW_EXPERIMENT_NAME", "mmrlvr"),
                                      run_name=run_dir.name)
    return tracking.TrackioTracker(os.environ.get("TRACKIO_PROJECT", "mmrlvr"), name=run_dir.name)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted key: plain value} (lists and mappings as their text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            ok = isinstance(value, (bool, int, float, str)) or value is None
            out[f"{prefix}{key}"] = value if ok else str(value)
    return out


class RunLogger:
    """Writes each step's metrics to RUN/metrics.jsonl and to the trackers of `report_to`.

    Only the main process logs (`enabled`); `resume_step` drops the rows a resumed run rewrites;
    `config` (the run's resolved config as a dict) goes to the trackers that keep hyperparameters
    (wandb, mlflow, trackio); each of `callbacks` (the Python API's) has `on_log(step, metrics)`
    called with every row once it is written (an exception there is the caller's and stops the
    run, as a bug in a script should)."""

    def __init__(self, run_dir: Path, enabled: bool = True, resume_step: int | None = None,
                 report_to: Sequence[str] = ("tensorboard",),
                 config: dict[str, Any] | None = None, callbacks: Sequence[Any] = ()):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.trackers: list[Any] = []
        self.callbacks = list(callbacks)
        if not enabled:
            return
        if resume_step is not None:
            truncate_metrics(self.path, resume_step)
        for name in dict.fromkeys(report_to):          # each once, in order
            tracker = self._start(name, Path(run_dir), resume_step, config)
            if tracker is not None:
                self.trackers.append(tracker)

    @staticmethod
    def _start(name: str, run_dir: Path, resume_step: int | None,
               config: dict[str, Any] | None):
        package = TRACKER_PACKAGES.get(name)
        if package is None:
            _warn(f"unknown tracker {name!r} (known: {sorted(TRACKER_PACKAGES)}); skipped")
            return None
        if importlib.util.find_spec(package) is None:
            _warn(f"{name} needs the package {package!r}, which is not installed (pip install "
                  f"{package}); the run goes on without it (metrics.jsonl is still written)")
            return None
        try:
            tracker = _make_tracker(name, run_dir, resume_step)
            tracker.main_process_only = False   # only the main process builds a RunLogger
            tracker.start()
            if config and name != "tensorboard":    # TensorBoard's hparams add a run dir each
                tracker.store_init_configuration(_flat(config))
        except Exception as err:     # noqa: BLE001 - a tracker must never stop the run
            _warn(f"{name} failed to start ({type(err).__name__}: {err}); the run goes on "
                  "without it")
            return None
        return tracker

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        # one write of the whole line, cut back if it fails: never half a row (mmrlvr.train.writes)
        append_line(self.path, json.dumps(row) + "\n", run_dir=self.path.parent)
        scalars = {k: v for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and v is not None}
        for tracker in list(self.trackers):
            try:
                tracker.log(scalars, step=step)
            except Exception as err:     # noqa: BLE001 - a tracker must never stop the run
                _warn(f"{tracker.name} failed to log step {step} ({type(err).__name__}: "
                      f"{err}); it is dropped for the rest of the run")
                self.trackers.remove(tracker)
        for callback in self.callbacks:
            callback.on_log(step, {k: v for k, v in row.items() if k != "step"})

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.finish()
            except Exception as err:     # noqa: BLE001
                _warn(f"{tracker.name} failed to close ({type(err).__name__}: {err})")
        self.trackers = []


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def read_metrics(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill: drop it
                break
    return rows


def truncate_metrics(path: Path, step: int) -> None:
    """Keep rows up to `step` (a resumed run rewrites the steps after its checkpoint)."""
    rows = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    write_atomic(Path(path), "".join(json.dumps(r) + "\n" for r in rows))   # the old file or this
