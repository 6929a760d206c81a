"""`reward_funcs` of the Python API as the config's reward specs, and the callables behind them.

A run dir records its rewards by name in config.yaml, so a callable is recorded by the import
path that loads it again: `package.module:function` for a function of an importable module,
`/abs/path/script.py:function` for one defined at the top level of a script that trains under
`if __name__ == "__main__":` (loading the file then defines the function without training), and
`python:NAME` for anything else (a lambda, a closure, a function of a script without that guard,
an object). While the API's run lasts the callables themselves are handed to the reward loader
(`rewards.supplied`), so a script's reward is never re-imported inside its own run, and every one
of them runs `Isolated` exactly as a `file.py:function` reward does. A `python:` reward is
resumed only through `GRPOTrainer.resume(run_dir, reward_funcs=[...])`.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import rewards
from mmrlvr.config import ConfigError

SPEC_KEYS = ("name", "weight")


def _script_defines(path: Path, name: str) -> bool:
    """Whether loading `path` as a module defines `name` without running its training: the
    file guards its work with `if __name__ == "__main__":` and defines `name` outside it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    guarded, defined = False, set()
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) \
                and "__name__" in ast.unparse(node.test):
            guarded = True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return guarded and name in defined


def import_path(obj: Any) -> str | None:
    """The name that loads `obj` again in another process, or None (module docstring)."""
    target = obj if inspect.isfunction(obj) or inspect.isclass(obj) else None
    if target is None:
        return None
    qualname = getattr(target, "__qualname__", "")
    if "<" in qualname or "." in qualname:          # a lambda, a closure, a method
        return None
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    if module is None or getattr(module, qualname, None) is not target:
        return None
    file = getattr(module, "__file__", None)
    if module.__name__.startswith("mmrlvr_user_reward_") and file:     # loaded from its file
        return f"{Path(file).resolve()}:{qualname}"
    if module.__name__ == "__main__":
        if file and Path(file).is_file() and _script_defines(Path(file), qualname):
            return f"{Path(file).resolve()}:{qualname}"
        return None
    try:
        if getattr(importlib.import_module(module.__name__), qualname, None) is target:
            return f"{module.__name__}:{qualname}"
    except ImportError:
        pass
    return None


def _label_of(obj: Any, index: int) -> str:
    target = obj.func if isinstance(obj, functools.partial) else obj
    name = getattr(target, "__name__", None) or type(target).__name__
    return name if name.isidentifier() else f"reward_{index}"


def reward_specs(reward_funcs: Any, weights: Any = None
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`reward_funcs` (a callable, a name, a spec dict, `(callable or name, weight)`, or a list of
    these) as config specs `[{name, weight, label?, ...}]`, and the objects to supply for names
    (`rewards.supplied`). `weights` (TRL's `reward_weights`) sets each weight in order."""
    items = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) and not \
        _is_pair(reward_funcs) else [reward_funcs]
    if not items:
        raise ConfigError("reward_funcs is empty: GRPO needs at least one reward (a function, "
                          "a registered name such as 'accuracy', or path/file.py:function)")
    if weights is not None and len(list(weights)) != len(items):
        raise ConfigError(f"reward_weights has {len(list(weights))} weights for {len(items)} "
                          "reward_funcs; give one weight per reward")
    specs, objects, labels = [], {}, set()
    for i, item in enumerate(items):
        spec, obj = _one(item, i)
        if weights is not None:
            spec["weight"] = float(list(weights)[i])
        label = spec.get("label") or spec["name"].rpartition(":")[2]
        while label in labels:                       # two rewards named alike: keep both apart
            label = f"{label}_{i}"
        if label != spec["name"].rpartition(":")[2]:
            spec["label"] = label
        labels.add(label)
        if obj is not None:
            if spec.get("isolation") == "process" and spec["name"].startswith(rewards.PYTHON):
                raise ConfigError(f"reward {label}: isolation: process rebuilds the reward in a "
                                  "fresh interpreter, which cannot import this callable (a lambda, "
                                  "closure or unguarded script function); define it in a module "
                                  "or drop isolation: process")
            objects[spec["name"]] = obj
        specs.append(spec)
    return specs, objects


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], (int, float)) \
        and not isinstance(item[1], bool)


def _one(item: Any, index: int) -> tuple[dict[str, Any], Any]:
    """One reward_funcs entry as (spec, the object to supply or None)."""
    weight = 1.0
    if _is_pair(item):
        item, weight = item
    if isinstance(item, dict):
        spec = dict(item)
        if "name" not in spec:
            raise ConfigError(f"reward_funcs[{index}] is a mapping without 'name': give "
                              "{'name': my_function_or_name, 'weight': 1.0, ...options}")
        spec.setdefault("weight", weight)
        item = spec.pop("name")
    else:
        spec = {"weight": weight}
    if isinstance(item, str):
        return {"name": item, **spec}, None
    if not callable(item):
        raise ConfigError(f"reward_funcs[{index}] is {type(item).__name__} {item!r}: give a "
                          "function (any convention of rewards/conventions.py), an ORM class or "
                          "object, a registered name or path/file.py:function")
    label = _label_of(item, index)
    name = import_path(item) or f"{rewards.PYTHON}{label}"
    return {"name": name, **spec}, item


def label_of(spec: dict[str, Any]) -> str:
    """The label a spec's reward logs under (`reward/<label>`), as `build_combined` names it."""
    return spec.get("label") or spec["name"].rpartition(":")[2]


def rebind(saved: list[dict[str, Any]], reward_funcs: Any, run_dir: Path
           ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """For a resume: the run's own specs (weights and options as saved), with the callables of
    `reward_funcs` supplied for the saved names they match by label. A saved `python:` reward
    left without one, or a callable the run never had, is a ConfigError naming both lists."""
    given: dict[str, Any] = {}
    if reward_funcs is not None:
        specs, objects = reward_specs(reward_funcs)
        by_name = {s["name"]: label_of(s) for s in specs}
        given = {by_name[name]: obj for name, obj in objects.items()}
    labels = [label_of(s) for s in saved]
    unknown = sorted(set(given) - set(labels))
    if unknown:
        raise ConfigError(f"{run_dir} was trained with the rewards {labels}; reward_funcs gives "
                          f"{unknown} besides, which the run did not have (a resume keeps its "
                          "rewards; start a new run to change them)")
    objects, missing = {}, []
    for spec, label in zip(saved, labels):
        if label in given:
            objects[spec["name"]] = given[label]
        elif spec["name"].startswith(rewards.PYTHON):
            missing.append(label)
    if missing:
        raise ConfigError(f"{run_dir}: the rewards {missing} were Python callables with no import "
                          f"path; pass them again: GRPOTrainer.resume({str(run_dir)!r}, "
                          f"reward_funcs=[{', '.join(missing)}, ...])")
    return saved, objects
