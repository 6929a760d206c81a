"""A run dir belongs to one run: locked while written, never silently reused.

- `claim` takes an exclusive lock (`RUN/.lock`, `fcntl.flock`, released when the process ends,
  even by kill -9) naming the holder's pid and host; a second writer is refused with who holds
  it.
- A fresh run refuses a dir that already holds a run (metrics or checkpoints) unless
  `overwrite`, which removes that run's files (and only those) first. `--resume` checks that the
  model and data it is given are the ones the run was started with, unless `force`.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import yaml

LOCK = ".lock"
RUN_FILES = ("metrics.jsonl", "summary.json", "report.md", "reward_errors.jsonl",
             "skipped_rows.jsonl", "recycled.jsonl", "rubrics.jsonl", "config.yaml")
RUN_DIRS = ("checkpoints", "final", "tb", "plots")
PINNED = ("model.path", "model.modality", "data.train", "data.eval")
"""What a resumed run must share with the run it continues."""


class RunDirError(RuntimeError):
    """A run dir that is in use, already holds a run, or does not match a resume."""


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / "metrics.jsonl").is_file() or (run_dir / "checkpoints").is_dir()


def _dotted(cfg: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        cfg = cfg.get(part, {}) if isinstance(cfg, dict) else {}
    return cfg if cfg != {} else None


def check_resume(run_dir: Path, cfg: dict[str, Any]) -> None:
    """Refuse a resume whose model or data differ from the saved run's config."""
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        return
    saved = yaml.safe_load(saved_path.read_text()) or {}
    changed = [f"{key}: {_dotted(saved, key)!r} -> {_dotted(cfg, key)!r}" for key in PINNED
               if _dotted(saved, key) != _dotted(cfg, key)]
    if changed:
        raise RunDirError(f"--resume {run_dir}: the run was started with other settings "
                          f"({'; '.join(changed)}); continuing would mix two runs. Resume "
                          "without those overrides, or pass --force to continue anyway")


class RunLock:
    """The exclusive lock on a run dir, held until `release` or the process's end."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fh = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise RunDirError(f"{self.path.parent} is in use by {holder}; wait for that run to "
                              "finish, or give this run another train.out_dir") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        self.fh = fh

    def release(self) -> None:
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None


def claim(run_dir: Path, *, resume: bool, overwrite: bool = False, force: bool = False,
          cfg: dict[str, Any] | None = None) -> RunLock:
    """Lock `run_dir` for this run after checking it may be written (see the module doc)."""
    run_dir = Path(run_dir)
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        if resume:
            if not force and cfg is not None:
                check_resume(run_dir, cfg)
        elif holds_a_run(run_dir):
            if not overwrite:
                raise RunDirError(f"{run_dir} already holds a run ({_describe(run_dir)}); continue "
                                  f"it with `mmrlvr train --resume {run_dir}`, or start over with "
                                  "--overwrite (removes its metrics, checkpoints and report)")
            for name in RUN_FILES:
                (run_dir / name).unlink(missing_ok=True)
            for name in RUN_DIRS:
                shutil.rmtree(run_dir / name, ignore_errors=True)
    except BaseException:
        lock.release()
        raise
    return lock


def _describe(run_dir: Path) -> str:
    steps = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                steps.append(json.loads(line)["step"])
            except (ValueError, KeyError):
                break
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) \
        if (run_dir / "checkpoints").is_dir() else []
    parts = [f"metrics up to step {max(steps)}" if steps else "",
             f"checkpoints {', '.join(ckpts)}" if ckpts else ""]
    return "; ".join(p for p in parts if p) or "files of an earlier run"
