"""Layer 4: synthetic tasks with verifiable answers, found by name (`mmrlvr data NAME`), and
converters of public releases into the same JSONL.

Each task module defines `TASK`: how to make the synthetic set from the CLI's options and, where
a public layout exists, how to convert it (`--from LAYOUT:PATH`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mmrlvr.core.registry import Registry


@dataclass(frozen=True)
class TaskOptions:
    """What `mmrlvr data` passes a task; each task reads the options that apply to it."""

    n_train: int = 2000
    n_test: int = 200
    seed: int = 0
    image_size: int = 112
    families: list[str] | None = None
    compact: bool = False
    ood: bool = False
    """shapes: also write test_ood.jsonl, a shifted test split (`mmrlvr.tasks.shapes_ood`)."""


@dataclass(frozen=True)
class Task:
    description: str
    make: Callable[[Path, TaskOptions], dict[str, Any]]
    """Write the synthetic set to a dir; returns its info dict."""
    convert: Callable[[str, Path], dict[str, Any]] | None = None
    """Convert a public release (`LAYOUT:PATH`) to JSONL in a dir; None where there is none."""
    layouts: tuple[str, ...] = field(default_factory=tuple)


TASKS = Registry("data task")
TASKS.register("shapes", "mmrlvr.tasks.shapes_ood:TASK")   # shapes.py + --ood
TASKS.register("medvqa", "mmrlvr.tasks.medvqa:TASK")
TASKS.register("tones", "mmrlvr.tasks.tones:TASK")
TASKS.register("banners", "mmrlvr.tasks.banners:TASK")
TASKS.register("motion", "mmrlvr.tasks.motion:TASK")
TASKS.register("arith", "mmrlvr.tasks.arith:TASK")
TASKS.register("zoom", "mmrlvr.tasks.zoom:TASK")      # multi-turn tools (docs/tools.md)
TASKS.register("clip", "mmrlvr.tasks.clip:TASK")      # multi-turn tools, audio (docs/tools.md)

__all__ = ["TASKS", "Task", "TaskOptions"]
