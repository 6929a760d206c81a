"""NC-GRPO latent noise inside vLLM's model runner (the `vllm` rollout backend).

The contract is `mmrlvr.methods.ncgrpo.branching`'s: for a flagged request, every forward pass that
processes its prompt tokens adds s·α·‖h_t‖/√d·ε_t at those tokens, ε = `RowNoise.epsilon(L, d)`
with L the request's prompt token count, each chunk of a chunked prefill taking its own rows
ε[c : c+n]; decode tokens and clean requests are untouched.

How a request carries its noise: `SamplingParams(extra_args={"mmrlvr_noise": {...}})` (vLLM's
documented pass-through for custom per-request arguments); the runner keeps each request's
SamplingParams in `runner.requests[req_id].sampling_params`.

How the hook finds the batch layout. vLLM V1 flattens the scheduled tokens of all running
requests into one [T, d] batch, request by request in `runner.input_batch.req_ids` order,
`num_scheduled_tokens[req_id]` tokens each, starting at position
`input_batch.num_computed_tokens_cpu[i]` (GPUModelRunner.execute_model/_prepare_inputs). The
per-step `num_scheduled_tokens` dict lives only on the SchedulerOutput, so `RunnerNoise` wraps
the runner's `execute_model` to hold it for the duration of the step; a forward outside
`execute_model` (vLLM's warm-up and dummy runs) is left alone. T may exceed the scheduled total
(padding rows), which are never displaced.

Sites. `last_layer_input`: a forward pre-hook on the last decoder layer. vLLM's Qwen2 layers
take (positions, hidden_states, residual) with the residual stream split in two, so the layer's
true input is hidden_states + residual (residual is None only for a first layer): σ uses the norm
of that sum, and the displacement is added to `hidden_states`, which moves the sum by exactly
σ·ε (up to the bf16 rounding of one add). `final_hidden`: a forward hook on the final norm,
whose output is a tensor or, with a residual argument, an (output, residual) tuple.

The hooks are installed through a worker extension (`NoiseWorkerExtension`, vLLM's documented
`worker_extension_cls` + `LLM.collective_rpc`), which works in-process and across processes.
Python hooks need an eager model: CUDA-graph replay and vLLM's torch.compile graph skip them,
so the engine is built with `enforce_eager=True` whenever noise is on (the plug-in's
`vllm_llm_kwargs`, `mmrlvr.methods.ncgrpo.plugin`).

Nothing here imports vllm: the runner is reached through attributes only, so everything but the
hook's installation is exercised by the CPU tests. Not yet run on a GPU.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from mmrlvr.methods.ncgrpo.branching import SITES, BranchSiteError, RowNoise, find_decoder

EXTRA_ARGS_KEY = "mmrlvr_noise"


def noise_extra_args(noise: RowNoise) -> dict[str, Any]:
    """The `SamplingParams.extra_args` that flag one request as noisy."""
    return {EXTRA_ARGS_KEY: asdict(noise)}


def noise_from_extra_args(extra_args: dict[str, Any] | None) -> RowNoise | None:
    """A request's RowNoise, or None for a clean request."""
    raw = (extra_args or {}).get(EXTRA_ARGS_KEY)
    return None if raw is None else RowNoise(**raw)


@dataclass(frozen=True)
class Segment:
    """One request's rows in a flattened vLLM batch (rows follow each other in batch order)."""

    query_len: int
    """Tokens this forward pass processes for the request (its scheduled tokens)."""
    computed: int
    """Tokens of the request already in the KV cache: the position of its first row here."""
    prompt_len: int
    """L: the request's prompt tokens (media placeholders included)."""
    noise: RowNoise | None
    """The request's noise, None when clean."""

    @property
    def prompt_rows(self) -> int:
        """How many of this pass's rows are prompt tokens (0 while decoding)."""
        return max(0, min(self.query_len, self.prompt_len - self.computed))


def prefill_displacement(base: torch.Tensor, segments: Sequence[Segment]) -> torch.Tensor | None:
    """σ_t·ε_t for a flattened batch: [T, d] float32, zero off noisy prompt rows; None if none.

    `base` [T, d] is the hidden state at the injection site (σ_t = α·‖base_t‖/√d in float32);
    the segments tile its first Σ query_len rows in order, the rest is padding. The rows of a
    request at positions c … c+n-1 (n = `prompt_rows`) take ε[c : c+n] of
    `RowNoise.epsilon(L, d)`, so a prefill split into chunks adds exactly what one pass would.
    """
    T, d = base.shape
    scheduled = sum(s.query_len for s in segments)
    if scheduled > T:
        raise RuntimeError(f"latent-noise branching: the batch layout schedules {scheduled} tokens "
                           f"but the hidden states hold {T} rows; vLLM's runner state does not "
                           "match this forward pass (speculative decoding, sequence parallelism "
                           "and micro-batching are not supported with rollout.branching)")
    disp = None
    draws: dict[tuple[int, int], torch.Tensor] = {}   # shared / antithetic requests reuse one draw
    start = 0
    for seg in segments:
        n = seg.prompt_rows
        if seg.noise is not None and seg.noise.alpha > 0 and n > 0:
            key = (seg.noise.seed, seg.prompt_len)
            if key not in draws:
                unsigned = replace(seg.noise, sign=1.0)
                draws[key] = unsigned.epsilon(seg.prompt_len, d, base.device)      # [L, d]
            eps = seg.noise.sign * draws[key][seg.computed:seg.computed + n]      # [n, d]
            h = base[start:start + n].float()                                     # [n, d]
            sigma = seg.noise.alpha * h.norm(dim=-1, keepdim=True) / math.sqrt(d)  # [n, 1]
            if disp is None:
                disp = torch.zeros(T, d, dtype=torch.float32, device=base.device)
            disp[start:start + n] = sigma * eps
        start += seg.query_len
    return disp


def batch_segments(runner, num_scheduled: dict[str, int]) -> list[Segment]:
    """The flattened batch of the step in progress, read from a vLLM V1 GPUModelRunner."""
    batch = runner.input_batch
    segments = []
    for i, req_id in enumerate(batch.req_ids[:batch.num_reqs]):
        params = getattr(runner.requests[req_id], "sampling_params", None)
        segments.append(Segment(
            query_len=int(num_scheduled[req_id]),
            computed=int(batch.num_computed_tokens_cpu[i]),
            prompt_len=int(batch.num_prompt_tokens[i]),
            noise=noise_from_extra_args(getattr(params, "extra_args", None))))
    return segments


class RunnerNoise:
    """The hooks on one vLLM GPUModelRunner, plus counters the engine checks after each call."""

    def __init__(self, runner, site: str):
        if site not in SITES:
            raise ValueError(f"latent-noise branching: unknown site {site!r}; use one of {SITES}")
        needed = ("input_batch", "requests", "execute_model")
        missing = [a for a in needed if not hasattr(runner, a)]
        if missing:
            raise RuntimeError(
                f"latent-noise branching: vLLM's model runner {type(runner).__name__} lacks "
                f"{missing}; the vllm backend needs vLLM V1's GPUModelRunner "
                "(set VLLM_USE_V2_MODEL_RUNNER=0, which the engine does by default)")
        self.runner, self.site = runner, site
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        self.decoder = find_decoder(model)
        self.num_scheduled: dict[str, int] | None = None
        self.noised = 0          # prompt rows displaced since the last take_counts()
        self.expected = 0        # Σ L over the noisy requests seen since then
        self.seen: set[str] = set()

        forward = runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            self.num_scheduled = scheduler_output.num_scheduled_tokens
            try:
                return forward(scheduler_output, *args, **kwargs)
            finally:
                self.num_scheduled = None

        runner.execute_model = execute_model
        if site == "last_layer_input":
            layer = self.decoder.layers[-1]
            sig = inspect.signature(type(layer).forward)
            self.signature = sig.replace(parameters=list(sig.parameters.values())[1:])  # no self
            if "hidden_states" not in self.signature.parameters:
                raise BranchSiteError(
                    f"latent-noise branching: {type(layer).__name__}.forward has no "
                    f"`hidden_states` argument ({self.signature}); use site final_hidden")
            self.handle = layer.register_forward_pre_hook(self.pre_hook, with_kwargs=True)
        else:
            self.handle = self.decoder.norm.register_forward_hook(self.post_hook)

    def displacement(self, base: torch.Tensor) -> torch.Tensor | None:
        if self.num_scheduled is None:
            return None                                  # warm-up / dummy run
        segments = batch_segments(self.runner, self.num_scheduled)
        for seg, req_id in zip(segments, self.runner.input_batch.req_ids):
            if seg.noise is None or seg.noise.alpha <= 0 or not seg.prompt_rows:
                continue
            if seg.noise.site != self.site:
                raise RuntimeError(f"latent-noise branching: request {req_id} asks for site "
                                   f"{seg.noise.site!r} but the hook sits at {self.site!r}")
            if req_id not in self.seen:
                self.seen.add(req_id)
                self.expected += seg.prompt_len
            self.noised += seg.prompt_rows
        return prefill_displacement(base, segments)

    def pre_hook(self, module, args, kwargs):
        bound = self.signature.bind(*args, **kwargs)
        hidden = bound.arguments["hidden_states"]                                 # [T, d]
        residual = bound.arguments.get("residual")
        base = hidden.float() if residual is None else hidden.float() + residual.float()
        disp = self.displacement(base)
        if disp is None:
            return None
        bound.arguments["hidden_states"] = (hidden.float() + disp).to(hidden.dtype)
        return bound.args, bound.kwargs

    def post_hook(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output               # [T, d]
        disp = self.displacement(hidden.float())
        if disp is None:
            return None
        new = (hidden.float() + disp).to(hidden.dtype)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    def take_counts(self) -> dict[str, int]:
        """Counters since the last call: noisy requests seen, prompt rows displaced, Σ L."""
        out = {"requests": len(self.seen), "noised": self.noised, "expected": self.expected}
        self.noised, self.expected, self.seen = 0, 0, set()
        return out


class NoiseWorkerExtension:
    """Mixed into vLLM's GPU Worker (`LLM(worker_extension_cls=WORKER_EXTENSION)`), so that
    `LLM.collective_rpc("mmrlvr_install_noise", args=(site,))` reaches its model runner."""

    def mmrlvr_install_noise(self, site: str) -> dict[str, str]:
        """Hook this worker's model runner; returns what was hooked."""
        runner = self.model_runner
        if getattr(runner, "_mmrlvr_noise", None) is not None:
            raise RuntimeError("latent-noise branching: the hooks are already on this runner")
        hooks = RunnerNoise(runner, site)
        runner._mmrlvr_noise = hooks
        return {"decoder": type(hooks.decoder).__name__, "site": site}

    def mmrlvr_noise_counts(self) -> dict[str, int]:
        """The runner's noise counters since the last call."""
        return self.model_runner._mmrlvr_noise.take_counts()


WORKER_EXTENSION = f"{__name__}.{NoiseWorkerExtension.__name__}"
