"""A tiny random-weight Gemma 3 (`mmrlvr tiny gemma3`): `Gemma3ForConditionalGeneration` +
`Gemma3Processor` (`Gemma3ImageProcessor`).

Gemma 3 has no dynamic resolution: the image processor resizes every image to one square
(`size`, 896 px in the released models; 64 px here) and the SigLIP tower's patch grid is
average-pooled to `mm_tokens_per_image` soft tokens (256 real; 16 here: 64 px / patch 8 = 8x8
patches, pooled 2x2). The chat template writes `<start_of_image>` for an image; the processor
expands it to `\\n\\n<start_of_image>` + 16 x `<image_soft_token>` + `<end_of_image>\\n\\n` and returns
`token_type_ids` (1 on the soft tokens), which the model uses to let an image's tokens attend to
each other both ways. Positions are 1-D RoPE (local layers theta 1e4, global 1e6); the decoder
alternates sliding-window and full attention (`layer_types`). The tokenizer is
`mmrlvr.tiny.tokenizer.build_tokenizer`'s byte-level BPE (real Gemma: a 262k SentencePiece) with
Gemma's special tokens, `add_bos_token` like the real one, and Gemma 3's real chat template.
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import save_seeded, set_named_tokens, siglip_vision_config, write_card
from mmrlvr.tiny.tokenizer import TINY_MAX_NEW_TOKENS, build_tokenizer

GEMMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
    "<start_of_image>", "<end_of_image>", "<image_soft_token>")
"""Gemma 3's special tokens, in the order of their ids in the real vocabulary (0, 1, 2, 3, 4,
105, 106, 255999, 256000, 262144)."""

GEMMA3_TOKEN_ROLES: dict[str, str] = {
    "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
"""The named tokens `Gemma3Processor` reads off its tokenizer (`tokenizer.boi_token`, ...)."""

# google/gemma-3-*-it's chat template, verbatim.
GEMMA3_CHAT_TEMPLATE: str = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


def _check_geometry(hidden_size: int, num_heads: int, vision_width: int, image_size: int, patch_size: int,
                    mm_tokens_per_image: int) -> int:
    """Reject sizes the model cannot take; the patch grid's side."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if vision_width % 16:
        raise ValueError("vision_width must be a multiple of 16 (vision head dim 16)")
    side = image_size // patch_size
    per_side = round(mm_tokens_per_image ** 0.5)
    if image_size % patch_size or per_side ** 2 != mm_tokens_per_image or side % per_side:
        raise ValueError(f"image_size {image_size} / patch_size {patch_size} must give a square patch grid "
                         f"that {mm_tokens_per_image} (a square) tokens pool evenly")
    return side


def _gemma3_processor(tok, image_size: int, mm_tokens_per_image: int):
    """`Gemma3Processor` over `tok`: every image resized to one `image_size` square."""
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    image_processor = Gemma3ImageProcessor(
        size={"height": image_size, "width": image_size}, image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5], resample=2, do_pan_and_scan=None)
    return Gemma3Processor(image_processor=image_processor, tokenizer=tok,
                           chat_template=GEMMA3_CHAT_TEMPLATE, image_seq_length=mm_tokens_per_image)


def _gemma3_text_config(tok, *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                        intermediate_size: int, sliding_window: int) -> dict:
    """The Gemma 3 decoder's keyword arguments: sliding-window layers, every `num_layers`-th global."""
    ids = tok.convert_tokens_to_ids
    head_dim = hidden_size // num_heads
    return dict(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, query_pre_attn_scalar=head_dim, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=4096, rms_norm_eps=1e-6, sliding_window=sliding_window,
        layer_types=["full_attention" if (i + 1) % num_layers == 0 else "sliding_attention"
                     for i in range(num_layers)],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        bos_token_id=ids("<bos>"), eos_token_id=ids("<eos>"), pad_token_id=ids("<pad>"), dtype="float32")


def build_tiny_gemma3(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vision_depth: int = 2,
    vision_width: int = 64,
    image_size: int = 64,
    patch_size: int = 8,
    mm_tokens_per_image: int = 16,
    sliding_window: int = 128,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random-weight Gemma 3 model dir in `out_dir` (every `num_layers`-th layer global,
    the others sliding-window, as the real 5:1 pattern ends each group with a global layer)."""
    from transformers import Gemma3Config
    from transformers import Gemma3ForConditionalGeneration as model_cls

    side = _check_geometry(hidden_size, num_heads, vision_width, image_size, patch_size, mm_tokens_per_image)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, GEMMA3_SPECIAL_TOKENS,
                          chat_template=GEMMA3_CHAT_TEMPLATE, eos_token="<eos>", pad_token="<pad>",
                          bos_token="<bos>", unk_token="<unk>", add_bos_token=True)
    set_named_tokens(tok, GEMMA3_TOKEN_ROLES)
    processor = _gemma3_processor(tok, image_size, mm_tokens_per_image)
    ids = tok.convert_tokens_to_ids
    text = _gemma3_text_config(tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                               num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                               sliding_window=sliding_window)
    vision = dict(model_type="siglip_vision_model",
                  **siglip_vision_config(vision_width=vision_width, vision_depth=vision_depth,
                                         image_size=image_size, patch_size=patch_size),
                  vision_use_head=False)
    config = Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=mm_tokens_per_image,
        boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"), tie_word_embeddings=True)
    model = save_seeded(model_cls, config, processor, out, seed, bos_token_id=ids("<bos>"),
                        eos_token_id=[ids("<eos>"), ids("<end_of_turn>")], pad_token_id=ids("<pad>"),
                        max_new_tokens=TINY_MAX_NEW_TOKENS)
    write_card(
        out, "gemma3", model, processor, tok, seed, builder="mmrlvr.tiny.gemma3.build_tiny_gemma3",
        body=(f"Text hidden {hidden_size}, {num_layers} layers ({text['layer_types']}, sliding window "
              f"{sliding_window}), {num_heads} heads / {num_kv_heads} KV heads; SigLIP vision depth "
              f"{vision_depth}, width {vision_width}. Every image is resized to {image_size}x{image_size} "
              f"(patch {patch_size}: {side}x{side} patches, average-pooled to {mm_tokens_per_image} "
              f"`<image_soft_token>` tokens between `<start_of_image>` and `<end_of_image>`). "
              f"Generation stops at `<eos>` or `<end_of_turn>`; the tokenizer adds `<bos>` like Gemma's, "
              f"and the chat template writes one too."),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)`.",
        info=dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                  vision_depth=vision_depth, vision_width=vision_width, image_size=image_size,
                  patch_size=patch_size, mm_tokens_per_image=mm_tokens_per_image,
                  sliding_window=sliding_window, vocab_target=vocab_target))
    return out
