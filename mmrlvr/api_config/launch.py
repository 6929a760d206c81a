"""`accelerate launch` for an API script: which forms start the processes the trainer joins.

The trainer's distributed init (`mmrlvr.train.parallel.init`) reads torchrun's RANK and
WORLD_SIZE. `accelerate launch --multi_gpu --num_processes N` is torchrun underneath and sets
them, on GPUs or (gloo) on CPU. Without `--multi_gpu` (with `--cpu`, or where fewer than two
GPUs are visible) accelerate starts ONE process, with no RANK, WORLD_SIZE, nor the process
count asked for, which would then train the whole run alone as if N had been started. Its
child can tell only from its parent's command line; `refuse_lone_launch` reads it and says
what to launch with instead, before anything is written.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["refuse_lone_launch"]


def refuse_lone_launch() -> None:
    """Refuse a script that `accelerate launch --num_processes N` (N > 1) started alone."""
    if "WORLD_SIZE" in os.environ or "ACCELERATE_USE_CPU" not in os.environ:
        return                   # torchrun (or accelerate's torchrun), or not accelerate at all
    asked = asked_processes(parent_command())
    if asked > 1:
        from mmrlvr.train.parallel import LaunchError

        raise LaunchError(
            f"accelerate launch --num_processes {asked} started this script as one process: "
            "without --multi_gpu (with --cpu, or with fewer GPUs than processes) accelerate "
            "starts a single process and sets no RANK or WORLD_SIZE, so it would train the "
            f"whole run alone. Launch it with torchrun --nproc_per_node {asked} SCRIPT (gloo "
            f"on CPU), or accelerate launch --multi_gpu --num_processes {asked} SCRIPT, which "
            "runs torchrun (on CPU too)")


def parent_command() -> list[str]:
    """The parent process's command line (Linux's /proc; elsewhere [], and no check)."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def asked_processes(argv: list[str]) -> int:
    """The process count an accelerate launch command line asks for (1 when it names none)."""
    for i, arg in enumerate(argv):
        if arg.split("=", 1)[0] in ("--num_processes", "--num-processes"):
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() else 1
    return 1
