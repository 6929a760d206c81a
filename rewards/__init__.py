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

import importlib.util
from pathlib import Path
from typing import Any, Callable

from mmrlvr.core.registry import Registry, UnknownName
from rewards.base import Combined, Reward, RewardError, build_combined, lift

REWARDS = Registry("reward")
for _name, _target in {
        "accuracy": "rewards.accuracy:AccuracyReward",
        "format": "rewards.format:FormatReward",
        "pirl": "rewards.pirl:PirlReward",
        "struct_steps": "rewards.struct_steps:StructStepsReward",
        "audio_rubrics": "rewards.audio_rubrics:AudioRubricsReward",
        "translation": "rewards.translation:TranslationReward"}.items():
    REWARDS.register(_name, _target)

register = REWARDS.register
"""`@rewards.register("name")` on a reward class or function makes `rewards.get("name")` build it."""


def _load_user(spec: str) -> Callable:
    path, _, func = spec.rpartition(":")
    file = Path(path)
    if not file.is_file():
        raise UnknownName(f"reward {spec!r}: file {file} not found")
    module_spec = importlib.util.spec_from_file_location(f"mmrlvr_user_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, func):
        raise UnknownName(f"reward {spec!r}: {file} defines no '{func}'")
    return getattr(module, func)


def get(name: str, **options: Any) -> Reward:
    """Build the reward registered as `name`, or load `file.py:function` (lifted if plain)."""
    if ".py:" in name:
        obj = _load_user(name)
        if isinstance(obj, type):
            return obj(**options)
        if callable(getattr(obj, "score", None)):
            return obj
        return lift(obj, name=name, **options)
    factory = REWARDS.get(name)                 # an unknown name: an error naming the known ones
    if isinstance(factory, type):
        return factory(**options)
    return lift(factory, name=name, **options)  # a registered plain function


def names() -> list[str]:
    return REWARDS.names()


__all__ = ["REWARDS", "Combined", "Reward", "RewardError", "build_combined", "get", "lift", "names",
           "register"]
