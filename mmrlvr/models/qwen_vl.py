"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE: dynamic-resolution vision, 3-D M-RoPE.

Geometry: an image is resized (qwen-vl-utils' `fetch_image`) to sides that are multiples of
patch × merge — 14 × 2 = 28 px for Qwen2/2.5-VL, 16 × 2 = 32 px for Qwen3-VL — within the pixel
bounds, and the processor runs with `do_resize=False`. `pixel_values` is a flat block of patches
per image (`image_grid_thw` rows), so a sample's images are cut out whole; an image gives
t·h·w / merge² tokens.

Positions: `get_rope_index` from ids, `mm_token_type_ids` and the grids over the attention mask
(computed here even for text-only batches, so a left-padded row sees the positions it has alone).
Qwen3-VL interleaves the M-RoPE frequencies itself (`mrope_interleaved` in its text config) and
injects DeepStack features of chosen vision layers into the first decoder layers: shared media
features carry those per image as well.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from mmrlvr.models.base import (PER_EXPERT, TRANSPOSED_EXPERTS, Family, VllmNames,
                                text_dims as _text)


class QwenVL(Family):
    modality = "vision"
    image_token = "<|image_pad|>"
    video_token = "<|video_pad|>"
    placeholder_tokens = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>",
                          "<|vision_pad|>")
    vision_towers = ("visual",)
    unit_classes = ("DecoderLayer", "VisionBlock")
    media_inputs = ("pixel_values", "pixel_values_videos")
    media_keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                  "second_per_grid_ts")
    image_key = "image_grid_thw"
    """The media key whose `media_rows` range counts images (pixel_values counts patches)."""
    video_key = "video_grid_thw"
    default_patch = 14

    # ---------------------------------------------------------------- processor side
    def patch_size(self, processor: Any) -> int:
        """The processor's patch side (no processor: the family's)."""
        return int(getattr(getattr(processor, "image_processor", None), "patch_size", None)
                   or self.default_patch)

    def merge_size(self, processor: Any) -> int:
        return int(getattr(getattr(processor, "image_processor", None), "merge_size", None) or 2)

    def resize(self, image: Any, processor: Any, min_pixels: int, max_pixels: int) -> Any:
        """The image at sides that are multiples of patch × merge, within the pixel bounds."""
        from qwen_vl_utils import fetch_image

        return fetch_image({"image": image, "min_pixels": min_pixels, "max_pixels": max_pixels},
                           image_patch_size=self.patch_size(processor))

    processor_kwargs = {"do_resize": False}
    pixel_bounds = True

    def processor_images(self, per_sample: list[list[Any]]) -> list[Any] | None:
        """The `images` argument of the processor call: one flat list for the batch."""
        flat = [img for imgs in per_sample for img in imgs]
        return flat or None

    def media_rows(self, inputs: dict[str, torch.Tensor], per_sample: list[int],
                   processor: Any = None) -> list[dict]:
        return self._grid_rows(inputs, per_sample, "image_grid_thw", "pixel_values")

    def video_rows(self, inputs: dict[str, torch.Tensor], per_sample: list[int]) -> list[dict]:
        """Each sample's rows of the video tensors (grids, patches, and Qwen2.5-VL's seconds per
        temporal patch), as `media_rows` gives the images'."""
        rows = self._grid_rows(inputs, per_sample, "video_grid_thw", "pixel_values_videos")
        if "second_per_grid_ts" in inputs:
            for row in rows:
                if row:
                    row["second_per_grid_ts"] = row["video_grid_thw"]
        return rows

    @staticmethod
    def _grid_rows(inputs: dict[str, torch.Tensor], per_sample: list[int], grid_key: str,
                   patch_key: str) -> list[dict]:
        rows, item, patch = [], 0, 0
        grid = inputs.get(grid_key)
        for n in per_sample:
            if n == 0:
                rows.append({})
                continue
            patches = int(grid[item:item + n].prod(dim=1).sum())
            rows.append({grid_key: (item, item + n), patch_key: (patch, patch + patches)})
            item, patch = item + n, patch + patches
        return rows

    def image_features(self, inputs: dict[str, torch.Tensor], row: dict, processor: Any) -> int:
        """How many image tokens the images of one sample (its `media_rows` entry) make."""
        return self._grid_tokens(inputs, row, "image_grid_thw", processor)

    def video_features(self, inputs: dict[str, torch.Tensor], row: dict, processor: Any) -> int:
        """How many video tokens the videos of one sample make (t·h·w / merge² each)."""
        return self._grid_tokens(inputs, row, "video_grid_thw", processor)

    def _grid_tokens(self, inputs: dict, row: dict, key: str, processor: Any) -> int:
        if key not in row:
            return 0
        start, stop = row[key]
        return int(inputs[key][start:stop].prod(dim=1).sum()) // self.merge_size(processor) ** 2

    def video_kwargs(self, clips: list[Any], processor: Any = None) -> dict[str, Any]:
        """The processor's video arguments for `clips` (`mmrlvr.data.video.Clip`, frames already
        sampled and resized): their frames, and metadata with the source frame rate and the
        indices sampled, from which Qwen2.5-VL takes the seconds per temporal patch (its
        temporal positions) and Qwen3-VL the timestamps it writes before each frame."""
        from transformers.video_utils import VideoMetadata

        # frames come resized (`do_resize=False`): the per-frame pixel cap has nothing to do
        capped = {"cap_pixels_per_frame": False} \
            if hasattr(getattr(processor, "video_processor", None), "cap_pixels_per_frame") else {}
        return {"videos": [clip.frames for clip in clips], "do_sample_frames": False, **capped,
                "video_metadata": [VideoMetadata(
                    total_num_frames=clip.total_frames, fps=clip.native_fps,
                    frames_indices=list(clip.indices), duration=clip.duration,
                    width=clip.frames[0].width, height=clip.frames[0].height) for clip in clips]}

    def check_processor(self, processor: Any, config: Any) -> None:
        super().check_processor(processor, config)
        vision = getattr(config, "vision_config", None)
        want = getattr(vision, "patch_size", None)
        have = self.patch_size(processor)
        if want is not None and have != want:
            from mmrlvr.models.base import FamilyError

            raise FamilyError(f"the processor does not match the model: its image processor cuts "
                              f"{have}-pixel patches, the {self.name} model's vision tower takes "
                              f"{want}-pixel ones (vision_config.patch_size); load the processor "
                              "saved with this checkpoint")

    def tokens_per_image(self, config: Any, max_pixels: int) -> int:
        vision = getattr(config, "vision_config", None)
        side = getattr(vision, "patch_size", self.default_patch) * getattr(vision, "spatial_merge_size", 2)
        return max_pixels // side ** 2

    # ---------------------------------------------------------------- model side
    def position_ids(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """M-RoPE positions [3, N, T] from the attention mask, as `generate` computes them."""
        extra = {"second_per_grid_ts": inputs["second_per_grid_ts"]} \
            if inputs.get("second_per_grid_ts") is not None else {}
        positions, _ = model.model.get_rope_index(
            inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs.get("image_grid_thw"), video_grid_thw=inputs.get("video_grid_thw"),
            attention_mask=inputs["attention_mask"], **extra)
        return positions

    def encode_images(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                      device: torch.device, dtype: torch.dtype) -> Any:
        """The vision tower's output for every image of `inputs` (pooler_output: one per image)."""
        return model.model.get_image_features(inputs["pixel_values"].to(device, dtype),
                                              inputs["image_grid_thw"].to(device), return_dict=True)

    def encode_videos(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                      device: torch.device, dtype: torch.dtype) -> Any:
        """The vision tower's output for every video of `inputs` (one per video)."""
        return model.model.get_video_features(inputs["pixel_values_videos"].to(device, dtype),
                                              inputs["video_grid_thw"].to(device), return_dict=True)

    def tower_zero(self, model: torch.nn.Module, device: torch.device) -> torch.Tensor:
        """The tower on one merged patch of zeros (grid [1, merge, merge]), times 0."""
        visual = model.model.visual
        merge = visual.spatial_merge_size
        pixels = torch.zeros(merge * merge, visual.patch_embed.proj.weight.shape[1:].numel(),
                             device=device)                               # C·T·P·P values a patch
        grid = torch.tensor([[1, merge, merge]], device=device)
        out = model.model.get_image_features(pixels, grid, return_dict=True)
        parts = list(out.pooler_output)
        for layer in getattr(out, "deepstack_features", None) or ():    # Qwen3-VL's mergers too
            parts.extend(layer)
        return sum(p.sum() for p in parts) * 0

    def pick_features(self, encoded: Any, ranges: list[tuple[int, int]]) -> Any:
        """`encoded`'s features of the items (images or videos) `ranges` name (a [start, stop)
        range per row, in row order), as the model's `mm_encoder_outputs` takes them."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        per_item = encoded.pooler_output
        ordered = [per_item[k] for a, b in ranges for k in range(a, b)]
        return BaseModelOutputWithPooling(pooler_output=ordered)


_QWEN2_VL_NAMES = VllmNames(
    renames=(("model.language_model.", "model."), ("model.visual.", "visual.")),
    roots=("model.", "visual.", "lm_head."), media="image")


_QWEN3_VL_NAMES = VllmNames(renames=(), roots=("model.language_model.", "model.visual.", "lm_head."),
                            media="image")
"""Qwen3-VL and Qwen3.5 checkpoints use transformers 5's own names (vLLM's mapper: model.visual. ->
visual., model.language_model. -> language_model.model., lm_head. -> language_model.lm_head.)."""


def _vl(model_type: str, text: dict, vision: dict) -> dict:
    return dict(model_type=model_type, text_config=text, vision_config=vision,
                tie_word_embeddings=text["tie_word_embeddings"])


def _qwen25_vision(out: int, inter: int = 3420) -> dict:
    return dict(depth=32, hidden_size=1280, intermediate_size=inter, num_heads=16, in_channels=3,
                out_hidden_size=out, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)


def _qwen2_vl(text: dict) -> dict:
    return _vl("qwen2_vl", text, dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16,
                                      hidden_size=text["hidden_size"], in_channels=3, patch_size=14,
                                      spatial_merge_size=2, temporal_patch_size=2))


class Qwen2VL(QwenVL):
    name = "qwen2-vl"
    model_types = ("qwen2_vl",)
    classes = ("Qwen2VLForConditionalGeneration",)
    processors = ("Qwen2VLProcessor",)
    tiny = "qwen2-vl"
    vllm = _QWEN2_VL_NAMES
    published = {
        "Qwen/Qwen2-VL-2B-Instruct": _qwen2_vl(_text(1536, 8960, 28, 12, 2, 151936, True)),
        "Qwen/Qwen2-VL-7B-Instruct": _qwen2_vl(_text(3584, 18944, 28, 28, 4, 152064, False)),
    }


class Qwen25VL(QwenVL):
    name = "qwen2.5-vl"
    model_types = ("qwen2_5_vl",)
    classes = ("Qwen2_5_VLForConditionalGeneration",)
    processors = ("Qwen2_5_VLProcessor",)
    tiny = "qwen2.5-vl"
    vllm = _QWEN2_VL_NAMES
    published = {
        "Qwen/Qwen2.5-VL-3B-Instruct": _vl("qwen2_5_vl", _text(2048, 11008, 36, 16, 2, 151936, True),
                                           _qwen25_vision(2048)),
        "Qwen/Qwen2.5-VL-7B-Instruct": _vl("qwen2_5_vl", _text(3584, 18944, 28, 28, 4, 152064, False),
                                           _qwen25_vision(3584)),
        "Qwen/Qwen2.5-VL-32B-Instruct": _vl("qwen2_5_vl", _text(5120, 27648, 64, 40, 8, 152064, False),
                                            _qwen25_vision(5120, 3456)),
        "Qwen/Qwen2.5-VL-72B-Instruct": _vl("qwen2_5_vl", _text(8192, 29568, 80, 64, 8, 152064, False),
                                            _qwen25_vision(8192, 3456)),
    }


def _qwen3_vision(out: int, depth: int = 27, width: int = 1152, inter: int = 4304,
                  deepstack: tuple[int, ...] = (8, 16, 24)) -> dict:
    return dict(depth=depth, hidden_size=width, intermediate_size=inter, num_heads=16,
                in_channels=3, out_hidden_size=out, patch_size=16, spatial_merge_size=2,
                temporal_patch_size=2, num_position_embeddings=2304,
                deepstack_visual_indexes=list(deepstack))


def _qwen3_text(h, i, layers, heads, kv, vocab, tied, **extra) -> dict:
    return dict(_text(h, i, layers, heads, kv, vocab, tied), head_dim=128,
                rope_parameters={"rope_type": "default", "rope_theta": 5000000,
                                 "mrope_section": [24, 20, 20], "mrope_interleaved": True},
                **extra)


class Qwen3VL(QwenVL):
    """Qwen3-VL: 16-pixel patches, interleaved M-RoPE, DeepStack features."""

    name = "qwen3-vl"
    model_types = ("qwen3_vl",)
    classes = ("Qwen3VLForConditionalGeneration",)
    processors = ("Qwen3VLProcessor",)
    tiny = "qwen3-vl"
    default_patch = 16
    vllm = _QWEN3_VL_NAMES
    published = {
        "Qwen/Qwen3-VL-2B-Instruct": _vl("qwen3_vl", _qwen3_text(2048, 6144, 28, 16, 8, 151936, True),
                                         _qwen3_vision(2048, 24, 1024, 4096, (5, 11, 17))),
        "Qwen/Qwen3-VL-4B-Instruct": _vl("qwen3_vl", _qwen3_text(2560, 9728, 36, 32, 8, 151936, True),
                                         _qwen3_vision(2560, 24, 1024, 4096, (5, 11, 17))),
        "Qwen/Qwen3-VL-8B-Instruct": _vl("qwen3_vl", _qwen3_text(4096, 12288, 36, 32, 8, 151936, False),
                                         _qwen3_vision(4096)),
        "Qwen/Qwen3-VL-32B-Instruct": _vl("qwen3_vl", _qwen3_text(5120, 25600, 64, 64, 8, 151936, False),
                                          _qwen3_vision(5120)),
    }

    def pick_features(self, encoded: Any, ranges: list[tuple[int, int]]) -> Any:
        """Qwen3-VL's: the merged features and, per DeepStack layer, the same items' features
        of that layer, in the same order."""
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        pick = lambda per_item: [per_item[k] for a, b in ranges for k in range(a, b)]  # noqa: E731
        return BaseModelOutputWithDeepstackFeatures(
            pooler_output=pick(encoded.pooler_output),
            deepstack_features=[pick(layer) for layer in encoded.deepstack_features])


class Qwen3VLMoe(Qwen3VL):
    name = "qwen3-vl-moe"
    model_types = ("qwen3_vl_moe",)
    classes = ("Qwen3VLMoeForConditionalGeneration",)
    processors = ()
    tiny = "qwen3-vl-moe"
    moe = True
    vllm = replace(_QWEN3_VL_NAMES, transposed=TRANSPOSED_EXPERTS)
    """Qwen3-VL's names; the fused experts sent whole but transposed, [E, H, 2I] / [E, I, H], as
    the released checkpoints hold them and vLLM's loader (is_fused_checkpoint_transposed) takes."""
    unit_classes = ("DecoderLayer", "VisionBlock", "TextExperts")
    published = {
        "Qwen/Qwen3-VL-30B-A3B-Instruct": _vl(
            "qwen3_vl_moe", _qwen3_text(2048, 6144, 48, 32, 4, 151936, False, num_experts=128,
                                        num_experts_per_tok=8, moe_intermediate_size=768,
                                        decoder_sparse_step=1),
            _qwen3_vision(2048)),
    }


def _qwen3_5_vision(out: int) -> dict:
    """Qwen3.5's tower: Qwen3-VL's 27-block, 1152-wide one without DeepStack."""
    vision = _qwen3_vision(out)
    vision.pop("deepstack_visual_indexes")
    return vision


class Qwen35(QwenVL):
    """Qwen3.5 (natively multimodal): Qwen3-VL's vision (16-pixel patches, no DeepStack) on a
    hybrid text model (Gated DeltaNet linear-attention layers between full-attention ones)."""

    name = "qwen3.5"
    model_types = ("qwen3_5",)
    classes = ("Qwen3_5ForConditionalGeneration",)
    processors = ()
    tiny = "qwen3.5"
    default_patch = 16
    vllm = _QWEN3_VL_NAMES
    repeatable_cache = False
    lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj")

    published = {
        # Qwen/Qwen3.5-4B: the text dims of slime's Megatron script for it (scripts/models/
        # qwen3.5-4B.sh: 32 layers, hidden 2560, FFN 9216, 16 heads / 4 KV groups of 256, partial
        # rotary 0.25, tied embeddings, vocab 248320), with Gated DeltaNet's 16 key / 32 value
        # heads of 128 and full attention every 4th layer as a public simulator's spec of the
        # release states them; its vision tower is assumed the 35B-A3B's (27 blocks, 1152 wide),
        # projected to 2560: neither source states it
        "Qwen/Qwen3.5-4B": _vl("qwen3_5", dict(
            _text(2560, 9216, 32, 16, 4, 248320, True), head_dim=256, full_attention_interval=4,
            linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_num_key_heads=16, linear_num_value_heads=32,
            rope_parameters={"rope_type": "default", "rope_theta": 10000000,
                             "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                             "mrope_section": [11, 11, 10]}), _qwen3_5_vision(2560)),
    }


def _qwen3_5_moe_text(h: int, layers: int, heads: int, kv: int, experts: int, top: int, inter: int,
                      vocab: int) -> dict:
    """Qwen3.5-MoE's text config: head_dim 256; Gated DeltaNet (16 key / 32 value heads of 128,
    conv 4) with full attention every fourth layer; interleaved M-RoPE on a quarter of each
    head; every layer sparse, with one shared expert as wide as a routed one."""
    return dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=256, vocab_size=vocab, tie_word_embeddings=False,
                full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                num_experts=experts, num_experts_per_tok=top, moe_intermediate_size=inter,
                shared_expert_intermediate_size=inter,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000,
                                 "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                                 "mrope_section": [11, 11, 10]})


class Qwen35Moe(Qwen35):
    """Qwen3.5-MoE: Qwen3.5's vision and hybrid decoder with a sparse MoE block in every layer
    (routed experts + a gated shared expert)."""

    name = "qwen3.5-moe"
    model_types = ("qwen3_5_moe",)
    classes = ("Qwen3_5MoeForConditionalGeneration",)
    tiny = "qwen3.5-moe"
    moe = True
    vllm = replace(_QWEN3_VL_NAMES, experts=PER_EXPERT)
    """Qwen3.5's names, the fused experts sent one weight per expert as its checkpoints (and
    transformers' save) hold them: vLLM's Qwen3.5-MoE loader maps `experts.{e}.gate_proj` etc."""
    unit_classes = ("DecoderLayer", "VisionBlock", "MoeExperts")
    published = {
        # dims of the release's config.json (as slime's Megatron script for it states them too)
        "Qwen/Qwen3.5-35B-A3B": _vl("qwen3_5_moe", _qwen3_5_moe_text(2048, 40, 16, 2, 256, 8, 512, 248320),
                                    _qwen3_5_vision(2048)),
    }
