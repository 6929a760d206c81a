"""The vLLM weight sync of the Qwen2.5-Omni thinker and of Llama (SmolLM2), without vLLM or a GPU:
what the sync sends is, name for name and bit for bit (fp32 and bf16), what transformers' save
writes — the full Qwen2.5-Omni checkpoint (thinker + talker, `thinker.` names, as released and as
vLLM serves it) around the tiny thinker, and `LlamaForCausalLM`'s own save with tied and with
untied embeddings (tied: no `lm_head.weight` anywhere, the shared tensor sent once under
`model.embed_tokens.weight`). LoRA merges as peft's merge_and_unload, and a text-only family's
engine gets no `limit_mm_per_prompt`. The other families: test_vllm_names.py."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from mmrlvr import models
from mmrlvr.rollout.vllm import llm_kwargs
from mmrlvr.rollout.vllm_sync import checkpoint_name, plain_name
from tests.test_vllm_names import (assert_sent_as_saved, checkpoint_keys, saved_checkpoint,
                                   vllm_internal_name)
from tests.vllm_helpers import load, synced, with_lora

OMNI = "qwen2_5_omni_thinker"
LLAMA = "llama"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Attention and the dense MLPs (the Omni thinker's text model has no experts), and the Omni
vision tower's separate attn.q / attn.k / attn.v as well, below."""


@pytest.fixture(scope="module")
def dirs(tiny_dirs, tmp_path_factory) -> dict[str, Path]:
    """The tiny Qwen2.5-Omni thinker, the tiny (tied) Llama, and an untied Llama made from it by
    config (`tie_word_embeddings: false`, its own random head)."""
    from transformers import AutoConfig, LlamaForCausalLM

    tied = Path(tiny_dirs("llama"))
    config = AutoConfig.from_pretrained(tied)
    assert config.tie_word_embeddings
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    untied = tmp_path_factory.mktemp("llama-untied")
    LlamaForCausalLM(config).save_pretrained(untied)
    return {"omni": Path(tiny_dirs("qwen2.5-omni")), "tied": tied, "untied": untied}


# ------------------------------------------------------------------------------- Qwen2.5-Omni

def test_omni_thinker_syncs_as_the_full_checkpoint_saves_it(dirs, tmp_path):
    model = load(dirs["omni"])
    assert model.config.model_type == OMNI
    want = saved_checkpoint(model, OMNI, tmp_path)       # Qwen2_5OmniForConditionalGeneration's
    assert_sent_as_saved(model, OMNI, want)
    # the full checkpoint is thinker. + the thinker's own save, every tower in it
    assert set(want) == {f"thinker.{k}" for k in checkpoint_keys(dirs["omni"])}
    for root in ("thinker.model.layers.", "thinker.audio_tower.", "thinker.visual.",
                 "thinker.lm_head.weight", "thinker.model.embed_tokens.weight"):
        assert any(n.startswith(root) for n in want), root
    cases = {"model.language_model.layers.1.self_attn.q_proj.bias":
             "thinker.model.layers.1.self_attn.q_proj.bias",
             "model.audio_tower.audio_bos_eos_token.weight":
             "thinker.audio_tower.audio_bos_eos_token.weight",
             "model.visual.blocks.0.attn.q.weight": "thinker.visual.blocks.0.attn.q.weight",
             "lm_head.weight": "thinker.lm_head.weight"}
    for name, ckpt in cases.items():
        assert checkpoint_name(name, OMNI) == ckpt
    assert vllm_internal_name("thinker.model.norm.weight", OMNI) == "language_model.model.norm.weight"
    assert vllm_internal_name("thinker.visual.merger.mlp.0.weight", OMNI) == "visual.merger.mlp.0.weight"


def test_lora_on_the_omni_thinker_merges_as_peft(dirs, tmp_path):
    base = load(dirs["omni"])
    unmerged = saved_checkpoint(base, OMNI, tmp_path / "base")
    peft_model = with_lora(base, targets=LORA_TARGETS + ("q", "k", "v"))
    want = saved_checkpoint(copy.deepcopy(peft_model).merge_and_unload(), OMNI, tmp_path / "merged")
    got = synced(peft_model, OMNI)
    assert got.keys() == want.keys()
    for name in want:
        assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=name)
    adapted = {checkpoint_name(plain_name(f"{n}.base_layer.weight"), OMNI)
               for n, m in peft_model.named_modules() if hasattr(m, "lora_A")}
    assert {n for n in want if not torch.equal(got[n], unmerged[n])} == adapted
    for part in ("thinker.model.layers.0.mlp.down_proj.", "thinker.audio_tower.layers.0.self_attn.",
                 "thinker.visual.blocks.0.attn.q."):
        assert any(n.startswith(part) for n in adapted), part


# ------------------------------------------------------------------------------- Llama

@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_llama_syncs_as_transformers_saves_it(dirs, kind, tmp_path):
    model = load(dirs[kind])
    assert model.config.model_type == LLAMA and model.config.tie_word_embeddings == (kind == "tied")
    want = saved_checkpoint(model, LLAMA, tmp_path)
    assert set(want) == checkpoint_keys(dirs[kind])
    assert_sent_as_saved(model, LLAMA, want)
    embed = model.model.embed_tokens.weight
    if kind == "tied":
        # one tensor, one name: the save writes no lm_head.weight and neither does the sync
        # (vLLM's LlamaForCausalLM ties its head to model.embed_tokens and skips lm_head.)
        assert model.lm_head.weight is embed and "lm_head.weight" not in want
        assert torch.equal(synced(model, LLAMA)["model.embed_tokens.weight"], model.lm_head.weight)
    else:
        assert not torch.equal(want["lm_head.weight"], want["model.embed_tokens.weight"])
        assert torch.equal(synced(model, LLAMA)["lm_head.weight"], model.lm_head.weight)
    # later syncs: only the trainable weights, the shared embedding once
    sent = synced(model, LLAMA, only_trainable=True)
    assert sent.keys() == want.keys()


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_lora_on_llama_merges_as_peft(dirs, kind, tmp_path):
    base = load(dirs[kind])
    unmerged = saved_checkpoint(base, LLAMA, tmp_path / "base")
    peft_model = with_lora(base, targets=LORA_TARGETS)
    want = saved_checkpoint(copy.deepcopy(peft_model).merge_and_unload(), LLAMA, tmp_path / "merged")
    got = synced(peft_model, LLAMA)
    assert got.keys() == want.keys() == unmerged.keys()
    for name in want:
        assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=name)
    adapted = {n for n in want if not torch.equal(got[n], unmerged[n])}
    layers = base.config.num_hidden_layers
    assert adapted == {f"model.layers.{i}.{m}.weight" for i in range(layers) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    # later syncs: the merged bases only (the embedding and norms are frozen under LoRA)
    assert synced(peft_model, LLAMA, only_trainable=True).keys() == adapted


def test_a_text_only_engine_gets_no_media_limits():
    args = dict(dtype=torch.bfloat16, gpu_memory_utilization=0.4, max_model_len=None, seed=0,
                rank=0, world=1)
    text = llm_kwargs("/m", media=None, **args)
    assert "limit_mm_per_prompt" not in text
    assert llm_kwargs("/m", media="audio", **args)["limit_mm_per_prompt"] == {"audio": 8}
    assert {k: v for k, v in llm_kwargs("/m", media="audio", **args).items()
            if k != "limit_mm_per_prompt"} == text
    assert models.of_type(LLAMA).vllm.media is None and models.of_type(OMNI).vllm.media == "audio"
