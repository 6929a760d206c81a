"""SmolVLM (`SmolVLMForConditionalGeneration`, SmolVLM2 and the Idefics3 layout it shares): a SigLIP
tower over fixed squares, a pixel-shuffle connector, a Llama decoder with 1-D RoPE.

Geometry: the processor resizes each image to its own longest edge, cuts it into squares of
`max_image_size` and adds the global image (one square) unless the image fits one; each square
becomes `image_seq_len` `<image>` tokens (81 for SmolVLM2-2.2B: 384 px / 14 = 27² patches,
pixel-shuffled by 3). The chat template writes `<image>`; the processor expands it. No dynamic
resolution: `model.min_pixels`/`max_pixels` do not apply.

`pixel_values` is [samples, most squares of any sample, 3, S, S], one row per *sample* (a text-only
one too), zero-padded; the model drops all-zero squares. So a sample's media rows are its one row
of `pixel_values` and `pixel_attention_mask`, and it makes (real squares) x `image_seq_len`
features: counted off the pixels, as the model counts them, so a processor whose prompt disagrees
is caught before the first step.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from mmrlvr.models.base import Family, FamilyError, VllmNames, text_dims

SMOLVLM_NAMES = VllmNames(renames=(), roots=("model.text_model.", "model.vision_model.",
                                             "model.connector.", "lm_head."), media="image")
"""SmolVLM checkpoints carry transformers 5's own tree (`model.text_model.`, `model.vision_model.`,
`model.connector.`, `lm_head.`), the names vLLM's Idefics3/SmolVLM `load_weights` takes."""


def _smolvlm(text: dict, vision: dict, scale: int) -> dict:
    return dict(model_type="smolvlm", text_config=dict(model_type="llama", **text),
                vision_config=vision, scale_factor=scale, tie_word_embeddings=False)


class SmolVLM(Family):
    name = "smolvlm"
    model_types = ("smolvlm",)
    classes = ("SmolVLMForConditionalGeneration",)
    processors = ("SmolVLMProcessor",)
    modality = "vision"
    image_token = "<image>"
    placeholder_tokens = ("<image>", "<fake_token_around_image>", "<global-img>", "<video>",
                          *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))
    stop_tokens = ("<end_of_utterance>", "<|im_end|>", "<|endoftext|>")
    vision_towers = ("vision_model", "connector")
    unit_classes = ("DecoderLayer", "EncoderLayer")
    media_keys = ("pixel_values", "pixel_attention_mask")
    media_inputs = ("pixel_values", "pixel_attention_mask")
    image_key = "pixel_values"
    processor_kwargs: dict[str, Any] = {}
    vllm = SMOLVLM_NAMES
    tiny = "smolvlm"
    published = {
        # HuggingFaceTB/SmolVLM2-500M-Video-Instruct: SmolLM2-360M + SigLIP-B/16 at 512 px, scale
        # factor 4 (64 tokens a square); the dims a public Core ML exporter checks the loaded
        # checkpoint's config against (`validate_smolvlm2_500m_model`), not its config.json itself
        "HuggingFaceTB/SmolVLM2-500M-Video-Instruct": _smolvlm(
            dict(head_dim=64, **text_dims(960, 2560, 32, 15, 5, 49280, False)),
            dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, image_size=512, patch_size=16), 4),
    }

    # ---------------------------------------------------------------- processor side
    def resize(self, image: Any, processor: Any, min_pixels: int, max_pixels: int) -> Any:
        """Unchanged (RGB): the processor sizes and cuts every image itself."""
        return image.convert("RGB") if image.mode != "RGB" else image

    def processor_images(self, per_sample: list[list[Any]]) -> list[Any] | None:
        """Nested per sample (an empty list for none), as `SmolVLMProcessor` checks them."""
        return per_sample if any(per_sample) else None

    def media_rows(self, inputs: dict[str, torch.Tensor], per_sample: list[int],
                   processor: Any = None) -> list[dict]:
        have = int(inputs["pixel_values"].shape[0]) if "pixel_values" in inputs else 0
        if any(per_sample) and have != len(per_sample):
            raise FamilyError(f"the smolvlm processor made {have} rows of squares for "
                              f"{len(per_sample)} prompts; load the processor saved with the model")
        return [{key: (i, i + 1) for key in self.media_keys if key in inputs} if n else {}
                for i, n in enumerate(per_sample)]

    def image_features(self, inputs: dict[str, torch.Tensor], row: dict, processor: Any) -> int:
        """Real (not all-zero) squares of the sample's row x tokens a square, as the model counts."""
        if not row:
            return 0
        start, stop = row["pixel_values"]
        squares = inputs["pixel_values"][start:stop].flatten(0, 1)              # [n, 3, S, S]
        real = int((squares != 0).flatten(1).any(dim=1).sum())
        return real * int(processor.image_seq_len)

    def check_processor(self, processor: Any, config: Any) -> None:
        super().check_processor(processor, config)
        vision = config.vision_config
        want = (vision.image_size // vision.patch_size) ** 2 // config.scale_factor ** 2
        have = getattr(processor, "image_seq_len", None)
        if have is not None and int(have) != want:
            raise FamilyError(f"the processor does not match the model: it writes {have} <image> "
                              f"tokens a square, the smolvlm model's config.json makes {want} "
                              f"((image_size {vision.image_size} / patch_size {vision.patch_size})² "
                              f"/ scale_factor {config.scale_factor}²); load the processor saved "
                              "with this checkpoint")

    def tokens_per_image(self, config: Any, max_pixels: int) -> int:
        """A square image of `max_pixels`: its squares (plus the global one) x tokens a square."""
        vision = config.vision_config
        per_square = (vision.image_size // vision.patch_size) ** 2 // config.scale_factor ** 2
        n = max(1, math.ceil(math.sqrt(max_pixels) / vision.image_size))
        return per_square * (n * n + 1 if n > 1 else 1)

    # ---------------------------------------------------------------- model side
    def encode_images(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                      device: torch.device, dtype: torch.dtype) -> Any:
        """The tower's output for every sample row of `inputs` (pooler_output: one per row)."""
        mask = inputs.get("pixel_attention_mask")
        return model.model.get_image_features(
            inputs["pixel_values"].to(device, dtype),
            mask.to(device) if mask is not None else None, return_dict=True)

    def tower_zero(self, model: torch.nn.Module, device: torch.device) -> torch.Tensor:
        """The tower and connector on one square of zeros (the model keeps one all-zero square
        when a batch has no real one), times 0."""
        size = model.config.vision_config.image_size
        pixels = torch.zeros(1, 1, 3, size, size, device=device)
        out = self.encode_images(model, {"pixel_values": pixels}, device, next(model.parameters()).dtype)
        return sum(p.sum() for p in out.pooler_output) * 0

    def pick_features(self, encoded: Any, ranges: list[tuple[int, int]]) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        per_row = encoded.pooler_output
        return BaseModelOutputWithPooling(
            pooler_output=[per_row[k] for a, b in ranges for k in range(a, b)])
