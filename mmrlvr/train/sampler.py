"""A seeded, resumable prompt order: a fresh permutation each epoch, a cursor into it; and the
hook other prompt samplers plug into (`train.sampler`).

A sampler has `next(k)` (the next k dataset indices) and `cursor` (prompts drawn so far, saved in
checkpoints); one that learns from outcomes also has `observe(indices, wins, group_size)`, and
one with state `state_dict()`/`load_state_dict()`, both called by the trainer where present.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

from mmrlvr.core.registry import Registry

SAMPLERS = Registry("prompt sampler")
"""`train.sampler` names other than `uniform`: factories `(train_data, seed, **train.sampler_options)
-> sampler`, registered by the methods that bring one (`mmrlvr.methods.difficulty`)."""


class Sampler(Protocol):
    """What the trainer asks of a prompt sampler (`observe`, `state_dict` and `load_state_dict`
    are optional: called where present)."""

    cursor: int
    """Prompts drawn so far (saved with each checkpoint)."""

    def next(self, k: int) -> list[int]:
        """The next `k` dataset indices."""


def make_sampler(name: str, train_data: Any, seed: int, options: dict[str, Any]) -> Sampler:
    """`uniform`: the seeded permutations (no options); else the registered sampler."""
    if name == "uniform":
        return PromptSampler(len(train_data), seed)
    return SAMPLERS.get(name)(train_data, seed, **options)


class PromptSampler:
    def __init__(self, n: int, seed: int, cursor: int = 0):
        if n <= 0:
            raise ValueError("cannot sample prompts from an empty dataset")
        self.n, self.seed, self.cursor = n, seed, cursor

    def _order(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.n, generator=gen).tolist()

    def next(self, k: int) -> list[int]:
        """The next `k` dataset indices; the cursor counts prompts drawn since the start."""
        out = []
        while len(out) < k:
            epoch, pos = divmod(self.cursor, self.n)
            order = self._order(epoch)
            take = min(k - len(out), self.n - pos)
            out.extend(order[pos:pos + take])
            self.cursor += take
        return out
