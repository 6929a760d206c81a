"""Tiny random-weight models of real architectures, for tests and laptops.

`build_tiny("qwen2-vl", DIR)` writes a directory that loads exactly like a real checkpoint::

    processor = AutoProcessor.from_pretrained(DIR)
    model = AutoModelForImageTextToText.from_pretrained(DIR)

The model is the real transformers class (`Qwen2VLForConditionalGeneration`,
`Qwen2_5_VLForConditionalGeneration`) with a tiny config and random weights; the processor is
the real one (`Qwen2VLProcessor` / `Qwen2_5_VLProcessor` with the stock Qwen2-VL image and video
processors); the tokenizer is a byte-level BPE of about 600 tokens trained here, offline, on a
small built-in English corpus, carrying every Qwen2-VL / Qwen2-Audio special token with its
exact string and the family's real chat template. Nothing touches the network.

`build_tiny("qwen2-audio", DIR)` and `build_tiny("qwen2.5-omni", DIR)` make the audio families
(`mmrlvr.tiny.audio`: Qwen2-Audio and the Qwen2.5-Omni thinker, with a short feature window).

The tokenizer and the seeded init are shared with the audio families (`mmrlvr.tiny.tokenizer`).
"""
from __future__ import annotations

import json
from pathlib import Path

from mmrlvr.tiny.text import text_config
from mmrlvr.tiny.tokenizer import (QWEN2_VL_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS,
                                   QWEN_VL_SPECIAL_TOKENS, build_tokenizer, instantiate_and_save)


def _config(kind: str, tok, *, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
            vision_depth, vision_width):
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    head_dim = hidden_size // num_heads
    if head_dim % 2 or head_dim < 6:
        raise ValueError(f"head_dim {head_dim} too small for M-RoPE")
    if vision_width % 16:
        raise ValueError("vision_width must be a multiple of 16 (vision head dim 16)")
    vision_heads = vision_width // 16

    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_VL_SPECIAL_TOKENS}
    text = text_config(tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, intermediate_size=intermediate_size, mrope=True,
                       use_sliding_window=False, max_window_layers=num_layers)
    common = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    if kind == "qwen2-vl":
        from transformers import Qwen2VLConfig

        vision = dict(
            depth=vision_depth, embed_dim=vision_width, hidden_size=hidden_size, mlp_ratio=2,
            num_heads=vision_heads, in_channels=3, patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2, hidden_act="quick_gelu",
        )
        return Qwen2VLConfig(text_config=text, vision_config=vision, **common)
    if kind == "qwen2.5-vl":
        from transformers import Qwen2_5_VLConfig

        vision = dict(
            depth=vision_depth, hidden_size=vision_width, intermediate_size=2 * vision_width,
            out_hidden_size=hidden_size, num_heads=vision_heads, in_channels=3, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, hidden_act="silu", window_size=112,
            # real: window attention everywhere except every 8th block; here the last block is full
            fullatt_block_indexes=[vision_depth - 1], tokens_per_second=2,
        )
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)
    raise ValueError(f"unknown tiny vision kind {kind!r}; choose qwen2-vl or qwen2.5-vl")


def _processor(kind: str, tok, *, min_pixels: int, max_pixels: int):
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    pix = dict(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    image_processor = Qwen2VLImageProcessor(**pix)
    video_processor = Qwen2VLVideoProcessor(**pix)
    if kind == "qwen2-vl":
        from transformers import Qwen2VLProcessor as cls
    else:
        from transformers import Qwen2_5_VLProcessor as cls
    return cls(image_processor=image_processor, tokenizer=tok, video_processor=video_processor,
               chat_template=QWEN2_VL_CHAT_TEMPLATE)


def build_tiny_vision(
    kind: str,
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vision_depth: int = 2,
    vision_width: int = 64,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    min_pixels: int = 56 * 56,
    max_pixels: int = 112 * 112,
    seed: int = 0,
    audio_window: int = 3,
) -> Path:
    """Build a tiny random-weight `kind` model with its tokenizer and processor into `out_dir`.

    The directory holds `config.json`, `generation_config.json`, `model.safetensors` (float32),
    the tokenizer files, `processor_config.json`/`preprocessor_config.json`, `chat_template.jinja`
    and `TINY.md`. The processor's pixel bounds (`min_pixels`..`max_pixels`) and the generation
    config's `max_new_tokens` (64) are what a run takes where its config leaves
    `model.min_pixels`, `model.max_pixels`, `rollout.max_new_tokens` at 0 ("the model's"). It
    loads with `AutoProcessor` + `AutoModelForImageTextToText`. The same arguments and seed give
    bit-identical weights and tokenizer. For the audio kinds the vision
    arguments size the audio encoder (`vision_depth` layers, `vision_width` wide) and
    `audio_window` is the feature window in seconds (`mmrlvr.tiny.audio.build_tiny_audio`).
    """

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = build_tokenizer(None, extra_corpus, vocab_target, QWEN_SPECIAL_TOKENS)
    processor = _processor(kind, tok, min_pixels=min_pixels, max_pixels=max_pixels)
    config = _config(kind, tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                     num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                     vision_depth=vision_depth, vision_width=vision_width)
    if kind == "qwen2-vl":
        from transformers import Qwen2VLForConditionalGeneration as model_cls
    else:
        from transformers import Qwen2_5_VLForConditionalGeneration as model_cls

    model = instantiate_and_save(model_cls, config, tok, processor, out, seed)
    n_params = sum(p.numel() for p in model.parameters())
    (out / "TINY.md").write_text(
        f"# Tiny {kind} (random weights)\n\n"
        f"This directory is a tiny **random-weight** `{type(model).__name__}` ({n_params:,} parameters, "
        f"float32) built offline by `mmrlvr tiny {kind} --out DIR` (`mmrlvr.tiny.build_tiny`, seed {seed}): "
        f"the real transformers model class with a tiny config (text hidden {hidden_size}, {num_layers} layers, "
        f"{num_heads} heads / {num_kv_heads} KV heads; vision depth {vision_depth}, width {vision_width}), the "
        f"real `{type(processor).__name__}` (images resized to {min_pixels}..{max_pixels} pixels, patch 14, "
        f"merge 2) and a {len(tok)}-token byte-level BPE tokenizer trained locally with every Qwen special "
        f"token and the Qwen2-VL chat template. It knows nothing until trained; it exists so tests and "
        f"laptops run the real loading, processing and generation code. Load it with "
        f"`AutoProcessor.from_pretrained(DIR)` and `AutoModelForImageTextToText.from_pretrained(DIR)`; "
        f"rebuild it bit-identically with `mmrlvr tiny {kind} --out DIR` (same options and seed).\n"
    )
    (out / "tiny.json").write_text(json.dumps({
        "kind": kind, "seed": seed, "params": n_params, "vocab_size": len(tok),
        "hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
        "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size,
        "vision_depth": vision_depth, "vision_width": vision_width,
        "min_pixels": min_pixels, "max_pixels": max_pixels, "vocab_target": vocab_target,
    }, indent=2) + "\n")
    return out
