"""Per-token log-probabilities from logits, in chunks that keep the backward's memory to the
logits alone: what every training forward (`mmrlvr.train.policy`, `mmrlvr.train.packing`) ends in.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

LOGPROB_CHUNK = 1 << 24
"""Logit elements (positions × vocabulary) per chunk of `token_logprobs`: 64 MB of fp32."""


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(ids) [N, C] from raw logits [N, C, V] at `temperature`, and the entropy [N, C].

    In chunks of positions, each recomputed in the backward (`torch.utils.checkpoint`): only
    the logits stay for the backward, never their fp32 log-softmax over the whole vocabulary
    (with a real Qwen vocabulary of 151,936 that was ~20 GB for 16 completions × 2,048 tokens).
    Per position the arithmetic is that of the whole tensor, so the values are the same.
    """
    from torch.utils.checkpoint import checkpoint

    N, C, V = logits.shape
    step = max(1, LOGPROB_CHUNK // max(N * V, 1))
    logps, entropies = [], []
    for start in range(0, C, step):
        part, part_ids = logits[:, start:start + step], ids[:, start:start + step]
        logps.append(checkpoint(_chosen_logprob, part, part_ids, temperature, use_reentrant=False)
                     if part.requires_grad else _chosen_logprob(part, part_ids, temperature))
        if with_entropy:
            with torch.no_grad():
                lp = F.log_softmax(part.float() / temperature, dim=-1)             # [N, c, V]
                entropies.append(-(lp.exp() * lp).sum(-1))                         # [N, c]
    return torch.cat(logps, dim=1), torch.cat(entropies, dim=1) if with_entropy else None


def _chosen_logprob(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)                 # [N, c, V]
    return logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)                      # [N, c]
