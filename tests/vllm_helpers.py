"""Shared by the vLLM sync and name tests (and the FSDP2 worker process they start): a tiny
model loaded with fixed init, what `sync_units` sends as {name: tensor}, and a LoRA wrapper whose
merge is not a no-op."""
from __future__ import annotations

import torch

from mmrlvr.rollout.vllm_sync import sync_units


def load(path, dtype=torch.float32):
    from mmrlvr.train.policy import load_model

    torch.manual_seed(0)
    return load_model(str(path), dtype)


def synced(model, model_type, dtype=torch.float32, **kw) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for unit in sync_units(model, model_type, dtype, **kw):
        for name, tensor in unit:
            assert name not in out, f"{name} sent twice"
            out[name] = tensor
    return out


def with_lora(model, seed=1, targets=("q_proj", "k_proj", "v_proj", "o_proj", "qkv")):
    """peft LoRA (scaling alpha/r = 4) with random B, so the merge is not a no-op."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=list(targets)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return peft_model
