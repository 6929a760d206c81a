"""Group-relative advantages.

GRPO:    A_i = (r_i − mean_g(r)) / (std_g(r) + eps)      (std with Bessel's correction off)
Dr.GRPO: A_i =  r_i − mean_g(r)

The same advantage applies to every token of completion i.
"""
from __future__ import annotations

import torch

from mmrlvr.core.registry import Registry


ADVANTAGES = Registry("advantage estimator")
"""`algo.advantage` names one: f(rewards [B, G], centred [B, G], eps) -> advantages [B, G]."""


@ADVANTAGES.register("drgrpo")
def drgrpo(rewards: torch.Tensor, centred: torch.Tensor, eps: float) -> torch.Tensor:
    return centred


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, centred: torch.Tensor, eps: float) -> torch.Tensor:
    std = rewards.std(dim=1, keepdim=True, unbiased=False)           # [B, 1]
    return centred / (std + eps)


def group_advantages(rewards: torch.Tensor, kind: str = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """rewards [B, G] -> advantages [B, G] by the estimator `kind` (`ADVANTAGES`)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, G], got shape {tuple(rewards.shape)}")
    estimator = ADVANTAGES.get(kind)
    mean = rewards.mean(dim=1, keepdim=True)                     # [B, 1]
    # A group whose rewards are all equal carries no signal: its advantages are exactly 0.
    # Without this, rounding in the mean of e.g. eight 0.9s leaves ~1e-8 residues that the
    # GRPO division by (std + eps) blows up to advantages of ~0.05 on pure noise.
    flat = rewards.max(dim=1, keepdim=True).values == rewards.min(dim=1, keepdim=True).values
    centred = torch.where(flat, torch.zeros_like(rewards), rewards - mean)   # [B, G]
    return estimator(rewards, centred, eps)


def zero_spread_fraction(rewards: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values   # [B]
    return float((spread == 0).float().mean())
