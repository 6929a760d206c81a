"""Launchers the trainer cannot use, refused before anything loads or is written: accelerate's
DeepSpeed and FSDP plugins, and an `accelerate launch` that started one process for N.

The trainer's distributed init (`mmrlvr.train.parallel.init`, for `mmrlvr train` and the Python API
alike) reads torchrun's RANK and WORLD_SIZE. `accelerate launch --multi_gpu --num_processes N` is
torchrun underneath and sets them, on GPUs or (gloo) on CPU. Without `--multi_gpu` (with `--cpu`,
or where fewer than two GPUs are visible) accelerate starts ONE process, with no RANK, WORLD_SIZE,
nor the process count asked for, which would then train the whole run alone as if N had been
started. Its child can tell only from its parent's command line, or from the accelerate config file
that command line names (or accelerate's default one) where it gives no --num_processes;
`refuse_lone_launch` reads them and says what to launch with instead.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

__all__ = ["LaunchError", "refuse_lone_launch", "refuse_unsupported_launch"]


class LaunchError(RuntimeError):
    """A launcher, engine or world size this run cannot use; the message says what to do."""


def refuse_unsupported_launch() -> None:
    """DeepSpeed and accelerate's FSDP plugin would wrap the model behind our back: say so."""
    env = {k: os.environ.get(k, "").lower() for k in ("ACCELERATE_USE_DEEPSPEED",
                                                          "ACCELERATE_USE_FSDP")}
    if env["ACCELERATE_USE_DEEPSPEED"] == "true":
        raise LaunchError("DeepSpeed is not supported: mmrlvr shards with FSDP2 itself. Launch with "
                          "a plain multi-GPU accelerate config (configs/accelerate/) or torchrun, "
                          "and set train.strategy: fsdp2")
    if env["ACCELERATE_USE_FSDP"] == "true":
        raise LaunchError("accelerate's FSDP plugin is not used: mmrlvr applies FSDP2 itself. Launch "
                          "with a plain multi-GPU accelerate config (configs/accelerate/) or "
                          "torchrun, and set train.strategy: fsdp2")


def refuse_lone_launch() -> None:
    """Refuse a script that `accelerate launch --num_processes N` (N > 1) started alone."""
    if "WORLD_SIZE" in os.environ or "ACCELERATE_USE_CPU" not in os.environ:
        return                   # torchrun (or accelerate's torchrun), or not accelerate at all
    asked = asked_processes(parent_command())
    if asked > 1:
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


def flag(argv: list[str], *names: str) -> str | None:
    """The value of a `--name V` or `--name=V` flag in a command line (None when absent)."""
    for i, arg in enumerate(argv):
        if arg.split("=", 1)[0] in names:
            if "=" in arg:
                return arg.split("=", 1)[1]
            return argv[i + 1] if i + 1 < len(argv) else ""
    return None


def asked_processes(argv: list[str]) -> int:
    """The process count an accelerate launch asks for: its --num_processes, else the
    num_processes of the config file it reads (--config_file, else accelerate's default file);
    1 when neither names one."""
    value = flag(argv, "--num_processes", "--num-processes")
    path = flag(argv, "--config_file", "--config-file")
    if value is None and (path is not None or "--cpu" not in argv):   # accelerate's own rule
        value = str(config_file(path).get("num_processes", 1))
    return int(value) if value is not None and value.isdigit() else 1


def config_file(path: str | None) -> dict:
    """An accelerate config file's settings: PATH, else accelerate's default file
    ($HF_HOME/accelerate/default_config.yaml, HF_HOME defaulting to ~/.cache/huggingface);
    {} when there is none or it does not read as a mapping (accelerate reports a broken one)."""
    if path is None:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
        path = os.path.join(os.path.expanduser(home), "accelerate", "default_config.yaml")
    try:
        settings = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return settings if isinstance(settings, dict) else {}
