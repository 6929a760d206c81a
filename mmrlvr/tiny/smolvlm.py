"""A tiny random-weight SmolVLM (`mmrlvr tiny smolvlm`): `SmolVLMForConditionalGeneration` (the
SmolVLM2 layout, Idefics3-style: a SigLIP tower, a pixel-shuffle connector, a Llama decoder) +
`SmolVLMProcessor` (`SmolVLMImageProcessor`, `SmolVLMVideoProcessor`).

Geometry: the image processor resizes an image so its longest edge is `size.longest_edge`
(1536 px for SmolVLM2-2.2B; 64 px here), cuts it into squares of `max_image_size` (384 px real;
32 px here) and adds the whole image shrunk to one square (the global image), unless it fits one
square. Each square's patch grid (32 / 8 = 4x4 here) is pixel-shuffled by `scale_factor` (3 real;
2 here) to `image_seq_len` tokens (81 real; 4 here). The chat template writes `<image>` for an
image; the processor expands it to rows of `<fake_token_around_image><row_R_col_C>` + 4 x `<image>`,
then `<fake_token_around_image><global-img>` + 4 x `<image><fake_token_around_image>`.
`pixel_values` is [samples, most squares of a sample, 3, 32, 32], zero-padded; the model drops the
all-zero squares. A 112 px image becomes 2x2 squares plus the global one: 5 squares, 20 tokens.
Positions are plain 1-D RoPE. The tokenizer is `mmrlvr.tiny.tokenizer.build_tokenizer`'s
byte-level BPE with SmolVLM2's added tokens, and the chat template is transformers' SmolVLM one
(SmolVLM2's, with video parts).
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import save_seeded, set_named_tokens, siglip_vision_config, write_card
from mmrlvr.tiny.tokenizer import TINY_MAX_NEW_TOKENS, build_tokenizer

MAX_GRID = 4
"""Rows and columns of squares the tiny processor can cut (64 / 32 = 2; tokens to 4x4 for
larger `longest_edge`s)."""

SMOLVLM_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>",
    "<end_of_utterance>", "<global-img>", "<video>",
    *(f"<row_{r}_col_{c}>" for r in range(1, MAX_GRID + 1) for c in range(1, MAX_GRID + 1)))
"""SmolVLM2's added tokens: SmolLM2's (`<|endoftext|>` 0, `<|im_start|>` 1, `<|im_end|>` 2),
then the image ones (`<fake_token_around_image>`, `<image>`, `<end_of_utterance>`,
`<global-img>`, `<row_R_col_C>` for each square of the grid)."""

SMOLVLM_TOKEN_ROLES: dict[str, str] = {
    "image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
    "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
    "video_token": "<video>"}
"""The named tokens `SmolVLMProcessor` reads off its tokenizer."""


def _check_geometry(hidden_size: int, num_heads: int, vision_width: int, tile_size: int, patch_size: int,
                    scale_factor: int, longest_edge: int) -> int:
    """Reject sizes the model or the processor cannot take; a square's patch grid side."""
    if vision_width % 16 or hidden_size % num_heads:
        raise ValueError("vision_width must be a multiple of 16 and hidden_size of num_heads")
    side = tile_size // patch_size
    if tile_size % patch_size or side % scale_factor:
        raise ValueError(f"tile_size {tile_size} / patch_size {patch_size} must give a patch grid "
                         f"that scale_factor {scale_factor} divides")
    if longest_edge % tile_size or longest_edge // tile_size > MAX_GRID:
        raise ValueError(f"longest_edge {longest_edge} must be a multiple of tile_size {tile_size}, "
                         f"at most {MAX_GRID} of them")
    return side


def _smolvlm_processor(tok, *, longest_edge: int, tile_size: int, image_seq_len: int, chat_template: str):
    """`SmolVLMProcessor` over `tok`: images cut into `tile_size` squares plus the global image."""
    from transformers import SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    pix = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(
            size={"longest_edge": longest_edge}, max_image_size={"longest_edge": tile_size},
            do_image_splitting=True, **pix),
        tokenizer=tok, video_processor=SmolVLMVideoProcessor(
            size={"longest_edge": tile_size}, max_image_size={"longest_edge": tile_size}, **pix),
        image_seq_len=image_seq_len, chat_template=chat_template)


def _llama_text_config(tok, *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                       intermediate_size: int, bos: int, eos: int, pad: int) -> dict:
    """The Llama decoder's keyword arguments (1-D RoPE, theta 1e5, 8192 positions)."""
    return dict(
        model_type="llama", vocab_size=len(tok), hidden_size=hidden_size,
        intermediate_size=intermediate_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, head_dim=hidden_size // num_heads, hidden_act="silu",
        max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, dtype="float32")


def build_tiny_smolvlm(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vision_depth: int = 2,
    vision_width: int = 64,
    tile_size: int = 32,
    patch_size: int = 8,
    scale_factor: int = 2,
    longest_edge: int = 64,
    vocab_target: int = 600,
    extra_corpus: list[str] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random-weight SmolVLM model dir in `out_dir` (squares of `tile_size` px, images
    resized to a longest edge of `longest_edge`)."""
    from transformers import SmolVLMConfig
    from transformers import SmolVLMForConditionalGeneration as model_cls
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    side = _check_geometry(hidden_size, num_heads, vision_width, tile_size, patch_size, scale_factor,
                           longest_edge)
    image_seq_len = (side // scale_factor) ** 2
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(None, extra_corpus, vocab_target, SMOLVLM_SPECIAL_TOKENS,
                          chat_template=DEFAULT_CHAT_TEMPLATE, eos_token="<end_of_utterance>",
                          pad_token="<|im_end|>", bos_token="<|im_start|>", unk_token="<|endoftext|>",
                          model_max_length=8192)
    set_named_tokens(tok, SMOLVLM_TOKEN_ROLES)
    processor = _smolvlm_processor(tok, longest_edge=longest_edge, tile_size=tile_size,
                                   image_seq_len=image_seq_len, chat_template=DEFAULT_CHAT_TEMPLATE)
    ids = tok.convert_tokens_to_ids
    bos, eos, pad = ids("<|im_start|>"), ids("<end_of_utterance>"), ids("<|im_end|>")
    text = _llama_text_config(tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                              num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                              bos=bos, eos=eos, pad=pad)
    vision = siglip_vision_config(vision_width=vision_width, vision_depth=vision_depth,
                                  image_size=tile_size, patch_size=patch_size)
    config = SmolVLMConfig(text_config=text, vision_config=vision, scale_factor=scale_factor,
                           image_token_id=ids("<image>"), pad_token_id=pad, tie_word_embeddings=False)
    model = save_seeded(model_cls, config, processor, out, seed, bos_token_id=bos, eos_token_id=eos,
                        pad_token_id=pad, max_new_tokens=TINY_MAX_NEW_TOKENS)
    squares = processor.image_processor.get_number_of_image_patches(112, 112, {})[0]
    write_card(
        out, "smolvlm", model, processor, tok, seed, builder="mmrlvr.tiny.smolvlm.build_tiny_smolvlm",
        body=(f"Text (Llama) hidden {hidden_size}, {num_layers} layers, {num_heads} heads / {num_kv_heads} "
              f"KV heads, 1-D RoPE; SigLIP vision depth {vision_depth}, width {vision_width}. Images are "
              f"resized to a longest edge of {longest_edge} px and cut into {tile_size} px squares plus the "
              f"global image; each square's {side}x{side} patches are pixel-shuffled by {scale_factor} to "
              f"{image_seq_len} `<image>` tokens: a 112 px image gives {squares} squares, "
              f"{squares * image_seq_len} tokens. Generation stops at `<end_of_utterance>`."),
        load="Load it with `AutoProcessor.from_pretrained(DIR)` and "
             "`AutoModelForImageTextToText.from_pretrained(DIR)`.",
        info=dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                  vision_depth=vision_depth, vision_width=vision_width, tile_size=tile_size,
                  patch_size=patch_size, scale_factor=scale_factor, longest_edge=longest_edge,
                  image_seq_len=image_seq_len, vocab_target=vocab_target))
    return out
