"""Vision adapter: images into the prompts of any vision family (`mmrlvr.models`).

Images load through PIL (a missing or corrupt file is an error naming the sample) and are resized
as the model's family does it (Qwen-VL: qwen-vl-utils to multiples of patch × merge within
`min_pixels`/`max_pixels`, then the processor with `do_resize=False`; Gemma 3: the processor's own
fixed size); the processor runs once per prompt (never per rollout copy). The family says what
one image's placeholder is, how `pixel_values` splits per sample (so samples are cut out whole),
how many tokens an image makes, the positions and how shared image features are passed.
"""
from __future__ import annotations

import warnings
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
    """Qwen-VL's; a bound family's (`mmrlvr.models`) take their place."""

    def __init__(self, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112,
                 cache_size: int = 8192, **options: Any):
        super().__init__(**options)
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self._cache: OrderedDict[str, Image.Image] = OrderedDict()
        self._cache_size = cache_size
        self.upscaled = 0
        """Images smaller than `min_pixels`, resized up (a warning names the first)."""

    def load_image(self, image: Any, example: Example, processor: Any = None) -> Image.Image:
        """Open and resize one image (cached by path); errors name the sample and file."""
        family = self.family_of(processor)
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
        if family.pixel_bounds and pil.width * pil.height < self.min_pixels:
            self.upscaled += 1
            if self.upscaled == 1:
                sample = getattr(example, "id", "?")
                warnings.warn(f"sample {sample}: image {pil.width}x{pil.height} px is below the "
                              f"model's minimum of {self.min_pixels} pixels (model.min_pixels); it "
                              "is resized up, and so is every such image (counted in the adapter's "
                              "`upscaled`)", stacklevel=2)
        resized = family.resize(pil, processor, self.min_pixels, self.max_pixels)
        if key is not None:
            self._cache[key] = resized
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return resized

    def vllm_media(self, example: Example, processor: Any = None) -> dict[str, list[Image.Image]]:
        """The example's images as vLLM's `multi_modal_data` (resized like the HF path)."""
        return {"image": [self.load_image(img, example, processor) for img in example.images]} \
            if example.images else {}

    def build_messages(self, example: Example, system_prompt: str = "",
                       format_prompt: str = "") -> list[dict[str, Any]]:
        return self.chat([{"type": "image"} for _ in example.images], example, system_prompt,
                         format_prompt)

    def encode(self, examples: list[Example], processor: Any, system_prompt: str = "",
               format_prompt: str = "", **_: Any) -> PromptBatch:
        family = self.family_of(processor)
        marker = family.image_marker or family.image_token
        texts, images, per_sample = [], [], []
        for ex in examples:
            messages = self.build_messages(ex, system_prompt, format_prompt)
            text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            if text.count(marker) != len(ex.images):
                raise DataError(
                    f"sample {ex.id}: the prompt holds {text.count(marker)} image "
                    f"placeholders ({marker}, the {family.name} chat template's) for "
                    f"{len(ex.images)} image(s); remove literal {marker} text from the question")
            texts.append(text)
            loaded = [self.load_image(img, ex, processor) for img in ex.images]
            images.append(loaded)
            per_sample.append(len(loaded))
        images = family.processor_images(images)
        # the chat template writes every special token (Gemma's <bos> too): add none again
        inputs = processor(text=texts, images=images, padding=True, return_tensors="pt",
                           add_special_tokens=False, **(family.processor_kwargs if images else {}))
        inputs = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
        media_rows = family.media_rows(inputs, per_sample, processor)
        self._check_token_counts(family, inputs, media_rows, examples, processor)
        return PromptBatch(list(examples), inputs, media_rows, texts,
                           {"system_prompt": system_prompt, "format_prompt": format_prompt})

    def shared_media(self, model: torch.nn.Module, batch: PromptBatch, rows: list[int],
                     device: torch.device, dtype: torch.dtype) -> dict[str, Any] | None:
        found = self.distinct_media(batch, rows)
        if found is None:
            return None
        family = self.family_of(None)
        distinct, inputs, media_rows = found
        encoded = family.encode_images(model, inputs, device, dtype)
        key = family.image_key
        images = {i: r[key] for i, r in zip(distinct, media_rows)}
        return family.shared_media(encoded, [images[i] for i in rows if i in images])

    @staticmethod
    def _check_token_counts(family, inputs, media_rows, examples, processor) -> None:
        """Image-token count must equal the vision features each sample's images produce."""
        pad_id = processor.tokenizer.convert_tokens_to_ids(family.image_token)
        for i, (ex, rows) in enumerate(zip(examples, media_rows)):
            tokens = int((inputs["input_ids"][i] == pad_id).sum())
            features = family.image_features(inputs, rows, processor)
            if tokens != features:
                raise DataError(
                    f"sample {ex.id}: {tokens} image tokens in the prompt but its "
                    f"{len(ex.images)} image(s) give {features} features; check that the prompt "
                    f"text holds no literal {family.image_token} and the processor matches the model")
