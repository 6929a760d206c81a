"""The rollout interface: un-expanded prompts in, G completions per prompt out."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from mmrlvr.core.types import PromptBatch, Rollouts


@dataclass
class SamplingParams:
    n: int = 8
    """Completions per prompt."""
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


class RolloutEngine(Protocol):
    def generate(self, batch: PromptBatch, params: SamplingParams) -> Rollouts:
        """Sample `params.n` completions for every prompt of `batch` (expanded here, once)."""

    def wake_up(self) -> None:
        """Before rollouts: take back the engine's memory and pull changed weights (every rank)."""

    def sleep(self) -> None:
        """After rollouts: free the engine's memory for the update."""

    def mark_weights_changed(self) -> None:
        """After each optimiser step: the next rollout must see the new weights."""

    def without_branching(self) -> "RolloutEngine":
        """The same engine sampling from the clean model only (eval, pass@k)."""


def completion_mask(ids: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 on every token up to and including the first EOS of each row. [N, C] -> [N, C]."""
    is_eos = torch.isin(ids, torch.tensor(eos_ids, device=ids.device))      # [N, C]
    before = (is_eos.cumsum(dim=1) - is_eos.long()) == 0                    # no EOS strictly before
    return before.long()


def scrub_placeholders(ids: torch.Tensor, mask: torch.Tensor, placeholder_ids: list[int],
                       pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Cut each completion at its first media placeholder token (never trained on).

    Returns (ids, mask, rows scrubbed). The placeholder and everything after it become padding.
    """
    if not placeholder_ids:
        return ids, mask, 0
    bad = torch.isin(ids, torch.tensor(placeholder_ids, device=ids.device)) & mask.bool()  # [N, C]
    rows = int(bad.any(dim=1).sum())
    if rows:
        keep = (bad.long().cumsum(dim=1) == 0).long()                       # [N, C]
        mask = mask * keep
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
    return ids, mask, rows
