"""Auxiliary objectives added to the GRPO loss (PIRL consistency, PWSD, recycling, ...).

An objective is built from a config entry `{name, weight, ...options}` and called once per
update with the step's context; it returns a scalar loss (already scaled for the batch) and
stats to log. With no objectives configured the update is plain GRPO.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mmrlvr.core.registry import Registry
from mmrlvr.core.types import Scores


@dataclass
class StepContext:
    """What an objective may read: the policy, this step's rollouts, scores and advantages."""

    policy: Any
    rollouts: Any
    scores: Scores                        # [B][G] parts, totals, correct()
    advantages: torch.Tensor               # [B*G]
    step: int
    total_steps: int
    run_dir: Any = None
    ref_model: Any = None                  # frozen model.path weights, where loaded (beta > 0 or asked)

    def __post_init__(self) -> None:
        if not isinstance(self.scores, Scores):      # [B][G] dicts, as a plug-in's test builds them
            self.scores = Scores(self.scores)


class Objective(Protocol):
    name: str

    def loss(self, ctx: StepContext) -> tuple[torch.Tensor | None, dict[str, float]]:
        """A scalar to add to the loss (None: nothing this step) and stats to log."""


def sample_rows(rollouts: Any, max_rows: int, seed: int, step: int
                ) -> tuple[list[int], torch.Generator]:
    """Up to `max_rows` rollout rows with a non-empty completion, drawn reproducibly per step,
    and the step's generator for any further draws (the global RNG, so resume, is untouched)."""
    n = rollouts.completion_ids.shape[0]
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    rows = list(range(n)) if n <= max_rows else \
        sorted(torch.randperm(n, generator=gen)[:max_rows].tolist())
    return [r for r in rows if rollouts.completion_mask[r].sum() > 0], gen


OBJECTIVES = Registry("objective")
register = OBJECTIVES.register


def build(specs: list[dict[str, Any]]) -> list[tuple[float, Objective]]:
    out = []
    for spec in specs:
        spec = dict(spec)
        name = spec.pop("name")
        weight = float(spec.pop("weight", 1.0))
        out.append((weight, OBJECTIVES.build(name, **spec)))
    return out

"""Filled by the methods with an auxiliary objective (`mmrlvr.methods`: PIRL's consistency,
StructReward's recycling, TransAnyText's PWSD), each from its own folder."""
