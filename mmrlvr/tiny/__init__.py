"""Layer 4: tiny random-weight models of real architectures with locally trained tokenizers
(`vision`: Qwen2-VL, Qwen2.5-VL; `audio`: Qwen2-Audio, Qwen2.5-Omni; one module per newer family:
`qwen3_vl` (Qwen3-VL, Qwen3-VL-MoE), `gemma3`, `qwen3_omni` (the Qwen3-Omni thinker), `internvl`,
`qwen3_5` (Qwen3.5, Qwen3.5-MoE), `smolvlm`, `llava_onevision`, `mistral3`, `glm4v`; `tokenizer`: what
they all share, `common`: what the newer families share), and `vision_pretrain`, which teaches a tiny vision tower to read before SFT."""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

VISION_KINDS: tuple[str, ...] = ("qwen2-vl", "qwen2.5-vl")
"""The kinds `mmrlvr.tiny.vision` builds (Qwen2-VL's processor, pixel bounds 56x56..112x112 and
default system prompt; tests/test_tiny.py checks exactly those over this tuple)."""
NEW_VISION_KINDS: tuple[str, ...] = ("qwen3-vl", "qwen3-vl-moe", "gemma3", "internvl", "qwen3.5",
                                     "qwen3.5-moe", "smolvlm", "llava-onevision", "mistral3", "glm4v")
"""Image-language kinds with their own builder module (`mmrlvr.tiny.<family>`), each with its
family's processor geometry, placeholder tokens and chat template (tests/test_tiny_families.py)."""
IMAGE_KINDS: tuple[str, ...] = VISION_KINDS + NEW_VISION_KINDS
"""Every image-language kind."""
AUDIO_KINDS: tuple[str, ...] = ("qwen2-audio", "qwen2.5-omni", "qwen3-omni")
"""Every audio-language kind."""
TEXT_KINDS: tuple[str, ...] = ("llama",)
"""Text-only kinds (`mmrlvr.tiny.llama`: the suite's stand-in for SmolLM2)."""
KINDS: tuple[str, ...] = IMAGE_KINDS + AUDIO_KINDS + TEXT_KINDS
"""Architectures `build_tiny` can make (also the names `mmrlvr tiny KIND` accepts)."""

_BUILDERS: dict[str, tuple[str, str, bool]] = {
    "qwen3-vl": ("mmrlvr.tiny.qwen3_vl", "build_tiny_qwen3_vl", True),
    "qwen3-vl-moe": ("mmrlvr.tiny.qwen3_vl", "build_tiny_qwen3_vl", True),
    "gemma3": ("mmrlvr.tiny.gemma3", "build_tiny_gemma3", False),
    "qwen3-omni": ("mmrlvr.tiny.qwen3_omni", "build_tiny_qwen3_omni", False),
    "internvl": ("mmrlvr.tiny.internvl", "build_tiny_internvl", False),
    "llama": ("mmrlvr.tiny.llama", "build_tiny_llama", False),
    "qwen3.5": ("mmrlvr.tiny.qwen3_5", "build_tiny_qwen3_5", True),
    "qwen3.5-moe": ("mmrlvr.tiny.qwen3_5", "build_tiny_qwen3_5", True),
    "smolvlm": ("mmrlvr.tiny.smolvlm", "build_tiny_smolvlm", False),
    "llava-onevision": ("mmrlvr.tiny.llava_onevision", "build_tiny_llava_onevision", False),
    "mistral3": ("mmrlvr.tiny.mistral3", "build_tiny_mistral3", False),
    "glm4v": ("mmrlvr.tiny.glm4v", "build_tiny_glm4v", False),
}
"""kind -> (module, builder, whether the builder takes the kind first) for the newer families."""
_VISION_ONLY = ("min_pixels", "max_pixels")
_AUDIO_ONLY = ("audio_window",)
_FIXED_SIZE = ("gemma3", "internvl", "smolvlm", "llava-onevision", "mistral3")
"""Kinds whose processor sizes every image itself (Gemma 3's square, InternVL's tiles; Mistral 3's
builder sets a longest edge instead): their builders take no pixel bounds."""


def _audio_options(options: dict) -> dict:
    """The vision-named options an audio builder takes: `vision_depth`/`vision_width` size its
    audio encoder; pixel bounds are dropped."""
    for vision_only in _VISION_ONLY:
        options.pop(vision_only, None)
    if "vision_depth" in options:
        options["audio_layers"] = options.pop("vision_depth")
    if "vision_width" in options:
        options["audio_width"] = options.pop("vision_width")
    return options


def build_tiny(kind: str, out_dir: str | Path, **options) -> Path:
    """A tiny random-weight `kind` model with its tokenizer and processor in `out_dir`
    (`mmrlvr.tiny.vision.build_tiny_vision`, `mmrlvr.tiny.audio.build_tiny_audio` and the
    per-family builders, e.g. `mmrlvr.tiny.qwen3_vl.build_tiny_qwen3_vl`, take the options; the
    vision ones size an audio model's encoder: `vision_depth`, `vision_width`; options a kind
    has no use for, such as `audio_window` for an image model, are dropped)."""
    if kind not in KINDS:
        raise ValueError(f"unknown tiny kind {kind!r}; choose from {KINDS}")
    if kind in ("qwen2-audio", "qwen2.5-omni"):
        from mmrlvr.tiny.audio import build_tiny_audio

        return build_tiny_audio(kind, out_dir, **_audio_options(options))
    if kind in _BUILDERS:
        module, name, takes_kind = _BUILDERS[kind]
        builder = getattr(import_module(module), name)
        if kind in AUDIO_KINDS:
            options = _audio_options(options)
        unused = (_AUDIO_ONLY if kind in IMAGE_KINDS else ()) + (_VISION_ONLY if kind in _FIXED_SIZE else ())
        for option in unused:
            options.pop(option, None)
        return builder(kind, out_dir, **options) if takes_kind else builder(out_dir, **options)
    from mmrlvr.tiny.vision import build_tiny_vision

    options.pop("audio_window", None)
    return build_tiny_vision(kind, out_dir, **options)


__all__ = ["AUDIO_KINDS", "IMAGE_KINDS", "KINDS", "NEW_VISION_KINDS", "TEXT_KINDS", "VISION_KINDS",
           "build_tiny"]
