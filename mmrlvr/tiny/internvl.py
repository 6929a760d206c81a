"""A tiny random-weight InternVL (`mmrlvr tiny internvl`): `InternVLForConditionalGeneration` (the
transformers-native InternVL3 "-hf" layout: InternViT tower, pixel-shuffle MLP projector, Qwen2
decoder) + `InternVLProcessor` (`GotOcr2ImageProcessor`, `InternVLVideoProcessor`).

Geometry: the image processor cuts an image into square tiles of `size` (448 px real; 56 px here)
on the grid closest to its aspect ratio (`crop_to_patches`, which the processor turns on, with
`min_patches`..`max_patches` tiles plus a thumbnail when there is more than one); each tile's
patch grid (56 / 14 = 4x4 here) is pixel-shuffled by `downsample_ratio` 0.5 to
`image_seq_length` tokens (256 real; 4 here). The chat template writes `<IMG_CONTEXT>` for an
image; the processor expands it to `<img>` + tiles x 4 `<IMG_CONTEXT>` + `</img>`. `pixel_values` is
[total tiles, 3, 56, 56]. A 112 px image becomes a 2x2 grid plus the thumbnail: 5 tiles, 20 tokens.
Positions are plain 1-D RoPE. The tokenizer is `mmrlvr.tiny.tokenizer.build_tokenizer`'s byte-level
BPE with the Qwen2 added tokens and InternVL's (`<img>`, `</img>`, `<IMG_CONTEXT>`, `<video>`, ...)
and the chat template transformers' InternVL conversion script writes.
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import set_named_tokens, write_card
from mmrlvr.tiny.text import text_config
from mmrlvr.tiny.tokenizer import QWEN_VL_SPECIAL_TOKENS, build_tokenizer, instantiate_and_save

INTERNVL_SPECIAL_TOKENS: tuple[str, ...] = QWEN_VL_SPECIAL_TOKENS + (
    "<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>", "<video>")
"""InternVL3's added tokens: Qwen2.5's, then InternVL's (`<img>` 151665, `</img>` 151666,
`<IMG_CONTEXT>` 151667, ...) and the `<video>` placeholder the -hf conversion adds."""

INTERNVL_TOKEN_ROLES: dict[str, str] = {
    "context_image_token": "<IMG_CONTEXT>", "start_image_token": "<img>", "end_image_token": "</img>",
    "video_token": "<video>"}
"""The named tokens `InternVLProcessor` reads off its tokenizer."""

# The chat template of the InternVL "-hf" checkpoints (transformers'
# models/internvl/convert_internvl_weights_to_hf.py), verbatim.
INTERNVL_CHAT_TEMPLATE: str = (
    "{% for message in messages %}"
        "{{'<|im_start|>' + message['role'] + '\n'}}"
        "{% if message['content'] is string %}"
            "{{ message['content'] }}"
        "{% else %}"
            "{% for content in message['content'] %}"
                "{% if content['type'] == 'image' %}"
                    "{{ '<IMG_CONTEXT>\n' }}"
                "{% elif content['type'] == 'video' %}"
                    "{{ '<video>\n' }}"
                "{% elif content['type'] == 'text' %}"
                    "{{ content['text'] }}"
                "{% endif %}"
            "{% endfor %}"
        "{% endif %}"
        "{{'<|im_end|>\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
        "{{'<|im_start|>assistant\n' }}"
    "{% endif %}"
)  # noqa: E131


def build_tiny_internvl(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vision_depth: int = 2,
    vision_width: int = 64,
    tile_size: int = 56,
    patch_size: int = 14,
    max_tiles: int = 4,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random-weight InternVL model dir in `out_dir` (tiles of `tile_size` px, at most
    `max_tiles` per image plus a thumbnail)."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLProcessor,
        InternVLVideoProcessor,
    )
    from transformers import InternVLForConditionalGeneration as model_cls

    if vision_width % 16:
        raise ValueError("vision_width must be a multiple of 16 (vision head dim 16)")
    side = tile_size // patch_size
    if tile_size % patch_size or side % 2:
        raise ValueError(f"tile_size {tile_size} / patch_size {patch_size} must give an even patch grid "
                         "(pixel shuffle halves each side)")
    image_seq_length = (side // 2) ** 2
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, INTERNVL_SPECIAL_TOKENS,
                          chat_template=INTERNVL_CHAT_TEMPLATE)
    set_named_tokens(tok, INTERNVL_TOKEN_ROLES)
    pix = dict(size={"height": tile_size, "width": tile_size}, image_mean=[0.485, 0.456, 0.406],
               image_std=[0.229, 0.224, 0.225])
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(crop_to_patches=False, min_patches=1, max_patches=max_tiles, **pix),
        tokenizer=tok, video_processor=InternVLVideoProcessor(**pix), image_seq_length=image_seq_length,
        chat_template=INTERNVL_CHAT_TEMPLATE)
    text = dict(model_type="qwen2", **text_config(
        tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size, mrope=False, use_sliding_window=False,
        max_window_layers=num_layers))
    vision = dict(
        hidden_size=vision_width, num_hidden_layers=vision_depth, num_attention_heads=vision_width // 16,
        intermediate_size=2 * vision_width, hidden_act="gelu", norm_type="layer_norm", use_qk_norm=False,
        layer_norm_eps=1e-6, image_size=[tile_size, tile_size], patch_size=[patch_size, patch_size],
        num_channels=3, use_absolute_position_embeddings=True, layer_scale_init_value=0.1,
        use_mean_pooling=True)
    config = InternVLConfig(
        vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=image_seq_length, downsample_ratio=0.5, projector_hidden_act="gelu",
        vision_feature_layer=-1, vision_feature_select_strategy="default", tie_word_embeddings=True)
    model = instantiate_and_save(model_cls, config, tok, processor, out, seed)
    tiles_112 = processor._get_num_multimodal_tokens(image_sizes=[(112, 112)])["num_image_patches"][0]
    write_card(
        out, "internvl", model, processor, tok, seed, builder="mmrlvr.tiny.internvl.build_tiny_internvl",
        body=(f"Text (Qwen2) hidden {hidden_size}, {num_layers} layers, {num_heads} heads / {num_kv_heads} KV "
              f"heads, 1-D RoPE; InternViT depth {vision_depth}, width {vision_width}. Images are cut into "
              f"{tile_size} px tiles (1..{max_tiles} on the grid nearest the aspect ratio, plus a thumbnail "
              f"when more than one); each tile's {side}x{side} patches are pixel-shuffled to "
              f"{image_seq_length} `<IMG_CONTEXT>` tokens between `<img>` and `</img>`: a 112 px image gives "
              f"{tiles_112} tiles, {tiles_112 * image_seq_length} tokens."),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)`.",
        info=dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                  vision_depth=vision_depth, vision_width=vision_width, tile_size=tile_size,
                  patch_size=patch_size, max_tiles=max_tiles, image_seq_length=image_seq_length,
                  vocab_target=vocab_target))
    return out
