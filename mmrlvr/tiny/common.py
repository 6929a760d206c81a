"""What the newer tiny families (`qwen3_vl`, `gemma3`, `qwen3_omni`, `internvl`, ...) share: the
seeded save with any family's generation ids, the `TINY.md` / `tiny.json` card, the Qwen3 decoder
keyword arguments, the SigLIP tower's keyword arguments and the registration of a tokenizer's named
special tokens.

The first families (`vision`, `audio`) keep their own code paths so their bytes never change;
`mmrlvr.tiny.tokenizer.instantiate_and_save` is the Qwen special case of `save_seeded`.
"""
from __future__ import annotations

import json
from pathlib import Path

from mmrlvr.tiny.text import text_config


def save_seeded(model_cls, config, processor, out: Path, seed: int, *, bos_token_id, eos_token_id,
                pad_token_id, max_new_tokens: int):
    """Seeded float32 random init on CPU (global RNG untouched), a generation config with the
    family's bos/eos/pad ids and a small completion budget, then processor and model saved."""
    import torch
    from transformers import GenerationConfig

    fork_devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            model = model_cls(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                                               pad_token_id=pad_token_id, max_new_tokens=max_new_tokens)
    model.eval()
    processor.save_pretrained(str(out))
    model.save_pretrained(str(out))
    return model


def set_named_tokens(tok, roles: dict[str, str]) -> None:
    """Register `roles` (e.g. {"image_token": "<|IMAGE|>"}) as the tokenizer's model-specific
    special tokens, so `tok.image_token` / `tok.image_token_id` exist and survive save/load the
    way real checkpoints' `tokenizer_config.json` carry them."""
    tok._set_model_specific_special_tokens(special_tokens=dict(roles))


def qwen3_text_config(tok, *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                      intermediate_size: int, rope_theta: float = 5000000.0,
                      mrope_section: list[int] | None = None, **extra) -> dict:
    """Qwen3 decoder keyword arguments (explicit `head_dim`; with `mrope_section`, Qwen3-VL's
    interleaved M-RoPE: `rope_parameters = {..., "mrope_interleaved": True, "mrope_section": ...}`)."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    text = text_config(tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, intermediate_size=intermediate_size, mrope=False,
                       head_dim=hidden_size // num_heads, **extra)
    rope = {"rope_type": "default", "rope_theta": rope_theta}
    if mrope_section is not None:
        rope.update(mrope_interleaved=True, mrope_section=list(mrope_section))
    text["rope_parameters"] = rope
    return text


def interleaved_mrope_section(head_dim: int) -> list[int]:
    """Qwen3-VL's interleaved M-RoPE split of head_dim/2 frequencies over (t, h, w): real models
    use [24, 20, 20] for head_dim 128; here the same 6:5:5 proportions (e.g. [6, 5, 5] for 32).
    Interleaving puts h on frequencies 1, 4, 7, ... and w on 2, 5, 8, ..., so 3 * h <= head_dim/2."""
    half = head_dim // 2
    h = (half * 5) // 16
    return [half - 2 * h, h, h]


def siglip_vision_config(*, vision_width: int, vision_depth: int, image_size: int, patch_size: int) -> dict:
    """A tiny SigLIP tower's keyword arguments (head dim 16, MLP twice as wide), shared by the SigLIP families."""
    return dict(
        hidden_size=vision_width, intermediate_size=2 * vision_width, num_hidden_layers=vision_depth,
        num_attention_heads=vision_width // 16, num_channels=3, image_size=image_size,
        patch_size=patch_size, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)


def write_card(out: Path, kind: str, model, processor, tok, seed: int, *, builder: str, body: str,
               load: str, info: dict) -> None:
    """`TINY.md` (what this random-weight directory is and how to load it) and `tiny.json`."""
    n_params = sum(p.numel() for p in model.parameters())
    (out / "TINY.md").write_text(
        f"# Tiny {kind} (random weights)\n\n"
        f"This directory is a tiny **random-weight** `{type(model).__name__}` ({n_params:,} parameters, "
        f"float32) built offline by `mmrlvr tiny {kind} --out DIR` (`{builder}`, seed {seed}): the real "
        f"transformers class with a tiny config, the real `{type(processor).__name__}` and a "
        f"{len(tok)}-token byte-level BPE tokenizer trained locally with the family's special tokens and "
        f"chat template. {body} It knows nothing until trained; it exists so tests and laptops run the "
        f"real loading, processing and generation code. {load} Rebuild it bit-identically with "
        f"`mmrlvr tiny {kind} --out DIR` (same options and seed).\n")
    (out / "tiny.json").write_text(json.dumps({
        "kind": kind, "seed": seed, "params": n_params, "vocab_size": len(tok), **info,
    }, indent=2) + "\n")


def write_info_card(out: Path, stem: str, info: dict, card: str) -> None:
    """What a builder of real weights wrote: `STEM.json` (its figures) and `STEM.md` (its card)."""
    (out / f"{stem}.json").write_text(json.dumps(info, indent=2) + "\n")
    (out / f"{stem.upper()}.md").write_text(card)
