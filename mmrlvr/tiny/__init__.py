"""Layer 4: tiny random-weight models of real architectures with locally trained tokenizers
(`vision`: Qwen2-VL, Qwen2.5-VL; `audio`: Qwen2-Audio, Qwen2.5-Omni; `tokenizer`: what they
share), and `vision_pretrain`, which teaches a tiny vision tower to read before SFT."""
from __future__ import annotations

from pathlib import Path

VISION_KINDS: tuple[str, ...] = ("qwen2-vl", "qwen2.5-vl")
AUDIO_KINDS: tuple[str, ...] = ("qwen2-audio", "qwen2.5-omni")
KINDS: tuple[str, ...] = VISION_KINDS + AUDIO_KINDS
"""Architectures `build_tiny` can make (also the names `mmrlvr tiny KIND` accepts)."""


def build_tiny(kind: str, out_dir: str | Path, **options) -> Path:
    """A tiny random-weight `kind` model with its tokenizer and processor in `out_dir`
    (`mmrlvr.tiny.vision.build_tiny_vision`, `mmrlvr.tiny.audio.build_tiny_audio` take the
    options; the vision ones size an audio model's encoder: `vision_depth`, `vision_width`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown tiny kind {kind!r}; choose from {KINDS}")
    if kind in AUDIO_KINDS:
        from mmrlvr.tiny.audio import build_tiny_audio

        for vision_only in ("min_pixels", "max_pixels"):
            options.pop(vision_only, None)
        if "vision_depth" in options:
            options["audio_layers"] = options.pop("vision_depth")
        if "vision_width" in options:
            options["audio_width"] = options.pop("vision_width")
        return build_tiny_audio(kind, out_dir, **options)
    from mmrlvr.tiny.vision import build_tiny_vision

    options.pop("audio_window", None)
    return build_tiny_vision(kind, out_dir, **options)


__all__ = ["AUDIO_KINDS", "KINDS", "VISION_KINDS", "build_tiny"]
