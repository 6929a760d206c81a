"""InternVL (`InternVLForConditionalGeneration`, the transformers-native InternVL3 checkpoints):
an InternViT tower over 448 px tiles, pixel shuffle to 256 tokens a tile, a Qwen2 decoder.

The chat template writes `<IMG_CONTEXT>` for an image; the processor tiles the image on the grid
nearest its aspect ratio (plus a thumbnail when there are several tiles) and writes
`<img>` + tiles × `image_seq_length` `<IMG_CONTEXT>` + `</img>`. A sample's tiles are read off
its placeholder count. Positions are 1-D.
"""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.models.base import text_dims
from mmrlvr.models.tiled import TiledVision

_INTERNVIT_300M = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                       intermediate_size=4096, image_size=[448, 448], patch_size=[14, 14])
"""InternViT-300M-448px-V2_5, the tower of the InternVL3 releases up to 14B."""


class InternVL(TiledVision):
    name = "internvl"
    model_types = ("internvl",)
    classes = ("InternVLForConditionalGeneration",)
    processors = ("InternVLProcessor",)
    image_token = "<IMG_CONTEXT>"
    placeholder_tokens = ("<IMG_CONTEXT>", "<img>", "</img>")
    vision_towers = ("vision_tower", "multi_modal_projector")
    unit_classes = ("DecoderLayer", "VisionLayer")
    tiny = "internvl"
    published = {
        # InternVL3-8B: InternViT-300M + Qwen2.5-7B (InternVL3's tokenizer: 151674 entries)
        "OpenGVLab/InternVL3-8B-hf": dict(
            model_type="internvl", vision_config=_INTERNVIT_300M, image_seq_length=256,
            downsample_ratio=0.5, tie_word_embeddings=False,
            text_config=dict(model_type="qwen2", **text_dims(3584, 18944, 28, 28, 4, 151674, False))),
    }

    def tiles(self, inputs: dict[str, torch.Tensor], per_sample: list[int], processor: Any
              ) -> list[int]:
        token = processor.tokenizer.convert_tokens_to_ids(self.image_token)
        counts = (inputs["input_ids"] == token).sum(dim=1).tolist()
        return [int(c) // self.tokens_per_tile(processor) for c in counts]

    def encode_images(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                      device: torch.device, dtype: torch.dtype) -> Any:
        config = model.config
        return model.model.get_image_features(
            inputs["pixel_values"].to(device, dtype), return_dict=True,
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy)
