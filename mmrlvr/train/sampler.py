"""A seeded, resumable prompt order: a fresh permutation each epoch, a cursor into it."""
from __future__ import annotations

import torch


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
