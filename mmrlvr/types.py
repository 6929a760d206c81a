"""The typed hand-offs of one GRPO step (DESIGN.md, "How data flows")."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mmrlvr.data import Example


@dataclass
class PromptBatch:
    """B un-expanded prompts, processed once: token ids plus their media tensors.

    `inputs` holds the processor's output: `input_ids`/`attention_mask` [B, P] (left padded)
    and the modality's tensors (e.g. `pixel_values` [sum patches, D] + `image_grid_thw` [n_img, 3]).
    `media_rows[i]` is the (start, stop) slice of every media tensor belonging to sample i,
    so any subset or repetition of samples can be cut out exactly (`modalities.base.select`).
    """

    examples: list[Example]
    inputs: dict[str, torch.Tensor]
    media_rows: list[dict[str, tuple[int, int]]]
    prompt_texts: list[str] = field(default_factory=list)
    prompt_options: dict[str, str] = field(default_factory=dict)
    """The system/format prompts the batch was encoded with (so derived prompts can match them)."""

    def __len__(self) -> int:
        return len(self.examples)


@dataclass
class Rollouts:
    """B×G completions, flattened prompt-major (row b*G + g is member g of prompt b)."""

    prompts: PromptBatch
    group_size: int
    completion_ids: torch.Tensor          # [B*G, C] right padded
    completion_mask: torch.Tensor         # [B*G, C] 1 on tokens up to and including EOS
    sample_logprobs: torch.Tensor | None  # [B*G, C] logprobs under the sampling model (temperature-scaled)
    texts: list[str]                      # [B*G] decoded completions
    branch: list[str]                     # [B*G] branch tag per member ("clean", "noisy", ...)
    stats: dict[str, Any] = field(default_factory=dict)

    def example_of(self, row: int) -> Example:
        return self.prompts.examples[row // self.group_size]
