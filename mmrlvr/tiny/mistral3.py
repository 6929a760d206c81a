"""A tiny random-weight Mistral 3 (`mmrlvr tiny mistral3`): `Mistral3ForConditionalGeneration` (a
Pixtral vision tower, an RMSNorm + patch-merger + MLP projector, a Mistral decoder) +
`PixtralProcessor` (`PixtralImageProcessor`).

Geometry (Pixtral): the image processor keeps each image's aspect, shrinks it to fit a
`longest_edge` square (1540 px for Mistral Small 3.1; 64 px here; never enlarged) and rounds each
side up to a multiple of patch x merge (14 x 2 = 28 px real; 8 x 2 = 16 px here). Every 16 px
cell becomes one `[IMG]` token: the processor writes a row of them, `[IMG_BREAK]` after each row
and `[IMG_END]` in place of the last break, and the patch merger makes exactly one feature per
`[IMG]`. A 112 px image becomes 64 px: 4 x 4 = 16 `[IMG]` tokens (+ 3 breaks + the end).
`pixel_values` is [images, 3, H, W] padded to the batch's largest image, `image_sizes` the real
sizes. The chat template writes `[IMG]` for an image inside `[INST] ... [/INST]`. Positions are
1-D RoPE. The tokenizer is `mmrlvr.tiny.tokenizer.build_tokenizer`'s byte-level BPE (real: the
131k Tekken) with the first twenty Tekken control tokens in their order.
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import save_seeded, write_card
from mmrlvr.tiny.tokenizer import TINY_MAX_NEW_TOKENS, build_tokenizer

MISTRAL3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]")
"""Tekken's control tokens 0..19 in their order (`[IMG]` is 10, Mistral3Config's image_token_index)."""

# The structure of Mistral-Small-3.1-24B-Instruct-2503's chat template (bos, one system prompt in
# [SYSTEM_PROMPT], each user turn in [INST] ... [/INST] with [IMG] where an image goes, assistant
# turns closed by </s>); its long dated default system prompt is one short sentence here.
MISTRAL3_CHAT_TEMPLATE: str = r"""{%- set default_system_message = "You are a helpful assistant." %}
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set system_message = messages[0]['content'] %}
    {%- else %}
        {%- set system_message = messages[0]['content'][0]['text'] %}
    {%- endif %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if message['content'] is string %}
            {{- '[INST]' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST]' }}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}
                    {{- block['text'] }}
                {%- elif block['type'] in ['image', 'image_url'] %}
                    {{- '[IMG]' }}
                {%- else %}
                    {{- raise_exception('Only text and image blocks are supported in message content!') }}
                {%- endif %}
            {%- endfor %}
            {{- '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is string %}
            {{- message['content'] + eos_token }}
        {%- else %}
            {{- message['content'][0]['text'] + eos_token }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Only user, system and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}"""


def build_tiny_mistral3(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vision_depth: int = 2,
    vision_width: int = 64,
    patch_size: int = 8,
    merge_size: int = 2,
    longest_edge: int = 64,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random-weight Mistral 3 model dir in `out_dir` (images at most `longest_edge` px a
    side, one `[IMG]` token per `patch_size` x `merge_size` px cell)."""
    from transformers import Mistral3Config, PixtralImageProcessor, PixtralProcessor
    from transformers import Mistral3ForConditionalGeneration as model_cls

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if vision_width % 16:
        raise ValueError("vision_width must be a multiple of 16 (vision head dim 16)")
    cell = patch_size * merge_size
    if longest_edge % cell:
        raise ValueError(f"longest_edge {longest_edge} must be a multiple of patch x merge ({cell})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, MISTRAL3_SPECIAL_TOKENS,
                          chat_template=MISTRAL3_CHAT_TEMPLATE, eos_token="</s>", pad_token="<pad>",
                          bos_token="<s>", unk_token="<unk>")
    image_processor = PixtralImageProcessor(
        size={"longest_edge": longest_edge}, patch_size={"height": patch_size, "width": patch_size},
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    processor = PixtralProcessor(image_processor=image_processor, tokenizer=tok, patch_size=patch_size,
                                 spatial_merge_size=merge_size, chat_template=MISTRAL3_CHAT_TEMPLATE)
    ids = tok.convert_tokens_to_ids
    head_dim = hidden_size // num_heads
    text = dict(
        model_type="mistral", vocab_size=len(tok), hidden_size=hidden_size,
        intermediate_size=intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
        hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000000.0},
        bos_token_id=ids("<s>"), eos_token_id=ids("</s>"), pad_token_id=ids("<pad>"), dtype="float32")
    vision = dict(
        model_type="pixtral", hidden_size=vision_width, intermediate_size=2 * vision_width,
        num_hidden_layers=vision_depth, num_attention_heads=vision_width // 16, num_channels=3,
        image_size=longest_edge, patch_size=patch_size, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config = Mistral3Config(
        text_config=text, vision_config=vision, image_token_index=ids("[IMG]"),
        spatial_merge_size=merge_size, vision_feature_layer=-1, projector_hidden_act="gelu",
        multimodal_projector_bias=False, tie_word_embeddings=False)
    model = save_seeded(model_cls, config, processor, out, seed, bos_token_id=ids("<s>"),
                        eos_token_id=[ids("</s>")], pad_token_id=ids("<pad>"),
                        max_new_tokens=TINY_MAX_NEW_TOKENS)
    side = longest_edge // cell
    write_card(
        out, "mistral3", model, processor, tok, seed, builder="mmrlvr.tiny.mistral3.build_tiny_mistral3",
        body=(f"Text (Mistral) hidden {hidden_size}, {num_layers} layers, {num_heads} heads / "
              f"{num_kv_heads} KV heads, 1-D RoPE; Pixtral vision depth {vision_depth}, width "
              f"{vision_width}, patch {patch_size}, merged {merge_size}x{merge_size}. Images keep "
              f"their aspect within {longest_edge} px a side, sides rounded up to {cell} px; one "
              f"`[IMG]` per {cell} px cell, `[IMG_BREAK]` after each row, `[IMG_END]` last: a 112 px "
              f"image gives {side * side} `[IMG]` tokens."),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)`.",
        info=dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                  vision_depth=vision_depth, vision_width=vision_width, patch_size=patch_size,
                  merge_size=merge_size, longest_edge=longest_edge, vocab_target=vocab_target))
    return out
