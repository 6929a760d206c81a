"""A run dir belongs to one run: locked while written, never silently reused.

- `claim` takes an exclusive lock (`RUN/.lock`, `fcntl.flock`, released when the process ends,
  even by kill -9) naming the holder's pid and host; a second writer is refused with who holds
  it.
- A fresh run refuses a dir that already holds a run (metrics or checkpoints) unless
  `overwrite`, which removes that run's files (and only those: its eval records and tracker
  logs too) first. `--resume` checks that the model and data it is given are the ones the run
  was started with, unless `force`; a forced change is recorded in `RUN/forced_resumes.jsonl`
  (what changed, from which checkpoint, and the whole config it replaced) and said on stderr,
  since config.yaml then holds the new values.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from mmrlvr.train.checkpoint import complete_checkpoints
from mmrlvr.train.writes import append_line

LOCK = ".lock"
RUN_FILES = ("metrics.jsonl", "summary.json", "report.md", "reward_errors.jsonl",
             "reward_errors.rank*.jsonl", "skipped_rows.jsonl", "recycled.jsonl", "rubrics.jsonl",
             "rubric_cache.jsonl", "config.yaml", "forced_resumes.jsonl")
"""A run's own files (glob patterns): what `--overwrite` removes."""
RUN_DIRS = ("checkpoints", "final", ".tmp-final", "tb", "plots", "eval", "wandb", "mlruns")
FORCED = "forced_resumes.jsonl"
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


def resume_changes(run_dir: Path, cfg: dict[str, Any]) -> dict[str, list[Any]]:
    """The pinned keys whose value in `cfg` differs from the saved run's: {key: [old, new]}."""
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        return {}
    saved = yaml.safe_load(saved_path.read_text()) or {}
    return {key: [_dotted(saved, key), _dotted(cfg, key)] for key in PINNED
            if _dotted(saved, key) != _dotted(cfg, key)}


def check_resume(run_dir: Path, cfg: dict[str, Any]) -> None:
    """Refuse a resume whose model or data differ from the saved run's config."""
    changed = resume_changes(run_dir, cfg)
    if changed:
        shown = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changed.items())
        raise RunDirError(f"--resume {run_dir}: the run was started with other settings "
                          f"({shown}); continuing would mix two runs. Resume without those "
                          "overrides, or pass --force to continue anyway (recorded in "
                          f"{FORCED})")


def record_forced(run_dir: Path, cfg: dict[str, Any]) -> dict[str, list[Any]]:
    """A forced resume's changes, kept: one line of `forced_resumes.jsonl` with the time, the
    checkpoint it continues from, what changed and the config.yaml it replaces (which is then
    rewritten with the new values), and a warning on stderr."""
    changed = resume_changes(run_dir, cfg)
    if not changed:
        return changed
    done = complete_checkpoints(run_dir)
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "from_checkpoint": done[-1].name if done else None, "changed": changed,
              "replaced_config": (run_dir / "config.yaml").read_text()}
    append_line(run_dir / FORCED, json.dumps(record) + "\n", run_dir=run_dir)
    shown = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changed.items())
    print(f"warning: --resume --force {run_dir}: continuing with {shown}. The weights and "
          "optimizer come from the checkpoint; model.path now gives the reference model and a "
          f"LoRA run's base. config.yaml holds the new values; the old config and this change "
          f"are in {run_dir / FORCED}", file=sys.stderr)
    return changed


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
        if resume and cfg is not None:
            if force:
                record_forced(run_dir, cfg)
            else:
                check_resume(run_dir, cfg)
        elif holds_a_run(run_dir):
            if not overwrite:
                raise RunDirError(f"{run_dir} already holds a run ({_describe(run_dir)}); continue "
                                  f"it with `mmrlvr train --resume {run_dir}`, or start over with "
                                  "--overwrite (removes its metrics, checkpoints and report)")
            for pattern in RUN_FILES:
                for path in run_dir.glob(pattern):
                    path.unlink(missing_ok=True)
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
