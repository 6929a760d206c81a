"""model.freeze_audio keeps the audio encoder fixed and leaves the rest trainable."""
from __future__ import annotations

import torch

import modalities
from mmrlvr.config import ModelConfig
from mmrlvr.train.policy import Policy
from mmrlvr.tiny.audio import build_tiny_audio


def test_freeze_audio_fixes_the_audio_tower_only(tmp_path):
    path = build_tiny_audio("qwen2-audio", tmp_path / "tiny")
    cfg = ModelConfig(path=str(path), modality="audio", freeze_audio=True)
    policy = Policy.load(cfg, modalities.get("audio"), torch.device("cpu"))
    frozen = {n for n, p in policy.model.named_parameters() if not p.requires_grad}
    assert frozen and all("audio_tower." in n for n in frozen)
    assert any("multi_modal_projector" in n for n, p in policy.model.named_parameters() if p.requires_grad)
