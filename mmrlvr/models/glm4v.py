"""GLM-4.1V (`Glm4vForConditionalGeneration`; GLM-4.1V-9B-Thinking, GLM-4.1V-9B-Base): Qwen2-VL's
geometry and 3-D M-RoPE on a GLM-4 decoder.

Geometry: an image is resized (GLM's own `smart_resize`) to sides that are multiples of
patch x merge (14 x 2 = 28 px) within the pixel bounds, the processor runs with
`do_resize=False`, and `pixel_values` is a flat block of 14 px patches per image
(`image_grid_thw` rows), each image doubled to the temporal patch of 2: t·h·w / merge² tokens.
GLM's processor states its bounds (`size.shortest_edge`/`longest_edge`) over t x h x w, an image
counting twice; `model.min_pixels`/`max_pixels` are an image's area here, as for every family,
so the bounds read from a GLM processor (`model.max_pixels: 0`) allow twice the area GLM's own
processor would: set `model.max_pixels` to half its `longest_edge` to match it.

The chat template writes `<|begin_of_image|><|image|><|end_of_image|>`; the processor repeats
`<|image|>` and returns `mm_token_type_ids`, from which `get_rope_index` places the image on its
(t, h, w) grid, as the Qwen-VL families do. Videos are not trained: GLM writes a video as frames
of image tokens with timestamps, which mmrlvr's video path does not build (a row with one is
refused, naming it).
"""
from __future__ import annotations

from typing import Any

from mmrlvr.models.base import VllmNames, text_dims
from mmrlvr.models.qwen_vl import QwenVL

GLM4V_NAMES = VllmNames(renames=(), roots=("model.language_model.", "model.visual.", "lm_head."),
                        media="image")
"""GLM-4.1V checkpoints use transformers 5's own names, which vLLM's `Glm4vForConditionalGeneration`
mapper takes (model.language_model. -> language_model.model., model.visual. -> visual., lm_head. ->
language_model.lm_head.), as Qwen3-VL's."""


class Glm4v(QwenVL):
    name = "glm4v"
    model_types = ("glm4v",)
    classes = ("Glm4vForConditionalGeneration",)
    processors = ("Glm4vProcessor",)
    image_token = "<|image|>"
    video_token = None
    video_key = None
    placeholder_tokens = ("<|image|>", "<|video|>", "<|begin_of_image|>", "<|end_of_image|>",
                          "<|begin_of_video|>", "<|end_of_video|>")
    stop_tokens = ("<|endoftext|>", "<|user|>", "<|observation|>")
    media_inputs = ("pixel_values",)
    media_keys = ("pixel_values", "image_grid_thw")
    lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    vllm = GLM4V_NAMES
    tiny = "glm4v"
    published = {
        # zai-org/GLM-4.1V-9B-Thinking: transformers 5.24's Glm4vConfig / Glm4vTextConfig /
        # Glm4vVisionConfig defaults, which their docstrings state are that checkpoint's
        # configuration (configuration_glm4v.py, @auto_docstring(checkpoint=...))
        "zai-org/GLM-4.1V-9B-Thinking": dict(
            model_type="glm4v", tie_word_embeddings=False,
            text_config=dict(model_type="glm4v_text", max_position_embeddings=32768,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.5,
                                              "mrope_section": [8, 12, 12]},
                             **text_dims(4096, 13696, 40, 32, 2, 151552, False)),
            vision_config=dict(model_type="glm4v_vision", depth=24, hidden_size=1536, num_heads=12,
                               intermediate_size=13696, out_hidden_size=4096, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2, image_size=336)),
    }

    def resize(self, image: Any, processor: Any, min_pixels: int, max_pixels: int) -> Any:
        """The image at sides that are multiples of patch x merge with its area within the
        bounds, as GLM's `smart_resize` sizes it (its t x h x w bound at t = temporal patch)."""
        from PIL import Image
        from transformers.models.glm4v.image_processing_glm4v import smart_resize

        image = image.convert("RGB") if image.mode != "RGB" else image
        ip = getattr(processor, "image_processor", None)
        t = int(getattr(ip, "temporal_patch_size", None) or 2)
        factor = self.patch_size(processor) * self.merge_size(processor)
        height, width = smart_resize(t, image.height, image.width, temporal_factor=t, factor=factor,
                                     min_pixels=t * min_pixels, max_pixels=t * max_pixels)
        if (width, height) == image.size:
            return image
        return image.resize((width, height), Image.Resampling.BICUBIC)

    def check_processor(self, processor: Any, config: Any) -> None:
        super().check_processor(processor, config)          # the <|image|> id and the patch size
        from mmrlvr.models.base import FamilyError

        vision = config.vision_config
        have = self.merge_size(processor)
        if have != vision.spatial_merge_size:
            raise FamilyError(f"the processor does not match the model: it merges {have}x{have} "
                              f"patches, the glm4v model's config.json {vision.spatial_merge_size}x"
                              f"{vision.spatial_merge_size} (vision_config.spatial_merge_size); load "
                              "the processor saved with this checkpoint")
