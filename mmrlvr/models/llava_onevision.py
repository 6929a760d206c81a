"""LLaVA-OneVision (`LlavaOnevisionForConditionalGeneration`, the "-hf" checkpoints): a SigLIP tower
over fixed crops (AnyRes), an MLP projector, a learnt newline embedding, a Qwen2 decoder, 1-D RoPE.

Geometry: the processor picks the `image_grid_pinpoints` grid best fitting each image, cuts it
into crops of the tower's size and prepends the whole image as the base crop; `pixel_values` is
[images, most crops, 3, S, S], one row per image (`image_sizes` beside it). The model keeps an
image's base crop and its grid only when it is alone in its prompt: the grid is unpadded to the
image's aspect, shrunk past `anyres_max_N` crops, and a newline closes every row. In a prompt with
several images (`batch_num_images`, one entry per prompt that has images) each image is its base
crop and one newline. The chat template writes `<image>` (a turn's images before its text); the
processor expands it. `model.min_pixels`/`max_pixels` do not apply.

`image_features` counts each image's features with the model's own grid and unpadding functions
(on the meta device, no tower run) from the processor's geometry, which `check_processor` holds
equal to config.json's; the prompt's `<image>` count comes from the processor's separate formula.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from mmrlvr.models.base import FamilyError, VllmNames, text_dims
from mmrlvr.models.tiled import TILED_NAMES, TiledVision

LLAVA_OV_NAMES = VllmNames(
    renames=TILED_NAMES.renames + (("model.image_newline", "image_newline"),),
    roots=TILED_NAMES.roots + ("image_newline",), media="image")
"""The transformers-4 tree the "-hf" checkpoints keep (as Gemma 3's), plus `image_newline`; vLLM's
LLaVA-OneVision model has the same modules (`vision_tower`, `multi_modal_projector`,
`language_model`, `image_newline`)."""

_SIGLIP_SO400M = dict(model_type="siglip_vision_model", vision_use_head=False, hidden_size=1152,
                      intermediate_size=4304, num_hidden_layers=26, num_attention_heads=16,
                      image_size=384, patch_size=14)
"""siglip-so400m-patch14-384 cut to 26 layers, the tower of the LLaVA-OneVision releases (transformers'
`LlavaOnevisionConfig` defaults, documented as the llava-onevision-qwen2-7b-ov-hf configuration)."""


class LlavaOnevision(TiledVision):
    name = "llava-onevision"
    model_types = ("llava_onevision",)
    classes = ("LlavaOnevisionForConditionalGeneration",)
    processors = ("LlavaOnevisionProcessor",)
    image_token = "<image>"
    placeholder_tokens = ("<image>", "<video>")
    vision_towers = ("vision_tower", "multi_modal_projector")
    unit_classes = ("DecoderLayer", "EncoderLayer")
    media_keys = ("pixel_values", "image_sizes", "batch_num_images")
    media_inputs = ("pixel_values", "image_sizes", "batch_num_images")
    vllm = LLAVA_OV_NAMES
    tiny = "llava-onevision"
    published = {
        # llava-hf/llava-onevision-qwen2-7b-ov-hf: SigLIP-so400m (26 layers) + Qwen2-7B's decoder (the
        # dims of Qwen2-7B-Instruct's config.json); vocab 152128 is Qwen2's 152064 grown for <image> and
        # <video> as recalled from the -hf config.json, not read from the file here
        "llava-hf/llava-onevision-qwen2-7b-ov-hf": dict(
            model_type="llava_onevision", vision_config=_SIGLIP_SO400M, tie_word_embeddings=False,
            vision_feature_select_strategy="full", vision_feature_layer=-1,
            text_config=dict(model_type="qwen2", **text_dims(3584, 18944, 28, 28, 4, 152128, False))),
    }

    def media_rows(self, inputs: dict[str, torch.Tensor], per_sample: list[int],
                   processor: Any = None) -> list[dict]:
        have = int(inputs["pixel_values"].shape[0]) if "pixel_values" in inputs else 0
        if sum(per_sample) != have:
            raise FamilyError(f"the llava-onevision processor made {have} images' crops where the "
                              f"prompts hold placeholders for {sum(per_sample)}")
        rows, image, prompt = [], 0, 0
        for n in per_sample:
            if not n:
                rows.append({})
                continue
            rows.append({"pixel_values": (image, image + n), "image_sizes": (image, image + n),
                         "batch_num_images": (prompt, prompt + 1)})
            image, prompt = image + n, prompt + 1
        return rows

    def image_features(self, inputs: dict[str, torch.Tensor], row: dict, processor: Any) -> int:
        if not row:
            return 0
        start, stop = row["image_sizes"]
        return sum(self.features_of(inputs["image_sizes"][k].tolist(), stop - start == 1, processor)
                   for k in range(start, stop))

    def features_of(self, size: list[int], alone: bool, processor: Any) -> int:
        """Features the model makes of one image of `size` (H, W): `pack_image_features`'s count."""
        from transformers.models.llava_onevision.modeling_llava_onevision import (
            get_anyres_image_grid_shape,
            unpad_image,
        )

        side = int(math.isqrt(int(processor.num_image_tokens)))            # patches a crop side
        base = side * side - (processor.vision_feature_select_strategy == "default")
        if not alone:
            return base + 1                                                 # base crop + newline
        crop = int(processor.image_processor.size["height"])
        rows, cols = get_anyres_image_grid_shape(size, processor.image_processor.image_grid_pinpoints,
                                                 crop)
        grid = unpad_image(torch.empty(1, rows * side, cols * side, device="meta"), size)
        h, w = grid.shape[1:]
        cap = int(processor.vision_aspect_ratio.removeprefix("anyres_max_"))
        ratio = math.sqrt(h * w / (cap * side ** 2))
        if ratio > 1.1:
            h, w = int(h // ratio), int(w // ratio)
        return base + h * (w + 1)                                           # a newline every row

    def encode_images(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                      device: torch.device, dtype: torch.dtype) -> Any:
        config = model.config
        batch = inputs.get("batch_num_images")
        return model.model.get_image_features(
            inputs["pixel_values"].to(device, dtype), inputs["image_sizes"].to(device),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            vision_aspect_ratio=config.vision_aspect_ratio,
            batch_num_images=batch.to(device) if batch is not None else None, return_dict=True)

    def tower_zero(self, model: torch.nn.Module, device: torch.device) -> torch.Tensor:
        """The tower, projector and newline on one crop of zeros, times 0."""
        size = model.config.vision_config.image_size
        inputs = {"pixel_values": torch.zeros(1, 1, 3, size, size, device=device),
                  "image_sizes": torch.tensor([[size, size]], device=device),
                  "batch_num_images": torch.tensor([2], device=device)}     # no grid: one crop
        out = self.encode_images(model, inputs, device, next(model.parameters()).dtype)
        return sum(p.sum() for p in out.pooler_output) * 0

    def pick_features(self, encoded: Any, ranges: list[tuple[int, int]]) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        per_image = encoded.pooler_output                                   # one [tokens, D] an image
        return BaseModelOutputWithPooling(
            pooler_output=[per_image[k] for a, b in ranges for k in range(a, b)])

    def check_processor(self, processor: Any, config: Any) -> None:
        super().check_processor(processor, config)
        vision, ip = config.vision_config, getattr(processor, "image_processor", None)
        pairs = (("num_image_tokens", getattr(processor, "num_image_tokens", None),
                  (vision.image_size // vision.patch_size) ** 2),
                 ("vision_feature_select_strategy", getattr(processor, "vision_feature_select_strategy", None),
                  config.vision_feature_select_strategy),
                 ("vision_aspect_ratio", getattr(processor, "vision_aspect_ratio", None),
                  config.vision_aspect_ratio),
                 ("crop size", (getattr(ip, "size", None) or {}).get("height"), vision.image_size),
                 ("image_grid_pinpoints", [list(p) for p in getattr(ip, "image_grid_pinpoints", None) or []],
                  [list(p) for p in config.image_grid_pinpoints]))
        for what, have, want in pairs:
            if have is not None and have != want:
                raise FamilyError(f"the processor does not match the model: its {what} is {have}, "
                                  f"the llava-onevision model's config.json gives {want}; load the "
                                  "processor saved with this checkpoint")

    def tokens_per_image(self, config: Any, max_pixels: int) -> int:
        """A lone square image: the base crop plus the largest square grid within `anyres_max_N`
        crops, one newline a row (the most one image can make)."""
        vision = config.vision_config
        side = vision.image_size // vision.patch_size
        cap = int(config.vision_aspect_ratio.removeprefix("anyres_max_"))
        grid = min(math.isqrt(cap), max(1, math.ceil(math.sqrt(max_pixels) / vision.image_size)))
        return side * side + grid * side * (grid * side + 1)
