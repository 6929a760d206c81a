"""Vision families whose processor cuts every image into fixed-size tiles itself (Gemma 3: one
896 px square per image; InternVL: 448 px tiles on the grid nearest the image's aspect, plus a
thumbnail), each tile a fixed number of tokens.

`pixel_values` is [n_tiles, 3, S, S], one row per tile, so a sample's media rows are its tiles;
the vision tower's output is [n_tiles, tokens, D]. No dynamic resolution: the images go to the
processor as they are (`model.min_pixels`/`max_pixels` do not apply). Positions are 1-D.
"""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.models.base import Family, FamilyError, VllmNames

TILED_NAMES = VllmNames(
    renames=(("model.language_model.", "language_model.model."),
             ("model.vision_tower.", "vision_tower."),
             ("model.multi_modal_projector.", "multi_modal_projector."),
             ("lm_head.", "language_model.lm_head.")),
    roots=("language_model.", "vision_tower.", "multi_modal_projector."), media="image")
"""Gemma 3 and InternVL (-hf) checkpoints keep the transformers-4 tree (`language_model.model.`,
`vision_tower.`, `multi_modal_projector.`), which vLLM's mappers take as they are."""


class TiledVision(Family):
    modality = "vision"
    vllm = TILED_NAMES
    media_keys = ("pixel_values",)
    media_inputs = ("pixel_values",)
    image_key = "pixel_values"
    processor_kwargs: dict[str, Any] = {}

    def resize(self, image: Any, processor: Any, min_pixels: int, max_pixels: int) -> Any:
        """Unchanged (RGB): the processor sizes and tiles every image itself."""
        return image.convert("RGB") if image.mode != "RGB" else image

    def processor_images(self, per_sample: list[list[Any]]) -> list[Any] | None:
        """The processor takes the images nested per sample (an empty list for none)."""
        return per_sample if any(per_sample) else None

    def tokens_per_tile(self, processor: Any) -> int:
        return int(processor.image_seq_length)

    def tiles(self, inputs: dict[str, torch.Tensor], per_sample: list[int], processor: Any
              ) -> list[int]:
        """Tiles of each sample's images (default: one per image)."""
        return list(per_sample)

    def media_rows(self, inputs: dict[str, torch.Tensor], per_sample: list[int],
                   processor: Any = None) -> list[dict]:
        tiles = self.tiles(inputs, per_sample, processor)
        have = int(inputs["pixel_values"].shape[0]) if "pixel_values" in inputs else 0
        if sum(tiles) != have:
            raise FamilyError(f"the {self.name} processor made {have} image tiles where the prompts "
                              f"hold placeholders for {sum(tiles)}")
        rows, start = [], 0
        for n in tiles:
            rows.append({"pixel_values": (start, start + n)} if n else {})
            start += n
        return rows

    def image_features(self, inputs: dict[str, torch.Tensor], row: dict, processor: Any) -> int:
        if not row:
            return 0
        start, stop = row["pixel_values"]
        return (stop - start) * self.tokens_per_tile(processor)

    def encode_images(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                      device: torch.device, dtype: torch.dtype) -> Any:
        return model.model.get_image_features(inputs["pixel_values"].to(device, dtype),
                                              return_dict=True)

    def tower_zero(self, model: torch.nn.Module, device: torch.device) -> torch.Tensor:
        """The tower and projector on one tile of zeros, times 0."""
        vision = model.config.vision_config
        size = vision.image_size if isinstance(vision.image_size, int) else vision.image_size[0]
        pixels = torch.zeros(1, 3, size, size, device=device)
        return self.encode_images(model, {"pixel_values": pixels}, device,
                                  next(model.parameters()).dtype).pooler_output.sum() * 0

    def pick_features(self, encoded: Any, ranges: list[tuple[int, int]]) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        per_tile = encoded.pooler_output                                  # [n_tiles, tokens, D]
        index = torch.tensor([k for a, b in ranges for k in range(a, b)], dtype=torch.long,
                             device=per_tile.device)
        return BaseModelOutputWithPooling(pooler_output=per_tile.index_select(0, index))
