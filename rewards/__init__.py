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

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from mmrlvr.core.registry import Registry, UnknownName
from rewards.base import WRAPPER_KEYS, Combined, Reward, RewardError, build_combined
from rewards import swift_standin
from rewards.conventions import STYLES, ConventionError, adapt, lift

REWARDS = Registry("reward")
DATA_CHECKS = Registry("reward data check")
"""Reward name -> `check(train_rows, reward_spec, run_dir)`, run once on the main rank when a run
starts, for a reward to report what the rows allow it to pay (e.g. `struct_steps`' reference
step agreement); methods register here."""
for _name, _target in {
        "accuracy": "rewards.accuracy:AccuracyReward",
        "format": "rewards.format:FormatReward",
        "consensus": "rewards.consensus:ConsensusReward",
        "overlong": "rewards.overlong:OverlongReward",
        "countdown": "rewards.countdown:CountdownReward",
        "turn_format": "rewards.turns:TurnFormatReward"}.items():
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
    swift_standin.install()                  # an ms-swift plugin's imports, without ms-swift
    sys.modules[module_name] = module        # dataclasses and pickle look modules up there
    try:
        module_spec.loader.exec_module(module)
    except ImportError as err:               # a package the file needs is not installed here
        sys.modules.pop(module_name, None)
        raise UnknownName(f"reward {spec!r}: {file} cannot be loaded: {_import_hint(err)}") from None
    return _attribute(module, func, spec, str(file))


def _import_hint(err: ImportError) -> str:
    missing = err.name or ""
    if missing == "swift" or missing.startswith("swift.") or "from 'swift" in str(err):
        return swift_standin.missing_name_hint(str(err))
    return f"{err} (install the package it names, e.g. pip install {missing.split('.')[0]})" \
        if missing else str(err)


def _attribute(module: Any, func: str, spec: str, where: str) -> Any:
    """`func` of a loaded module: an attribute path (`Class.method` too), else a name its ms-swift
    `orms` registry holds (`orms['my_reward'] = MyReward`)."""
    obj: Any = module
    for part in func.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            break
    if obj is not None:
        return obj
    registry = getattr(module, "orms", None)
    if isinstance(registry, dict) and func in registry:
        return registry[func]
    raise UnknownName(f"reward {spec!r}: {where} defines no '{func}'")


def _import_path(spec: str) -> Any:
    """`package.module:function` (or `:Class`), imported like any module."""
    module_name, _, func = spec.rpartition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UnknownName(f"reward {spec!r}: cannot import {module_name!r} ({err}); give a "
                          "registered name, path/to/file.py:function or an importable "
                          "module:function") from None
    return _attribute(module, func, spec, f"module {module_name}")


PYTHON = "python:"
"""The name prefix under which the Python API records a reward callable it found no import
path for (a lambda, a closure, a function typed into a notebook)."""

_supplied: dict[str, Any] = {}


@contextlib.contextmanager
def supplied(objects: dict[str, Any]) -> Iterator[None]:
    """While inside, `get(name)` returns the object given for `name` instead of loading it: the
    Python API passes a script's reward callables to a run this way, under the names its
    config.yaml records them by (`module:function`, `file.py:function` or `python:NAME`)."""
    clash = {n for n in objects if n in _supplied and _supplied[n] is not objects[n]}
    if clash:
        raise RuntimeError(f"rewards {sorted(clash)} are already given by another run in this "
                           "process; run one trainer at a time")
    _supplied.update(objects)
    try:
        yield
    finally:
        for name in objects:
            _supplied.pop(name, None)


def is_import_path(name: str) -> bool:
    """`module.sub:attribute` (not a registered name, not a file)."""
    module, sep, attr = name.rpartition(":")
    return bool(sep and module and attr) and ".py:" not in name and not name.startswith(PYTHON) \
        and all(part.isidentifier() for part in module.split("."))


def get(name: str, style: str | None = None, **options: Any) -> Reward:
    """Build the reward registered as `name`, or load `file.py:function` or `module:function` (a
    function, a class or an object), called in the convention its signature shows or `style`
    names (`rewards.conventions.STYLES`); `options` go to the class or to each call."""
    if name in _supplied:
        obj = _supplied[name]
    elif name.startswith(PYTHON):
        raise UnknownName(
            f"reward {name!r} was a Python callable given to mmrlvr's GRPOTrainer, which has no "
            "import path to load it from here; continue the run from Python with "
            "GRPOTrainer.resume(RUN_DIR, reward_funcs=[...the same functions...]), or define the "
            "function in an importable module or at the top level of a script whose training "
            "runs under `if __name__ == \"__main__\":` (docs/api.md)")
    elif ".py:" in name:
        obj = _load_user(name)
    elif is_import_path(name):
        obj = _import_path(name)
    else:
        obj = REWARDS.get(name)        # unknown: names the known
    return adapt(obj, name, style, **options)


OWN_PACKAGES = ("rewards", "mmrlvr", "modalities")
"""Packages whose registered rewards run inline (trusted); a reward registered from anywhere
else is a user's and runs isolated, as a file reward does."""


def is_builtin(name: str) -> bool:
    """`name` is registered and its reward lives in one of `OWN_PACKAGES`."""
    if name in _supplied or ":" in name or name not in REWARDS:
        return False
    module = getattr(REWARDS.get(name), "__module__", "") or ""
    return module.split(".")[0] in OWN_PACKAGES


def names() -> list[str]:
    return REWARDS.names()


__all__ = ["PYTHON", "REWARDS", "STYLES", "WRAPPER_KEYS", "Combined", "ConventionError", "Reward",
           "RewardError", "build_combined", "get", "is_builtin", "is_import_path", "lift", "names", "register",
           "supplied"]
