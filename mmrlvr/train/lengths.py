"""A run's prompt budget (`mmrlvr.data.lengths.PromptBudget`): the longest prompt its model takes
and how this model's processor measures one, built before the data loads so that a too-long row
is refused (or skipped) at load, never in a rollout.

The limit is the smaller of the model's context (`max_position_embeddings` of its text config)
less the completion's room (`rollout.max_new_tokens`: a prompt that fills the context leaves
the rollout no token to write) and `data.max_prompt_tokens` (0: off). The bounds per medium
come from the model's family:

- an image: `family.tokens_per_image` at `model.max_pixels` (Qwen-VL: max_pixels / 28², Gemma 3:
  its fixed 256), plus what the template writes around it; a family without such a count
  (InternVL's tiles) has no bound, so its rows with images are encoded to be measured;
- a video: `data.max_frames` frames, each at most an image of `data.max_video_pixels` (else
  `model.max_pixels`), plus their timestamps and markers (twice the real count for Qwen-VL,
  which merges frames in pairs);
- an audio clip: the encoder's outputs for one feature window (Qwen2-Audio: 750 for 30 s), when
  long clips are cut to the window; split into windows, a clip has no bound.

Building it loads the model's config and processor (~0.1 s for a tiny model), never weights.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import modalities
from mmrlvr.config import Config, ConfigError
from mmrlvr.core.prompting import Prompting
from mmrlvr.data import DataError, Example, row_error
from mmrlvr.data.lengths import PromptBudget
from mmrlvr.train.policy import load_family, load_processor

SEAMS = 8
"""Tokens added to the template's own count: a question joined to its scaffold may tokenise
across the seam."""
MEDIUM_SEAMS = 16
"""Tokens per medium beyond its features: markers a processor adds around them (Gemma 3's blank
lines, Qwen3-VL's timestamps)."""


def prompt_budget(cfg: Config, path: str | None = None) -> PromptBudget | None:
    """The budget of prompts for the model at `path` (default `model.path`) fed as `cfg` feeds
    it; None when neither the model's config nor `data.max_prompt_tokens` sets a limit. A
    `rollout.max_new_tokens` that leaves no room for a prompt is a ConfigError."""
    import transformers

    path = path or cfg.model.path
    family = load_family(path)
    config = family.unwrap_config(transformers.AutoConfig.from_pretrained(path))
    context = getattr(config.get_text_config(), "max_position_embeddings", None)
    room = max(0, int(cfg.rollout.max_new_tokens))
    limits = []
    if isinstance(context, int) and context > 0:
        why = (f"the model's context of {context:,} tokens (max_position_embeddings in "
               f"{path}/config.json)")
        if room >= context:
            raise ConfigError(f"rollout.max_new_tokens ({room:,}) leaves no room for a prompt in "
                              f"{why}: lower it")
        limits.append((context - room, why + (f" less {room:,} for the completion "
                                              "(rollout.max_new_tokens)" if room else "")))
    if cfg.data.max_prompt_tokens:
        limits.append((int(cfg.data.max_prompt_tokens),
                       f"data.max_prompt_tokens ({int(cfg.data.max_prompt_tokens):,})"))
    if not limits:
        return None
    limit, why = min(limits)
    processor = load_processor(path)
    adapter = modalities.get(cfg.model.modality, min_pixels=cfg.model.min_pixels,
                             max_pixels=cfg.model.max_pixels, video_fps=cfg.data.video_fps,
                             max_frames=cfg.data.max_frames,
                             max_video_pixels=cfg.data.max_video_pixels).bind(family)
    return Measure(cfg, processor, adapter, family, config).budget(limit, why)


class Measure:
    """The three measures of `PromptBudget` for one processor, adapter and prompt settings."""

    def __init__(self, cfg: Config, processor: Any, adapter: Any, family: Any, config: Any):
        self.processor, self.adapter, self.family, self.config = processor, adapter, family, config
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.prompting = Prompting.of(cfg)     # every prompt a transform can make is measured
        self.system = self.prompting.system
        self.model, self.data = cfg.model, cfg.data

    def budget(self, limit: int, why: str) -> PromptBudget:
        empty = Example(id="-", prompt="", answer="-")
        overhead = self._tokens(empty) + SEAMS      # system and format included
        per = {kind: self._per_medium(kind, empty) for kind in ("images", "audios", "videos")}

        def media_bound(ex: Example) -> int | None:
            total = 0
            for kind, bound in per.items():
                n = len(getattr(ex, kind))
                if n and bound is None:
                    return None
                total += n * (bound or 0)
            return total

        return PromptBudget(limit, why, overhead, self.text_bytes, media_bound,
                            self.text_tokens, self.exact_tokens)

    def text_bytes(self, ex: Example) -> int:
        own = max(len(v.prompt.encode("utf-8")) for v in self.prompting.variants(ex))
        if not self.system:                       # the row's own system turn is used then
            own += len(str(ex.meta.get("system", "")).encode("utf-8"))
        return own

    def text_tokens(self, ex: Example) -> int:
        """The prompt with one placeholder per medium, in its longest transformed form."""
        return max(self._tokens(v) for v in self.prompting.variants(ex))

    def exact_tokens(self, ex: Example) -> int:
        """The prompt as `adapter.encode` makes it for a rollout, in its longest transformed form."""
        batches = (self.prompting.encode_with(self.adapter, self.processor, [v])
                   for v in self.prompting.variants(ex))
        return max(int(b.inputs["attention_mask"].sum()) for b in batches)

    def _tokens(self, ex: Example) -> int:
        messages = self.prompting.messages(self.adapter, ex)
        text = self.processor.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def _per_medium(self, kind: str, empty: Example) -> int | None:
        """An upper bound of the tokens one medium of `kind` adds to a prompt (None: none
        known; 0: the adapter ignores that kind)."""
        if kind == "videos" and self.family.modality == "vision" and self.family.video_key is None:
            return None               # no video path: the encode names it (Mistral 3's template
            #                           raises on a video block)
        try:
            scaffold = self._tokens(dataclasses.replace(empty, **{kind: [None]})) \
                - self._tokens(empty)
        except DataError:                         # the model takes no medium of this kind
            return None
        if scaffold <= 0:
            return 0
        features = self._features(kind)
        return None if features is None else scaffold + features + MEDIUM_SEAMS

    def _features(self, kind: str) -> int | None:
        family = self.family
        if kind == "images":
            n = family.tokens_per_image(self.config, self.model.max_pixels)
            return n or None
        if kind == "videos":
            area = self.data.max_video_pixels or self.model.max_pixels
            per_frame = family.tokens_per_image(self.config, area)
            if family.video_key is None or not per_frame:
                return None
            return self.data.max_frames * (per_frame + MEDIUM_SEAMS)
        if family.modality != "audio" or self.adapter.long_audio != "truncate":
            return None                           # split into windows: as many as the clip is long
        import torch

        fe = self.processor.feature_extractor
        frames = int(fe.n_samples) // int(fe.hop_length)
        return int(family.output_lengths(torch.tensor([frames]))[0])


def eval_budget(model_cfg: Any, max_new_tokens: int,
                prompting: Prompting = Prompting()) -> PromptBudget | None:
    """The prompt budget of `mmrlvr eval` and `mmrlvr stress`: the model at `model_cfg.path` fed
    through `model_cfg`'s modality with `prompting`'s system turn and format instruction (eval
    transforms no prompt), leaving `max_new_tokens` for the answer."""
    cfg = Config()
    cfg.model = model_cfg
    cfg.data.system_prompt, cfg.data.format_prompt = prompting.system, prompting.format
    cfg.rollout.max_new_tokens = max_new_tokens
    return prompt_budget(cfg)


def refuse_long(examples: list[Example], budget: PromptBudget | None, source: str) -> None:
    """Raise DataError for the first row of `examples` (loaded from `source`) whose prompt is over
    `budget`, named by row and id, before a model generates for any of them."""
    for i, ex in enumerate(examples if budget is not None else ()):
        problem = budget.problem(ex)
        if problem:
            raise row_error(source, i + 1, problem, ex.id)
