"""A SmolVLM-shaped VLM around a pretrained language model (`mmrlvr pretrained smolvlm --lm DIR
--out DIR`): `SmolVLMForConditionalGeneration` whose Llama decoder is the model in `--lm` (SmolLM2-
135M-Instruct from `mmrlvr pretrained smollm2`, the language model real SmolVLMs are built on),
with a small random SigLIP tower and pixel-shuffle connector in front of it.

The decoder's weights are copied in unchanged; the tokenizer is the language model's, plus
SmolVLM's image tokens (`<image>`, `<fake_token_around_image>`, `<global-img>`, the grid's
`<row_R_col_C>`, `<end_of_utterance>`, `<video>`), whose embedding rows are drawn around the
others' mean and covariance (transformers' `mean_resizing`, seeded). The chat template is the
language model's own turn format (ChatML for SmolLM2: `<|im_start|>user ... <|im_end|>`) with an
image part written as `<image>`, so the pretrained decoder sees the turns it was tuned on;
generation ends at `<|im_end|>`.

Geometry (defaults): an image is resized to a longest edge of 64 px and fits one 64 px square,
whose 8x8 patches are pixel-shuffled by 2 into 16 `<image>` tokens. The tower and connector know
nothing yet: they are random, and reading their features is what training has to teach.
"""
from __future__ import annotations

from pathlib import Path

from mmrlvr.tiny.common import set_named_tokens, siglip_vision_config, write_info_card
from mmrlvr.tiny.smolvlm import (SMOLVLM_SPECIAL_TOKENS, SMOLVLM_TOKEN_ROLES, _check_geometry,
                                 _smolvlm_processor)

CHATML_WITH_IMAGES = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] == 'image' -%}{{- '<image>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
"""ChatML (SmolLM2-Instruct's turns) with typed content parts: an image part is `<image>`, which
`SmolVLMProcessor` expands into the square's tokens."""


class SmolVLMBuildError(RuntimeError):
    """A language model this builder cannot wrap, or an output dir that would be overwritten."""


def build_smolvlm_from_lm(lm_dir: str | Path, out_dir: str | Path, *, vision_width: int = 128,
                          vision_depth: int = 2, tile_size: int = 64, patch_size: int = 8,
                          scale_factor: int = 2, longest_edge: int = 64, seed: int = 0,
                          overwrite: bool = False) -> dict:
    """Write the SmolVLM-shaped model around the Llama model in `lm_dir` to `out_dir`; returns
    (and saves as `smolvlm.json`) what was built."""
    import torch
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                              SmolVLMConfig, SmolVLMForConditionalGeneration)

    lm_dir, out = Path(lm_dir), Path(out_dir)
    if (out / "config.json").exists() and not overwrite:
        raise SmolVLMBuildError(f"{out} already holds a model (config.json); give another --out, "
                                "or --overwrite to write it again")
    lm_config = AutoConfig.from_pretrained(lm_dir)
    if lm_config.model_type != "llama":
        raise SmolVLMBuildError(f"{lm_dir}: a {lm_config.model_type!r} model; SmolVLM's decoder is "
                                "a Llama one (SmolLM2: mmrlvr pretrained smollm2 --out DIR)")
    side = _check_geometry(lm_config.hidden_size, lm_config.num_attention_heads, vision_width,
                           tile_size, patch_size, scale_factor, longest_edge)
    tok = AutoTokenizer.from_pretrained(lm_dir)
    missing = [t for t in SMOLVLM_SPECIAL_TOKENS if t not in tok.get_vocab()]
    tok.add_tokens(missing, special_tokens=True)
    set_named_tokens(tok, SMOLVLM_TOKEN_ROLES)
    tok.chat_template = CHATML_WITH_IMAGES
    tok.padding_side = "left"
    image_seq_len = (side // scale_factor) ** 2
    processor = _smolvlm_processor(tok, longest_edge=longest_edge, tile_size=tile_size,
                                   image_seq_len=image_seq_len, chat_template=CHATML_WITH_IMAGES)
    ids = tok.convert_tokens_to_ids
    eos = ids("<|im_end|>")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    text = {**lm_config.to_dict(), "vocab_size": len(tok), "eos_token_id": eos,
            "pad_token_id": pad, "dtype": "float32"}
    vision = siglip_vision_config(vision_width=vision_width, vision_depth=vision_depth,
                                  image_size=tile_size, patch_size=patch_size)
    tied = bool(getattr(lm_config, "tie_word_embeddings", False))
    config = SmolVLMConfig(text_config=text, vision_config=vision, scale_factor=scale_factor,
                           image_token_id=ids("<image>"), pad_token_id=pad,
                           tie_word_embeddings=tied)

    lm = AutoModelForCausalLM.from_pretrained(lm_dir, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)          # the new embedding rows, the tower and the connector
        lm.resize_token_embeddings(len(tok), mean_resizing=True)
        with torch.device("cpu"):
            model = SmolVLMForConditionalGeneration(config).to(torch.float32)
    model.model.text_model.load_state_dict(lm.model.state_dict(), strict=True)
    model.lm_head.weight.data.copy_(lm.lm_head.weight.data)
    if tied:
        model.tie_weights()
    model.generation_config = GenerationConfig(bos_token_id=lm_config.bos_token_id,
                                               eos_token_id=eos, pad_token_id=pad,
                                               max_new_tokens=64)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    parts = {"text_model": model.model.text_model, "vision_model": model.model.vision_model,
             "connector": model.model.connector}
    info = {"built_from": str(lm_dir), "class": type(model).__name__,
            "params": sum(p.numel() for p in model.parameters()),
            "params_by_part": {k: sum(p.numel() for p in v.parameters()) for k, v in parts.items()},
            "added_tokens": len(missing), "tied_embeddings": tied, "image_seq_len": image_seq_len,
            "tile_size": tile_size, "longest_edge": longest_edge, "vision_width": vision_width,
            "vision_depth": vision_depth, "seed": seed}
    write_info_card(out, "smolvlm", info,
        f"# A SmolVLM-shaped model around {lm_dir.name}\n\nWritten by `mmrlvr pretrained smolvlm "
        f"--lm {lm_dir} --out DIR`: `SmolVLMForConditionalGeneration` whose Llama decoder is "
        f"{lm_dir}'s weights unchanged ({info['params_by_part']['text_model']:,} parameters), "
        f"with a random SigLIP tower (width {vision_width}, depth {vision_depth}) and connector "
        f"({info['params_by_part']['vision_model'] + info['params_by_part']['connector']:,} "
        f"parameters) that know nothing until trained. An image becomes {image_seq_len} "
        "`<image>` tokens in the language model's own chat turns.\n")
    return info
