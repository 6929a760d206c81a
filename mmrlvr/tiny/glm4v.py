"""A tiny random-weight GLM-4.1V (`mmrlvr tiny glm4v`): `Glm4vForConditionalGeneration` (a ViT with
2-D RoPE and interpolated learnt positions, a conv downsample + merger, a GLM-4 decoder with
3-D M-RoPE on half of each head) + `Glm4vProcessor` (`Glm4vImageProcessor`,
`Glm4vVideoProcessor`).

Geometry: Qwen2-VL's. An image is resized to sides that are multiples of patch x merge
(14 x 2 = 28 px, as released) within the pixel bounds (56x56..112x112 here), cut into 14 px
patches (each image doubled to the temporal patch of 2) and merged 2x2: a 112 px image is
`image_grid_thw` [1, 8, 8] and 16 `<|image|>` tokens. The chat template writes
`<|begin_of_image|><|image|><|end_of_image|>` for an image (GLM-4.1V-9B-Thinking's), the
processor repeats `<|image|>`; `mm_token_type_ids` marks them for `get_rope_index`. The tokenizer
is `mmrlvr.tiny.tokenizer.build_tokenizer`'s byte-level BPE (real: GLM-4's 151k) with GLM-4.1V's
special tokens in their order.
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import save_seeded, set_named_tokens, write_card
from mmrlvr.tiny.tokenizer import TINY_MAX_NEW_TOKENS, build_tokenizer

GLM4V_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>", "<think>", "</think>",
    "<answer>", "</answer>")
"""GLM-4.1V's added tokens in id order (151329 `<|endoftext|>` ... 151343 `<|image|>`, the
Glm4vConfig default image_token_id), then the thinking tags."""

# The structure of GLM-4.1V-9B-Thinking's chat template: "[gMASK]<sop>", then each turn as
# <|role|>\n + content, an image as <|begin_of_image|><|image|><|end_of_image|>, a video as
# <|begin_of_video|><|video|><|end_of_video|>; the generation prompt "<|assistant|>\n".
GLM4V_CHAT_TEMPLATE: str = (
    "[gMASK]<sop>{%- for msg in messages %}"
    "{%- if msg.role == 'system' %}<|system|>{{ '\\n' }}"
    "{%- if msg.content is string %}{{ msg.content }}{%- else %}"
    "{%- for item in msg.content %}{%- if item.type == 'text' %}{{ item.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- elif msg.role == 'user' %}<|user|>{{ '\\n' }}"
    "{%- if msg.content is string %}{{ msg.content }}{%- else %}{%- for item in msg.content %}"
    "{%- if item.type == 'video' or 'video' in item %}<|begin_of_video|><|video|><|end_of_video|>"
    "{%- elif item.type == 'image' or 'image' in item %}<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif item.type == 'text' %}{{ item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- elif msg.role == 'assistant' %}<|assistant|>{{ '\\n' }}"
    "{%- if msg.content is string %}{{ msg.content }}{%- else %}"
    "{%- for item in msg.content %}{%- if item.type == 'text' %}{{ item.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}{%- endif %}{%- endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def build_tiny_glm4v(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vision_depth: int = 2,
    vision_width: int = 64,
    min_pixels: int = 56 * 56,
    max_pixels: int = 112 * 112,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random-weight GLM-4.1V model dir in `out_dir` (14 px patches merged 2x2, images of
    `min_pixels`..`max_pixels` each: the processor's `size` states twice that, GLM's t x h x w)."""
    from transformers import Glm4vConfig, Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor
    from transformers import Glm4vForConditionalGeneration as model_cls

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if vision_width % 16:
        raise ValueError("vision_width must be a multiple of 16 (vision head dim 16)")
    head_dim = hidden_size // num_heads
    rotary_half = head_dim // 4                 # partial_rotary_factor 0.5: half the head rotates
    h = (rotary_half * 3) // 8
    mrope = [rotary_half - 2 * h, h, h]         # GLM-4.1V's [8, 12, 12] of 32, in proportion
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, GLM4V_SPECIAL_TOKENS,
                          chat_template=GLM4V_CHAT_TEMPLATE, eos_token="<|endoftext|>",
                          pad_token="<|endoftext|>")
    set_named_tokens(tok, {"image_token": "<|image|>", "video_token": "<|video|>"})
    # GLM's smart_resize bounds t x h x w with t = the temporal patch (an image counts twice)
    pix = dict(size={"shortest_edge": 2 * min_pixels, "longest_edge": 2 * max_pixels}, patch_size=14,
               temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    processor = Glm4vProcessor(image_processor=Glm4vImageProcessor(**pix), tokenizer=tok,
                               video_processor=Glm4vVideoProcessor(**pix),
                               chat_template=GLM4V_CHAT_TEMPLATE)
    ids = tok.convert_tokens_to_ids
    eot = ids("<|endoftext|>")
    text = dict(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": mrope},
        pad_token_id=eot, eos_token_id=eot, dtype="float32")
    vision = dict(
        depth=vision_depth, hidden_size=vision_width, num_heads=vision_width // 16,
        intermediate_size=2 * hidden_size, out_hidden_size=hidden_size, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, image_size=112, in_channels=3,
        hidden_act="silu", rms_norm_eps=1e-5)
    config = Glm4vConfig(
        text_config=text, vision_config=vision, image_token_id=ids("<|image|>"),
        video_token_id=ids("<|video|>"), image_start_token_id=ids("<|begin_of_image|>"),
        image_end_token_id=ids("<|end_of_image|>"), video_start_token_id=ids("<|begin_of_video|>"),
        video_end_token_id=ids("<|end_of_video|>"), tie_word_embeddings=False)
    stops = [eot, ids("<|user|>"), ids("<|observation|>")]
    model = save_seeded(model_cls, config, processor, out, seed, bos_token_id=None, eos_token_id=stops,
                        pad_token_id=eot, max_new_tokens=TINY_MAX_NEW_TOKENS)
    write_card(
        out, "glm4v", model, processor, tok, seed, builder="mmrlvr.tiny.glm4v.build_tiny_glm4v",
        body=(f"Text (GLM-4) hidden {hidden_size}, {num_layers} layers, {num_heads} heads / "
              f"{num_kv_heads} KV heads, 3-D M-RoPE {mrope} on half of each head; vision depth "
              f"{vision_depth}, width {vision_width}, 14 px patches merged 2x2. Images of "
              f"{min_pixels}..{max_pixels} pixels at multiples of 28 px: a 112 px image is 16 "
              "`<|image|>` tokens between `<|begin_of_image|>` and `<|end_of_image|>`. Generation "
              "stops at `<|endoftext|>`, `<|user|>` or `<|observation|>`."),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)`.",
        info=dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                  vision_depth=vision_depth, vision_width=vision_width, min_pixels=min_pixels,
                  max_pixels=max_pixels, mrope_section=mrope, vocab_target=vocab_target))
    return out
