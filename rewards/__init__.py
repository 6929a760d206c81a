"""Rewards: verifiers and reward functions, found by name.

A reward scores a whole group at once: `score(example, completions) -> list[dict]`, one dict per
completion holding `overall` and any named components (all logged). A plain function
`fn(example, completion) -> float | dict` is lifted to that form. A user's own reward loads from
`path/to/file.py:function` (EasyR1's convention).

`rewards.get` returns the reward itself. `rewards.base.build_combined` (what the trainer uses)
isolates every user reward: a timeout per call (`timeout_s`, default 30), and exceptions, wrong
return types and non-finite values score `failure_value` (default 0) and are counted as the
components `failed` and `failed_<kind>`; `Combined.all_failed` and `RewardError` let the run stop
on a reward that fails every time or hangs. Built-in rewards run inline, as written.

    import rewards
    acc = rewards.get("accuracy")
    acc.score(example, ["<think>...</think><answer>3</answer>"])  # [{'overall': 1.0, ...}]
"""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Callable

from rewards.base import Reward, RewardError, lift

_REGISTRY: dict[str, Callable[..., Reward]] = {}
_BUILTIN_MODULES = ("rewards.accuracy", "rewards.format", "rewards.pirl", "rewards.struct_steps",
                    "rewards.audio_rubrics", "rewards.translation")


def register(name: str):
    """Class or function decorator: make `rewards.get(name, **options)` build it."""
    def wrap(factory):
        _REGISTRY[name] = factory
        return factory
    return wrap


def _load_builtins() -> None:
    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)


def _load_user(spec: str) -> Callable:
    path, _, func = spec.rpartition(":")
    file = Path(path)
    if not file.is_file():
        raise KeyError(f"reward {spec!r}: file {file} not found")
    module_spec = importlib.util.spec_from_file_location(f"mmrlvr_user_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, func):
        raise KeyError(f"reward {spec!r}: {file} defines no '{func}'")
    return getattr(module, func)


def get(name: str, **options: Any) -> Reward:
    """Build the reward registered as `name`, or load `file.py:function` (lifted if plain)."""
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name](**options)
    if ".py:" in name:
        obj = _load_user(name)
        if isinstance(obj, type):
            return obj(**options)
        if hasattr(obj, "score"):
            return obj
        return lift(obj, name=name, **options)
    raise KeyError(f"unknown reward {name!r}; registered: {sorted(_REGISTRY)} "
                   "(or give 'path/to/file.py:function')")


def names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


__all__ = ["Reward", "RewardError", "get", "lift", "names", "register"]
