"""GAPO — clip bounds that adapt to each rollout's advantage.

Rollouts with a larger |advantage| (a rare success on a hard prompt, a rare failure on an easy
one) get proportionally more room to move before the PPO clip stops their gradient; the
surrogate is otherwise unchanged (the seed paper derives this from a reverse-KL trust region):

    ε_low,i  = min(ε_low  · (1 + κ·|A_i|), 0.9)      ε_high,i = ε_high · (1 + κ·|A_i|)

|A_i| is the completion's mean |advantage| over its tokens (its GRPO advantage unless an earlier
plug-in made it per token). κ 0.5 is our choice; the 0.9 cap keeps the ratio's lower bound
positive. Config: `algo.shaping: [{name: gapo, kappa: 0.5}]`.
"""
from __future__ import annotations

import torch

from mmrlvr.algo.shaping import ShapeContext, TokenCredit


class GAPO:
    name = "gapo"
    stage = "clip"

    def __init__(self, kappa: float = 0.5):
        if not kappa >= 0:
            raise ValueError(f"gapo: kappa must be >= 0, got {kappa}")
        self.kappa = float(kappa)

    def shape(self, credit: TokenCredit, ctx: ShapeContext) -> dict[str, float]:
        m = ctx.mask.to(credit.advantages.dtype)                                  # [N, C]
        size = (credit.advantages.abs() * m).sum(1) / m.sum(1).clamp(min=1)      # [N] mean |A|
        scale = (1 + self.kappa * size).unsqueeze(1)                               # [N, 1]
        credit.clip_low = torch.clamp(credit.clip_low * scale, max=0.9)
        credit.clip_high = credit.clip_high * scale
        return {"clip_high_mean": float(credit.clip_high.mean()),
                "clip_high_max": float(credit.clip_high.max())}
