"""Rewards: verifiers and reward functions, found by name.

A reward scores a whole group at once: `score(example, completions) -> list[dict]`, one dict per
completion holding `overall` and any named components (all logged). A user's own reward loads
from `path/to/file.py:function` (EasyR1's convention) and may be written for mmrlvr, TRL, EasyR1
or ms-swift: `rewards.conventions` finds which from its signature (or `style:` names it) and
calls it that way; a plain `fn(example, completion) -> float | dict` is lifted to the group form.

`rewards.get` returns the reward itself. `rewards.base.build_combined` (what the trainer uses)
isolates every user reward (`rewards.isolation`): a timeout per call (`timeout_s`, default 30),
and exceptions, wrong return types and non-finite values score `failure_value` (default 0) and
are counted as the components `failed` and `failed_<kind>`; `Combined.all_failed` and
`RewardError` let the run stop on a reward that fails every time or hangs. Built-in rewards run
inline, as written.

    import rewards
    acc = rewards.get("accuracy")
    acc.score(example, ["<think>...</think><answer>3</answer>"])  # [{'overall': 1.0, ...}]
    mine = rewards.get("my_rewards.py:accuracy_reward")   # a TRL function: found by signature
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from mmrlvr.core.registry import Registry, UnknownName
from rewards.base import Combined, Reward, RewardError, build_combined
from rewards.conventions import STYLES, ConventionError, adapt, lift

REWARDS = Registry("reward")
for _name, _target in {
        "accuracy": "rewards.accuracy:AccuracyReward",
        "format": "rewards.format:FormatReward",
        "consensus": "rewards.consensus:ConsensusReward",
        "overlong": "rewards.overlong:OverlongReward",
        "countdown": "rewards.countdown:CountdownReward"}.items():
    REWARDS.register(_name, _target)

register = REWARDS.register
"""`@rewards.register("name")` on a reward class or function makes `rewards.get("name")` build it."""


def _load_user(spec: str) -> Callable:
    path, _, func = spec.rpartition(":")
    file = Path(path)
    if not file.is_file():
        raise UnknownName(f"reward {spec!r}: file {file} not found")
    module_name = f"mmrlvr_user_reward_{file.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module        # dataclasses and pickle look modules up there
    module_spec.loader.exec_module(module)
    if not hasattr(module, func):
        raise UnknownName(f"reward {spec!r}: {file} defines no '{func}'")
    return getattr(module, func)


def get(name: str, style: str | None = None, **options: Any) -> Reward:
    """Build the reward registered as `name`, or load `file.py:function` (a function, a class or
    an object), called in the convention its signature shows or `style` names
    (`rewards.conventions.STYLES`); `options` go to the class or to each call."""
    obj = _load_user(name) if ".py:" in name else REWARDS.get(name)   # unknown: names the known
    return adapt(obj, name, style, **options)


def names() -> list[str]:
    return REWARDS.names()


__all__ = ["REWARDS", "STYLES", "Combined", "ConventionError", "Reward", "RewardError",
           "build_combined", "get", "lift", "names", "register"]
