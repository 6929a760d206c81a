"""One-step-off rollouts (`train.async_rollouts: one_step_off`): the next step's completions are
generated while this step's update runs, from a snapshot of the weights before the update.

    step t:   take batch t (sampled by the weights before update t-1)  ─► score it
              snapshot the live weights (before update t) into the behaviour copy
              start generating batch t+1 from the copy, on a thread     ┐ at the same time
              update t on batch t                                     ◄─┘
    step t+1: wait for batch t+1 ...

A batch is then at most one update old. The update's importance ratio is taken against the
behaviour policy's logprobs (`Rollouts.behaviour_logprobs`: the engine's sample logprobs, or,
where the engine kept none, a forward of the behaviour copy before its next snapshot), so the
clip bounds what staleness may move; with a fresh batch it is 1, as in the synchronous step.

What stays as in the synchronous step: prompts are drawn in its order (the sampler's `next` for
step t+1 runs after step t's outcomes are observed); rewards, collectives and the sampler run on
the main thread; the rollout thread alone draws from torch's generator between step boundaries.
No batch is generated across a checkpoint, an eval or the last step: the step after one generates
its batch synchronously, from the current weights, in a run and in its resume alike, so a resume
keeps the schedule (which steps train on a batch generated ahead) and the prompts. Bit for bit it
is only with one intra-op thread (`train.threads: 1`): with more, the two threads' kernels split
their reductions differently from run to run (measured on this 2-core CPU: 1 of 5 repeats of one
3-step run differed at its generated-ahead step with 2 threads, 0 of 5 with 1). (A preemption
checkpoint at another step drops the batch in flight; that resume generates its next batch from
the current weights.)

The behaviour copy is a second model in the policy's dtype (its memory is the price); after the
first full copy only trainable weights are copied. Under FSDP2 the copy is whole, not sharded:
taken before the model is sharded (`load_policy`), held in the compute dtype, and refreshed by
all-gathering each trainable weight at the snapshot (verl's one-step-off keeps a separate
rollout model the same way), so a rank holds its shard plus one whole model in the compute
dtype, and generating ahead needs no collective on the rollout thread. Not with the vLLM backend
(its engine holds its own weights), rollout branching, or dynamic sampling: the config check
refuses those by name before anything loads (`mmrlvr.config.checks`).
"""
from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from mmrlvr.core.types import Rollouts


@dataclass
class _Flight:
    """The batch being generated for `step`, and what the thread left."""

    step: int
    indices: list[int]
    examples: list[Any]
    thread: threading.Thread
    box: dict = field(default_factory=dict)


class Prefetcher:
    """The behaviour copy, its engine, and at most one batch in flight."""

    def __init__(self, policy: Any, make_engine: Any, decode: str, temperature: float,
                 micro_batch: int):
        self.live = policy.model
        template = getattr(policy, "behaviour_template", None)   # FSDP2: taken before sharding
        self.copy = template if template is not None else copy.deepcopy(policy.model)
        policy.behaviour_template = None
        if policy.sharded:                          # generate as the sharded model does
            self.copy.to(policy.compute_dtype)
        for p in self.copy.parameters():
            p.requires_grad_(False)
        self.view = copy.copy(policy)               # the policy's tokenizer, adapter, ids...
        self.view.model = self.view.forward_model = self.copy   # ... on the behaviour copy
        self.view.sharded = False                   # a whole model: no collective in its forwards
        self.engine = make_engine("hf", self.view, None, decode=decode)
        self.trained = [n for n, p in self.live.named_parameters() if p.requires_grad]
        self.temperature, self.micro_batch = temperature, micro_batch
        self.flight: _Flight | None = None

    def snapshot(self) -> None:
        """The behaviour copy := the live weights (trainable ones: the rest never change). Under
        FSDP2 each is all-gathered (`full_tensor`): every rank calls this at the same step, on
        the main thread, in the same order."""
        live, behaviour = dict(self.live.named_parameters()), dict(self.copy.named_parameters())
        with torch.no_grad():
            for name in self.trained:
                weight = live[name]
                if isinstance(weight, DTensor):
                    weight = weight.full_tensor()
                behaviour[name].copy_(weight)

    def start(self, step: int, indices: list[int], examples: list[Any], prompts: Any,
              params: Any) -> None:
        """Generate `prompts` for `step` on a thread, from the live weights as they are now."""
        self.snapshot()
        box: dict = {}

        def work() -> None:
            try:
                box["rollouts"] = self.engine.generate(prompts, params)
            except BaseException as err:             # re-raised on the main thread, in take()
                box["error"] = err

        thread = threading.Thread(target=work, name=f"rollouts-step-{step}", daemon=True)
        self.flight = _Flight(step, indices, examples, thread, box)
        thread.start()

    def take(self, step: int) -> tuple[list[int], list[Any], Rollouts, float] | None:
        """The batch generated ahead for `step` (indices, examples, rollouts, seconds waited), or
        None when there is none (the first step, after a checkpoint or an eval)."""
        flight, self.flight = self.flight, None
        if flight is None or flight.step != step:
            self.drop(flight)
            return None
        t0 = time.perf_counter()
        flight.thread.join()
        if "error" in flight.box:
            raise flight.box["error"]
        rollouts = flight.box["rollouts"]
        rollouts.behaviour_logprobs = rollouts.sample_logprobs
        if rollouts.behaviour_logprobs is None:      # the engine kept no logits: score them here
            rollouts.behaviour_logprobs = self.logprobs(rollouts)
        return flight.indices, flight.examples, rollouts, time.perf_counter() - t0

    def logprobs(self, rollouts: Rollouts) -> torch.Tensor:
        """[N, C] logprobs of the sampled tokens under the behaviour copy (before it moves)."""
        ids, mask, G = rollouts.completion_ids, rollouts.completion_mask, rollouts.group_size
        out = torch.zeros(ids.shape, dtype=torch.float32)
        with torch.no_grad():
            for a in range(0, ids.shape[0], self.micro_batch):
                rows = list(range(a, min(a + self.micro_batch, ids.shape[0])))
                lp, _ = self.view.rollout_logprobs(rollouts.prompts, [r // G for r in rows],
                                                   ids[rows], mask[rows], self.temperature,
                                                   model=self.copy)
                out[rows] = lp.float().cpu()
        return out

    def drop(self, flight: _Flight | None = None) -> None:
        """Wait for a batch in flight and forget it (preemption, the end of a run)."""
        flight = flight or self.flight
        self.flight = None
        if flight is not None:
            flight.thread.join()


def plans_ahead(cfg: Any, step: int) -> bool:
    """Whether step `step` generates the next step's batch while it updates: not when a
    checkpoint, an eval or the end follows it (see the module docstring)."""
    tr = cfg.train
    if tr.async_rollouts != "one_step_off" or step >= tr.steps:
        return False
    saves = tr.save_every and step % tr.save_every == 0
    evals = tr.eval_every and step % tr.eval_every == 0
    return not (saves or evals)

