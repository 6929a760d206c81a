"""Run logging: `metrics.jsonl` (one object per step), TensorBoard scalars."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class RunLogger:
    def __init__(self, run_dir: Path, enabled: bool = True, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.tb = None
        if not enabled:
            return
        if resume_step is not None:
            truncate_metrics(self.path, resume_step)
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(Path(run_dir) / "tb"),
                                    purge_step=None if resume_step is None else resume_step + 1)
        except ImportError:  # tensorboard is a dependency, but logging must never stop a run
            self.tb = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None:
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


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
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
