"""A frozen model that scores the policy's own tokens (a distillation teacher): loaded once in the
policy's compute dtype, device and attention implementation, in eval mode with no gradients, and
refused unless its tokenizer is the policy's, since its log-probabilities are read at the policy's
token ids. OPD's loss and OPDVR's shaper load theirs through `load_teacher`."""
from __future__ import annotations

from typing import Any

import torch


def load_teacher(path: str, policy: Any, key: str, use: str) -> torch.nn.Module:
    """The model at `path`, frozen beside `policy`. `key` names the config key that gave `path`,
    `use` what compares the two models' log-probabilities (both go in the error)."""
    from mmrlvr.train.policy import load_model, load_processor

    processor = load_processor(path)
    tokenizer = getattr(processor, "tokenizer", processor)
    theirs, ours = tokenizer.get_vocab(), policy.tokenizer.get_vocab()
    if theirs != ours:
        differ = sorted(set(theirs.items()) ^ set(ours.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(f"{key} {path}: its tokenizer differs from the policy's ({len(theirs)} "
                         f"vs {len(ours)} tokens; e.g. {differ}); {use} compares "
                         "log-probabilities of the same token ids, so the teacher needs the "
                         "policy's tokenizer")
    model = load_model(path, policy.compute_dtype, policy.attn_implementation)
    return model.to(policy.device).eval().requires_grad_(False)
