"""The Qwen-VL line and GLM-4.1V from a model built by hand with transformers, as a user with a
checkpoint made elsewhere brings it (issue 27): the real config, model and processor classes with
other widths, depths, head counts and pixel bounds than `mmrlvr tiny`'s, another id for every
special token (`hand_built.retrained_tokenizer`), an embedding table padded past the tokenizer,
and for Qwen2.5-VL the hub's file layout (`preprocessor_config.json`, `chat_template.json`, no
`processor_config.json`). Each trains two GRPO steps (`hand_built.train_two_steps`).
Qwen3-VL dense and Gemma 3: tests/test_families.py."""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
import transformers as tf

from tests.hand_built import padded_vocab, retrained_tokenizer, save_model_dir, train_two_steps
from mmrlvr import models

pytestmark = pytest.mark.slow


def _qwen_generation(tok) -> dict:
    ids = tok.convert_tokens_to_ids
    return dict(bos_token_id=ids("<|endoftext|>"), pad_token_id=ids("<|endoftext|>"),
                eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")])


def _text_ids(tok) -> dict:
    """The ids a Qwen text config states (its defaults are the real vocabulary's, 151,643...)."""
    ids = tok.convert_tokens_to_ids
    return dict(bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                pad_token_id=ids("<|endoftext|>"))


def _vision_ids(tok) -> dict:
    ids = tok.convert_tokens_to_ids
    return dict(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))


def _qwen2_pixels(min_pixels: int, max_pixels: int) -> dict:
    """The hub's spelling of the bounds (`min_pixels`/`max_pixels`; the tiny builder writes `size`)."""
    return dict(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, temporal_patch_size=2,
                merge_size=2)


def build_qwen2_vl(tiny: Path, out: Path) -> Path:
    tok = retrained_tokenizer(tiny)
    pix = _qwen2_pixels(28 * 28 * 3, 28 * 28 * 6)
    processor = tf.Qwen2VLProcessor(image_processor=tf.Qwen2VLImageProcessor(**pix), tokenizer=tok,
                                    video_processor=tf.Qwen2VLVideoProcessor(**pix),
                                    chat_template=tok.chat_template)
    config = tf.Qwen2VLConfig(
        text_config=dict(vocab_size=padded_vocab(tok), hidden_size=96, intermediate_size=160,
                         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                          "mrope_section": [4, 6, 6]}, **_text_ids(tok)),
        vision_config=dict(depth=1, embed_dim=48, hidden_size=96, num_heads=3, mlp_ratio=2),
        tie_word_embeddings=False, **_vision_ids(tok))
    return save_model_dir(tf.Qwen2VLForConditionalGeneration(config), processor, out,
                          generation=_qwen_generation(tok))


def build_qwen2_5_vl(tiny: Path, out: Path) -> Path:
    """Saved as the hub's Qwen2.5-VL repos are: image processor, tokenizer and chat_template.json
    apart, no processor_config.json."""
    tok = retrained_tokenizer(tiny)
    pix = _qwen2_pixels(28 * 28 * 2, 28 * 28 * 8)
    config = tf.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=padded_vocab(tok), hidden_size=64, intermediate_size=192,
                         num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                          "mrope_section": [4, 6, 6]}, **_text_ids(tok)),
        vision_config=dict(depth=2, hidden_size=48, intermediate_size=80, num_heads=3, out_hidden_size=64,
                           window_size=56, fullatt_block_indexes=[0], tokens_per_second=2),
        tie_word_embeddings=True, **_vision_ids(tok))
    model = tf.Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config = tf.GenerationConfig(**_qwen_generation(tok))
    model.save_pretrained(out)
    tf.Qwen2VLImageProcessor(**pix).save_pretrained(out)
    tok.save_pretrained(out)
    (out / "chat_template.json").write_text(json.dumps({"chat_template": tok.chat_template}))
    return out


def build_qwen3_vl_moe(tiny: Path, out: Path) -> Path:
    tok = retrained_tokenizer(tiny)
    pix = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
               image_std=[0.5] * 3)
    processor = tf.Qwen3VLProcessor(
        image_processor=tf.Qwen2VLImageProcessor(size={"shortest_edge": 32 * 32 * 3,
                                                       "longest_edge": 32 * 32 * 6}, **pix),
        video_processor=tf.Qwen3VLVideoProcessor(**pix), tokenizer=tok, chat_template=tok.chat_template)
    config = tf.Qwen3VLMoeConfig(
        text_config=dict(vocab_size=padded_vocab(tok), hidden_size=96, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                         num_experts=3, num_experts_per_tok=1, moe_intermediate_size=48,
                         decoder_sparse_step=1, mlp_only_layers=[1],
                         rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                          "mrope_section": [6, 5, 5], "mrope_interleaved": True},
                         **_text_ids(tok)),
        vision_config=dict(depth=3, hidden_size=48, intermediate_size=96, num_heads=3, out_hidden_size=96,
                           num_position_embeddings=36, deepstack_visual_indexes=[1, 2]),
        tie_word_embeddings=False, **_vision_ids(tok))
    return save_model_dir(tf.Qwen3VLMoeForConditionalGeneration(config), processor, out,
                          generation=_qwen_generation(tok))


def build_qwen3_5(tiny: Path, out: Path, moe: bool = False) -> Path:
    """Qwen3.5 (dense or MoE): linear attention in 2 of 3 layers, 64-wide heads."""
    tok = retrained_tokenizer(tiny)
    pix = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
               image_std=[0.5] * 3)
    processor = tf.Qwen3VLProcessor(
        image_processor=tf.Qwen2VLImageProcessor(size={"shortest_edge": 32 * 32 * 2,
                                                       "longest_edge": 32 * 32 * 9}, **pix),
        video_processor=tf.Qwen3VLVideoProcessor(**pix), tokenizer=tok, chat_template=tok.chat_template)
    sizes = (dict(num_experts=3, num_experts_per_tok=2, moe_intermediate_size=40,
                  shared_expert_intermediate_size=56) if moe else dict(intermediate_size=144))
    text = dict(vocab_size=padded_vocab(tok), hidden_size=128, num_hidden_layers=3, num_attention_heads=2,
                num_key_value_heads=1, head_dim=64,
                layer_types=["linear_attention", "full_attention", "linear_attention"],
                linear_conv_kernel_dim=3, linear_key_head_dim=32, linear_value_head_dim=48,
                linear_num_key_heads=2, linear_num_value_heads=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": [4, 2, 2], "mrope_interleaved": True},
                **sizes, **_text_ids(tok))
    vision = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=128,
                  num_position_embeddings=16)
    config_cls, model_cls = ((tf.Qwen3_5MoeConfig, tf.Qwen3_5MoeForConditionalGeneration) if moe else
                             (tf.Qwen3_5Config, tf.Qwen3_5ForConditionalGeneration))
    config = config_cls(text_config=text, vision_config=vision, tie_word_embeddings=False, **_vision_ids(tok))
    return save_model_dir(model_cls(config), processor, out, generation=_qwen_generation(tok))


def build_glm4v(tiny: Path, out: Path) -> Path:
    tok = retrained_tokenizer(tiny)
    ids = tok.convert_tokens_to_ids
    pix = dict(size={"shortest_edge": 2 * 28 * 28 * 3, "longest_edge": 2 * 28 * 28 * 8}, patch_size=14,
               temporal_patch_size=2, merge_size=2)
    processor = tf.Glm4vProcessor(image_processor=tf.Glm4vImageProcessor(**pix), tokenizer=tok,
                                  video_processor=tf.Glm4vVideoProcessor(**pix),
                                  chat_template=tok.chat_template)
    eot = ids("<|endoftext|>")
    config = tf.Glm4vConfig(
        text_config=dict(vocab_size=padded_vocab(tok), hidden_size=96, intermediate_size=160,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=48,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "partial_rotary_factor": 0.5, "mrope_section": [4, 4, 4]},
                         pad_token_id=eot, eos_token_id=eot),
        vision_config=dict(depth=1, hidden_size=48, num_heads=3, intermediate_size=96, out_hidden_size=96,
                           image_size=84),
        image_token_id=ids("<|image|>"), video_token_id=ids("<|video|>"),
        image_start_token_id=ids("<|begin_of_image|>"), image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"), video_end_token_id=ids("<|end_of_video|>"))
    return save_model_dir(tf.Glm4vForConditionalGeneration(config), processor, out,
                          generation=dict(eos_token_id=[eot, ids("<|user|>"), ids("<|observation|>")],
                                          pad_token_id=eot))


BUILDERS = {"qwen2-vl": build_qwen2_vl, "qwen2.5-vl": build_qwen2_5_vl, "qwen3-vl-moe": build_qwen3_vl_moe,
            "qwen3.5": build_qwen3_5, "qwen3.5-moe": partial(build_qwen3_5, moe=True),
            "glm4v": build_glm4v}


PIXELS = {"qwen2-vl": (28 * 28 * 3, 28 * 28 * 6), "qwen2.5-vl": (28 * 28 * 2, 28 * 28 * 8),
          "qwen3-vl-moe": (32 * 32 * 3, 32 * 32 * 6), "qwen3.5": (32 * 32 * 2, 32 * 32 * 9),
          "qwen3.5-moe": (32 * 32 * 2, 32 * 32 * 9), "glm4v": (2 * 28 * 28 * 3, 2 * 28 * 28 * 8)}
"""The pixel bounds each hand-built processor states (GLM's over t x h x w, as its processor
counts; `mmrlvr.models.glm4v` says why the run takes them as they are)."""


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_a_model_built_by_hand_trains_two_grpo_steps(kind, tiny_dirs, shapes_dir, tmp_path):
    """The family is read off the dir's own files, the run takes the processor's pixel bounds
    (not the tiny model's), and two GRPO steps move the weights with finite metrics."""
    torch.manual_seed(0)
    model_dir = BUILDERS[kind](tiny_dirs(kind), tmp_path / "by-hand")
    assert models.resolve(str(model_dir)).name == kind
    cfg = train_two_steps(model_dir, shapes_dir, tmp_path, "vision")
    assert (cfg["model"]["min_pixels"], cfg["model"]["max_pixels"]) == PIXELS[kind]
