"""GMTS — train on the tokens whose gradient would matter most.

A gradient-magnitude proxy per token combines how uncertain the policy was there with how much
the completion's advantage pushes it (entropy alone would favour tokens whose gradient the
advantage zeroes):

    g_it = H_it · |A_it|        H: the sampling distribution's entropy at token t (where the
                                rollout engine recorded it; else the token's surprisal −log p)

The top `fraction` of the step's completion tokens by g (20 %, the seed paper's) keep their
policy gradient, weighted n_tokens / n_kept so the loss keeps its scale; the rest get weight 0
(their KL term, where β > 0, stays). Config: `algo.shaping: [{name: gmts, fraction: 0.2}]`.
"""
from __future__ import annotations

import math

import torch

from mmrlvr.algo.shaping import ShapeContext, TokenCredit


class GMTS:
    name = "gmts"
    stage = "tokens"

    def __init__(self, fraction: float = 0.2):
        if not 0 < fraction <= 1:
            raise ValueError(f"gmts: fraction must be in (0, 1], got {fraction}")
        self.fraction = float(fraction)

    def shape(self, credit: TokenCredit, ctx: ShapeContext) -> dict[str, float]:
        rollouts, mask = ctx.rollouts, ctx.mask.bool()                             # [N, C]
        entropy = rollouts.stats.get("token_entropy")
        if entropy is None and rollouts.sample_logprobs is not None:
            entropy = -rollouts.sample_logprobs                                   # surprisal
        if entropy is None:
            raise ValueError("gmts needs the rollout engine's per-token entropy or sampled-token "
                             "logprobs; this engine kept neither (the HF engine keeps them when "
                             "rows x new tokens x vocabulary fits mmrlvr.rollout.hf.LOGITS_BUDGET)")
        C = mask.shape[1]
        proxy = entropy[:, :C].to(credit.advantages) * credit.advantages.abs()    # [N, C]
        proxy = proxy.masked_fill(~mask, -math.inf)
        n = int(mask.sum())
        keep = max(1, math.ceil(self.fraction * n)) if n else 0
        chosen = torch.zeros_like(mask)
        if keep:
            top = proxy.flatten().topk(keep).indices
            chosen.view(-1)[top] = True
        weights = chosen.to(credit.advantages.dtype) * (n / max(keep, 1))         # [N, C]
        credit.weights = weights if credit.weights is None else credit.weights * weights
        return {"kept_frac": keep / max(n, 1),
                "proxy_kept_mean": float(proxy[chosen].mean()) if keep else 0.0,
                "proxy_mean": float(proxy[mask].mean()) if n else 0.0}
