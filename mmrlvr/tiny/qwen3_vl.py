"""Tiny random-weight Qwen3-VL models (`mmrlvr tiny qwen3-vl`, `mmrlvr tiny qwen3-vl-moe`).

    qwen3-vl       `Qwen3VLForConditionalGeneration` (dense Qwen3 decoder)
    qwen3-vl-moe   `Qwen3VLMoeForConditionalGeneration` (sparse MoE decoder: 4 experts, top-2)

Both load with `AutoProcessor` (`Qwen3VLProcessor`: `Qwen2VLImageProcessor` + `Qwen3VLVideoProcessor`,
16-pixel patches, merge 2, so resized image sides are multiples of 32, mean/std 0.5) and
`AutoModelForImageTextToText`. The text model uses Qwen3-VL's interleaved M-RoPE
(`rope_parameters["mrope_section"]`, `mrope_interleaved`), the vision tower has learned position
embeddings (`num_position_embeddings`, bilinearly resampled to each grid), 2-D axial rotary and
DeepStack (`deepstack_visual_indexes`: the merged features of those vision blocks are added to the
hidden states of the first decoder layers). With the default pixel bounds (64x64..128x128) a
112 px image is resized to 128x128: an 8x8 patch grid, merged 2x2 into 16 `<|image_pad|>` tokens.
The tokenizer is `mmrlvr.tiny.tokenizer.build_tokenizer`'s byte-level BPE with the Qwen2-VL/Qwen3-VL
added tokens and the real Qwen3-VL-Instruct chat template (no default system prompt).
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import interleaved_mrope_section, qwen3_text_config, write_card
from mmrlvr.tiny.tokenizer import QWEN_VL_SPECIAL_TOKENS, build_tokenizer, instantiate_and_save

QWEN3_VL_KINDS: tuple[str, ...] = ("qwen3-vl", "qwen3-vl-moe")

# Qwen/Qwen3-VL-*-Instruct's chat_template.json (the same for the MoE ones), verbatim.
QWEN3_VL_CHAT_TEMPLATE: str = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

PATCH_SIZE = 16
MERGE_SIZE = 2


def qwen3_vl_processor(tok, *, min_pixels: int, max_pixels: int,
                       chat_template: str = QWEN3_VL_CHAT_TEMPLATE):
    """The real `Qwen3VLProcessor` (also Qwen3.5's) with small pixel bounds."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    pix = dict(patch_size=PATCH_SIZE, temporal_patch_size=2, merge_size=MERGE_SIZE,
               image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    image_processor = Qwen2VLImageProcessor(size=size, **pix)
    # video pixel bounds count all frames (t x h x w); 8 frames of at most max_pixels each
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": 2 * min_pixels, "longest_edge": 8 * max_pixels}, max_frames=8, **pix)
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tok, video_processor=video_processor,
                            chat_template=chat_template)


def qwen3_vl_vision_config(*, vision_depth: int, vision_width: int, out_hidden_size: int,
                           num_position_embeddings: int = 64) -> dict:
    """A tiny Qwen3-VL vision tower: head dim 16, DeepStack from the first block (real 2B:
    depth 24, [5, 11, 17]), a learned 8x8 position grid (real: 48x48)."""
    if vision_width % 16:
        raise ValueError("vision_width must be a multiple of 16 (vision head dim 16)")
    return dict(depth=vision_depth, hidden_size=vision_width, intermediate_size=2 * vision_width,
                num_heads=vision_width // 16, in_channels=3, patch_size=PATCH_SIZE,
                spatial_merge_size=MERGE_SIZE, temporal_patch_size=2, hidden_act="gelu_pytorch_tanh",
                out_hidden_size=out_hidden_size, num_position_embeddings=num_position_embeddings,
                deepstack_visual_indexes=[0])


def build_tiny_qwen3_vl(
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
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    moe_intermediate_size: int = 64,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    min_pixels: int = 64 * 64,
    max_pixels: int = 128 * 128,
    seed: int = 0,
) -> Path:
    """A tiny random-weight `qwen3-vl` or `qwen3-vl-moe` model dir in `out_dir` (the MoE options
    only size the MoE kind)."""
    if kind not in QWEN3_VL_KINDS:
        raise ValueError(f"unknown tiny Qwen3-VL kind {kind!r}; choose from {QWEN3_VL_KINDS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, QWEN_VL_SPECIAL_TOKENS,
                          chat_template=QWEN3_VL_CHAT_TEMPLATE)
    processor = qwen3_vl_processor(tok, min_pixels=min_pixels, max_pixels=max_pixels)
    moe = kind == "qwen3-vl-moe"
    extra = dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                 moe_intermediate_size=moe_intermediate_size, decoder_sparse_step=1) if moe else {}
    text = qwen3_text_config(tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                             num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                             mrope_section=interleaved_mrope_section(hidden_size // num_heads), **extra)
    ids = tok.convert_tokens_to_ids
    common = dict(
        text_config=text,
        vision_config=qwen3_vl_vision_config(vision_depth=vision_depth, vision_width=vision_width,
                                             out_hidden_size=hidden_size),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    if moe:
        from transformers import Qwen3VLMoeConfig as config_cls
        from transformers import Qwen3VLMoeForConditionalGeneration as model_cls
    else:
        from transformers import Qwen3VLConfig as config_cls
        from transformers import Qwen3VLForConditionalGeneration as model_cls
    model = instantiate_and_save(model_cls, config_cls(**common), tok, processor, out, seed)
    n112 = processor._get_num_multimodal_tokens(image_sizes=[(112, 112)])["num_image_tokens"][0]
    moe_text = (f", MoE {num_experts} experts top-{num_experts_per_tok} of width {moe_intermediate_size}"
                if moe else "")
    write_card(
        out, kind, model, processor, tok, seed, builder="mmrlvr.tiny.qwen3_vl.build_tiny_qwen3_vl",
        body=(f"Text hidden {hidden_size}, {num_layers} layers, {num_heads} heads / {num_kv_heads} KV heads"
              f"{moe_text}, interleaved M-RoPE {text['rope_parameters']['mrope_section']}; vision depth "
              f"{vision_depth}, width {vision_width}, patch 16, merge 2, DeepStack from block 0. Images are "
              f"resized to {min_pixels}..{max_pixels} pixels with sides a multiple of 32; a 112x112 image "
              f"gives {n112} `<|image_pad|>` tokens (one per 2x2 group of 16 px patches)."),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)`.",
        info=dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                  vision_depth=vision_depth, vision_width=vision_width, min_pixels=min_pixels,
                  max_pixels=max_pixels, vocab_target=vocab_target,
                  **(dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                          moe_intermediate_size=moe_intermediate_size) if moe else {})))
    return out
