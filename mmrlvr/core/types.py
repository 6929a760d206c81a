"""The typed hand-offs of one GRPO step (docs/architecture.md, the data flow), the protocols the core
calls modality adapters and rewards through, and the sample-wise slicing of batches."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mmrlvr.data import Example


@dataclass
class PromptBatch:
    """B un-expanded prompts, processed once: token ids plus their media tensors.

    `inputs` holds the processor's output: `input_ids`/`attention_mask` [B, P] (left padded)
    and the modality's tensors (e.g. `pixel_values` [sum patches, D] + `image_grid_thw` [n_img, 3]).
    `media_rows[i]` is the (start, stop) slice of every media tensor belonging to sample i,
    so any subset or repetition of samples can be cut out exactly (`select`).
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
    behaviour_logprobs: torch.Tensor | None = None
    """[B*G, C] logprobs under the weights that sampled a batch generated ahead of its step
    (`train.async_rollouts`): the update's ratio is taken against them. None: sampled by the
    weights being updated (the ratio starts at 1)."""
    loss_mask: torch.Tensor | None = None
    """[N, C] 1 on the tokens the loss trains (None: `completion_mask`). A multi-turn rollout
    (`mmrlvr.rollout.multiturn`) attends to its tool turns but trains only the policy's tokens."""
    prompt_index: list[int] | None = None
    """[N] the row of `prompts` each completion continues (None: row r // group_size). A
    multi-turn rollout gives every trajectory a prompt row of its own, holding its tools' media."""

    def prompt_row(self, row: int) -> int:
        return row // self.group_size if self.prompt_index is None else self.prompt_index[row]

    @property
    def train_mask(self) -> torch.Tensor:
        """[N, C] the tokens the loss trains."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    def example_of(self, row: int) -> Example:
        return self.prompts.examples[self.prompt_row(row)]



@dataclass
class Scores:
    """One step's rewards, B groups of G completions, built once from what the rewards returned,
    so a hook reads fields instead of walking dicts, and "correct" is decided in one place.

    `parts[b][g]` is completion g of prompt b's dict as the reward layer gave it: each reward's
    named parts (`accuracy`, `format`, `struct_steps/acc`, ...) and `overall`, their weighted
    total. `total` [B, G] is `overall` with non-finite values set to 0 (`nonfinite` says where:
    user rewards are caught before this, so it is a guard, not a path).
    """

    parts: list[list[dict[str, float]]]
    total: torch.Tensor = field(init=False)        # [B, G] float32
    nonfinite: torch.Tensor = field(init=False)    # [B, G] bool

    def __post_init__(self) -> None:
        raw = torch.tensor([[s["overall"] for s in group] for group in self.parts])
        if raw.dim() < 2:                          # no groups: an empty [0, 0]
            raw = raw.reshape(len(self.parts), 0)
        self.nonfinite = ~torch.isfinite(raw)
        self.total = raw.masked_fill(self.nonfinite, 0.0)

    def __len__(self) -> int:
        return len(self.parts)

    @property
    def flat(self) -> list[dict[str, float]]:
        """The N = B·G dicts, prompt-major (row b·G + g)."""
        return [s for group in self.parts for s in group]

    @property
    def keys(self) -> list[str]:
        """The part names besides `overall`, in the order the rewards gave them."""
        return [k for k in self.parts[0][0] if k != "overall"] if self.parts and self.parts[0] else []

    def has(self, key: str) -> bool:
        return bool(self.parts and self.parts[0]) and key in self.parts[0][0]

    def values(self, key: str) -> list[float]:
        """Part `key` of the N completions, prompt-major."""
        return [s[key] for s in self.flat]

    def correct(self, key: str = "accuracy", threshold: float = 0.5, strict: bool = False
                ) -> torch.Tensor:
        """[B, G] bool: completion (b, g) counts as correct when part `key` is >= `threshold`, or,
        where its rewards have no such part, when `overall` is (`strict`: a KeyError naming the
        parts instead). The one rule every method that asks "was it right?" uses."""
        if strict:
            missing = next((s for s in self.flat if key not in s), None)
            if missing is not None:
                raise KeyError(f"{key!r} is not among the step's reward parts {sorted(missing)}")
        return torch.tensor([[s.get(key, s["overall"]) >= threshold for s in group]
                             for group in self.parts], dtype=torch.bool).reshape(len(self.parts), -1)


class ModalityAdapter(Protocol):
    """Every method the core calls on a modality adapter. `modalities.base.Adapter` implements
    the shared ones; `modalities.get(name)` returns one."""

    name: str
    media_keys: tuple[str, ...]
    feeds: str | None
    """The family modality it feeds (`vision`, `audio`, `text`); None: read from `name`."""

    def encode(self, examples: list[Example], processor: Any, **options: Any) -> PromptBatch:
        """Chat-format, tokenise and process `examples` once (no copies per rollout)."""

    def placeholder_ids(self, tokenizer: Any) -> list[int]:
        """Media placeholder ids: never sampled, scrubbed before recompute."""

    def generation_inputs(self, model: Any, batch: PromptBatch,
                          inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`generate` kwargs for un-expanded prompts."""

    def training_inputs(self, inputs: dict[str, torch.Tensor], completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Forward kwargs for prompt ++ completion."""

    def position_ids(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Position ids for a training forward (None: the model derives them)."""

    def shared_media(self, model: Any, batch: PromptBatch, rows: list[int], device: torch.device,
                     dtype: torch.dtype) -> dict[str, Any] | None:
        """Media features of the distinct prompts among `rows`, computed once."""

    def apply_media(self, model: Any, inputs: dict[str, Any], media: dict[str, Any]
                    ) -> dict[str, Any]:
        """Forward kwargs with `shared_media`'s features in place of the raw media."""

    def vllm_media(self, example: Example, processor: Any = None) -> dict[str, list]:
        """The example's media as vLLM's `multi_modal_data`."""


class Reward(Protocol):
    """A reward scores a whole group: one dict per completion with `overall` and any named
    components (all logged). `progress` is how far training is, in [0, 1] (annealed rewards)."""

    name: str

    def score(self, example: Example, completions: list[str], progress: float = 0.0
              ) -> list[dict[str, float]]:
        """Score `completions` of `example`."""

# Keys whose first dimension is the batch (one row per sample).
TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
TYPE_KEYS = ("mm_token_type_ids", "token_type_ids")
"""Per-token modality tags (Qwen-VL: `mm_token_type_ids`; Gemma 3: `token_type_ids`): a
completion's tokens are text, 0."""


def select(batch: PromptBatch, index: list[int]) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Inputs for samples `index` (repeats allowed), media cut per sample by its own rows."""
    idx = torch.tensor(index, dtype=torch.long)
    media_keys = {k for r in batch.media_rows for k in r}
    out: dict[str, torch.Tensor] = {}
    for key, value in batch.inputs.items():
        if key not in media_keys:
            out[key] = value.index_select(0, idx.to(value.device)) if torch.is_tensor(value) else value
    pieces: dict[str, list[torch.Tensor]] = {k: [] for k in media_keys}
    offsets = dict.fromkeys(media_keys, 0)
    rows = []
    for i in index:
        new = {}
        for key, (start, stop) in batch.media_rows[i].items():
            pieces[key].append(batch.inputs[key][start:stop])
            new[key] = (offsets[key], offsets[key] + stop - start)
            offsets[key] += stop - start
        rows.append(new)
    for key, parts in pieces.items():
        if parts:
            out[key] = torch.cat(parts, dim=0)
    return out, rows


def subset(batch: PromptBatch, index: list[int]) -> PromptBatch:
    """A PromptBatch of samples `index` (repeats allowed), e.g. each prompt G times."""
    inputs, rows = select(batch, index)
    texts = [batch.prompt_texts[i] for i in index] if batch.prompt_texts else []
    return PromptBatch([batch.examples[i] for i in index], inputs, rows, texts, batch.prompt_options)


def to_device(inputs: dict[str, Any], device: torch.device | str,
              float_dtype: torch.dtype | None = None) -> dict[str, Any]:
    out = {}
    for k, v in inputs.items():
        if torch.is_tensor(v):
            v = v.to(device)
            if float_dtype is not None and v.is_floating_point():
                v = v.to(float_dtype)
        out[k] = v
    return out
