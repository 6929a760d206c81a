"""The text model of every tiny family: one Qwen2 decoder config, sized by the caller."""
from __future__ import annotations


def mrope_section(head_dim: int) -> list[int]:
    """M-RoPE's split of head_dim/2 rotary frequencies over (temporal, height, width); real
    Qwen uses [16, 24, 24] for head_dim 128, i.e. 1/4, 3/8, 3/8."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def text_config(tok, *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                intermediate_size: int, mrope: bool, **extra) -> dict:
    """Qwen2 decoder keyword arguments for tokenizer `tok` (its special tokens as bos/eos/pad);
    `mrope` adds the 3-D rotary split; `extra` adds family-specific keys."""
    eot, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    if mrope:
        rope["mrope_section"] = mrope_section(hidden_size // num_heads)
    return dict(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads,
                num_key_value_heads=num_kv_heads, hidden_act="silu", max_position_embeddings=4096,
                rms_norm_eps=1e-6, rope_parameters=rope, bos_token_id=eot, eos_token_id=im_end,
                pad_token_id=eot, dtype="float32", **extra)
