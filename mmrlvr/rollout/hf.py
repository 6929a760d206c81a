"""Rollouts with transformers `generate` (CPU and GPU).

Prompts arrive processed once, and each prompt is prefilled once: its tokens and media run
through the model a single time (all but the last token), the key/value cache is repeated for
the G members (rows b*G+g), and `generate` samples from there — the tokens and logprobs of G full
prefills, for 1/G of their prefill compute (`rollout/prefill_tokens` counts what ran). Media
placeholder tokens are suppressed at sampling and any that slip through are scrubbed before
training. `generate` gets each prompt's position ids as the training forward computes them
(`prompt_positions`), so text-only prompts and left-padded rows decode where training scores them.
`rollout.branching` (the rollout-branching hook, `mmrlvr.rollout.base`) may make some members
sample differently during sampled (never greedy) generation: its plan's hooks are entered around
`generate`. While a plan is active its members must not share a prompt cache, so then (and for
adapters that hand `generate` embeddings) every member is prefilled whole, as
`num_return_sequences` does.

`rollout.decode` picks how the decode steps run:
  * `eager` (default; the CPU path): a dynamic KV cache that grows by one position a step.
  * `static`: a preallocated `StaticCache` of fixed shape (batch × a length bucket), no compile.
  * `compiled`: the static cache plus `torch.compile` of the one-token decode step (on CUDA mode
    `reduce-overhead`, i.e. CUDA graphs: one kernel-launch replay per token instead of a Python
    walk over every layer). The cache length is rounded up to a multiple of `CACHE_BUCKET`, so
    the compiled graph sees one shape per (rows, bucket) pair and recompiles are rare (training
    keeps rows = prompts × G fixed; eval adds one graph for its greedy batch).
The prefill (ours, or generate's own) always runs eagerly; only decoding is compiled. Compiled
graphs skip Python forward hooks, so `compiled` refuses a branching that does not support it
(`RolloutBranching.supports_compiled`).
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from mmrlvr.config.schema import DECODES
from mmrlvr.rollout.base import SamplingParams, completion_mask, make_branching, scrub_placeholders
from mmrlvr.core.types import PromptBatch, Rollouts
from mmrlvr.core.types import TOKEN_KEYS, to_device


CACHE_BUCKET = 128
"""Static KV caches are allocated to a multiple of this many positions (one graph per bucket)."""


class HFRolloutEngine:
    def __init__(self, policy, branching: dict | None = None, decode: str = "eager"):
        self.policy = policy
        self.branching = make_branching(branching)
        if decode not in DECODES:
            raise ValueError(f"rollout.decode: {decode!r} is not one of {list(DECODES)}")
        if decode == "compiled" and self.branching is not None \
                and not self.branching.supports_compiled:
            raise ValueError(f"rollout.decode: compiled skips the forward hooks rollout.branching "
                             f"{self.branching.kind!r} uses; use decode: eager or static with "
                             "branching")
        self.decode = decode

    # generate() runs on the policy's own weights: nothing to wake, free or sync
    def wake_up(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def mark_weights_changed(self) -> None:
        pass

    def without_branching(self) -> "HFRolloutEngine":
        return HFRolloutEngine(self.policy, decode=self.decode)

    @torch.no_grad()  # not inference_mode: these tensors feed a training forward later
    def generate(self, batch: PromptBatch, params: SamplingParams) -> Rollouts:
        policy = self.policy
        t0 = time.perf_counter()
        n = 1 if params.greedy else params.n
        inputs = to_device(batch.inputs, policy.device, policy.dtype)
        prompt_len = inputs["input_ids"].shape[1]
        row_mask = inputs["attention_mask"].repeat_interleave(n, dim=0)             # [B*G, P]
        plan = None if params.greedy or self.branching is None \
            else self.branching.plan(len(batch), n)
        # the sampled tokens' logprobs and entropies come from the step logits, which generate
        # keeps for every position: only where they fit (a real vocabulary x long rollouts do not)
        keep_logits = not params.greedy and logits_bytes(
            len(batch) * n, params.max_new_tokens, policy.model) <= LOGITS_BUDGET
        kwargs = dict(max_new_tokens=params.max_new_tokens, eos_token_id=policy.eos_ids,
                      pad_token_id=policy.pad_id, return_dict_in_generate=True,
                      output_logits=keep_logits, suppress_tokens=policy.placeholder_ids,
                      num_return_sequences=n)
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k or None)
        hooks = nullcontext() if plan is None else plan.hooks(policy.model, row_mask)
        with policy.generation(), hooks:
            inputs = policy.adapter.generation_inputs(policy.base_model(), batch, inputs)
            inputs["position_ids"] = prompt_positions(policy, inputs)
            branched = plan is not None and plan.active
            if n > 1 and not branched and "inputs_embeds" not in inputs and prompt_len > 1 \
                    and policy.family.repeatable_cache:
                inputs, kwargs = prefill_once(policy.base_model(), inputs, kwargs, n)
                prefill_tokens = int(batch.inputs["attention_mask"].sum())
            else:
                prefill_tokens = n * int(batch.inputs["attention_mask"].sum())
            if self.decode != "eager":
                kwargs = static_decoding(policy.base_model(), kwargs, len(batch) * n,
                                         prompt_len + params.max_new_tokens,
                                         compile=self.decode == "compiled")
            out = policy.model.generate(**inputs, **kwargs)
        ids = out.sequences[:, prompt_len:].cpu()                                  # [N, C]
        mask = completion_mask(ids, policy.eos_ids)                                # [N, C]
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, policy.pad_id))
        ids, mask, scrubbed = scrub_placeholders(ids, mask, policy.placeholder_ids, policy.pad_id)
        sample_logp, first_entropy, token_entropy = None, None, None
        if keep_logits:
            logits = torch.stack(out.logits, dim=1).float().cpu()                  # [N, C, V]
            logp_all = F.log_softmax(logits / params.temperature, dim=-1)
            sample_logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)        # [N, C]
            token_entropy = -(logp_all.exp() * logp_all).sum(-1)                   # [N, C]
            first_entropy = token_entropy[:, 0]                                    # [N]
        texts = policy.tokenizer.batch_decode(
            [row[:int(m.sum())] for row, m in zip(ids, mask)], skip_special_tokens=True)
        lengths = mask.sum(dim=1)
        ended = torch.isin(ids, torch.tensor(policy.eos_ids)).any(dim=1)
        stats = {"rollout/time_s": time.perf_counter() - t0,
                 "rollout/prefill_tokens": prefill_tokens,
                 "rollout/tokens": int(lengths.sum()),
                 "rollout/truncated_frac": float((~ended).float().mean()),
                 "rollout/placeholder_scrubbed": scrubbed}
        if self.decode != "eager":
            stats["rollout/cache_len"] = kwargs["cache"].layers[0].max_cache_len
        if first_entropy is not None:
            stats["first_token_entropy"] = first_entropy                           # [N] per row
            stats["token_entropy"] = token_entropy                                # [N, C]
        if plan is not None:
            stats.update(plan.stats(params.temperature))
        return Rollouts(prompts=batch, group_size=n, completion_ids=ids, completion_mask=mask,
                        sample_logprobs=sample_logp, texts=texts,
                        branch=plan.tags() if plan else ["clean"] * len(texts),
                        stats=stats)


LOGITS_BUDGET = 1 << 30
"""Bytes of fp32 step logits (rows × new tokens × vocabulary) a rollout may keep."""


def logits_bytes(rows: int, new_tokens: int, model: torch.nn.Module) -> int:
    vocab = model.get_output_embeddings().weight.shape[0]
    return rows * new_tokens * vocab * 4


def prompt_positions(policy, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The prompts' position ids ([3, B, P] M-RoPE or [B, P]), as the training forward gives
    them (`adapter.position_ids`, the family's).

    `generate` gets them explicitly and extends them by one a step, so no model derives them
    from state it keeps between calls: Qwen2/2.5-VL (and the Omni thinker) cache M-RoPE offsets
    (`rope_deltas`) on the module, which a batch without images reused from the batch before
    (wrong positions, or a shape error once the batch size differs), and a prefill without
    positions counted a text-only row's left padding. Any offsets kept are cleared here too.
    """
    positions = policy.adapter.position_ids(policy.base_model(), inputs)
    if positions is None:                  # an adapter that leaves them to the model
        positions = policy.family.position_ids(policy.base_model(), inputs)
    for module in policy.base_model().modules():          # nothing stale for anyone to read
        if getattr(module, "rope_deltas", None) is not None:
            module.rope_deltas = None
    return positions


def prefill_once(model: torch.nn.Module, inputs: dict[str, torch.Tensor], kwargs: dict,
                 n: int) -> tuple[dict[str, torch.Tensor], dict]:
    """`generate` arguments that sample `n` completions per prompt from one prefill of it.

    The prompts (media included) run once without their last token; the cache is repeated for
    the `n` members of each prompt, and `generate` gets the token rows and their position ids
    (`prompt_positions`) repeated the same way with that cache, so it runs only the last prompt
    token per member before sampling.
    """
    positions = inputs["position_ids"]                     # [3, B, P] (M-RoPE) or [B, P]
    prefix = {k: v[:, :-1] if k in TOKEN_KEYS else v for k, v in inputs.items()}
    prefix["position_ids"] = positions[..., :-1]
    out = model(**prefix, use_cache=True, logits_to_keep=1)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    cache.batch_repeat_interleave(n)                                   # [B, ...] -> [B*n, ...]
    rows = {k: v.repeat_interleave(n, dim=0) for k, v in inputs.items() if k in TOKEN_KEYS}
    rows["position_ids"] = positions.repeat_interleave(n, dim=-2)
    return rows, {**kwargs, "num_return_sequences": 1, "cache": cache}


def static_decoding(model: torch.nn.Module, kwargs: dict, rows: int, length: int,
                    compile: bool) -> dict:
    """`generate` arguments that decode into a preallocated `StaticCache` (and compile the step).

    The cache holds `length` rounded up to `CACHE_BUCKET` positions for `rows` sequences. A
    dynamic cache already filled by `prefill_once` is copied into it layer by layer (the shared
    prompt's keys and values, repeated per member), so one prefill per prompt still holds.
    `compile` lets generate compile its decode step on any device (CUDA graphs on CUDA); without
    it the static cache runs eagerly.
    """
    from transformers import StaticCache
    from transformers.generation.configuration_utils import CompileConfig

    bucket = -(-length // CACHE_BUCKET) * CACHE_BUCKET
    static = StaticCache(config=model.config, max_cache_len=bucket)
    filled = kwargs.get("cache")
    if filled is not None:
        for i, layer in enumerate(filled.layers):
            if layer.keys is None or layer.keys.shape[0] != rows:
                raise ValueError(f"prefilled cache layer {i} holds {getattr(layer.keys, 'shape', None)} "
                                 f"keys, not {rows} rows")
            static.update(layer.keys, layer.values, i)
    out = {**kwargs, "cache": static}
    if compile:
        config = CompileConfig(mode="reduce-overhead" if model.device.type == "cuda" else "default")
        config._compile_all_devices = True
        out.update(compile_config=config, disable_compile=False)
    else:
        out["disable_compile"] = True
    return out
