"""A tiny random-weight Qwen3-Omni thinker (`mmrlvr tiny qwen3-omni`):
`Qwen3OmniMoeThinkerForConditionalGeneration` (text out; no talker, no code2wav) +
`Qwen3OmniMoeProcessor` (`WhisperFeatureExtractor`, `Qwen2VLImageProcessor`, `Qwen2VLVideoProcessor`).

The audio encoder cuts the 128-bin log-mel features (100 frames a second) into chunks of
`2 * n_window` = 100 frames (1 s), runs three stride-2 convolutions over each (100 -> 50 -> 25 -> 13
frames) and attends within windows of `n_window_infer` frames; so a full second gives 13 audio
tokens, where Qwen2-Audio gives 25. The processor and the model count them with the same
function, `_get_feat_extract_output_lengths(input_lengths, n_window=50)` (in
`processing_qwen3_omni_moe` and `modeling_qwen3_omni_moe`):

    leave = L % (2 * n_window);  f = (leave - 1) // 2 + 1
    tokens = ((f - 1) // 2 + 1 - 1) // 2 + 1 + (L // (2 * n_window)) * 13

with L the clip's mel frames (`feature_attention_mask.sum(-1)`): 1 s -> L = 100 -> 13 tokens,
0.5 s -> 7, 2 s -> 26, 2.5 s -> 33. The feature extractor's window is `audio_window` seconds
(default 3; the real model's is 30 s). The text model is a tiny Qwen3-MoE decoder (4 experts,
top-2) with Qwen3-VL's interleaved M-RoPE; audio positions are 1-D (`get_rope_index` builds 3-D
positions only when images or videos are present). The vision tower is one tiny Qwen3-VL-style
block (16 px patches, merge 2, DeepStack from block 0) so image prompts run too.
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.audio import _features
from mmrlvr.tiny.common import interleaved_mrope_section, qwen3_text_config, set_named_tokens, write_card
from mmrlvr.tiny.qwen3_vl import MERGE_SIZE, PATCH_SIZE, QWEN3_VL_CHAT_TEMPLATE, qwen3_vl_vision_config
from mmrlvr.tiny.tokenizer import QWEN_VL_SPECIAL_TOKENS, build_tokenizer, instantiate_and_save

QWEN3_OMNI_SPECIAL_TOKENS: tuple[str, ...] = QWEN_VL_SPECIAL_TOKENS + (
    "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>")
"""Qwen3-Omni's added tokens: Qwen3-VL's plus the audio start/end marks and the audio placeholder
(real ids 151669, 151670, 151675)."""

QWEN3_OMNI_TOKEN_ROLES: dict[str, str] = {
    "image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}
"""The named special tokens `Qwen3OmniMoeProcessor` reads off its tokenizer (as the real
tokenizer_config.json names them)."""

AUDIO_BLOCK = "<|audio_start|><|audio_pad|><|audio_end|>"

_AUDIO_BRANCH = (
    "                {%- elif content.type == 'audio' or 'audio' in content or 'audio_url' in content %}\n"
    "                    {%- set audio_count.value = audio_count.value + 1 %}\n"
    "                    {%- if add_audio_id %}Audio {{ audio_count.value }}: {% endif -%}\n"
    "                    <|audio_start|><|audio_pad|><|audio_end|>\n")
_TEXT_BRANCH = "                {%- elif 'text' in content %}\n"


def _omni_template() -> str:
    """After Qwen3-Omni-Instruct's template: Qwen3-VL-Instruct's (no default system prompt, tools,
    tool responses) with an audio entry (type "audio", or an "audio"/"audio_url" key) written as
    `<|audio_start|><|audio_pad|><|audio_end|>`, in user turns and tool responses alike."""
    template = QWEN3_VL_CHAT_TEMPLATE
    if template.count(_TEXT_BRANCH) != 2:
        raise AssertionError("the Qwen3-VL template's content loops changed")
    template = template.replace(_TEXT_BRANCH, _AUDIO_BRANCH + _TEXT_BRANCH)
    return template.replace("{%- set video_count = namespace(value=0) %}\n",
                            "{%- set video_count = namespace(value=0) %}\n"
                            "{%- set audio_count = namespace(value=0) %}\n", 1)


QWEN3_OMNI_CHAT_TEMPLATE: str = _omni_template()


def _omni_processor(tok, audio_window: int):
    """`Qwen3OmniMoeProcessor` over `tok`: 16 px patches, merge 2, a Whisper window of `audio_window` s."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor, Qwen3OmniMoeProcessor

    pix = dict(patch_size=PATCH_SIZE, temporal_patch_size=2, merge_size=MERGE_SIZE,
               image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    size = {"shortest_edge": 64 * 64, "longest_edge": 128 * 128}
    return Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, **pix),
        video_processor=Qwen2VLVideoProcessor(size=dict(size), **pix),
        feature_extractor=_features(audio_window), tokenizer=tok, chat_template=QWEN3_OMNI_CHAT_TEMPLATE)


def _omni_config(tok, text: dict, *, hidden_size: int, audio_layers: int, audio_width: int,
                 audio_window: int):
    """The thinker's `Qwen3OmniMoeThinkerConfig`: the audio encoder, one vision block, `text`, token ids."""
    from transformers import Qwen3OmniMoeThinkerConfig

    ids = tok.convert_tokens_to_ids
    user = tok("user", add_special_tokens=False).input_ids
    return Qwen3OmniMoeThinkerConfig(
        audio_config=dict(num_mel_bins=128, encoder_layers=audio_layers,
                          encoder_attention_heads=audio_width // 16, encoder_ffn_dim=2 * audio_width,
                          d_model=audio_width, max_source_positions=50 * audio_window, n_window=50,
                          n_window_infer=800, conv_chunksize=500, downsample_hidden_size=audio_width // 2,
                          output_dim=hidden_size),
        vision_config=qwen3_vl_vision_config(vision_depth=1, vision_width=32, out_hidden_size=hidden_size),
        text_config=text, position_id_per_seconds=13,
        audio_token_id=ids("<|audio_pad|>"), image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"), audio_start_token_id=ids("<|audio_start|>"),
        audio_end_token_id=ids("<|audio_end|>"), vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        user_token_id=user[0] if len(user) == 1 else ids("<|im_start|>"),  # the talker's; unused here
        tie_word_embeddings=True)


def _card_body(info: dict, mrope_section: list[int]) -> str:
    """The `TINY.md` paragraph on this thinker's sizes and audio tokens (`info`: the builder's options)."""
    return (f"Text hidden {info['hidden_size']}, {info['num_layers']} layers, {info['num_heads']} heads / "
            f"{info['num_kv_heads']} KV heads, MoE {info['num_experts']} experts "
            f"top-{info['num_experts_per_tok']} of width {info['moe_intermediate_size']}, "
            f"interleaved M-RoPE {mrope_section}; audio encoder {info['audio_layers']} "
            f"layers, width {info['audio_width']}, 128 mel bins, a Whisper feature window of "
            f"{info['audio_window']} s (the real model's is 30 s). The encoder downsamples each 1 s chunk "
            f"of 100 mel frames 8x: a 1 s clip gives 13 `<|audio_pad|>` tokens between `<|audio_start|>` "
            f"and `<|audio_end|>` (`_get_feat_extract_output_lengths`; Qwen2-Audio gives 25). This is the "
            f"thinker only (text out).")


def build_tiny_qwen3_omni(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    moe_intermediate_size: int = 64,
    audio_layers: int = 2,
    audio_width: int = 64,
    audio_window: int = 3,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random-weight Qwen3-Omni thinker model dir in `out_dir`."""
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration as model_cls

    if audio_width % 16:
        raise ValueError("audio_width must be a multiple of 16 (encoder head dim 16)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, QWEN3_OMNI_SPECIAL_TOKENS,
                          chat_template=QWEN3_OMNI_CHAT_TEMPLATE)
    set_named_tokens(tok, QWEN3_OMNI_TOKEN_ROLES)
    processor = _omni_processor(tok, audio_window)
    text = qwen3_text_config(
        tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size, rope_theta=1000000.0,
        mrope_section=interleaved_mrope_section(hidden_size // num_heads), num_experts=num_experts,
        num_experts_per_tok=num_experts_per_tok, moe_intermediate_size=moe_intermediate_size,
        decoder_sparse_step=1, norm_topk_prob=True)
    text["rope_parameters"]["interleaved"] = True  # the real config carries both spellings
    config = _omni_config(tok, text, hidden_size=hidden_size, audio_layers=audio_layers,
                          audio_width=audio_width, audio_window=audio_window)
    model = instantiate_and_save(model_cls, config, tok, processor, out, seed)
    info = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                num_kv_heads=num_kv_heads, intermediate_size=intermediate_size, num_experts=num_experts,
                num_experts_per_tok=num_experts_per_tok, moe_intermediate_size=moe_intermediate_size,
                audio_layers=audio_layers, audio_width=audio_width, audio_window=audio_window,
                vocab_target=vocab_target)
    write_card(
        out, "qwen3-omni", model, processor, tok, seed,
        builder="mmrlvr.tiny.qwen3_omni.build_tiny_qwen3_omni",
        body=_card_body(info, text["rope_parameters"]["mrope_section"]),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)` (or "
             "`Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(DIR)`, the class config.json "
             "names).",
        info=info)
    return out
