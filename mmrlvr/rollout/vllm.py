"""Rollouts with vLLM (GPU only; `pip install mmrlvr[vllm]`).

Written against vLLM's documented offline API: `LLM(...)`, `SamplingParams(n=G, logprobs=0)`,
prompts as `{"prompt": chat_text, "multi_modal_data": {"image": [...]}}` so vLLM expands the
media tokens itself, once per prompt. The engine runs in the training process ("colocated"):
`sync_weights()` pushes the policy's current weights into vLLM's model before each rollout
(the same in-process path TRL's colocate mode uses; it needs `VLLM_ENABLE_V1_MULTIPROCESSING=0`,
which this module sets before importing vLLM).

This module is imported only when `rollout.backend: vllm`; CPU runs and tests never import it.
"""
from __future__ import annotations

import os
import time

import torch

from mmrlvr.rollout.base import SamplingParams, completion_mask, scrub_placeholders
from mmrlvr.types import PromptBatch, Rollouts


class VLLMRolloutEngine:
    def __init__(self, policy, branching: dict | None = None, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None):
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.backend 'vllm' needs a CUDA GPU; use 'hf' on CPU")
        kind = (branching or {}).get("kind", "none")
        if kind != "none":
            raise NotImplementedError(
                f"rollout.branching {kind!r} is implemented for the hf backend only so far")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.policy = policy
        path = getattr(policy.base_model().config, "_name_or_path", None)
        self.llm = LLM(model=path, dtype=str(policy.dtype).replace("torch.", ""),
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                       enable_prefix_caching=True, limit_mm_per_prompt={"image": 8})
        self._synced_version = None

    def sync_weights(self) -> None:
        """Copy the policy's weights (LoRA merged) into vLLM's model and drop stale caches."""
        policy = self.policy
        if policy.lora:
            policy.model.merge_adapter()
        try:
            state = {k.replace(".base_layer.", "."): v for k, v in
                     policy.base_model().state_dict().items() if "lora_" not in k}
            runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
            runner.model.load_weights(state.items())
        except AttributeError as err:
            raise RuntimeError(f"this vLLM version does not expose the in-process model "
                               f"runner mmrlvr syncs weights into ({err}); pin a vLLM release "
                               "that TRL's colocate mode supports") from None
        finally:
            if policy.lora:
                policy.model.unmerge_adapter()
        self.llm.reset_prefix_cache()

    def generate(self, batch: PromptBatch, params: SamplingParams) -> Rollouts:
        from vllm import SamplingParams as VSamplingParams

        policy = self.policy
        t0 = time.perf_counter()
        self.sync_weights()
        n = 1 if params.greedy else params.n
        requests = []
        for ex, text in zip(batch.examples, batch.prompt_texts):
            media = policy.adapter.vllm_media(ex)
            requests.append({"prompt": text, **({"multi_modal_data": media} if media else {})})
        sampling = VSamplingParams(
            n=n, max_tokens=params.max_new_tokens, logprobs=0, stop_token_ids=policy.eos_ids,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p, top_k=params.top_k or -1,
            logit_bias={tid: -100.0 for tid in policy.placeholder_ids} or None)
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        rows, logps = [], []
        for out in outputs:
            for comp in out.outputs:
                rows.append(list(comp.token_ids))
                logps.append([next(iter(lp.values())).logprob if lp else 0.0
                              for lp in (comp.logprobs or [])])
        width = max(1, max(len(r) for r in rows))
        ids = torch.full((len(rows), width), policy.pad_id, dtype=torch.long)
        sample_logp = torch.zeros((len(rows), width))
        for i, (r, lp) in enumerate(zip(rows, logps)):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            sample_logp[i, :len(lp)] = torch.tensor(lp)
        real = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            real[i, :len(r)] = 1
        mask = completion_mask(ids, policy.eos_ids) * real
        ids, mask, scrubbed = scrub_placeholders(ids, mask, policy.placeholder_ids, policy.pad_id)
        texts = policy.tokenizer.batch_decode(
            [row[:int(m.sum())] for row, m in zip(ids, mask)], skip_special_tokens=True)
        ended = torch.isin(ids, torch.tensor(policy.eos_ids)).any(dim=1)
        stats = {"rollout/time_s": time.perf_counter() - t0, "rollout/tokens": int(mask.sum()),
                 "rollout/truncated_frac": float((~ended).float().mean()),
                 "rollout/placeholder_scrubbed": scrubbed}
        return Rollouts(prompts=batch, group_size=n, completion_ids=ids, completion_mask=mask,
                        sample_logprobs=None if params.greedy else sample_logp, texts=texts,
                        branch=["clean"] * len(texts), stats=stats)
