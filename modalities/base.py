"""What every modality adapter provides, and the sample-wise media slicing they share.

An adapter turns Examples into chat messages and model inputs for one processor family,
cuts media tensors per sample, and names the placeholder tokens that must never be sampled.
A new model family is a new adapter file, not an `if` in the core.
"""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.data import DataError, Example
from mmrlvr.data.chat import interleaved, split_at_markers
from mmrlvr.core.types import TYPE_KEYS, PromptBatch, select
from mmrlvr.core.format_prompt import format_question


class Adapter:
    """Base class: subclasses set `name`, `media_keys` and implement `encode`."""

    name = "base"
    feeds: str | None = None
    """The family modality this adapter's prompts are for (`vision`, `audio` or `text`); None:
    `audio` and `text` for adapters of those names, `vision` for every other (a new modality
    names what it feeds, docs/extending.md)."""
    media_keys: tuple[str, ...] = ()
    """Tensors indexed by media row (not by sample); sliced with `PromptBatch.media_rows`."""
    placeholder_tokens: tuple[str, ...] = ()
    """Token strings that stand for media; suppressed at sampling and scrubbed before recompute."""

    def __init__(self, **options: Any):
        self.options = options
        self.family: Any = None
        """The model family this adapter feeds (`mmrlvr.models`), bound by `Policy.load`."""

    def bind(self, family: Any) -> "Adapter":
        """Feed a model of `family` (placeholders, geometry, positions come from it)."""
        self.family = family
        return self

    def family_of(self, processor: Any) -> Any:
        """The bound family, else the one `processor`'s class belongs to."""
        if self.family is None:
            from mmrlvr import models

            found = models.of_processor(processor)
            if found is None:
                raise ValueError(f"the {self.name} adapter is bound to no model family and the "
                                 f"processor {type(processor).__name__} names none; load the model "
                                 f"with Policy.load (families: {', '.join(models.names())})")
            self.family = found
        return self.family

    def build_messages(self, example: Example, system_prompt: str = "",
                       format_prompt: str = "") -> list[dict[str, Any]]:
        raise NotImplementedError

    def encode(self, examples: list[Example], processor: Any, **options: Any) -> PromptBatch:
        raise NotImplementedError

    @staticmethod
    def chat(media: list[dict[str, Any]], example: Example, system_prompt: str = "",
             format_prompt: str = "") -> list[dict[str, Any]]:
        """One user turn: the media items, then the question (+ format instruction), after the
        run's system prompt, else the dataset row's own system turn (`meta["system"]`). A
        question that keeps its `<image>`/`<audio>` markers (`mmrlvr.data.chat`: text stood
        before one) gets each medium, in order, where its marker stands."""
        question = format_question(example.prompt, format_prompt)   # appended, or a Jinja template
        content = [*media, {"type": "text", "text": question}]
        if media and interleaved(question):
            content, queue = [], list(media)
            for kind, piece in split_at_markers(question):
                if kind == "text":
                    content.append({"type": "text", "text": piece})
                elif any(item["type"] == kind for item in queue):   # the next one of its kind
                    content.append(queue.pop(next(k for k, item in enumerate(queue)
                                                  if item["type"] == kind)))
                else:
                    raise DataError(f"sample {example.id}: its question marks more {piece} "
                                    f"places than it has media of that kind ({len(media)} in all)")
            if queue:
                raise DataError(f"sample {example.id}: {len(queue)} medium/media have no marker "
                                "in the question; give every one its marker, or none")
        messages = [{"role": "user", "content": content}]
        system_prompt = system_prompt or example.meta.get("system", "")
        if system_prompt:
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system_prompt}]})
        return messages

    def placeholder_ids(self, tokenizer: Any) -> list[int]:
        ids = []
        tokens = self.family.placeholder_tokens if self.family is not None else self.placeholder_tokens
        for tok in tokens:
            tid = tokenizer.convert_tokens_to_ids(tok)
            if tid is not None and tid != tokenizer.unk_token_id:
                ids.append(int(tid))
        return ids

    def position_ids(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                     ) -> torch.Tensor | None:
        """Position ids for a training forward (None: let the model derive them): the family's,
        from the attention mask as `generate` computes them, so a batch without any medium gets
        mask-aware positions too (Qwen-VL would fall back to 0..T-1 over the padding) and a
        left-padded row sees the positions it has alone."""
        return self.family_of(None).position_ids(model, inputs)

    def shared_media(self, model: torch.nn.Module, batch: PromptBatch, rows: list[int],
                     device: torch.device, dtype: torch.dtype) -> dict[str, Any] | None:
        """Forward kwargs carrying media features computed once per distinct prompt in `rows`.

        A GRPO micro-batch holds G completions of each prompt; encoding its media once and
        sharing the features (gradients add up over the copies) saves G-1 encoder passes.
        None: the adapter has no such path and media tensors go to the forward as they are.
        """
        return None

    def apply_media(self, model: torch.nn.Module, inputs: dict[str, Any], media: dict[str, Any]
                    ) -> dict[str, Any]:
        """Training-forward kwargs with `shared_media`'s features in place of the raw media."""
        raw = set(self.family.media_inputs) if self.family is not None else {"pixel_values"}
        out = {k: v for k, v in inputs.items() if k not in raw}
        out.update(media)
        return out

    def vllm_media(self, example: Example, processor: Any = None) -> dict[str, list]:
        """The example's media as vLLM's `multi_modal_data` (none by default)."""
        return {}

    def generation_inputs(self, model: torch.nn.Module, batch: PromptBatch,
                          inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`generate` kwargs for un-expanded prompts (default: the processed inputs as they are)."""
        return inputs

    @staticmethod
    def distinct_media(batch: PromptBatch, rows: list[int]
                       ) -> tuple[list[int], dict[str, torch.Tensor], list[dict]] | None:
        """The distinct prompts among `rows` that carry media, in first-seen order, with their
        inputs cut out (`select`); None when no row has media. The start of `shared_media`."""
        distinct = [i for i in dict.fromkeys(rows) if batch.media_rows[i]]
        if not distinct:
            return None
        inputs, media_rows = select(batch, distinct)
        return distinct, inputs, media_rows

    def training_inputs(self, inputs: dict[str, torch.Tensor], completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Model kwargs for prompt ++ completion ([N, P+C]); media tensors unchanged."""
        out = dict(inputs)
        out["input_ids"] = torch.cat([inputs["input_ids"], completion_ids], dim=1)
        out["attention_mask"] = torch.cat(
            [inputs["attention_mask"], completion_mask.to(inputs["attention_mask"].dtype)], dim=1)
        for key in TYPE_KEYS:
            if key in inputs:
                zeros = torch.zeros_like(completion_ids, dtype=inputs[key].dtype)
                out[key] = torch.cat([inputs[key], zeros], dim=1)
        return out
