"""Vision adapter for the Qwen2-VL / Qwen2.5-VL family.

Images load through PIL (a missing or corrupt file is an error naming the sample) and are resized
by qwen-vl-utils to multiples of 28 px within `min_pixels`/`max_pixels`; the processor then runs
once per prompt (never per rollout copy) with `do_resize=False`. `pixel_values` is a flat block of
patches per image, so every image's rows are recorded and samples are cut out whole.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from PIL import Image

from mmrlvr.data import DataError, Example
from mmrlvr.core.types import PromptBatch
from modalities.base import Adapter


class VisionAdapter(Adapter):
    name = "vision"
    media_keys = ("pixel_values", "image_grid_thw")
    placeholder_tokens = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>",
                          "<|vision_pad|>")

    def __init__(self, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112,
                 cache_size: int = 8192, **options: Any):
        super().__init__(**options)
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self._cache: OrderedDict[str, Image.Image] = OrderedDict()
        self._cache_size = cache_size

    def load_image(self, image: Any, example: Example) -> Image.Image:
        """Open and resize one image (cached by path); errors name the sample and file."""
        from qwen_vl_utils import fetch_image

        key = image if isinstance(image, str) else None
        if key is not None and key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if isinstance(image, Image.Image):
            pil = image
        else:
            try:
                with Image.open(image) as fh:
                    fh.load()
                    pil = fh.copy()
            except FileNotFoundError:
                raise DataError(f"sample {example.id}: image not found: {image}") from None
            except Exception as err:  # PIL raises several types for bad files
                raise DataError(f"sample {example.id}: cannot read image {image}: {err}") from None
        resized = fetch_image({"image": pil, "min_pixels": self.min_pixels,
                               "max_pixels": self.max_pixels})
        if key is not None:
            self._cache[key] = resized
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return resized

    def vllm_media(self, example: Example) -> dict[str, list[Image.Image]]:
        """The example's images as vLLM's `multi_modal_data` (resized like the HF path)."""
        return {"image": [self.load_image(img, example) for img in example.images]} \
            if example.images else {}

    def build_messages(self, example: Example, system_prompt: str = "",
                       format_prompt: str = "") -> list[dict[str, Any]]:
        return self.chat([{"type": "image"} for _ in example.images], example, system_prompt,
                         format_prompt)

    def encode(self, examples: list[Example], processor: Any, system_prompt: str = "",
               format_prompt: str = "", **_: Any) -> PromptBatch:
        texts, images, per_sample = [], [], []
        for ex in examples:
            messages = self.build_messages(ex, system_prompt, format_prompt)
            text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            if text.count("<|image_pad|>") != len(ex.images):
                raise DataError(
                    f"sample {ex.id}: the prompt holds {text.count('<|image_pad|>')} image "
                    f"placeholders for {len(ex.images)} image(s); remove literal <|image_pad|> "
                    "text from the question")
            texts.append(text)
            loaded = [self.load_image(img, ex) for img in ex.images]
            images.extend(loaded)
            per_sample.append(len(loaded))
        inputs = processor(text=texts, images=images or None, padding=True, return_tensors="pt",
                           do_resize=False)
        inputs = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
        media_rows = self._media_rows(inputs, per_sample)
        self._check_token_counts(inputs, media_rows, examples, processor)
        return PromptBatch(list(examples), inputs, media_rows, texts,
                           {"system_prompt": system_prompt, "format_prompt": format_prompt})

    def position_ids(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                     ) -> torch.Tensor:
        """M-RoPE positions [3, N, T] from the attention mask, as `generate` computes them.

        Computed here rather than left to the forward so a batch without any image gets
        mask-aware positions too (the model would fall back to 0..T-1 over the padding).
        """
        positions, _ = model.model.get_rope_index(
            inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs.get("image_grid_thw"), attention_mask=inputs["attention_mask"])
        return positions

    def shared_media(self, model: torch.nn.Module, batch: PromptBatch, rows: list[int],
                     device: torch.device, dtype: torch.dtype) -> dict[str, Any] | None:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        found = self.distinct_media(batch, rows)
        if found is None:
            return None
        distinct, inputs, media_rows = found
        out = model.model.get_image_features(inputs["pixel_values"].to(device, dtype),
                                             inputs["image_grid_thw"].to(device), return_dict=True)
        per_image = out.pooler_output                                # one [tokens, D] per image
        features = {i: per_image[r["image_grid_thw"][0]:r["image_grid_thw"][1]]
                    for i, r in zip(distinct, media_rows)}
        ordered = [f for i in rows for f in features.get(i, ())]  # image-token order of the rows
        return {"mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=ordered)}}

    @staticmethod
    def _media_rows(inputs: dict[str, torch.Tensor], per_sample: list[int]) -> list[dict]:
        rows, img, patch = [], 0, 0
        grid = inputs.get("image_grid_thw")
        for n in per_sample:
            if n == 0:
                rows.append({})
                continue
            patches = int(grid[img:img + n].prod(dim=1).sum())
            rows.append({"image_grid_thw": (img, img + n), "pixel_values": (patch, patch + patches)})
            img, patch = img + n, patch + patches
        return rows

    @staticmethod
    def _check_token_counts(inputs, media_rows, examples, processor) -> None:
        """Image-token count must equal the vision features each sample's images produce."""
        pad_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        merge = getattr(processor.image_processor, "merge_size", 2)
        for i, (ex, rows) in enumerate(zip(examples, media_rows)):
            tokens = int((inputs["input_ids"][i] == pad_id).sum())
            if rows:
                start, stop = rows["image_grid_thw"]
                features = int(inputs["image_grid_thw"][start:stop].prod(dim=1).sum()) // merge ** 2
            else:
                features = 0
            if tokens != features:
                raise DataError(
                    f"sample {ex.id}: {tokens} image tokens in the prompt but its "
                    f"{len(ex.images)} image(s) give {features} features; check that the prompt "
                    "text holds no literal <|image_pad|> and the processor matches the model")
