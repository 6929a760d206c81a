"""Tiny random-weight audio-language models of real architectures (`mmrlvr tiny qwen2-audio`).

    qwen2-audio    `Qwen2AudioForConditionalGeneration` + `Qwen2AudioProcessor`, with
                   Qwen2-Audio-7B-Instruct's chat template
    qwen2.5-omni   the Qwen2.5-Omni thinker (`Qwen2_5OmniThinkerForConditionalGeneration`, text
                   out; no talker) + `Qwen2_5OmniProcessor`, 3-D M-RoPE, a one-block vision tower

Both use the real Whisper feature extractor (128 mel bins, 16 kHz) with a short window:
`audio_window` seconds (default 3; the real models' is 30 s) and, for Qwen2-Audio,
`max_source_positions` = 50 x the window, so a CPU forward over 64 sequences takes about a second
instead of ten. A 1 s clip gives 25 audio tokens. The tokenizer is `mmrlvr.tiny.tokenizer.build_tokenizer`'s
byte-level BPE with the family's special tokens. The directories load through `AutoProcessor` and
the class their config names (`mmrlvr.train.policy.load_model` falls back to it); the same arguments and
seed give the same bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

from mmrlvr.tiny.text import text_config
from mmrlvr.tiny.tokenizer import QWEN_SPECIAL_TOKENS, build_tokenizer, instantiate_and_save

# Qwen2-Audio-7B-Instruct's chat template, verbatim: an entry counts as audio when it has an
# "audio" (or "audio_url") key.
QWEN2_AUDIO_CHAT_TEMPLATE: str = (
    "{% set audio_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

OMNI_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_bos|>", "<|vision_eos|>",
    "<|vision_pad|>", "<|IMAGE|>", "<|VIDEO|>")
"""Qwen2.5-Omni's added tokens (audio, image and video placeholders with their begin/end marks)."""

OMNI_TOKEN_ROLES: dict[str, str] = {
    "image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}
"""The named special tokens `Qwen2_5OmniProcessor` reads off its tokenizer."""

# After Qwen2.5-Omni's template: media entries wrapped in their begin/end marks, the default
# system prompt shortened to the assistant one (the real one announces speech output).
OMNI_CHAT_TEMPLATE: str = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'image' or 'image' in content %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _features(audio_window: int):
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160,
                                   chunk_length=audio_window, n_fft=400)


def _qwen2_audio(dims: dict, encoder: dict, audio_window: int, vocab_target: int,
                 extra_corpus: list[str] | None):
    """Qwen2-Audio's model class, tokenizer, processor and config."""
    from transformers import Qwen2AudioConfig, Qwen2AudioProcessor
    from transformers import Qwen2AudioForConditionalGeneration as model_cls

    tok = build_tokenizer(None, extra_corpus, vocab_target, QWEN_SPECIAL_TOKENS,
                          chat_template=QWEN2_AUDIO_CHAT_TEMPLATE)
    processor = Qwen2AudioProcessor(feature_extractor=_features(audio_window), tokenizer=tok,
                                    chat_template=QWEN2_AUDIO_CHAT_TEMPLATE)
    config = Qwen2AudioConfig(
        audio_config=dict(model_type="qwen2_audio_encoder", max_source_positions=50 * audio_window,
                          **encoder),
        text_config=dict(model_type="qwen2", **text_config(tok, mrope=False, **dims)),
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"))
    return model_cls, tok, processor, config


def _qwen2_5_omni(dims: dict, encoder: dict, audio_window: int, vocab_target: int,
                  extra_corpus: list[str] | None):
    """The Qwen2.5-Omni thinker's model class, tokenizer, processor and config."""
    from transformers import (
        Qwen2_5OmniProcessor,
        Qwen2_5OmniThinkerConfig,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration as model_cls

    hidden_size = dims["hidden_size"]
    tok = build_tokenizer(None, extra_corpus, vocab_target, OMNI_SPECIAL_TOKENS,
                          chat_template=OMNI_CHAT_TEMPLATE)
    tok._set_model_specific_special_tokens(special_tokens=dict(OMNI_TOKEN_ROLES))
    pix = dict(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112}, patch_size=14,
               temporal_patch_size=2, merge_size=2)
    processor = Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(**pix), video_processor=Qwen2VLVideoProcessor(**pix),
        feature_extractor=_features(audio_window), tokenizer=tok, chat_template=OMNI_CHAT_TEMPLATE)
    ids = tok.convert_tokens_to_ids
    config = Qwen2_5OmniThinkerConfig(
        # the Omni encoder attends within windows of 2 x n_window mel frames (1 s here)
        audio_config=dict(max_source_positions=50 * audio_window, n_window=50,
                          output_dim=hidden_size, **encoder),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=hidden_size, fullatt_block_indexes=[0]),
        text_config=text_config(tok, mrope=True, **dims),
        audio_token_index=ids("<|AUDIO|>"), image_token_index=ids("<|IMAGE|>"),
        video_token_index=ids("<|VIDEO|>"), audio_start_token_id=ids("<|audio_bos|>"),
        audio_end_token_id=ids("<|audio_eos|>"), vision_start_token_id=ids("<|vision_bos|>"),
        vision_end_token_id=ids("<|vision_eos|>"), user_token_id=ids("<|im_start|>"))
    return model_cls, tok, processor, config


def _write_audio_card(out: Path, kind: str, model, processor, tok, seed: int, dims: dict, *,
                      audio_layers: int, audio_width: int, audio_window: int, vocab_target: int) -> None:
    """This family's own `TINY.md` and `tiny.json` (not `common.write_card`, so its bytes never change)."""
    n_params = sum(p.numel() for p in model.parameters())
    (out / "TINY.md").write_text(
        f"# Tiny {kind} (random weights)\n\n"
        f"This directory is a tiny **random-weight** `{type(model).__name__}` ({n_params:,} parameters, "
        f"float32) built offline by `mmrlvr tiny {kind} --out DIR` (`mmrlvr.tiny.audio.build_tiny_audio`, "
        f"seed {seed}): the real transformers class with a tiny config (text hidden {dims['hidden_size']}, "
        f"{dims['num_layers']} layers, {dims['num_heads']} heads / {dims['num_kv_heads']} KV heads; audio "
        f"encoder {audio_layers} layers, width {audio_width}, 128 mel bins), the real "
        f"`{type(processor).__name__}` with a Whisper feature extractor whose window is {audio_window} s "
        f"(the real model's is 30 s), and a "
        f"{len(tok)}-token byte-level BPE tokenizer trained locally with the family's special tokens and "
        f"chat template. It knows nothing until trained. Load it with `AutoProcessor.from_pretrained(DIR)` "
        f"and `{type(model).__name__}.from_pretrained(DIR)` (or `mmrlvr.train.policy.load_model`).\n")
    (out / "tiny.json").write_text(json.dumps({
        "kind": kind, "seed": seed, "params": n_params, "vocab_size": len(tok), **dims,
        "audio_layers": audio_layers, "audio_width": audio_width, "audio_window": audio_window,
        "vocab_target": vocab_target,
    }, indent=2) + "\n")


def build_tiny_audio(
    kind: str,
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    audio_layers: int = 2,
    audio_width: int = 64,
    audio_window: int = 3,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random-weight `qwen2-audio` or `qwen2.5-omni` (thinker) model dir in `out_dir`."""
    if audio_width % 16:
        raise ValueError("audio_width must be a multiple of 16 (encoder head dim 16)")
    if kind not in ("qwen2-audio", "qwen2.5-omni"):
        raise ValueError(f"unknown tiny audio kind {kind!r}; choose qwen2-audio or qwen2.5-omni")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dims = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                num_kv_heads=num_kv_heads, intermediate_size=intermediate_size)
    encoder = dict(num_mel_bins=128, encoder_layers=audio_layers, encoder_attention_heads=audio_width // 16,
                   encoder_ffn_dim=2 * audio_width, d_model=audio_width)
    parts = _qwen2_audio if kind == "qwen2-audio" else _qwen2_5_omni
    model_cls, tok, processor, config = parts(dims, encoder, audio_window, vocab_target, extra_corpus)
    model = instantiate_and_save(model_cls, config, tok, processor, out, seed)
    _write_audio_card(out, kind, model, processor, tok, seed, dims, audio_layers=audio_layers,
                      audio_width=audio_width, audio_window=audio_window, vocab_target=vocab_target)
    return out
