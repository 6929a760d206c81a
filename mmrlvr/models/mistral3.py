"""Mistral 3 (`Mistral3ForConditionalGeneration`: Mistral Small 3.1 / 3.2): a Pixtral vision tower at
each image's own resolution, an RMSNorm + 2x2 patch merger + MLP projector, a Mistral decoder with
1-D RoPE.

Geometry: the Pixtral image processor keeps an image's aspect, shrinks it to fit its
`longest_edge` (1540 px released) and rounds each side up to a multiple of patch x merge
(14 x 2 = 28 px); each 28 px cell is one `[IMG]` token, a row of them closed by `[IMG_BREAK]`,
the last by `[IMG_END]`, and the patch merger makes one feature per `[IMG]`. Here an image is
first shrunk to at most `model.max_pixels`, keeping its aspect (never enlarged, except that an
image within one cell is stretched over two: transformers' Mistral 3 cannot take a lone
one-feature image), so the prompt's image tokens stay within the bound a run
plans for. The chat template writes `[IMG]`; the processor expands it. `pixel_values` is
[images, 3, H, W] padded to the batch's largest image, one row per image, with the real sizes in
`image_sizes` (the tower crops each image back to its size and attends within it), so a sample's
media rows are its images' rows of both.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from mmrlvr.models.base import FamilyError, text_dims
from mmrlvr.models.tiled import TILED_NAMES, TiledVision


class Mistral3(TiledVision):
    name = "mistral3"
    model_types = ("mistral3",)
    classes = ("Mistral3ForConditionalGeneration",)
    processors = ("PixtralProcessor",)
    image_token = "[IMG]"
    placeholder_tokens = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")
    stop_tokens = ("</s>",)
    vision_towers = ("vision_tower", "multi_modal_projector")
    unit_classes = ("DecoderLayer", "AttentionLayer")   # MistralDecoderLayer, PixtralAttentionLayer
    media_keys = ("pixel_values", "image_sizes")
    media_inputs = ("pixel_values",)
    vllm = TILED_NAMES
    """Mistral 3 checkpoints keep the transformers-4 tree (`language_model.model.`, `vision_tower.`,
    `multi_modal_projector.`, `language_model.lm_head.`), as Gemma 3's: vLLM's
    `Mistral3ForConditionalGeneration` mapper renames only the transformers-5 prefixes
    (`model.language_model.` ...) and takes these as they are."""
    tiny = "mistral3"
    published = {
        # mistralai/Mistral-Small-3.1-24B-Instruct-2503: transformers 5.24's Mistral3Config
        # defaults, which its docstring states are that checkpoint's configuration
        # (configuration_mistral3.py, @auto_docstring(checkpoint=...)); untied embeddings (the
        # 24.0B count needs a separate lm_head)
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503": dict(
            model_type="mistral3", image_token_index=10, spatial_merge_size=2,
            projector_hidden_act="gelu", multimodal_projector_bias=False, vision_feature_layer=-1,
            tie_word_embeddings=False,
            text_config=dict(model_type="mistral", head_dim=128, max_position_embeddings=131072,
                             rms_norm_eps=1e-5, sliding_window=None,
                             **text_dims(5120, 32768, 40, 32, 8, 131072, False)),
            vision_config=dict(model_type="pixtral", hidden_size=1024, intermediate_size=4096,
                               num_hidden_layers=24, num_attention_heads=16, head_dim=64,
                               patch_size=14, image_size=1540, hidden_act="gelu")),
    }

    # ---------------------------------------------------------------- processor side
    def resize(self, image: Any, processor: Any, min_pixels: int, max_pixels: int) -> Any:
        """RGB, shrunk to at most `max_pixels` with its aspect kept (never enlarged); the
        processor then fits it to its `longest_edge` and rounds the sides up to whole cells."""
        from PIL import Image

        image = image.convert("RGB") if image.mode != "RGB" else image
        area = image.width * image.height
        if max_pixels and area > max_pixels:
            scale = math.sqrt(max_pixels / area)
            size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
            image = image.resize(size, Image.Resampling.BICUBIC)
        cell = self.cell(processor) if processor is not None else 0
        if cell and max(image.size) <= cell:
            # one cell, one feature: transformers' Mistral 3 squeezes a lone [1, D] feature
            # block to [D] and cannot split it; its long side spans two cells instead
            scale = (cell + 1) / max(image.size)
            image = image.resize((max(1, math.ceil(image.width * scale)),
                                  max(1, math.ceil(image.height * scale))), Image.Resampling.BICUBIC)
        return image

    def processor_images(self, per_sample: list[list[Any]]) -> list[Any] | None:
        """One flat list for the batch: the processor expands each `[IMG]` in prompt order."""
        flat = [img for imgs in per_sample for img in imgs]
        return flat or None

    def media_rows(self, inputs: dict[str, torch.Tensor], per_sample: list[int],
                   processor: Any = None) -> list[dict]:
        have = int(inputs["pixel_values"].shape[0]) if "pixel_values" in inputs else 0
        if sum(per_sample) != have:
            raise FamilyError(f"the mistral3 processor made {have} images where the prompts hold "
                              f"placeholders for {sum(per_sample)}")
        rows, start = [], 0
        for n in per_sample:
            rows.append({"pixel_values": (start, start + n), "image_sizes": (start, start + n)}
                        if n else {})
            start += n
        return rows

    @staticmethod
    def cell(processor: Any) -> int:
        """Pixels a side of one `[IMG]` token: patch x spatial merge."""
        return int(processor.patch_size) * int(processor.spatial_merge_size)

    def image_features(self, inputs: dict[str, torch.Tensor], row: dict, processor: Any) -> int:
        """Features the model makes of the row's images: (H / cell) x (W / cell) each, of their
        `image_sizes`, as the patch merger splits them."""
        if not row:
            return 0
        start, stop = row["image_sizes"]
        cell = self.cell(processor)
        return sum((int(h) // cell) * (int(w) // cell)
                   for h, w in inputs["image_sizes"][start:stop].tolist())

    def check_processor(self, processor: Any, config: Any) -> None:
        super().check_processor(processor, config)
        vision = config.vision_config
        size = getattr(getattr(processor, "image_processor", None), "size", None) or {}
        longest = size.get("longest_edge") if isinstance(size, dict) else getattr(size, "longest_edge", None)
        for what, have, want in (
                ("patch_size", getattr(processor, "patch_size", None), vision.patch_size),
                ("spatial_merge_size", getattr(processor, "spatial_merge_size", None),
                 config.spatial_merge_size)):
            if have is not None and int(have) != int(want):
                raise FamilyError(f"the processor does not match the model: its {what} is {have}, "
                                  f"the mistral3 model's config.json gives {want}; load the "
                                  "processor saved with this checkpoint")
        if longest is not None and int(longest) > int(vision.image_size):
            raise FamilyError(f"the processor does not match the model: it sizes images up to "
                              f"{longest} px a side, the mistral3 model's vision tower takes at most "
                              f"{vision.image_size} (vision_config.image_size); load the processor "
                              "saved with this checkpoint")

    def tokens_per_image(self, config: Any, max_pixels: int) -> int:
        """A square image of `max_pixels` (0: no cap but the tower's `image_size` a side):
        n x n `[IMG]` plus a break or end token a row."""
        vision = config.vision_config
        cell = vision.patch_size * config.spatial_merge_size
        side = min(math.isqrt(max_pixels), vision.image_size) if max_pixels > 0 else vision.image_size
        n = max(1, math.ceil(side / cell))
        return n * (n + 1)

    # ---------------------------------------------------------------- model side
    def encode_images(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                      device: torch.device, dtype: torch.dtype) -> Any:
        """The tower and projector on every image of `inputs` (pooler_output: one per image)."""
        return model.model.get_image_features(inputs["pixel_values"].to(device, dtype),
                                              inputs["image_sizes"].to(device), return_dict=True)

    def tower_zero(self, model: torch.nn.Module, device: torch.device) -> torch.Tensor:
        """The tower and projector on two cells of zeros (one would be squeezed away), times 0."""
        cell = model.config.vision_config.patch_size * model.config.spatial_merge_size
        inputs = {"pixel_values": torch.zeros(1, 3, cell, 2 * cell, device=device),
                  "image_sizes": torch.tensor([[cell, 2 * cell]], device=device)}
        out = self.encode_images(model, inputs, device, next(model.parameters()).dtype)
        return sum(p.sum() for p in out.pooler_output) * 0

    def pick_features(self, encoded: Any, ranges: list[tuple[int, int]]) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        per_image = encoded.pooler_output                                   # one [tokens, D] an image
        return BaseModelOutputWithPooling(
            pooler_output=[per_image[k] for a, b in ranges for k in range(a, b)])
