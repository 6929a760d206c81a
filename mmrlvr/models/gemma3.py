"""Gemma 3 (`Gemma3ForConditionalGeneration`): a SigLIP tower at a fixed square size, 1-D RoPE.

Geometry: the image processor resizes every image to its own `size` (896 px for the released
models; no dynamic resolution), and each image becomes `mm_tokens_per_image` (256) soft tokens
between `<start_of_image>` and `<end_of_image>`. The chat template writes `<start_of_image>` for
an image; the processor expands it. `pixel_values` is [n_images, 3, S, S], one row per image.
Image tokens attend to each other both ways: `token_type_ids` (1 on image tokens) mark them,
and a completion's tokens are 0. Positions are 1-D over the real tokens.
"""
from __future__ import annotations

from typing import Any

from mmrlvr.models.tiled import TiledVision


def _gemma3(h, i, layers, heads, kv, head_dim, vocab=262208) -> dict:
    text = dict(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, vocab_size=vocab,
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim)
    vision = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                  num_attention_heads=16, image_size=896, patch_size=14)
    return dict(model_type="gemma3", text_config=text, vision_config=vision, mm_tokens_per_image=256)


class Gemma3(TiledVision):
    name = "gemma3"
    model_types = ("gemma3",)
    classes = ("Gemma3ForConditionalGeneration",)
    processors = ("Gemma3Processor",)
    image_token = "<image_soft_token>"
    image_marker = "<start_of_image>"
    placeholder_tokens = ("<image_soft_token>", "<start_of_image>", "<end_of_image>")
    stop_tokens = ("<end_of_turn>", "<eos>")
    vision_towers = ("vision_tower", "multi_modal_projector")
    unit_classes = ("DecoderLayer", "EncoderLayer")
    tiny = "gemma3"
    published = {
        "google/gemma-3-4b-it": _gemma3(2560, 10240, 34, 8, 4, 256),
        "google/gemma-3-12b-it": _gemma3(3840, 15360, 48, 16, 8, 256),
        "google/gemma-3-27b-it": _gemma3(5376, 21504, 62, 32, 16, 128),
    }

    def check_processor(self, processor: Any, config: Any) -> None:
        super().check_processor(processor, config)
        from mmrlvr.models.base import FamilyError

        want = getattr(config, "mm_tokens_per_image", None)
        if want is not None and int(processor.image_seq_length) != int(want):
            raise FamilyError(f"the processor does not match the model: it writes "
                              f"{processor.image_seq_length} tokens per image, the gemma3 model's "
                              f"config.json expects mm_tokens_per_image {want}; load the processor "
                              "saved with this checkpoint")

    def tokens_per_image(self, config: Any, max_pixels: int) -> int:
        return int(getattr(config, "mm_tokens_per_image", 256))     # a fixed size, any pixels
