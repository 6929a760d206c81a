"""Qwen2-Audio, the Qwen2.5-Omni thinker and the Qwen3-Omni thinker from a model built by hand with
transformers, as a user with a checkpoint made elsewhere brings it (issue 27): the real config,
model and processor classes with other widths, depths and head counts than `mmrlvr tiny`'s, a
4 s Whisper window (the tiny models' is 3 s), and another id for every special token
(`hand_built.retrained_tokenizer`). Each trains two GRPO steps on `mmrlvr data tones`
(`hand_built.train_two_steps`). The vision families: tests/test_hand_built_qwen_vl.py and
tests/test_hand_built_families.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as tf

from mmrlvr import models
from tests.hand_built import padded_vocab, retrained_tokenizer, save_model_dir, train_two_steps

pytestmark = pytest.mark.slow

WINDOW = 4
"""The feature extractor's window in seconds (the real models' is 30)."""


def _features() -> tf.WhisperFeatureExtractor:
    return tf.WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160,
                                      chunk_length=WINDOW, n_fft=400)


def _encoder(**extra) -> dict:
    """A one-layer, 48-wide encoder of 3 heads (the tiny ones: two layers, 64 wide, 4 heads)."""
    return dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=3, encoder_ffn_dim=80, d_model=48,
                max_source_positions=50 * WINDOW, **extra)


def _qwen_ids(tok) -> dict:
    ids = tok.convert_tokens_to_ids
    return dict(bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                pad_token_id=ids("<|endoftext|>"))


def _generation(tok) -> dict:
    ids = tok.convert_tokens_to_ids
    return dict(bos_token_id=ids("<|endoftext|>"), pad_token_id=ids("<|endoftext|>"),
                eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")])


def build_qwen2_audio(tiny: Path, out: Path) -> Path:
    tok = retrained_tokenizer(tiny)
    processor = tf.Qwen2AudioProcessor(feature_extractor=_features(), tokenizer=tok,
                                       chat_template=tok.chat_template)
    config = tf.Qwen2AudioConfig(
        audio_config=dict(model_type="qwen2_audio_encoder", **_encoder()),
        text_config=dict(model_type="qwen2", vocab_size=padded_vocab(tok), hidden_size=96,
                         intermediate_size=160, num_hidden_layers=2, num_attention_heads=3,
                         num_key_value_heads=1, **_qwen_ids(tok)),
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"))
    return save_model_dir(tf.Qwen2AudioForConditionalGeneration(config), processor, out,
                          generation=_generation(tok))


def build_qwen2_5_omni(tiny: Path, out: Path) -> Path:
    """The thinker alone, M-RoPE [4, 6, 6] over 32-wide heads."""
    tok = retrained_tokenizer(tiny)
    ids = tok.convert_tokens_to_ids
    pix = dict(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 6, patch_size=14, temporal_patch_size=2,
               merge_size=2)
    processor = tf.Qwen2_5OmniProcessor(
        image_processor=tf.Qwen2VLImageProcessor(**pix), video_processor=tf.Qwen2VLVideoProcessor(**pix),
        feature_extractor=_features(), tokenizer=tok, chat_template=tok.chat_template)
    config = tf.Qwen2_5OmniThinkerConfig(
        audio_config=_encoder(n_window=50, output_dim=96),
        vision_config=dict(depth=1, hidden_size=48, intermediate_size=80, num_heads=3, out_hidden_size=96,
                           fullatt_block_indexes=[0]),
        text_config=dict(vocab_size=padded_vocab(tok), hidden_size=96, intermediate_size=160,
                         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                          "mrope_section": [4, 6, 6]}, **_qwen_ids(tok)),
        audio_token_index=ids("<|AUDIO|>"), image_token_index=ids("<|IMAGE|>"),
        video_token_index=ids("<|VIDEO|>"), audio_start_token_id=ids("<|audio_bos|>"),
        audio_end_token_id=ids("<|audio_eos|>"), vision_start_token_id=ids("<|vision_bos|>"),
        vision_end_token_id=ids("<|vision_eos|>"), user_token_id=ids("<|im_start|>"))
    return save_model_dir(tf.Qwen2_5OmniThinkerForConditionalGeneration(config), processor, out,
                          generation=_generation(tok))


def build_qwen3_omni(tiny: Path, out: Path) -> Path:
    """The thinker alone: 3 experts top-1 in 2 of 3 layers, interleaved M-RoPE over 32-wide heads."""
    tok = retrained_tokenizer(tiny)
    ids = tok.convert_tokens_to_ids
    pix = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    size = {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 6}
    processor = tf.Qwen3OmniMoeProcessor(
        image_processor=tf.Qwen2VLImageProcessor(size=size, **pix),
        video_processor=tf.Qwen2VLVideoProcessor(size=dict(size), **pix), feature_extractor=_features(),
        tokenizer=tok, chat_template=tok.chat_template)
    text = dict(vocab_size=padded_vocab(tok), hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                num_attention_heads=3, num_key_value_heads=1, head_dim=32, num_experts=3,
                num_experts_per_tok=1, moe_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[0],
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 5, 5],
                                 "mrope_interleaved": True, "interleaved": True}, **_qwen_ids(tok))
    config = tf.Qwen3OmniMoeThinkerConfig(
        audio_config=_encoder(n_window=50, n_window_infer=400, conv_chunksize=250, downsample_hidden_size=24,
                              output_dim=96),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=96,
                           num_position_embeddings=16, deepstack_visual_indexes=[0]),
        text_config=text, position_id_per_seconds=13, audio_token_id=ids("<|audio_pad|>"),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        audio_start_token_id=ids("<|audio_start|>"), audio_end_token_id=ids("<|audio_end|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        user_token_id=ids("<|im_start|>"), tie_word_embeddings=False)
    return save_model_dir(tf.Qwen3OmniMoeThinkerForConditionalGeneration(config), processor, out,
                          generation=_generation(tok))


def full_checkpoint(build, wrapper: str):
    """A builder of the whole Omni model around `build`'s thinker, as the releases ship it
    (`model_type` qwen2_5_omni / qwen3_omni_moe, weights under `thinker.`), without the talker
    (`enable_audio_output: false`)."""
    def build_full(tiny: Path, out: Path) -> Path:
        thinker = build(tiny, out.parent / f"{out.name}-thinker")
        config = getattr(tf, f"{wrapper}Config")(
            thinker_config=tf.AutoConfig.from_pretrained(thinker).to_dict(), enable_audio_output=False)
        model = getattr(tf, f"{wrapper}ForConditionalGeneration")(config)
        model.thinker.load_state_dict(type(model.thinker).from_pretrained(thinker).state_dict())
        model.generation_config = tf.GenerationConfig.from_pretrained(thinker)
        model.save_pretrained(out)
        tf.AutoProcessor.from_pretrained(thinker).save_pretrained(out)
        return out
    return build_full


BUILDERS = {"qwen2-audio": build_qwen2_audio, "qwen2.5-omni": build_qwen2_5_omni,
            "qwen3-omni": build_qwen3_omni,
            "qwen2.5-omni full": full_checkpoint(build_qwen2_5_omni, "Qwen2_5Omni"),
            "qwen3-omni full": full_checkpoint(build_qwen3_omni, "Qwen3OmniMoe")}


@pytest.fixture(scope="module")
def tones_dir(tmp_path_factory):
    from mmrlvr.tasks.tones import make_tones

    out = tmp_path_factory.mktemp("tones")
    make_tones(out, n_train=8, n_test=2, seed=0)
    return out


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_a_model_built_by_hand_trains_two_grpo_steps(kind, tiny_dirs, tones_dir, tmp_path):
    """The family is read off the dir's own files and two GRPO steps move the language model's
    and the audio encoder's weights with finite metrics, the rollout scoring what the trainer
    scores."""
    torch.manual_seed(0)
    family = kind.split()[0]
    model_dir = BUILDERS[kind](tiny_dirs(family), tmp_path / "by-hand")
    assert models.resolve(str(model_dir)).name == family
    train_two_steps(model_dir, tones_dir, tmp_path, "audio")
