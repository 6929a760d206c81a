"""Checkpoints that survive `kill -9`: written to a temp dir, renamed into place, marked complete.

`checkpoints/step-N/` holds an HF-loadable model dir plus the trainer state in two files that
cannot carry code: `trainer_state.json` (step, data cursor, scheduler, sampler, the Python and
NumPy RNG states of every rank) and `trainer_state.pt`, tensors only (torch's RNG states and —
unsharded runs — the optimizer), read back with `torch.load(weights_only=True)`. A checkpoint
written before this format (one pickled `trainer_state.pt`, no JSON) is refused: unpickling it
could run any code planted in it; `--trust-checkpoint` reads it anyway. Under FSDP2 each
rank also writes its shard of the model and optimizer with `torch.distributed.checkpoint` into
`step-N/sharded/`, which loads back at any world size; the HF model is gathered to rank 0. A dir
without the `COMPLETE` marker — a save cut short — is never picked up and is removed on resume.
"""
from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrlvr.train.parallel import Dist

MARKER = "COMPLETE"
STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.pt"
STATE_FORMAT = 2
_STEP_DIR = re.compile(r"^step-(\d+)$")


def rng_state() -> dict[str, Any]:
    """This process's random streams, as plain data (JSON) and tensors only."""
    version, words, gauss = random.getstate()
    name, key, pos, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": version, "state": list(words), "gauss": gauss},
             "numpy": {"name": name, "key": torch.from_numpy(key.astype(np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    np.random.set_state((npy["name"], npy["key"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written (no disk space); nothing half-written is kept."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint whose trainer state is a pickle that may carry code; refused unless trusted."""


def needed_bytes(model: torch.nn.Module, optimizer_states: int) -> int:
    """About what a checkpoint of `model` takes: its weights, plus `optimizer_states` fp32
    copies of the trainable ones (AdamW: 2)."""
    total = 0
    for p in model.parameters():
        total += p.numel() * p.element_size()          # DTensor: the global size
        if p.requires_grad:
            total += optimizer_states * p.numel() * 4
    return total


MARGIN = 64 << 20
"""Space kept free beside a checkpoint or final/: what the run's logs and reports still need."""


def check_space(root: Path, need: int, what: str = "a checkpoint") -> None:
    free = shutil.disk_usage(root).free
    if free < need * 1.05 + MARGIN:
        raise CheckpointError(f"no space left in {root}: {what} needs about "
                              f"{need / 2**20:,.0f} MB, plus {MARGIN >> 20} MB kept free for the "
                              f"run's logs, and {free / 2**20:,.0f} MB are free; free some space, "
                              "lower train.keep_checkpoints, or use another train.out_dir. "
                              "Nothing was written")


def write_failure(err: BaseException, where: Path, need: int) -> bool:
    """Whether `err`, raised while writing `need` bytes under `where`, is the disk's doing (an
    OSError; safetensors' and torch.save's own errors for a full disk) rather than a bug."""
    if isinstance(err, OSError) or "os error" in str(err).lower():
        return True
    try:
        return shutil.disk_usage(where).free < need + MARGIN
    except OSError:
        return True


def save_checkpoint(run_dir: Path, step: int, policy, trainer_state: dict[str, Any],
                    keep: int = 2, dist: Dist | None = None,
                    sharded: dict[str, Any] | None = None) -> Path:
    """Write checkpoints/step-N atomically; keep the newest `keep` complete ones.

    Every rank calls it. `sharded` (FSDP2: the model's and optimizer's sharded state dicts,
    `sharded_state`) is written by every rank into `sharded/`; rank 0 writes the rest and the
    marker. A disk too full for it is found before anything is written; a write that still
    fails for space removes the partial dir and says so.
    """
    dist = dist or Dist()
    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    error = None
    if dist.main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            check_space(root, needed_bytes(policy.model, 2))
            tmp.mkdir()
        except CheckpointError as err:
            error = str(err)
    error = dist.gather(error)[0]
    if error:
        raise CheckpointError(error)
    try:
        policy.save(tmp, main=dist.main)
        if sharded is not None:
            import torch.distributed.checkpoint as dcp

            dcp.save(sharded, checkpoint_id=tmp / "sharded")
        dist.barrier()
        if dist.main:
            write_trainer_state(tmp, trainer_state)
            (tmp / MARKER).write_text(f"step {step}\n")
            _fsync_dir(tmp)
    except Exception as err:   # noqa: BLE001 -- safetensors and torch.save report a full disk
        if not write_failure(err, root, needed_bytes(policy.model, 2)):   # as their own errors
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(root).free
        full = (getattr(err, "errno", None) == errno.ENOSPC or "os error 28" in str(err)
                or free < MARGIN)
        why = "no space left" if full else (str(err).strip() or type(err).__name__).splitlines()[0]
        raise CheckpointError(f"cannot write step-{step} in {root}: {why} ({free / 2**20:,.0f} "
                              "MB free now); the partial checkpoint was removed and the earlier "
                              "ones are intact") from None
    if dist.main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)
        for old in complete_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """FSDP2 model and optimizer state as DCP saves and loads it (each rank its shard)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def load_sharded(ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore FSDP2 model and optimizer shards from `ckpt/sharded` (any world size)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = sharded_state(model, optimizer)
    dcp.load(state, checkpoint_id=Path(ckpt) / "sharded")
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


def _fsync_dir(path: Path) -> None:
    for f in path.iterdir() if path.is_dir() else []:
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = []
    for d in root.iterdir() if root.is_dir() else []:
        m = _STEP_DIR.match(d.name)
        if m and (d / MARKER).is_file() and (d / STATE_TENSORS).is_file():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint; removes half-written leftovers."""
    root = Path(run_dir) / "checkpoints"
    for d in root.glob(".tmp-step-*") if root.is_dir() else []:
        shutil.rmtree(d, ignore_errors=True)
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def _split(value: Any, tensors: list[torch.Tensor]) -> Any:
    """`value` with every tensor replaced by {"__tensor__": i}, its index in `tensors`; what
    remains must be JSON."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {"__tensor__": len(tensors) - 1}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            # optimizer states are keyed by int parameter ids; JSON keys are strings
            return {"__intkeys__": [[k, _split(v, tensors)] for k, v in value.items()]}
        return {k: _split(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_split(v, tensors) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"trainer state holds a {type(value).__name__}, which a checkpoint cannot "
                    "store without pickling; keep trainer state to tensors and plain data")


def _join(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__tensor__"}:
            return tensors[value["__tensor__"]]
        if set(value) == {"__intkeys__"}:
            return {k: _join(v, tensors) for k, v in value["__intkeys__"]}
        return {k: _join(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_join(v, tensors) for v in value]
    return value


def _from_old(state: dict[str, Any]) -> dict[str, Any]:
    """An old-format state's RNG entries (the tuples `random` and NumPy return) as this format's."""
    for r in state.get("rng", []):
        if isinstance(r.get("python"), tuple):
            version, words, gauss = r["python"]
            r["python"] = {"version": version, "state": list(words), "gauss": gauss}
        if isinstance(r.get("numpy"), tuple):
            name, key, pos, has_gauss, cached = r["numpy"]
            r["numpy"] = {"name": name, "key": torch.from_numpy(key.astype(np.int64)),
                          "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)}
    return state


def write_trainer_state(ckpt: Path, state: dict[str, Any]) -> None:
    """`state` as `trainer_state.json` (plain data) and `trainer_state.pt` (a list of tensors)."""
    tensors: list[torch.Tensor] = []
    plain = {"format": STATE_FORMAT, "state": _split(state, tensors)}
    torch.save(tensors, Path(ckpt) / STATE_TENSORS)
    (Path(ckpt) / STATE_JSON).write_text(json.dumps(plain))


def load_trainer_state(ckpt: Path, trust: bool = False) -> dict[str, Any]:
    """The trainer state of `ckpt`, read without unpickling anything but tensors.

    A checkpoint of the old format (a pickled `trainer_state.pt` without `trainer_state.json`)
    is refused unless `trust` — it is read then as it was written, code and all.
    """
    ckpt = Path(ckpt)
    tensors_file, plain_file = ckpt / STATE_TENSORS, ckpt / STATE_JSON
    if not plain_file.is_file():
        if trust:
            return _from_old(torch.load(tensors_file, map_location="cpu", weights_only=False))
        raise UntrustedCheckpointError(
            f"{tensors_file} is a trainer state of the old format, a Python pickle: loading it "
            "runs whatever code it holds, and run dirs are shared and downloaded. If you wrote "
            "this run yourself, resume once with --trust-checkpoint (train(..., "
            "trust_checkpoint=True)); its next checkpoint is written in the safe format")
    try:
        tensors = torch.load(tensors_file, map_location="cpu", weights_only=True)
    except Exception as err:                          # an UnpicklingError names what it refused
        raise UntrustedCheckpointError(
            f"{tensors_file} holds more than tensors and was not loaded (it may carry code; "
            f"torch said: {str(err).splitlines()[0]}). Resume from a checkpoint you trust") from None
    try:
        plain = json.loads(plain_file.read_text())
        if not isinstance(tensors, list) or plain.get("format") != STATE_FORMAT:
            raise ValueError(f"format {plain.get('format')!r}, {type(tensors).__name__} of tensors")
        return _join(plain["state"], tensors)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
        raise UntrustedCheckpointError(f"{ckpt}: its trainer state is not one mmrlvr wrote "
                                       f"({err}); resume from another checkpoint") from None
