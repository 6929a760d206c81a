"""A tiny random-weight LLaVA-OneVision (`mmrlvr tiny llava-onevision`):
`LlavaOnevisionForConditionalGeneration` (a SigLIP tower, a 2-layer MLP projector, a learnt
newline embedding, a Qwen2 decoder) + `LlavaOnevisionProcessor` (`LlavaOnevisionImageProcessor`,
`LlavaOnevisionVideoProcessor`).

Geometry (AnyRes): the image processor resizes an image to the grid of `image_grid_pinpoints`
best fitting it (384 px crops on up to 6x6 crops for the released models; 16 px crops on up to
2x2 here), cuts it into crops and prepends the whole image at one crop's size. Each crop is a
patch grid (16 / 8 = 2x2 here: 4 tokens, 729 real); the model unpads the crops' grid to the
image's aspect ratio, appends the newline embedding to every row and, when a prompt holds one
image, puts the base crop first. With several images in a prompt each image is its base crop
plus one newline only (`batch_num_images`). The chat template writes `<image>` for an image (all
images of a turn first, then its text); the processor expands it to as many `<image>` tokens.
`pixel_values` is [images, most crops, 3, 16, 16]. A lone 112 px image gives 4 + 4 x (4 + 1) = 24
tokens. Positions are plain 1-D RoPE. The tokenizer is
`mmrlvr.tiny.tokenizer.build_tokenizer`'s byte-level BPE with Qwen2's ChatML tokens and
`<image>`/`<video>`.
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import save_seeded, set_named_tokens, siglip_vision_config, write_card
from mmrlvr.tiny.text import text_config
from mmrlvr.tiny.tokenizer import TINY_MAX_NEW_TOKENS, build_tokenizer

LLAVA_OV_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>",
                                            "<video>")
"""llava-onevision-qwen2's added tokens: Qwen2's ChatML ones, then `<image>` (151646) and
`<video>` (151647)."""

# The LLaVA-OneVision "-hf" chat template, as transformers' LLaVA-OneVision processor tests
# (tests/models/llava_onevision/test_processor_llava_onevision.py) carry it: each turn's images,
# then its videos, then its text.
LLAVA_OV_CHAT_TEMPLATE: str = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\n' + content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{'<|im_end|>'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _llava_processor(tok, *, crop_size: int, pinpoints: list[list[int]], tokens_per_crop: int):
    """`LlavaOnevisionProcessor` over `tok`: AnyRes `crop_size` crops on the grids of `pinpoints`."""
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    pix = dict(size={"height": crop_size, "width": crop_size}, image_mean=[0.5, 0.5, 0.5],
               image_std=[0.5, 0.5, 0.5])
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(image_grid_pinpoints=pinpoints, do_pad=True, **pix),
        tokenizer=tok, video_processor=LlavaOnevisionVideoProcessor(**pix),
        num_image_tokens=tokens_per_crop, vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9", chat_template=LLAVA_OV_CHAT_TEMPLATE)


def _card_body(info: dict, one: int) -> str:
    """The `TINY.md` paragraph on this model's sizes and image tokens (`info`: the builder's options)."""
    tokens_per_crop, max_grid = info["tokens_per_crop"], info["max_grid"]
    return (f"Text (Qwen2) hidden {info['hidden_size']}, {info['num_layers']} layers, {info['num_heads']} "
            f"heads / {info['num_kv_heads']} KV heads, 1-D RoPE; SigLIP vision depth {info['vision_depth']}, "
            f"width {info['vision_width']}. AnyRes: {info['crop_size']} px crops on grids up to "
            f"{max_grid}x{max_grid} plus the base crop, {tokens_per_crop} tokens a crop, unpadded, one "
            f"newline a row: a lone 112 px image gives {one} `<image>` tokens; in a prompt with several "
            f"images each gives {tokens_per_crop + 1}.")


def build_tiny_llava_onevision(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vision_depth: int = 2,
    vision_width: int = 64,
    crop_size: int = 16,
    patch_size: int = 8,
    max_grid: int = 2,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random-weight LLaVA-OneVision model dir in `out_dir` (crops of `crop_size` px on
    grids of up to `max_grid` x `max_grid`)."""
    from transformers import LlavaOnevisionConfig
    from transformers import LlavaOnevisionForConditionalGeneration as model_cls

    if vision_width % 16:
        raise ValueError("vision_width must be a multiple of 16 (vision head dim 16)")
    if crop_size % patch_size:
        raise ValueError(f"crop_size {crop_size} must be a multiple of patch_size {patch_size}")
    tokens_per_crop = (crop_size // patch_size) ** 2
    pinpoints = [[crop_size * r, crop_size * c] for r in range(1, max_grid + 1)
                 for c in range(1, max_grid + 1)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, LLAVA_OV_SPECIAL_TOKENS,
                          chat_template=LLAVA_OV_CHAT_TEMPLATE)
    set_named_tokens(tok, {"image_token": "<image>", "video_token": "<video>"})
    processor = _llava_processor(tok, crop_size=crop_size, pinpoints=pinpoints, tokens_per_crop=tokens_per_crop)
    text = dict(model_type="qwen2", **text_config(
        tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, intermediate_size=intermediate_size, mrope=False,
        use_sliding_window=False, max_window_layers=num_layers))
    vision = dict(model_type="siglip_vision_model",
                  **siglip_vision_config(vision_width=vision_width, vision_depth=vision_depth,
                                         image_size=crop_size, patch_size=patch_size),
                  vision_use_head=False)
    ids = tok.convert_tokens_to_ids
    config = LlavaOnevisionConfig(
        text_config=text, vision_config=vision, image_token_index=ids("<image>"),
        video_token_index=ids("<video>"), vision_feature_select_strategy="full",
        vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9", image_grid_pinpoints=pinpoints,
        tie_word_embeddings=False)
    eot, im_end = ids("<|endoftext|>"), ids("<|im_end|>")
    model = save_seeded(model_cls, config, processor, out, seed, bos_token_id=eot,
                        eos_token_id=[im_end, eot], pad_token_id=eot, max_new_tokens=TINY_MAX_NEW_TOKENS)
    one = processor._get_num_multimodal_tokens(image_sizes=[(112, 112)])["num_image_tokens"][0]
    info = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                vision_depth=vision_depth, vision_width=vision_width, crop_size=crop_size,
                patch_size=patch_size, max_grid=max_grid, tokens_per_crop=tokens_per_crop,
                vocab_target=vocab_target)
    write_card(
        out, "llava-onevision", model, processor, tok, seed,
        builder="mmrlvr.tiny.llava_onevision.build_tiny_llava_onevision",
        body=_card_body(info, one),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)`.",
        info=info)
    return out
