"""Qwen2-Audio and the Qwen2.5-Omni thinker: a Whisper-style encoder whose outputs replace the
`<|AUDIO|>` tokens.

Qwen2-Audio's text model has 1-D RoPE over the real tokens. The Omni thinker has 3-D M-RoPE with
audio tokens placed by time (`get_rope_index` over the ids, the mask and each clip's length). A
full Qwen2.5-Omni checkpoint (`model_type` `qwen2_5_omni`: thinker and talker) trains its thinker
only. Both encoders make ((frames − 1) // 2 + 1 − 2) // 2 + 1 outputs from a clip's mel frames
(a stride-2 convolution, then pooling by 2).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from mmrlvr.models.base import PER_EXPERT, Family, VllmNames, text_dims as _text

_WHISPER = dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                num_mel_bins=128, max_source_positions=1500)


def _omni(text: dict) -> dict:          # the thinker's dims (only the thinker is trained)
    out = text["hidden_size"]
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, in_channels=3,
                  out_hidden_size=out, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    return dict(model_type="qwen2_5_omni_thinker", text_config=text,
                audio_config=dict(_WHISPER, output_dim=out), vision_config=vision)


_QWEN2_AUDIO = dict(    # its config.json leaves hidden 4096, 32 layers, 32 (kv) heads to Qwen2's
    model_type="qwen2_audio", architectures=["Qwen2AudioForConditionalGeneration"],
    audio_config=_WHISPER, vocab_size=156032,
    text_config=dict(model_type="qwen2", **_text(4096, 11008, 32, 32, 32, 156032, False)))


class QwenAudio(Family):
    modality = "audio"
    audio_token = "<|AUDIO|>"
    placeholder_tokens = ("<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")
    audio_towers = ("audio_tower",)
    unit_classes = ("DecoderLayer", "EncoderLayer")
    media_inputs = ("input_features",)
    dummy_frames: ClassVar[int] = 100
    """Mel frames of the dummy clip `tower_zero` encodes (1 s)."""

    def tower_zero(self, model: torch.nn.Module, device: torch.device) -> torch.Tensor:
        """The encoder and projector on a silent clip, times 0."""
        audio = model.config.audio_config
        frames = self.dummy_frames or 2 * audio.max_source_positions
        features = torch.zeros(1, audio.num_mel_bins, frames, device=device,
                               dtype=next(model.parameters()).dtype)
        mask = torch.ones(1, frames, dtype=torch.long, device=device)
        return sum(c.sum() for c in self.encode_audio(model, features, mask)) * 0

    def output_lengths(self, mel_frames: torch.Tensor) -> torch.Tensor:
        """Encoder outputs per clip from its mel-frame count."""
        return ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1

    def encode_audio(self, model: torch.nn.Module, features: torch.Tensor,
                     feature_mask: torch.Tensor) -> list[torch.Tensor]:
        """Projected encoder outputs per clip, trimmed to its length: n_audio × [L_a, D_text]."""
        raise NotImplementedError

    def audio_token_id(self, model: torch.nn.Module) -> int:
        cfg = model.model.config if hasattr(model, "model") else model.config
        token = getattr(cfg, "audio_token_id", None)
        return token if token is not None else cfg.audio_token_index


class Qwen2Audio(QwenAudio):
    name = "qwen2-audio"
    model_types = ("qwen2_audio",)
    classes = ("Qwen2AudioForConditionalGeneration",)
    processors = ("Qwen2AudioProcessor",)
    tiny = "qwen2-audio"
    vision_towers = ()
    dummy_frames = 0          # its encoder takes whole windows (2 x max_source_positions frames)
    vllm = VllmNames(
        renames=(("model.language_model.", "language_model.model."),
                 ("model.audio_tower.", "audio_tower."),
                 ("model.multi_modal_projector.", "multi_modal_projector."),
                 ("lm_head.", "language_model.lm_head.")),
        roots=("language_model.", "audio_tower.", "multi_modal_projector."), media="audio")
    published = {"Qwen/Qwen2-Audio-7B": _QWEN2_AUDIO, "Qwen/Qwen2-Audio-7B-Instruct": _QWEN2_AUDIO}

    def encode_audio(self, model: torch.nn.Module, features: torch.Tensor,
                     feature_mask: torch.Tensor) -> list[torch.Tensor]:
        """As `Qwen2AudioModel.forward` does it: mask from the mel lengths, encoder, projector."""
        from transformers.masking_utils import create_bidirectional_mask

        inner = model.model
        frames = feature_mask.sum(-1)                                     # [n_audio]
        tower = inner.audio_tower
        in_lengths = (frames - 1) // 2 + 1                                # after conv stride 2
        n, _, mel_frames = features.shape
        width = (mel_frames - 2) // 2 + 1
        valid = torch.arange(width, device=frames.device)[None, :] < in_lengths[:, None]   # [n, W]
        mask = create_bidirectional_mask(config=tower.config,
                                         inputs_embeds=torch.zeros(n, width, 1, dtype=features.dtype,
                                                                   device=features.device),
                                         attention_mask=valid.long())
        hidden = tower(features, attention_mask=mask).last_hidden_state      # [n, W/2, D_audio]
        projected = inner.multi_modal_projector(hidden)                      # [n, W/2, D_text]
        lengths = self.output_lengths(frames).tolist()
        return [projected[k, :lengths[k]] for k in range(n)]


_QWEN3_OMNI = dict(     # the thinker of the release's config.json (the talker is not trained)
    model_type="qwen3_omni_moe_thinker",
    text_config=dict(_text(2048, 768, 48, 32, 4, 152064, False), head_dim=128, num_experts=128,
                     num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000,
                                      "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
    audio_config=dict(_WHISPER, output_dim=2048, n_window=50, downsample_hidden_size=480),
    vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                       in_channels=3, out_hidden_size=2048, patch_size=16, spatial_merge_size=2,
                       temporal_patch_size=2, num_position_embeddings=2304,
                       deepstack_visual_indexes=[8, 16, 24]))


class Qwen25Omni(QwenAudio):
    """The Qwen2.5-Omni thinker (text out); a full Omni checkpoint trains its thinker (the
    thinker class loads the thinker's weights out of it)."""

    name = "qwen2.5-omni"
    model_types = ("qwen2_5_omni_thinker",)
    wrapper_types = ("qwen2_5_omni",)
    classes = ("Qwen2_5OmniThinkerForConditionalGeneration",)
    processors = ("Qwen2_5OmniProcessor",)
    tiny = "qwen2.5-omni"
    vision_towers = ("visual",)
    unit_classes = ("DecoderLayer", "EncoderLayer", "VisionBlock")
    vllm = VllmNames(
        renames=(("model.language_model.", "thinker.model."),
                 ("model.audio_tower.", "thinker.audio_tower."),
                 ("model.visual.", "thinker.visual."),
                 ("lm_head.", "thinker.lm_head.")),
        roots=("thinker.model.", "thinker.audio_tower.", "thinker.visual.", "thinker.lm_head."),
        media="audio")
    """The released (thinker + talker + token2wav) checkpoint's names: `thinker.` before what
    the thinker's own save writes (model.layers., audio_tower., visual., lm_head.), as
    transformers saves `Qwen2_5OmniForConditionalGeneration` (tested). vLLM serves the full
    checkpoint with its thinker class, whose mapper takes `thinker.` (thinker.model. ->
    language_model.model., thinker.lm_head. -> language_model.lm_head., thinker. -> '') and
    whose loader skips talker. and token2wav."""
    published = {
        "Qwen/Qwen2.5-Omni-3B": _omni(_text(2048, 11008, 36, 16, 2, 151936, False)),
        "Qwen/Qwen2.5-Omni-7B": _omni(_text(3584, 18944, 28, 28, 4, 152064, False)),
    }
    time_positions = True

    def unwrap_config(self, config: Any) -> Any:
        return config.thinker_config if config.model_type in self.wrapper_types else config

    def position_ids(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """3-D M-RoPE positions [3, N, T] from ids, mask and clip lengths."""
        lengths = inputs["feature_attention_mask"].sum(-1) if "feature_attention_mask" in inputs else None
        positions, _ = model.model.get_rope_index(inputs["input_ids"], None, None,
                                                  inputs["attention_mask"], False, lengths)
        return positions

    def encode_audio(self, model: torch.nn.Module, features: torch.Tensor,
                     feature_mask: torch.Tensor) -> list[torch.Tensor]:
        """The thinker's `get_audio_features` (it drops padding frames itself), split per clip."""
        flat = model.model.get_audio_features(features, feature_mask, return_dict=True).last_hidden_state
        return list(flat.split(self.output_lengths(feature_mask.sum(-1)).tolist()))


class Qwen3Omni(Qwen25Omni):
    """The Qwen3-Omni-MoE thinker: an encoder that cuts the mel features into 1 s chunks (13
    tokens a second), `<|audio_pad|>` placeholders, a MoE text model. Its `get_rope_index`
    places audio tokens like text (3-D positions only with images or video)."""

    name = "qwen3-omni"
    model_types = ("qwen3_omni_moe_thinker",)
    wrapper_types = ("qwen3_omni_moe",)
    classes = ("Qwen3OmniMoeThinkerForConditionalGeneration",)
    processors = ("Qwen3OmniMoeProcessor",)
    tiny = "qwen3-omni"
    moe = True
    unit_classes = ("DecoderLayer", "EncoderLayer", "VisionBlock", "TextExperts")
    vllm = dataclasses.replace(Qwen25Omni.vllm, experts=PER_EXPERT)
    """The released (thinker + talker) checkpoint's names: `thinker.` before what the thinker's
    own save writes (model.layers., audio_tower., visual., lm_head.), experts one per expert.
    vLLM serves the full checkpoint with its thinker class, whose mapper takes `thinker.`."""
    audio_token = "<|audio_pad|>"
    placeholder_tokens = ("<|audio_pad|>", "<|audio_start|>", "<|audio_end|>", "<|image_pad|>",
                          "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    published = {
        "Qwen/Qwen3-Omni-30B-A3B-Instruct": _QWEN3_OMNI,
    }

    def output_lengths(self, mel_frames: torch.Tensor) -> torch.Tensor:
        """The encoder's own count (`_get_feat_extract_output_lengths`, 100-frame chunks)."""
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            _get_feat_extract_output_lengths)

        return _get_feat_extract_output_lengths(mel_frames)
