"""Rollouts with transformers `generate` (CPU and GPU).

Prompts arrive processed once; each is repeated G times here by cutting its own token rows and
media rows (`modalities.base.subset`), never by re-running the processor. Media placeholder
tokens are suppressed at sampling and any that slip through are scrubbed before training.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from mmrlvr.rollout.base import SamplingParams, completion_mask, scrub_placeholders
from mmrlvr.types import PromptBatch, Rollouts
from modalities.base import subset, to_device


class HFRolloutEngine:
    def __init__(self, policy, branching: dict | None = None):
        self.policy = policy
        kind = (branching or {}).get("kind", "none")
        if kind != "none":
            raise NotImplementedError(f"rollout.branching kind {kind!r} is not available yet")

    @torch.no_grad()  # not inference_mode: these tensors feed a training forward later
    def generate(self, batch: PromptBatch, params: SamplingParams) -> Rollouts:
        policy = self.policy
        t0 = time.perf_counter()
        n = 1 if params.greedy else params.n
        expanded = subset(batch, [b for b in range(len(batch)) for _ in range(n)])
        inputs = to_device(expanded.inputs, policy.device, policy.dtype)
        prompt_len = inputs["input_ids"].shape[1]
        kwargs = dict(max_new_tokens=params.max_new_tokens, eos_token_id=policy.eos_ids,
                      pad_token_id=policy.pad_id, return_dict_in_generate=True,
                      output_logits=not params.greedy, suppress_tokens=policy.placeholder_ids)
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k or None)
        was_training = policy.model.training
        policy.model.eval()
        try:
            out = policy.model.generate(**inputs, **kwargs)
        finally:
            policy.model.train(was_training)
        ids = out.sequences[:, prompt_len:].cpu()                                  # [N, C]
        mask = completion_mask(ids, policy.eos_ids)                                # [N, C]
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, policy.pad_id))
        ids, mask, scrubbed = scrub_placeholders(ids, mask, policy.placeholder_ids, policy.pad_id)
        sample_logp = None
        if not params.greedy:
            logits = torch.stack(out.logits, dim=1).float().cpu()                  # [N, C, V]
            logp_all = F.log_softmax(logits / params.temperature, dim=-1)
            sample_logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)        # [N, C]
        texts = policy.tokenizer.batch_decode(
            [row[:int(m.sum())] for row, m in zip(ids, mask)], skip_special_tokens=True)
        lengths = mask.sum(dim=1)
        ended = torch.isin(ids, torch.tensor(policy.eos_ids)).any(dim=1)
        stats = {"rollout/time_s": time.perf_counter() - t0,
                 "rollout/tokens": int(lengths.sum()),
                 "rollout/truncated_frac": float((~ended).float().mean()),
                 "rollout/placeholder_scrubbed": scrubbed}
        return Rollouts(prompts=batch, group_size=n, completion_ids=ids, completion_mask=mask,
                        sample_logprobs=sample_logp, texts=texts, branch=["clean"] * len(texts),
                        stats=stats)
