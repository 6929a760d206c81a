"""InternVL, LLaVA-OneVision, SmolVLM, Mistral 3 and the text-only Llama from a model built by hand
with transformers, as a user with a checkpoint made elsewhere brings it (issue 27): the real
config, model and processor classes with other widths, depths, head counts, tile, crop and patch
sizes than `mmrlvr tiny`'s, and another id for every special token
(`hand_built.retrained_tokenizer`). Each trains two GRPO steps (`hand_built.train_two_steps`).
The Qwen-VL line and GLM-4.1V: tests/test_hand_built_qwen_vl.py; the audio families:
tests/test_hand_built_audio.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as tf

from mmrlvr import models
from tests.hand_built import padded_vocab, retrained_tokenizer, save_model_dir, train_two_steps

pytestmark = pytest.mark.slow

HALF = dict(image_mean=[0.5] * 3, image_std=[0.5] * 3)


def _text(tok, model_type: str, **extra) -> dict:
    """A small decoder (96 wide, 2 layers, 3 heads over 1 KV head; `extra` overrides) with the
    tokenizer's ids."""
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return dict(model_type=model_type, vocab_size=padded_vocab(tok), hidden_size=96, intermediate_size=160,
                num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1, **ids) | extra


def _generation(tok, *stops: str) -> dict:
    eos = [tok.eos_token_id] + [tok.convert_tokens_to_ids(t) for t in stops]
    return dict(bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=tok.pad_token_id)


def build_internvl(tiny: Path, out: Path) -> Path:
    """48 px tiles of 8 px patches (a 6x6 grid, pixel-shuffled to 9 tokens), up to 2 tiles."""
    tok = retrained_tokenizer(tiny)
    pix = dict(size={"height": 48, "width": 48}, image_mean=[0.485, 0.456, 0.406],
               image_std=[0.229, 0.224, 0.225])
    processor = tf.InternVLProcessor(
        image_processor=tf.GotOcr2ImageProcessor(crop_to_patches=True, min_patches=1, max_patches=2, **pix),
        video_processor=tf.InternVLVideoProcessor(**pix), tokenizer=tok, image_seq_length=9,
        chat_template=tok.chat_template)
    config = tf.InternVLConfig(
        vision_config=dict(hidden_size=48, num_hidden_layers=1, num_attention_heads=3, intermediate_size=96,
                           image_size=[48, 48], patch_size=[8, 8], norm_type="rms_norm", use_qk_norm=True),
        text_config=_text(tok, "qwen2"), image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=9, downsample_ratio=0.5, vision_feature_layer=-1,
        vision_feature_select_strategy="default", tie_word_embeddings=False)
    return save_model_dir(tf.InternVLForConditionalGeneration(config), processor, out,
                          generation=_generation(tok, "<|endoftext|>"))


def build_llava_onevision(tiny: Path, out: Path) -> Path:
    """24 px crops of 8 px patches (9 tokens each) on AnyRes grids up to 2x3; features from the
    tower's second-to-last layer."""
    tok = retrained_tokenizer(tiny)
    pinpoints = [[24 * r, 24 * c] for r in (1, 2) for c in (1, 2, 3)]
    pix = dict(size={"height": 24, "width": 24}, **HALF)
    processor = tf.LlavaOnevisionProcessor(
        image_processor=tf.LlavaOnevisionImageProcessor(image_grid_pinpoints=pinpoints, do_pad=True, **pix),
        video_processor=tf.LlavaOnevisionVideoProcessor(**pix), tokenizer=tok, num_image_tokens=9,
        vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
        chat_template=tok.chat_template)
    config = tf.LlavaOnevisionConfig(
        text_config=_text(tok, "qwen2"),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=48, intermediate_size=96,
                           num_hidden_layers=2, num_attention_heads=3, image_size=24, patch_size=8,
                           vision_use_head=False),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"), vision_feature_select_strategy="full",
        vision_feature_layer=-2, vision_aspect_ratio="anyres_max_9", image_grid_pinpoints=pinpoints,
        tie_word_embeddings=True)
    return save_model_dir(tf.LlavaOnevisionForConditionalGeneration(config), processor, out,
                          generation=_generation(tok, "<|endoftext|>"))


def build_smolvlm(tiny: Path, out: Path) -> Path:
    """32 px squares of 4 px patches, pixel-shuffled by 4 (SmolVLM2's factor) to 4 tokens; images
    to a longest edge of 64."""
    tok = retrained_tokenizer(tiny)
    processor = tf.SmolVLMProcessor(
        image_processor=tf.SmolVLMImageProcessor(size={"longest_edge": 64},
                                                 max_image_size={"longest_edge": 32},
                                                 do_image_splitting=True, **HALF),
        video_processor=tf.SmolVLMVideoProcessor(size={"longest_edge": 32},
                                                 max_image_size={"longest_edge": 32}, **HALF),
        tokenizer=tok, image_seq_len=4, chat_template=tok.chat_template)
    config = tf.SmolVLMConfig(
        text_config=_text(tok, "llama", head_dim=32),
        vision_config=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=3,
                           image_size=32, patch_size=4),
        scale_factor=4, image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True)
    return save_model_dir(tf.SmolVLMForConditionalGeneration(config), processor, out,
                          generation=_generation(tok))


def build_mistral3(tiny: Path, out: Path) -> Path:
    """Pixtral with 4 px patches merged 2x2: one [IMG] per 8 px cell, images to 48 px."""
    tok = retrained_tokenizer(tiny)
    processor = tf.PixtralProcessor(
        image_processor=tf.PixtralImageProcessor(size={"longest_edge": 48},
                                                 patch_size={"height": 4, "width": 4}, **HALF),
        tokenizer=tok, patch_size=4, spatial_merge_size=2, chat_template=tok.chat_template)
    config = tf.Mistral3Config(
        text_config=_text(tok, "mistral", head_dim=32, sliding_window=None),
        vision_config=dict(model_type="pixtral", hidden_size=48, intermediate_size=96, num_hidden_layers=1,
                           num_attention_heads=3, head_dim=16, image_size=48, patch_size=4),
        image_token_index=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=2, vision_feature_layer=-1,
        multimodal_projector_bias=True, tie_word_embeddings=False)
    return save_model_dir(tf.Mistral3ForConditionalGeneration(config), processor, out,
                          generation=_generation(tok))


def build_llama(tiny: Path, out: Path) -> Path:
    """A SmolLM2-shaped decoder, untied, 3 layers; the tokenizer is the whole processor."""
    tok = retrained_tokenizer(tiny)
    config = tf.LlamaConfig(**_text(tok, "llama", head_dim=32, num_hidden_layers=3,
                                    tie_word_embeddings=False))
    return save_model_dir(tf.LlamaForCausalLM(config), tok, out, generation=_generation(tok))


BUILDERS = {"internvl": build_internvl, "llava-onevision": build_llava_onevision, "smolvlm": build_smolvlm,
            "mistral3": build_mistral3, "llama": build_llama}


@pytest.fixture(scope="module")
def arith_dir(tmp_path_factory):
    from mmrlvr.tasks.arith import make_arith

    out = tmp_path_factory.mktemp("arith")
    make_arith(out, n_train=8, n_test=2, seed=0, families=["add"])
    return out


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_a_model_built_by_hand_trains_two_grpo_steps(kind, tiny_dirs, shapes_dir, arith_dir, tmp_path):
    """The family is read off the dir's own files and two GRPO steps move the weights with finite
    metrics, the rollout scoring what the trainer scores."""
    torch.manual_seed(0)
    model_dir = BUILDERS[kind](tiny_dirs(kind), tmp_path / "by-hand")
    family = models.resolve(str(model_dir))
    assert family.name == kind
    text = family.modality == "text"
    train_two_steps(model_dir, arith_dir if text else shapes_dir, tmp_path, family.modality)
