"""Group-relative advantages.

GRPO:        A_i = (r_i − mean_g(r)) / (std_g(r) + eps)      (std with Bessel's correction off)
Dr.GRPO:     A_i =  r_i − mean_g(r)
RLOO:        A_i =  r_i − mean_{j≠i}(r_j) = G/(G−1) · (r_i − mean_g(r))   (leave-one-out baseline)
REINFORCE++: A_i = (r_i − mean_g(r)) / (std_batch(r − mean_g(r)) + eps)
             (REINFORCE++-baseline: the group mean as baseline, one std over the whole step's
             centred rewards, every rank's, so two processes give what one does)

The same advantage applies to every token of completion i.
"""
from __future__ import annotations

import torch

from collections.abc import Callable

from mmrlvr.core.registry import Registry

Sum = Callable[[float], float]
"""Sums a number over the step's ranks (the identity in one process)."""

ADVANTAGES = Registry("advantage estimator")
"""`algo.advantage` names one: f(rewards [B, G], centred [B, G], eps, batch_sum) -> advantages
[B, G]; `batch_sum` is for estimators that normalise over the whole step (REINFORCE++)."""


def _own(x: float) -> float:
    return x


@ADVANTAGES.register("drgrpo")
def drgrpo(rewards: torch.Tensor, centred: torch.Tensor, eps: float, batch_sum: Sum = _own
           ) -> torch.Tensor:
    return centred


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, centred: torch.Tensor, eps: float, batch_sum: Sum = _own
         ) -> torch.Tensor:
    std = rewards.std(dim=1, keepdim=True, unbiased=False)           # [B, 1]
    return centred / (std + eps)


@ADVANTAGES.register("rloo")
def rloo(rewards: torch.Tensor, centred: torch.Tensor, eps: float, batch_sum: Sum = _own
         ) -> torch.Tensor:
    G = rewards.shape[1]
    return centred * (G / (G - 1)) if G > 1 else torch.zeros_like(centred)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(rewards: torch.Tensor, centred: torch.Tensor, eps: float, batch_sum: Sum = _own
                 ) -> torch.Tensor:
    # every group's centred rewards sum to 0, so the step's are 0 on average: the std is the RMS
    n = batch_sum(float(centred.numel()))
    var = batch_sum(float(centred.double().pow(2).sum())) / max(n, 1.0)
    return centred / (var ** 0.5 + eps)


def group_advantages(rewards: torch.Tensor, kind: str = "grpo", eps: float = 1e-6,
                     batch_sum: Sum = _own) -> torch.Tensor:
    """rewards [B, G] -> advantages [B, G] by the estimator `kind` (`ADVANTAGES`); `batch_sum`
    sums over ranks for the estimators that normalise over the whole step."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, G], got shape {tuple(rewards.shape)}")
    estimator = ADVANTAGES.get(kind)
    mean = rewards.mean(dim=1, keepdim=True)                     # [B, 1]
    # A group whose rewards are all equal carries no signal: its advantages are exactly 0.
    # Without this, rounding in the mean of e.g. eight 0.9s leaves ~1e-8 residues that the
    # GRPO division by (std + eps) blows up to advantages of ~0.05 on pure noise.
    flat = rewards.max(dim=1, keepdim=True).values == rewards.min(dim=1, keepdim=True).values
    centred = torch.where(flat, torch.zeros_like(rewards), rewards - mean)   # [B, G]
    return estimator(rewards, centred, eps, batch_sum)


def zero_spread_fraction(rewards: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values   # [B]
    return float((spread == 0).float().mean())
