"""Tiny random-weight Qwen3.5 models: `mmrlvr tiny qwen3.5` (`Qwen3_5ForConditionalGeneration`, natively
multimodal) and `mmrlvr tiny qwen3.5-moe` (`Qwen3_5MoeForConditionalGeneration`: the same hybrid
decoder with a sparse MoE block in every layer, routed experts plus one gated shared expert, as
Qwen3.5-35B-A3B has), each + `Qwen3VLProcessor` (`Qwen2VLImageProcessor`, `Qwen3VLVideoProcessor`; 16 px patches,
merge 2, so a 112 px image gives 16 `<|image_pad|>` tokens as for Qwen3-VL).

The decoder is a hybrid: Gated DeltaNet linear-attention layers (`linear_attention`, a causal
depthwise conv + gated delta rule; recurrent state instead of a KV cache) with a full-attention
layer every fourth (`layer_types`, real `full_attention_interval` 4), gated full attention, and
interleaved M-RoPE on a quarter of each head (`partial_rotary_factor` 0.25, real
`mrope_section` [11, 11, 10] of 32 rotary pairs; [2, 1, 1] of 4 here). The vision tower is
Qwen3-VL's without DeepStack. On CPU the linear-attention kernels fall back to transformers'
reference PyTorch code (`causal_conv1d`, `flash-linear-attention` not installed): correct, slower.
The chat template follows Qwen3.5's (see `QWEN3_5_CHAT_TEMPLATE`).
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import qwen3_text_config, set_named_tokens, write_card
from mmrlvr.tiny.qwen3_omni import QWEN3_OMNI_SPECIAL_TOKENS, QWEN3_OMNI_TOKEN_ROLES
from mmrlvr.tiny.qwen3_vl import qwen3_vl_processor, qwen3_vl_vision_config
from mmrlvr.tiny.tokenizer import build_tokenizer, instantiate_and_save

# After Qwen3.5's chat_template.jinja: its content macro, system-first rule, thinking history and
# generation prompt ("<think>\n", or an empty think block with enable_thinking=False); its tools
# prelude and XML tool-call rendering are left out (the tiny models never call tools).
QWEN3_5_CHAT_TEMPLATE: str = """{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count, is_system_content=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain images.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Picture ' ~ image_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif 'video' in item or item.type == 'video' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain videos.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set video_count.value = video_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Video ' ~ video_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if messages[0].role == 'system' %}
    {%- set content = render_content(messages[0].content, false, true)|trim %}
    {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}"""


QWEN3_5_KINDS: tuple[str, ...] = ("qwen3.5", "qwen3.5-moe")


def _layer_types(num_layers: int, full_attention_interval: int) -> list[str]:
    """Linear attention everywhere but every `full_attention_interval`-th layer (at least one full)."""
    full_attention_interval = min(full_attention_interval, num_layers)  # at least one full layer
    return ["full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
            for i in range(num_layers)]


def _qwen3_5_text_config(tok, *, moe: bool, hidden_size: int, num_layers: int, num_heads: int,
                         num_kv_heads: int, intermediate_size: int, layer_types: list[str],
                         num_experts: int, num_experts_per_tok: int, moe_intermediate_size: int) -> dict:
    """The hybrid decoder's keyword arguments: Gated DeltaNet and gated full attention, M-RoPE [2, 1, 1]
    on a quarter of each head, with `moe` a sparse block (and a shared expert) in every layer."""
    head_dim = hidden_size // num_heads
    text = qwen3_text_config(
        tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size, rope_theta=10000000.0, mrope_section=[2, 1, 1],
        layer_types=layer_types, linear_conv_kernel_dim=4, linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim, linear_num_key_heads=max(1, num_heads // 2),
        linear_num_value_heads=num_heads,
        **(dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                moe_intermediate_size=moe_intermediate_size,
                shared_expert_intermediate_size=moe_intermediate_size) if moe else {}))
    if moe:
        text.pop("intermediate_size")      # every layer is sparse; the MoE config has no dense width
    text["rope_parameters"]["partial_rotary_factor"] = 0.25
    if 2 * sum(text["rope_parameters"]["mrope_section"]) != head_dim // 4:
        raise ValueError(f"head_dim {head_dim}: the [2, 1, 1] M-RoPE split needs 32-wide heads")
    return text


def _card_body(info: dict, moe: bool, n112: int) -> str:
    """The `TINY.md` paragraph on this model's sizes and image tokens (`info`: the builder's options)."""
    moe_text = (f", MoE {info['num_experts']} experts top-{info['num_experts_per_tok']} of width "
                f"{info['moe_intermediate_size']} + a shared expert" if moe else "")
    return (f"Text hidden {info['hidden_size']}, {info['num_layers']} layers ({info['layer_types']}), "
            f"{info['num_heads']} heads / {info['num_kv_heads']} KV heads{moe_text}, interleaved M-RoPE "
            f"[2, 1, 1] on a quarter of each head; vision depth {info['vision_depth']}, width "
            f"{info['vision_width']}, patch 16, merge 2. Images are resized to {info['min_pixels']}.."
            f"{info['max_pixels']} pixels; a 112x112 image gives {n112} `<|image_pad|>` tokens. "
            f"The generation prompt opens a `<think>` block, as Qwen3.5's does.")


def build_tiny_qwen3_5(
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
    full_attention_interval: int = 4,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    min_pixels: int = 64 * 64,
    max_pixels: int = 128 * 128,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    moe_intermediate_size: int = 64,
    seed: int = 0,
) -> Path:
    """A tiny random-weight `qwen3.5` or `qwen3.5-moe` model dir in `out_dir` (the MoE options
    only size the MoE kind; its shared expert is `moe_intermediate_size` wide, as the release's)."""
    import transformers

    if kind not in QWEN3_5_KINDS:
        raise ValueError(f"unknown Qwen3.5 kind {kind!r}; choose from {QWEN3_5_KINDS}")
    moe = kind == "qwen3.5-moe"
    prefix = "Qwen3_5Moe" if moe else "Qwen3_5"
    config_cls = getattr(transformers, f"{prefix}Config")
    model_cls = getattr(transformers, f"{prefix}ForConditionalGeneration")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, QWEN3_OMNI_SPECIAL_TOKENS,
                          chat_template=QWEN3_5_CHAT_TEMPLATE)
    set_named_tokens(tok, QWEN3_OMNI_TOKEN_ROLES)
    processor = qwen3_vl_processor(tok, min_pixels=min_pixels, max_pixels=max_pixels,
                                   chat_template=QWEN3_5_CHAT_TEMPLATE)
    layer_types = _layer_types(num_layers, full_attention_interval)
    moe_sizes = dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                     moe_intermediate_size=moe_intermediate_size)
    text = _qwen3_5_text_config(
        tok, moe=moe, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, intermediate_size=intermediate_size, layer_types=layer_types, **moe_sizes)
    vision = qwen3_vl_vision_config(vision_depth=vision_depth, vision_width=vision_width,
                                    out_hidden_size=hidden_size)
    vision.pop("deepstack_visual_indexes")  # Qwen3.5's tower has no DeepStack
    ids = tok.convert_tokens_to_ids
    config = config_cls(
        text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=True)
    model = instantiate_and_save(model_cls, config, tok, processor, out, seed)
    n112 = processor._get_num_multimodal_tokens(image_sizes=[(112, 112)])["num_image_tokens"][0]
    info = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                vision_depth=vision_depth, vision_width=vision_width, layer_types=layer_types,
                min_pixels=min_pixels, max_pixels=max_pixels, vocab_target=vocab_target,
                **(moe_sizes if moe else {}))
    write_card(
        out, kind, model, processor, tok, seed, builder="mmrlvr.tiny.qwen3_5.build_tiny_qwen3_5",
        body=_card_body(info, moe, n112),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)`.",
        info=info)
    return out
