"""Token-level credit: plug-ins that reshape a step's per-token advantages, token weights and
clip bounds between the group advantages and the loss.

One step, in this fixed order:

    rewards [B, G] ─► advantages [B, G] ─► broadcast to tokens: TokenCredit
        ─► stage "advantage": methods that move advantages (Cue-GRPO: rarity of the solution)
        ─► stage "tokens":    methods that weight tokens (GMTS: the top tokens by a gradient proxy)
        ─► stage "clip":      methods that set per-completion clip bounds (GAPO)
        ─► clipped surrogate ─► aggregation (token / seq / seq-sum-norm)

Within a stage, plug-ins run in the order the config lists them (`algo.shaping: [{name: gapo,
kappa: 0.5}, ...]`). Each returns what it changed (logged as `shaping/<name>/<stat>`). With no
plug-in configured the update is today's, bit for bit: advantages stay one number per completion
and no token weights or per-completion bounds reach the loss.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mmrlvr.core.registry import Registry
from mmrlvr.core.types import Scores

STAGES = ("advantage", "tokens", "clip")


@dataclass
class TokenCredit:
    """What the loss reads, for all N = B·G rows of a step (sliced per micro-batch)."""

    advantages: torch.Tensor             # [N, C] per token (or [N] before any token method)
    weights: torch.Tensor | None         # [N, C] or None (all ones)
    clip_low: float | torch.Tensor       # a number, or [N, 1] per completion
    clip_high: float | torch.Tensor

    def rows(self, index: list[int], width: int) -> dict[str, Any]:
        """grpo_loss keyword arguments for rows `index`, trimmed to `width` tokens."""
        def cut(t):
            if not torch.is_tensor(t):
                return t
            t = t[index]
            return t[:, :width] if t.dim() == 2 and t.shape[1] > 1 else t
        return {"advantages": cut(self.advantages), "token_weights": cut(self.weights),
                "clip_low": cut(self.clip_low), "clip_high": cut(self.clip_high)}


@dataclass
class ShapeContext:
    """What a plug-in may read about the step."""

    rollouts: Any                        # Rollouts: texts, completion_ids/mask [N, C], stats
    scores: Scores                       # [B][G] parts, totals, correct()
    mask: torch.Tensor                   # [N, C] completion tokens
    examples: list[Any] = field(default_factory=list)   # [B] the step's Examples
    prompts: Any = None                  # the PromptBatch the rollouts were sampled from
    policy: Any = None                   # the Policy (tokenizer, logprobs) for methods that score
    progress: float = 0.0                # step / total steps

    def __post_init__(self) -> None:
        if not isinstance(self.scores, Scores):      # [B][G] dicts, as a plug-in's test builds them
            self.scores = Scores(self.scores)


class Shaper(Protocol):
    name: str
    stage: str

    def shape(self, credit: TokenCredit, ctx: ShapeContext) -> dict[str, float]:
        """Change `credit` in place; return what changed (logged)."""


SHAPERS = Registry("shaping method")
"""Filled by the methods that shape credit (`mmrlvr.methods`: GAPO, Cue-GRPO, GMTS, OM-GRPO,
OPDVR, Cliff), each from its own folder."""


def build(specs: list[dict[str, Any]]) -> list[Shaper]:
    """Plug-ins from `algo.shaping`, in stage order (config order within a stage)."""
    built = []
    for spec in specs:
        spec = dict(spec)
        built.append(SHAPERS.build(spec.pop("name"), **spec))
    return sorted(built, key=lambda s: STAGES.index(s.stage))


def token_credit(advantages: torch.Tensor, mask: torch.Tensor, clip_low: float, clip_high: float,
                 shapers: list[Shaper], ctx: ShapeContext
                 ) -> tuple[TokenCredit, dict[str, float]]:
    """The step's credit: sequence advantages [N] as they are when no plug-in runs, else each
    plug-in's change in stage order (advantages become [N, C] for the first that needs tokens)."""
    credit = TokenCredit(advantages, None, clip_low, clip_high)
    stats: dict[str, float] = {}
    if not shapers:
        return credit, stats
    credit.advantages = advantages.unsqueeze(1).expand_as(mask).to(torch.float32).clone()  # [N, C]
    for shaper in shapers:
        before = credit.advantages.clone()
        stats.update({f"shaping/{shaper.name}/{k}": v for k, v in shaper.shape(credit, ctx).items()})
        m = mask.bool()
        stats[f"shaping/{shaper.name}/mean_abs_delta_adv"] = \
            float((credit.advantages - before).abs()[m].mean()) if m.any() else 0.0
    return credit, stats
