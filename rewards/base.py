"""The group-scoring reward interface and the weighted combination the trainer uses."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from mmrlvr.data import Example


class Reward(Protocol):
    name: str

    def score(self, example: Example, completions: list[str]) -> list[dict[str, float]]:
        """One dict per completion with `overall` and any named components."""


class _Lifted:
    """A per-completion function lifted to the group interface."""

    def __init__(self, fn: Callable[..., Any], name: str, **options: Any):
        self.fn, self.name, self.options = fn, name, options

    def score(self, example: Example, completions: list[str]) -> list[dict[str, float]]:
        out = []
        for text in completions:
            value = self.fn(example, text, **self.options)
            if isinstance(value, dict):
                if "overall" not in value:
                    raise ValueError(f"reward {self.name} returned a dict without 'overall'")
                out.append({k: float(v) for k, v in value.items()})
            else:
                out.append({"overall": float(value)})
        return out


def lift(fn: Callable[..., Any], name: str | None = None, **options: Any) -> _Lifted:
    """Wrap `fn(example, completion, **options) -> float | dict` as a group reward."""
    return _Lifted(fn, name or getattr(fn, "__name__", "reward"), **options)


class Combined:
    """Weighted sum of several rewards; every component is kept under `name/component`."""

    def __init__(self, parts: list[tuple[str, float, Reward]]):
        if not parts:
            raise ValueError("at least one reward is needed")
        self.parts = parts

    def set_progress(self, progress: float) -> None:
        """Tell rewards that anneal (e.g. PIRL's r_mid) how far training is, in [0, 1]."""
        for _, _, reward in self.parts:
            if hasattr(reward, "set_progress"):
                reward.set_progress(progress)

    def score(self, example: Example, completions: list[str]) -> list[dict[str, float]]:
        totals = [dict(overall=0.0) for _ in completions]
        for name, weight, reward in self.parts:
            scores = reward.score(example, completions)
            if len(scores) != len(completions):
                raise ValueError(f"reward {name} returned {len(scores)} scores for "
                                 f"{len(completions)} completions (example {example.id})")
            for total, s in zip(totals, scores):
                total["overall"] += weight * s["overall"]
                total[name] = s["overall"]
                for key, value in s.items():
                    if key != "overall":
                        total[f"{name}/{key}"] = value
        return totals


def build_combined(specs: list[dict[str, Any]]) -> Combined:
    """From config: `[{name, weight, ...options}]` -> Combined."""
    import rewards

    parts = []
    for spec in specs:
        spec = dict(spec)
        name = spec.pop("name")
        weight = float(spec.pop("weight", 1.0))
        label = spec.pop("label", None) or name.rpartition(":")[2]
        parts.append((label, weight, rewards.get(name, **spec)))
    return Combined(parts)
