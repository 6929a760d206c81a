"""The group-scoring reward interface and the weighted combination the trainer uses.

A reward scores a whole group: `score(example, completions, progress) -> list[dict]`, one dict
per completion with `overall` and named components. `build_combined` builds the configured
rewards: a user's own (`path/file.py:function`, in any convention `rewards.conventions` knows)
runs `Isolated` (`rewards.isolation`: a timeout per call, failures scored and counted); a built-in
one runs inline. `Combined.score_groups` scores a step's groups together, so an async reward's
calls for all of them run at once; `Combined.score` is the same for one group.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from mmrlvr.core.types import Reward
from mmrlvr.data import Example
from rewards.conventions import Group, UserReward, lift
from rewards.isolation import FAILURE_KINDS, Isolated, RewardError, ScoresGroups
from rewards.process import Worker

__all__ = ["FAILURE_KINDS", "WRAPPER_KEYS", "Combined", "Isolated", "Reward", "RewardError",
           "build_combined", "lift"]

WRAPPER_KEYS = ("timeout_s", "failure_value", "isolation", "memory_mb")
"""A reward spec's keys that `Isolated` takes; the reward never sees them."""


class Combined(ScoresGroups):
    """Weighted sum of several rewards; every component is kept under `name/component`
    (`score` of one group: the weighted total and every part's components)."""

    def __init__(self, parts: list[tuple[str, float, Reward]]):
        if not parts:
            raise ValueError("at least one reward is needed")
        self.parts = parts

    def score_groups(self, examples: list[Example], groups: list[list[str]], progress: float = 0.0,
                     completion_ids: list[list[list[int]]] | None = None
                     ) -> list[list[dict[str, float]]]:
        """`score` for each (example, group) pair: one list of dicts per group. A user reward's
        async calls for all the groups run at once; everything else runs group by group."""
        totals = [[dict(overall=0.0) for _ in group] for group in groups]
        for name, weight, reward in self.parts:
            if isinstance(reward, ScoresGroups):      # all groups in one call (async rewards)
                scored = reward.score_groups(examples, groups, progress, completion_ids)
            else:
                scored = [reward.score(ex, group, progress=progress)
                          for ex, group in zip(examples, groups)]
            for example, group, scores, rows in zip(examples, groups, scored, totals):
                if len(scores) != len(group):
                    raise ValueError(f"reward {name} returned {len(scores)} scores for "
                                     f"{len(group)} completions (example {example.id})")
                for total, s in zip(rows, scores):
                    total["overall"] += weight * s["overall"]
                    total[name] = s["overall"]
                    for key, value in s.items():
                        if key != "overall":
                            total[f"{name}/{key}"] = value
        return totals

    def all_failed(self, scores: list[list[dict[str, float]]]) -> str | None:
        """Given a step's scores (one list of dicts per group, from `score`): a message naming
        the reward and its first traceback when an isolated reward failed on every completion,
        else None. The trainer stops the run with it: such a reward is broken, not unlucky."""
        rows = [s for group in scores for s in group]
        for name, _, reward in self.parts:
            if rows and isinstance(reward, Isolated) and all(s[f"{name}/failed"] for s in rows):
                kinds = {kind: int(sum(s[f"{name}/failed_{kind}"] for s in rows))
                         for kind in FAILURE_KINDS}
                return reward.failure_message(len(rows), kinds)
        return None


def build_combined(specs: list[dict[str, Any]], error_log: str | Path | None = None) -> Combined:
    """From config: `[{name, weight, label?, style?, timeout_s?, failure_value?, ...options}]`.

    User rewards (`file.py:function`, `module:function`, a callable the Python API passes, one
    registered from outside mmrlvr's packages) are always `Isolated`; a built-in one only when its
    spec sets one of the wrapper's keys: `timeout_s`, `failure_value`, `isolation` (`thread`, the
    default, or `process`: a worker process of its own, `rewards.process`) and `memory_mb` (the
    worker's cap). `style` names the calling convention (`rewards.conventions`; found from the
    signature when left out); the other options go to the reward. `error_log`: the JSONL file
    for the first failures of each isolated reward.
    """
    import rewards

    parts = []
    for spec in specs:
        spec = dict(spec)
        name = spec.pop("name")
        weight = float(spec.pop("weight", 1.0))
        label = spec.pop("label", None) or name.rpartition(":")[2]
        isolation = {key: spec.pop(key) for key in WRAPPER_KEYS if key in spec}
        style = spec.pop("style", None)
        reward = rewards.get(name, style=style, **spec)
        if not rewards.is_builtin(name) or isolation:
            calls = reward if isinstance(reward, UserReward) else Group(reward, label)
            where = isolation.pop("isolation", "thread")
            memory_mb = isolation.pop("memory_mb", None)
            if where not in ("thread", "process"):
                raise ValueError(f"reward {label}: isolation must be 'thread' or 'process', "
                                 f"got {where!r}")
            if where == "process":             # the worker builds the reward as it is built here
                isolation["worker"] = Worker(label, functools.partial(
                    rebuild, name, style, spec, label), memory_mb)
            elif memory_mb is not None:
                raise ValueError(f"reward {label}: memory_mb caps a worker process; it needs "
                                 "isolation: process")
            reward = Isolated(calls, label, error_log=error_log, **isolation)
        parts.append((label, weight, reward))
    return Combined(parts)


def rebuild(name: str, style: str | None, options: dict[str, Any],
            label: str) -> tuple[Any, bool]:
    """In a reward's worker process: the function `Isolated` calls, and whether it is async."""
    import rewards

    reward = rewards.get(name, style=style, **options)
    calls = reward if isinstance(reward, UserReward) else Group(reward, label)
    return calls.fn, calls.is_async
