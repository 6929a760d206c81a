"""Rollouts with vLLM (GPU only; `pip install mmrlvr[vllm]`).

Written against vLLM's documented offline API: `LLM(...)`, `SamplingParams(n=G, logprobs=0)`,
prompts as `{"prompt": chat_text, "multi_modal_data": {"image": [...]}}` so vLLM expands the
media tokens itself, once per prompt. The engine runs in the training process ("colocated"):
`sync_weights()` pushes the policy's current weights into vLLM's model before each rollout
(the same in-process path TRL's colocate mode uses; it needs `VLLM_ENABLE_V1_MULTIPROCESSING=0`,
which this module sets before importing vLLM).

NC-GRPO (`rollout.branching`, `mmrlvr.rollout.vllm_noise`): the clean members of a group stay one
request with n = G-k; every noisy member is a request of its own (n = 1) carrying its RowNoise in
`SamplingParams.extra_args` and a fresh `cache_salt`, so it neither reuses nor publishes a prompt
KV cache; completions are put back in the NoisePlan's row order. With noise on (alpha > 0) the
hooks go in through a worker extension, on vLLM's V1 model runner (`VLLM_USE_V2_MODEL_RUNNER=0`),
and the engine runs eagerly (`enforce_eager=True`: CUDA graphs and torch.compile would skip the
Python hooks, so rollouts are slower); after each call the hooks' counters are checked (every
noisy request seen, all of its prompt tokens displaced).

Not yet run on a GPU here, with or without branching: the request building, row order and the
displacement arithmetic are tested on CPU (tests/test_vllm_noise.py); the hook installation and
the runner attributes it reads were checked against vLLM's source only.

This module imports vllm only inside the engine; CPU runs and tests never import vllm.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

import torch

from mmrlvr.rollout.base import SamplingParams, completion_mask, scrub_placeholders
from mmrlvr.rollout.branching import Branching, NoisePlan, RowNoise, make_plan
from mmrlvr.rollout.vllm_noise import WORKER_EXTENSION, noise_extra_args
from mmrlvr.types import PromptBatch, Rollouts


@dataclass(frozen=True)
class RequestSpec:
    """One vLLM request of a generate call."""

    prompt: int
    """Index of its prompt in the batch."""
    rows: tuple[int, ...]
    """The rollout rows (b·G + g) its n = len(rows) completions fill, in order."""
    noise: RowNoise | None = None
    """The displacement of a noisy member; None for clean requests."""
    cache_salt: str | None = None
    """A salt of its own for a noisy request, so its prompt KV cache is never shared."""


def request_specs(n_prompts: int, group_size: int, plan: NoisePlan | None,
                  salt: str) -> list[RequestSpec]:
    """The requests for B prompts × G members: clean rows of a prompt together, noisy ones alone.

    `salt` must be unique per generate call (a noisy request's cache_salt is `salt:row`), so a
    noisy prompt cache of an earlier call is never hit either.
    """
    specs = []
    for b in range(n_prompts):
        rows = range(b * group_size, (b + 1) * group_size)
        noisy = [r for r in rows if plan is not None and plan.row(r) is not None]
        clean = tuple(r for r in rows if r not in noisy)
        if clean:
            specs.append(RequestSpec(b, clean))
        specs += [RequestSpec(b, (r,), plan.row(r), f"{salt}:{r}") for r in noisy]
    return specs


def rows_in_plan_order(specs: list[RequestSpec], completions: list[list]) -> list:
    """Flatten per-request completions (vLLM's output order = request order) into row order."""
    rows = sorted(r for s in specs for r in s.rows)
    if rows != list(range(len(rows))):
        raise RuntimeError(f"the request specs fill rows {rows}, which do not tile 0..N-1 once each")
    out: list = [None] * len(rows)
    for spec, comps in zip(specs, completions, strict=True):
        if len(comps) != len(spec.rows):
            raise RuntimeError(f"vLLM returned {len(comps)} completions for the request of prompt "
                               f"{spec.prompt} filling rows {spec.rows}; expected {len(spec.rows)}")
        for row, comp in zip(spec.rows, comps):
            out[row] = comp
    return out


class VLLMRolloutEngine:
    def __init__(self, policy, branching: dict | None = None, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None):
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.backend 'vllm' needs a CUDA GPU; use 'hf' on CPU")
        self.branching = Branching.from_config(branching)
        self.noise_on = self.branching.kind != "none" and self.branching.alpha > 0
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if self.noise_on:   # the hooks read the V1 runner's input_batch / requests
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        from vllm import LLM

        self.policy = policy
        path = getattr(policy.base_model().config, "_name_or_path", None)
        self.llm = LLM(model=path, dtype=str(policy.dtype).replace("torch.", ""),
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                       enable_prefix_caching=True, limit_mm_per_prompt={"image": 8},
                       **({"enforce_eager": True, "worker_extension_cls": WORKER_EXTENSION}
                          if self.noise_on else {}))
        if self.noise_on:
            self.llm.collective_rpc("mmrlvr_install_noise", args=(self.branching.site,))
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
        plan = None if params.greedy else make_plan(self.branching, len(batch), n)
        noisy = plan is not None and plan.active
        specs = request_specs(len(batch), n, plan if noisy else None, salt=uuid.uuid4().hex)
        prompts = []
        for ex, text in zip(batch.examples, batch.prompt_texts):
            media = policy.adapter.vllm_media(ex)
            prompts.append({"prompt": text, **({"multi_modal_data": media} if media else {})})
        requests, samplings = [], []
        for spec in specs:
            salt = {"cache_salt": spec.cache_salt} if spec.cache_salt else {}
            requests.append({**prompts[spec.prompt], **salt})
            samplings.append(VSamplingParams(
                n=len(spec.rows), max_tokens=params.max_new_tokens, logprobs=0,
                stop_token_ids=policy.eos_ids,
                temperature=0.0 if params.greedy else params.temperature,
                top_p=1.0 if params.greedy else params.top_p, top_k=params.top_k or -1,
                logit_bias={tid: -100.0 for tid in policy.placeholder_ids} or None,
                extra_args=noise_extra_args(spec.noise) if spec.noise else None))
        outputs = self.llm.generate(requests, samplings, use_tqdm=False)
        completions = [[(list(comp.token_ids),
                         [next(iter(lp.values())).logprob if lp else 0.0
                          for lp in (comp.logprobs or [])])
                        for comp in out.outputs] for out in outputs]
        rows, logps = zip(*rows_in_plan_order(specs, completions))
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
        if self.noise_on:
            counts = self.llm.collective_rpc("mmrlvr_noise_counts")[0]
            n_noisy = sum(spec.noise is not None for spec in specs)
            if counts["requests"] != n_noisy or counts["noised"] < counts["expected"]:
                raise RuntimeError(
                    f"latent-noise branching on vLLM: {n_noisy} noisy requests were sent but the "
                    f"hook displaced {counts['requests']} of them, {counts['noised']} of their "
                    f"{counts['expected']} prompt tokens (a prefix-cache hit or a forward the hook "
                    "missed); set rollout.backend: hf or rollout.branching.kind: none")
            stats["branch/noised_prompt_tokens"] = counts["noised"]
        return Rollouts(prompts=batch, group_size=n, completion_ids=ids, completion_mask=mask,
                        sample_logprobs=None if params.greedy else sample_logp, texts=texts,
                        branch=plan.tags() if plan else ["clean"] * len(texts), stats=stats)
