"""The files a run writes, each whole or not at all; a write that fails says so in one line.

- `append_line` (metrics.jsonl's rows): the line goes down in one `os.write`; one that fails or
  comes up short is cut back to where the file ended, so the file never holds half a line.
- `write_atomic` (report.md, summary.json, plots, eval records): a temp file beside the target,
  renamed over it, so a reader finds the old file or the new one, never a part of one.
- `save_final` (final/): written as a checkpoint is, into a temp dir renamed in place after a
  space check, so a final/ is whole or absent.

A write that fails — a full disk, a quota, any OSError — raises `WriteError` (a
`TrainingError`: the CLI prints its one line and exits 2) naming the dir, what the write
needed and what is free, and the last complete checkpoint, which is intact and what
`--resume` continues from.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

from mmrlvr.core.errors import TrainingError
from mmrlvr.train.checkpoint import (CheckpointError, check_space, complete_checkpoints,
                                     needed_bytes, write_failure)
from mmrlvr.train.parallel import Dist


class WriteError(TrainingError):
    """A run file that could not be written; nothing half-written is left."""


def size(n: float) -> str:
    """Bytes as a person reads them: 310 bytes, 4.1 KB, 12 MB."""
    if n < 1024:
        return f"{int(n)} bytes"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1024
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if n < 10 else f"{n:,.0f} {unit}"
    raise AssertionError("unreachable")


def _free(path: Path) -> str:
    for where in (path, *path.parents):
        try:
            return size(shutil.disk_usage(where).free)
        except OSError:
            continue
    return "an unknown amount"


def resume_note(run_dir: Path | None) -> str:
    """Which checkpoint a stopped run can continue from."""
    if run_dir is None:
        return ""
    done = complete_checkpoints(run_dir)
    if not done:
        return " No checkpoint of this run was written yet."
    return (f" The last complete checkpoint, {done[-1]}, is intact: free some space, then "
            f"`mmrlvr train --resume {run_dir}` continues from it.")


def _why(err: BaseException) -> str:
    code = getattr(err, "errno", None)
    text = str(err).strip()
    if code == errno.ENOSPC or "os error 28" in text:      # safetensors says it in its text
        return "no space left"
    if code == errno.EDQUOT:
        return "disk quota exceeded"
    if getattr(err, "strerror", None):
        return err.strerror
    return text.splitlines()[0] if text else type(err).__name__


def failed(path: Path, need: int, err: BaseException, run_dir: Path | None = None) -> WriteError:
    """The one-line error for a write of `need` bytes to `path` that raised `err`."""
    return WriteError(f"cannot write {path.name} in {path.parent}: {_why(err)} (it needed "
                      f"{size(need)}; {_free(path.parent)} free there).{resume_note(run_dir)}")


def append_line(path: Path, line: str, run_dir: Path | None = None) -> None:
    """`line` (ending in a newline) appended to `path` whole, or the file left as it was."""
    data = line.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        end = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):         # a full disk takes what fits, then refuses
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
        except OSError as err:
            try:
                os.ftruncate(fd, end)         # the half line goes
            except OSError:
                pass
            raise failed(Path(path), len(data), err, run_dir) from None
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes, run_dir: Path | None = None) -> None:
    """`data` as the whole content of `path` (UTF-8 if text), replacing it in one rename."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise failed(path, len(raw), err, run_dir) from None


def save_final(run_dir: Path, policy: Any, dist: Dist | None = None,
               note: str | None = None) -> Path:
    """The trained model as `run_dir/final` (every rank calls it: FSDP2 gathers the weights),
    checked for space first and renamed into place whole. A refusal ends with `note` (default:
    the checkpoint a GRPO run resumes from)."""
    dist = dist or Dist()
    run_dir = Path(run_dir)
    note = resume_note(run_dir) if note is None else note
    final, tmp = run_dir / "final", run_dir / ".tmp-final"
    need = needed_bytes(policy.model, 0)
    error = None
    if dist.main:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            check_space(run_dir, need, what="the final model")
        except CheckpointError as err:
            error = f"{err}.{note}"
    if (error := dist.gather(error)[0]) is None:
        try:
            policy.save(tmp, main=dist.main)
        except Exception as err:   # noqa: BLE001 -- safetensors and torch.save report a full
            if not write_failure(err, run_dir, need):   # disk as their own errors
                raise              # a bug, not a write: its traceback is wanted
            shutil.rmtree(tmp, ignore_errors=True)
            error = str(failed(final, need, err)) + note
        error = next((e for e in dist.gather(error) if e), None)
    if error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(error)
    if dist.main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final
