"""The published config.json dims of the Qwen2/2.5-VL, Qwen2-Audio and Qwen2.5-Omni releases, so
`mmrlvr plan` works offline for hub ids that are not on this machine (the planner builds each on
the meta device and counts its parameters exactly)."""
from __future__ import annotations


def _text(h, i, layers, heads, kv, vocab, tied) -> dict:
    return dict(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, vocab_size=vocab,
                num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied)


def _qwen25_vision(out: int, inter: int = 3420) -> dict:
    return dict(depth=32, hidden_size=1280, intermediate_size=inter, num_heads=16, in_channels=3,
                out_hidden_size=out, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)


def _vl(model_type: str, text: dict, vision: dict) -> dict:
    return dict(model_type=model_type, text_config=text, vision_config=vision,
                tie_word_embeddings=text["tie_word_embeddings"])


def _qwen2_vl(text: dict) -> dict:
    return _vl("qwen2_vl", text, dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16,
                                      hidden_size=text["hidden_size"], in_channels=3, patch_size=14,
                                      spatial_merge_size=2, temporal_patch_size=2))


_WHISPER = dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                num_mel_bins=128, max_source_positions=1500)
_QWEN2_AUDIO = dict(    # its config.json leaves hidden 4096, 32 layers, 32 (kv) heads to Qwen2's
    model_type="qwen2_audio", architectures=["Qwen2AudioForConditionalGeneration"],
    audio_config=_WHISPER, vocab_size=156032,
    text_config=dict(model_type="qwen2", **_text(4096, 11008, 32, 32, 32, 156032, False)))


def _omni(text: dict) -> dict:          # the thinker's dims (Policy.load trains only the thinker)
    out = text["hidden_size"]
    return dict(model_type="qwen2_5_omni_thinker", text_config=text,
                audio_config=dict(_WHISPER, output_dim=out), vision_config=_qwen25_vision(out))


BUILTIN: dict[str, dict] = {    # published config.json dims, for hub ids not on this machine
    "Qwen/Qwen2.5-VL-3B-Instruct": _vl("qwen2_5_vl", _text(2048, 11008, 36, 16, 2, 151936, True),
                                       _qwen25_vision(2048)),
    "Qwen/Qwen2.5-VL-7B-Instruct": _vl("qwen2_5_vl", _text(3584, 18944, 28, 28, 4, 152064, False),
                                       _qwen25_vision(3584)),
    "Qwen/Qwen2.5-VL-32B-Instruct": _vl("qwen2_5_vl", _text(5120, 27648, 64, 40, 8, 152064, False),
                                        _qwen25_vision(5120, 3456)),
    "Qwen/Qwen2.5-VL-72B-Instruct": _vl("qwen2_5_vl", _text(8192, 29568, 80, 64, 8, 152064, False),
                                        _qwen25_vision(8192, 3456)),
    "Qwen/Qwen2-VL-2B-Instruct": _qwen2_vl(_text(1536, 8960, 28, 12, 2, 151936, True)),
    "Qwen/Qwen2-VL-7B-Instruct": _qwen2_vl(_text(3584, 18944, 28, 28, 4, 152064, False)),
    "Qwen/Qwen2-Audio-7B": _QWEN2_AUDIO,
    "Qwen/Qwen2-Audio-7B-Instruct": _QWEN2_AUDIO,
    "Qwen/Qwen2.5-Omni-3B": _omni(_text(2048, 11008, 36, 16, 2, 151936, False)),
    "Qwen/Qwen2.5-Omni-7B": _omni(_text(3584, 18944, 28, 28, 4, 152064, False)),
}
