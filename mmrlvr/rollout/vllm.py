"""Rollouts with vLLM (GPU only; `pip install mmrlvr[vllm]`), colocated with training.

Written against vLLM's offline API (the source of vLLM 0.33.0, which pins transformers < 5.21
and torch 2.14.0, was read for this): `LLM(...)`, `SamplingParams(n=G, logprobs=0)`, prompts as
`{"prompt": chat_text, "multi_modal_data": {"image": [...]}}` so vLLM expands the media tokens
itself, once per prompt. The engine runs in the training process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set before vLLM is imported).

One engine per rank. Under a multi-process run (torch.distributed initialised, world size > 1,
torchrun's RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set) each rank builds
its own engine with `distributed_executor_backend="external_launcher"` and tensor parallel size 1
(TRL's colocate mode), samples its own prompts, and seeds its sampler with `train.seed + rank`.
Sample logprobs are vLLM's `processed_logprobs` (after temperature), the distribution the
trainer's recompute scores.

The trainer's side of it, in order, every step (under FSDP2 on every rank at the same point):

    engine.wake_up()               # weights back on the GPU, synced if they changed, KV cache back
    rollouts = engine.generate(batch, params)
    engine.sleep()                 # level 1: weights to CPU, KV cache freed, for the update
    ... backward, optimizer.step() ...
    engine.mark_weights_changed()  # the next wake_up (or generate) syncs

`generate` wakes and syncs by itself when needed, so a caller that never sleeps (`mmrlvr eval
--backend vllm`) just calls it. `without_branching()` is the same engine sampling every member
clean: eval's pass@k.

Weight sync (`mmrlvr.rollout.vllm_sync`): the policy's parameters are walked in a fixed order,
one decoder layer / block / module at a time; a sharded parameter is gathered with
`full_tensor()` (a collective), LoRA is merged in float32, the unit is cast to the engine's dtype,
renamed to checkpoint names and loaded with the vLLM model's own `load_weights` (reached with
`LLM.apply_model`), then the prefix and encoder caches are reset. The first sync sends every
weight; later ones only trainable weights and LoRA-merged bases (frozen weights never change).
Its time is `rollout/weight_sync_s` in the stats of the next `generate`.

Rollout branching (`rollout.branching`, the hook in `mmrlvr.rollout.base`; NC-GRPO's is
`mmrlvr.methods.ncgrpo`): the clean members of a group stay one request with n = G-k; every
displaced member is a request of its own (n = 1) carrying its plan payload in
`SamplingParams.extra_args` and a fresh `cache_salt`, so it neither reuses nor publishes a prompt
KV cache; completions are put back in the plan's row order. The branching adds what it needs to
the `LLM(...)` arguments and environment (NC-GRPO: a worker extension with its hooks, vLLM's V1
model runner, `enforce_eager=True`), runs its set-up once the LLM is built, and checks each
generate call after it.

What is tested, and where: on CPU without vLLM (tests/test_vllm_sync.py, tests/test_vllm_noise.py)
— the name mapping of every parameter of tiny Qwen2-VL, Qwen2.5-VL, Qwen2-Audio, Qwen3-VL (+MoE),
Qwen3.5, Gemma 3, InternVL, SmolVLM, LLaVA-OneVision, Mistral 3 and GLM-4.1V against the
checkpoints transformers writes (tests/test_vllm_names.py), the fused experts of Qwen3.5-MoE and
the Qwen3-Omni thinker cut one weight per expert as transformers saves them and Qwen3-VL-MoE's
sent transposed as its released checkpoints hold them, the Qwen2.5-Omni thinker as its full
checkpoint saves it and Llama with tied and untied embeddings as its save writes them
(tests/test_vllm_names_text_omni.py; all name for name and value for value), the
LoRA merge against peft's `merge_and_unload`, the unit-by-unit gathering (counted fake shards,
and real FSDP2 DTensors on 2 gloo processes), seeds, LLM arguments, request building, row order,
and this class end to end against a stand-in `LLM` (sync once per change, sleep/wake order,
greedy eval and clean pass@k through `evaluate`). Never run on a GPU with a real vLLM: engine
start-up under external_launcher, sleep mode, `apply_model` + `load_weights` with these names
and layouts, and the noise hooks were checked against vLLM's source only.

This module imports vllm only inside `build_llm` / `vllm_sampling_params`.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mmrlvr.rollout.base import (BranchPlan, SamplingParams, completion_mask, make_branching,
                                 scrub_placeholders)
from mmrlvr.rollout.vllm_sync import architecture, engine_seed, load_units, sync_units
from mmrlvr.core.types import PromptBatch, Rollouts

MAX_MEDIA_PER_PROMPT = 8
LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RequestSpec:
    """One vLLM request of a generate call."""

    prompt: int
    """Index of its prompt in the batch."""
    rows: tuple[int, ...]
    """The rollout rows (b·G + g) its n = len(rows) completions fill, in order."""
    payload: Any = None
    """A displaced member's plan payload (`BranchPlan.row`); None for clean requests."""
    cache_salt: str | None = None
    """A salt of its own for a displaced request, so its prompt KV cache is never shared."""


def request_specs(n_prompts: int, group_size: int, plan: BranchPlan | None,
                  salt: str) -> list[RequestSpec]:
    """The requests for B prompts × G members: clean rows of a prompt together, displaced ones
    (a payload in `plan`) alone.

    `salt` must be unique per generate call (a displaced request's cache_salt is `salt:row`), so
    a displaced prompt cache of an earlier call is never hit either.
    """
    specs = []
    for b in range(n_prompts):
        rows = range(b * group_size, (b + 1) * group_size)
        displaced = [r for r in rows if plan is not None and plan.row(r) is not None]
        clean = tuple(r for r in rows if r not in displaced)
        if clean:
            specs.append(RequestSpec(b, clean))
        specs += [RequestSpec(b, (r,), plan.row(r), f"{salt}:{r}") for r in displaced]
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


def build_requests(prompts: list[dict], specs: list[RequestSpec], params: SamplingParams,
                   eos_ids: list[int], placeholder_ids: list[int],
                   extra_args: Callable[[Any], dict] | None = None) -> tuple[list[dict], list[dict]]:
    """(vLLM prompt, SamplingParams keyword arguments) for each request spec, in order;
    `extra_args` turns a spec's payload into its `SamplingParams.extra_args`
    (`RolloutBranching.vllm_extra_args`)."""
    requests, samplings = [], []
    for spec in specs:
        if spec.payload is not None and extra_args is None:
            raise ValueError(f"the request of prompt {spec.prompt} (rows {spec.rows}) carries a "
                             "branching payload but no extra_args function was given for it")
        salt = {"cache_salt": spec.cache_salt} if spec.cache_salt else {}
        requests.append({**prompts[spec.prompt], **salt})
        samplings.append(dict(
            n=len(spec.rows), max_tokens=params.max_new_tokens, logprobs=0,
            stop_token_ids=list(eos_ids),
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p, top_k=params.top_k or -1,
            logit_bias={tid: -100.0 for tid in placeholder_ids} or None,
            extra_args=None if spec.payload is None else extra_args(spec.payload)))
    return requests, samplings


def llm_kwargs(path: str, *, dtype: torch.dtype, media: str | None,
               gpu_memory_utilization: float, max_model_len: int | None, seed: int, rank: int,
               world: int, extra: dict[str, Any] | None = None) -> dict:
    """The `vllm.LLM(...)` arguments of rank `rank`'s colocated engine, plus `extra` (what the
    rollout branching needs: `RolloutBranching.vllm_llm_kwargs`). `media` None (a text-only
    family): no `limit_mm_per_prompt`, which older vLLM releases refuse for a model without
    media."""
    kwargs = dict(model=path, dtype=str(dtype).removeprefix("torch."),
                  seed=engine_seed(seed, rank), gpu_memory_utilization=gpu_memory_utilization,
                  max_model_len=max_model_len, enable_prefix_caching=True, enable_sleep_mode=True,
                  logprobs_mode="processed_logprobs")
    if media is not None:
        kwargs["limit_mm_per_prompt"] = {media: MAX_MEDIA_PER_PROMPT,
                                         **({"video": 0} if media == "image" else {})}
    if world > 1:
        kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    kwargs.update(extra or {})
    return kwargs


def process_place() -> tuple[int, int]:
    """(rank, world size) of this process in torch.distributed, (0, 1) outside it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_llm(**kwargs):
    from vllm import LLM

    return LLM(**kwargs)


def vllm_sampling_params(**kwargs):
    from vllm import SamplingParams as VSamplingParams

    return VSamplingParams(**kwargs)


class VLLMRolloutEngine:
    def __init__(self, policy, branching: dict | None = None, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None, *, seed: int = 0):
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.backend 'vllm' needs a CUDA GPU; use 'hf' on CPU")
        self.policy = policy
        self.branching = make_branching(branching)
        config = policy.base_model().config
        self.model_type = config.model_type
        self.dtype = policy.compute_dtype
        rank, world = process_place()
        missing = [k for k in LAUNCH_ENV if k not in os.environ]
        if world > 1 and missing:
            raise RuntimeError(f"rollout.backend 'vllm' in a {world}-process run builds one engine "
                               f"per rank from torchrun's environment, which lacks {missing}; "
                               "launch with torchrun or accelerate launch")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        for key, value in (self.branching.vllm_env() if self.branching else {}).items():
            os.environ.setdefault(key, value)
        self.llm = build_llm(**llm_kwargs(
            config._name_or_path, dtype=self.dtype, media=architecture(self.model_type).media,
            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
            seed=seed, rank=rank, world=world,
            extra=self.branching.vllm_llm_kwargs() if self.branching else None))
        if self.branching is not None:
            self.branching.vllm_setup(self.llm)
        self._version = 0               # bumped by mark_weights_changed()
        self._synced_version = None     # what vLLM holds; None: its own load, not yet synced
        self._asleep = False
        self._sync_s = 0.0              # sync time not yet reported by generate

    # -- the trainer's calls ----------------------------------------------------------------
    def mark_weights_changed(self) -> None:
        """The policy's weights changed (an optimizer step): the next wake_up/generate syncs."""
        self._version += 1

    def sleep(self) -> None:
        """Free the GPU for the update: weights to CPU, KV cache dropped (vLLM sleep level 1)."""
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Weights back, synced if they changed, then the KV cache (so the sync has its room).

        A sync gathers sharded parameters: under FSDP2 every rank must call this together."""
        if not self._asleep:
            self.sync_weights()
            return
        torch.cuda.empty_cache()        # the update's cached blocks, before vLLM maps its own
        self.llm.wake_up(tags=["weights"])
        self._asleep = False
        try:
            self.sync_weights()
        finally:
            self.llm.wake_up(tags=["kv_cache"])

    def sync_weights(self, force: bool = False) -> float:
        """Load the policy's weights into vLLM if they changed since the last sync (or `force`).
        Returns the seconds it took (0.0 when nothing was sent)."""
        if self._asleep:
            raise RuntimeError("VLLMRolloutEngine.sync_weights: the engine is asleep; call "
                               "wake_up(), which syncs")
        if self._synced_version == self._version and not force:
            return 0.0
        t0 = time.perf_counter()
        units = sync_units(self.policy.model, self.model_type, self.dtype,
                           only_trainable=self._synced_version is not None and not force)
        with torch.no_grad():
            load_units(units, self._load)
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()   # media features of the old weights
        torch.cuda.synchronize()
        self._synced_version = self._version
        seconds = time.perf_counter() - t0
        self._sync_s += seconds
        return seconds

    def _load(self, unit: list[tuple[str, torch.Tensor]]) -> None:
        self.llm.apply_model(lambda model: model.load_weights(unit))

    def without_branching(self) -> "CleanVLLMEngine":
        """This engine (same weights, same GPU memory) with every member sampled clean."""
        return CleanVLLMEngine(self)

    def generate(self, batch: PromptBatch, params: SamplingParams) -> Rollouts:
        return self._generate(batch, params, branching=True)

    # -- one generate call ------------------------------------------------------------------
    def _generate(self, batch: PromptBatch, params: SamplingParams, branching: bool) -> Rollouts:
        policy = self.policy
        t0 = time.perf_counter()
        self.wake_up()
        sync_s, self._sync_s = self._sync_s, 0.0
        n = 1 if params.greedy else params.n
        plan = None if params.greedy or not branching or self.branching is None \
            else self.branching.plan(len(batch), n)
        active = plan is not None and plan.active
        specs = request_specs(len(batch), n, plan if active else None, salt=uuid.uuid4().hex)
        prompts = []
        for ex, text in zip(batch.examples, batch.prompt_texts):
            media = policy.adapter.vllm_media(ex, policy.processor)
            prompts.append({"prompt": text, **({"multi_modal_data": media} if media else {})})
        requests, samplings = build_requests(
            prompts, specs, params, policy.eos_ids, policy.placeholder_ids,
            self.branching.vllm_extra_args if self.branching else None)
        outputs = self.llm.generate(requests, [vllm_sampling_params(**s) for s in samplings],
                                    use_tqdm=False)
        completions = [[(list(comp.token_ids),
                         [next(iter(lp.values())).logprob if lp else 0.0
                          for lp in (comp.logprobs or [])])
                        for comp in out.outputs] for out in outputs]
        rows, logps = zip(*rows_in_plan_order(specs, completions))
        width = max(1, max(len(r) for r in rows))
        ids = torch.full((len(rows), width), policy.pad_id, dtype=torch.long)
        sample_logp = torch.zeros((len(rows), width))
        real = torch.zeros_like(ids)
        for i, (r, lp) in enumerate(zip(rows, logps)):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            sample_logp[i, :len(lp)] = torch.tensor(lp)
            real[i, :len(r)] = 1
        mask = completion_mask(ids, policy.eos_ids) * real
        ids, mask, scrubbed = scrub_placeholders(ids, mask, policy.placeholder_ids, policy.pad_id)
        texts = policy.tokenizer.batch_decode(
            [row[:int(m.sum())] for row, m in zip(ids, mask)], skip_special_tokens=True)
        ended = torch.isin(ids, torch.tensor(policy.eos_ids)).any(dim=1)
        stats = {"rollout/time_s": time.perf_counter() - t0, "rollout/tokens": int(mask.sum()),
                 "rollout/truncated_frac": float((~ended).float().mean()),
                 "rollout/placeholder_scrubbed": scrubbed, "rollout/weight_sync_s": sync_s}
        if self.branching is not None:
            stats.update(self.branching.vllm_check(
                self.llm, sum(spec.payload is not None for spec in specs)))
        return Rollouts(prompts=batch, group_size=n, completion_ids=ids, completion_mask=mask,
                        sample_logprobs=None if params.greedy else sample_logp, texts=texts,
                        branch=plan.tags() if plan else ["clean"] * len(texts), stats=stats)


class CleanVLLMEngine:
    """A VLLMRolloutEngine's clean view: its engine and weights, never a noisy member (eval)."""

    branching = None

    def __init__(self, engine: VLLMRolloutEngine):
        self.engine = engine

    def generate(self, batch: PromptBatch, params: SamplingParams) -> Rollouts:
        return self.engine._generate(batch, params, branching=False)
