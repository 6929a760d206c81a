"""The rollout interface: un-expanded prompts in, G completions per prompt out; and the
rollout-branching hook, through which a method makes some members of a group sample differently.

Rollout branching (`rollout.branching`, the `BRANCHINGS` registry). The core knows no branching
method: `make_branching(cfg.rollout.branching)` is None for `kind: none` (plain GRPO) and
otherwise the plug-in registered under `kind` (NC-GRPO's `latent_noise`: `mmrlvr.methods.ncgrpo`),
built from the whole mapping. Per generate call the engine asks it for a `BranchPlan`; the HF
engine enters the plan's hooks around `generate`, the vLLM engine sends each displaced row as a
request of its own carrying the plan's payload. With no plug-in nothing of this runs: no plan, no
hooks, every member tagged "clean".
"""
from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mmrlvr.config import ConfigError
from mmrlvr.core.registry import Registry
from mmrlvr.core.types import PromptBatch, Rollouts


@dataclass
class SamplingParams:
    n: int = 8
    """Completions per prompt."""
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


class RolloutEngine(Protocol):
    def generate(self, batch: PromptBatch, params: SamplingParams) -> Rollouts:
        """Sample `params.n` completions for every prompt of `batch` (expanded here, once)."""

    def wake_up(self) -> None:
        """Before rollouts: take back the engine's memory and pull changed weights (every rank)."""

    def sleep(self) -> None:
        """After rollouts: free the engine's memory for the update."""

    def mark_weights_changed(self) -> None:
        """After each optimiser step: the next rollout must see the new weights."""

    def without_branching(self) -> "RolloutEngine":
        """The same engine sampling from the clean model only (eval, pass@k)."""

    branching: "RolloutBranching | None"
    """The engine's rollout branching (None: plain GRPO); the trainer asks it for its metrics."""


class BranchPlan(Protocol):
    """One generate call's branching: which of its rows (B prompts × G members, row b·G+g)
    sample differently, and how."""

    @property
    def active(self) -> bool:
        """Some row samples differently, so rows must not share a prompt cache."""

    def tags(self) -> list[str]:
        """Each row's tag for `Rollouts.branch` ("clean" on the ordinary rows). [N]"""

    def row(self, r: int) -> Any | None:
        """Row `r`'s payload (what its vLLM request carries), None for a clean row."""

    def hooks(self, model: torch.nn.Module, row_mask: torch.Tensor) -> AbstractContextManager:
        """The HF engine enters this around `model.generate`; `row_mask` [N, P] is the expanded
        prompts' attention mask. It must leave the model as it found it, also on errors."""

    def stats(self, temperature: float) -> dict[str, float]:
        """After the HF engine's `generate` (sampled at `temperature`): the plan's own figures of
        the call (e.g. what its hooks measured), added to `Rollouts.stats`."""


class RolloutBranching(Protocol):
    """A rollout-branching plug-in: built once per engine from the `rollout.branching` mapping
    (its `kind` included; it validates its own keys), asked for a plan per generate call."""

    kind: str
    """The name it is registered under."""
    supports_compiled: bool
    """Whether it works under the HF engine's `rollout.decode: compiled` (compiled graphs skip
    Python forward hooks)."""

    def plan(self, n_prompts: int, group_size: int) -> BranchPlan | None:
        """The plan of one sampled generate call (never asked for greedy ones); None: all clean."""

    def metrics(self, rollouts: Rollouts, scores: list[list[dict[str, float]]]) -> dict[str, float]:
        """Per-step figures of its own (the trainer logs them beside `rollout_metrics`'s)."""

    def state_dict(self) -> dict[str, Any]:
        """Plain data the plug-in keeps between calls (saved in each checkpoint, per rank)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` gave (on `--resume`)."""

    def vllm_llm_kwargs(self) -> dict[str, Any]:
        """Extra `vllm.LLM(...)` arguments (e.g. `worker_extension_cls`, `enforce_eager`)."""

    def vllm_env(self) -> dict[str, str]:
        """Environment variables the vLLM engine sets (unless set) before building the LLM."""

    def vllm_setup(self, llm: Any) -> None:
        """Called once the LLM is built (e.g. a `collective_rpc` installing hooks)."""

    def vllm_extra_args(self, payload: Any) -> dict[str, Any]:
        """The `SamplingParams.extra_args` of a request carrying `payload` (`BranchPlan.row`)."""

    def vllm_check(self, llm: Any, displaced: int) -> dict[str, float]:
        """Called after every vLLM generate call that sent `displaced` payload-carrying requests:
        raises if they were not sampled as planned; returns stats for `Rollouts.stats`."""


BRANCHINGS = Registry("rollout branching")
"""`rollout.branching.kind` -> a factory `(mapping) -> RolloutBranching`; methods register here."""


def make_branching(raw: Mapping[str, Any] | None) -> RolloutBranching | None:
    """The rollout branching `rollout.branching` names: None for `kind: none` or no mapping
    (plain GRPO; the other keys are then not read), else the registered plug-in built from the
    whole mapping."""
    if not raw:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"rollout.branching must be a mapping with a `kind`, got {raw!r}")
    kind = raw.get("kind", "none")
    if kind == "none":
        return None
    if not isinstance(kind, str) or kind not in BRANCHINGS:
        raise ConfigError(f"rollout.branching.kind is {kind!r}; choose one of "
                          f"{['none', *BRANCHINGS.names()]}")
    return BRANCHINGS.get(kind)(dict(raw))


def truncated_rows(ids: torch.Tensor, mask: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """[N] True for the completions without an EOS among their tokens: cut by the token budget
    (or at a scrubbed media placeholder). [N, C], [N, C] -> [N] bool."""
    ended = torch.isin(ids, torch.tensor(eos_ids, device=ids.device)) & mask.bool()
    return ~ended.any(dim=1)


def completion_mask(ids: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 on every token up to and including the first EOS of each row. [N, C] -> [N, C]."""
    is_eos = torch.isin(ids, torch.tensor(eos_ids, device=ids.device))      # [N, C]
    before = (is_eos.cumsum(dim=1) - is_eos.long()) == 0                    # no EOS strictly before
    return before.long()


def scrub_placeholders(ids: torch.Tensor, mask: torch.Tensor, placeholder_ids: list[int],
                       pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Cut each completion at its first media placeholder token (never trained on).

    Returns (ids, mask, rows scrubbed). The placeholder and everything after it become padding.
    """
    if not placeholder_ids:
        return ids, mask, 0
    bad = torch.isin(ids, torch.tensor(placeholder_ids, device=ids.device)) & mask.bool()  # [N, C]
    rows = int(bad.any(dim=1).sum())
    if rows:
        keep = (bad.long().cumsum(dim=1) == 0).long()                       # [N, C]
        mask = mask * keep
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
    return ids, mask, rows
