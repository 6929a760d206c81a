"""NC-GRPO: latent-noise rollout branching (docs/methods.md, "NC-GRPO"; docs/ncgrpo.md).

Part of every group is sampled from a displaced start: during the prefill pass only, Gaussian
noise is added to the language model's hidden states at the prompt positions of the flagged
rows,

    h_t <- h_t + s · α · ‖h_t‖/√d · ε_t,    ε_t ~ N(0, I_d),  s = ±1,

at one site: the input of the last decoder layer (`last_layer_input`, default: the displaced
prompt keys/values of that layer stay in the KV cache, so the displacement persists through
decoding) or the final norm's output (`final_hidden`: only the first sampled position's logits
move). Decoding steps are untouched; the weights are untouched, so training logprobs come from
the clean model and advantages are computed over the whole group as in plain GRPO. Noise is
modality-agnostic: it acts on the text decoder, whatever encoder fed it.

Which members are noisy: in each group of G, the LAST k = ⌊fraction·G + ½⌋ members
(rows b·G + G-k … b·G + G-1); the first G-k are clean. Every rollout carries its tag
("clean"/"noisy") in `Rollouts.branch`. With `alpha: 0` the rows are still tagged but nothing
is displaced and no random number is drawn (a placebo control); `kind: none` is plain GRPO (the
core's: no plug-in at all).

Backend interface. The core's rollout-branching hook (`mmrlvr.rollout.base.BRANCHINGS`,
`mmrlvr.methods.ncgrpo.plugin.LatentNoise`) hands a rollout backend a `NoisePlan` per generate
call: per row a flag, a noise seed and a sign. `NoisePlan.row(n)` gives the per-request view
(`RowNoise`) a vLLM model runner consumes (`mmrlvr.methods.ncgrpo.vllm_noise`);
`NoisePlan.hooks` the HF engine's prefill hook (`latent_noise`). The contract any backend
implements:

  * only in the forward pass that processes the prompt (prefill; with chunked prefill, every
    chunk of it, each chunk taking its own slice of ε), never while decoding;
  * ε for a request is `RowNoise.epsilon(L, d)`: `torch.randn(L, d)` from a generator seeded with
    `seed` on the hidden states' device, times `sign`, where L counts the request's real prompt
    tokens (media placeholders included, padding excluded), so the noise does not depend on how
    the batch was padded; σ_t uses ‖h_t‖ in float32 at the injection site;
  * a noisy request never reuses or publishes a prompt KV cache (vLLM: disable prefix caching
    for it, e.g. give it its own `cache_salt`); the HF engine's `generate` expands every prompt
    to its G rows before the prefill, so each row computes and keeps its own prompt cache.
Noise modes: `independent` gives every noisy row its own seed; `shared` one seed per group;
`antithetic` pairs consecutive noisy members on one seed with signs +1/-1 (an odd last member
gets a fresh seed). Seeds come from a generator seeded once per generate call from torch's
global RNG, so a run is reproducible from `train.seed` (and resumes exactly).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import nn

from mmrlvr.core.types import Scores
from mmrlvr.rollout.diversity import (
    completion_tokens,
    distinct,
    final_answers,
    group_pairs,
    group_rows,
    normalised_edit,
)

KINDS = ("latent_noise",)
SITES = ("last_layer_input", "final_hidden")
NOISES = ("independent", "shared", "antithetic")


@dataclass(frozen=True)
class Branching:
    """The `rollout.branching` config mapping of NC-GRPO, validated (`kind: none`, plain GRPO,
    is the core's and never reaches here)."""

    kind: str = "latent_noise"
    """`latent_noise` (NC-GRPO)."""
    fraction: float = 0.5
    """Share of each group sampled from the displaced prefill (the last ⌊fraction·G + ½⌋ members)."""
    alpha: float | str = 0.1
    """Noise scale relative to the hidden-state norm: σ_t = α·‖h_t‖/√d; or `auto`: α is steered
    every generate call so the first-step KL(noisy ‖ clean) reaches `target` (auto.py)."""
    site: str = "last_layer_input"
    """`last_layer_input` (input of the last decoder layer) or `final_hidden` (final norm output)."""
    noise: str = "independent"
    """`independent` per noisy member, `shared` within a group, or `antithetic` ±ε pairs."""
    target: float = 0.1
    """With `alpha: auto`: the first-step KL(noisy ‖ clean) aimed at, as a fraction of the clean
    members' first-step sampling entropy (docs/ncgrpo.md says why 0.1)."""
    alpha_init: float = 0.5
    """With `alpha: auto`: the α of the first generate call, before anything is measured."""

    @classmethod
    def from_config(cls, raw: dict[str, Any] | None) -> Branching:
        raw = dict(raw or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise ValueError(f"rollout.branching: unknown key(s) {unknown}; known: {names}")
        for key in ("fraction", "alpha", "target", "alpha_init"):
            if key in raw and not (key == "alpha" and raw[key] == "auto"):
                try:        # YAML 1.1 reads `1e-1` (no dot) as a string
                    raw[key] = float(raw[key])
                except (TypeError, ValueError):
                    raise ValueError(f"rollout.branching.{key} must be a number, "
                                     f"got {raw[key]!r}") from None
        out = cls(**raw)
        for key, allowed in (("kind", KINDS), ("site", SITES), ("noise", NOISES)):
            if getattr(out, key) not in allowed:
                raise ValueError(f"rollout.branching.{key} is {getattr(out, key)!r}; "
                                 f"choose one of {list(allowed)}")
        if not 0.0 <= out.fraction <= 1.0:
            raise ValueError(f"rollout.branching.fraction is {out.fraction}; it must lie in [0, 1]")
        if not out.auto and out.alpha < 0:
            raise ValueError(f"rollout.branching.alpha is {out.alpha}; it must be >= 0 or auto")
        if out.auto and not (out.target > 0 and out.alpha_init > 0):
            raise ValueError(f"rollout.branching: alpha auto needs target > 0 and alpha_init > 0, "
                             f"got target {out.target}, alpha_init {out.alpha_init}")
        return out

    @property
    def auto(self) -> bool:
        """Whether α is steered to a target KL (`alpha: auto`)."""
        return self.alpha == "auto"

    def noisy_members(self, group_size: int) -> int:
        """How many members of a group of `group_size` are noisy (round half up)."""
        return math.floor(self.fraction * group_size + 0.5)


@dataclass(frozen=True)
class RowNoise:
    """One request's noise, as a vLLM model runner would receive it."""

    seed: int
    sign: float
    alpha: float
    site: str

    def epsilon(self, length: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """sign · N(0, I) noise for `length` real prompt tokens. [L, d] float32."""
        return self.sign * _standard_normal(self.seed, length, dim, device)


def _standard_normal(seed: int, length: int, dim: int, device: torch.device | str) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(length, dim, generator=gen, device=device)                # [L, d]


@dataclass
class NoisePlan:
    """Which rows of one generate call (B prompts × G members, row b·G+g) are displaced, and how."""

    site: str
    alpha: float
    group_size: int
    flags: list[bool]      # [N] row is a noisy member
    seeds: list[int]       # [N] noise seed (0 on clean rows, and everywhere when alpha is 0)
    signs: list[float]     # [N] +1/-1 on noisy rows (antithetic pairs), 0 on clean rows

    @property
    def active(self) -> bool:
        """Whether any hidden state is displaced at all."""
        return self.alpha > 0 and any(self.flags)

    def tags(self) -> list[str]:
        return ["noisy" if f else "clean" for f in self.flags]

    def row(self, n: int) -> RowNoise | None:
        """Request `n`'s noise, or None for a clean request (or alpha 0)."""
        if not (self.active and self.flags[n]):
            return None
        return RowNoise(self.seeds[n], self.signs[n], self.alpha, self.site)

    def hooks(self, model: nn.Module, row_mask: torch.Tensor):
        """The HF engine's prefill hook for one `generate` call (`latent_noise`)."""
        return latent_noise(model, self, row_mask)

    def displace(self, hidden: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """Noisy copy of prefill hidden states [N, P, d]; `prompt_mask` [N, P] marks real tokens."""
        out = hidden.clone()
        d = hidden.shape[-1]
        cache: dict[tuple[int, int], torch.Tensor] = {}
        for n in range(hidden.shape[0]):
            spec = self.row(n)
            if spec is None:
                continue
            pos = prompt_mask[n].to(hidden.device).bool()                         # [P]
            L = int(pos.sum())
            if (spec.seed, L) not in cache:      # shared / antithetic rows reuse one draw
                cache[(spec.seed, L)] = _standard_normal(spec.seed, L, d, hidden.device)
            eps = spec.sign * cache[(spec.seed, L)]                               # [L, d]
            h = hidden[n, pos].float()                                            # [L, d]
            sigma = self.alpha * h.norm(dim=-1, keepdim=True) / math.sqrt(d)      # [L, 1]
            out[n, pos] = (h + sigma * eps).to(hidden.dtype)
        return out


def make_plan(branching: Branching, n_prompts: int, group_size: int,
              alpha: float | None = None) -> NoisePlan:
    """The plan for one generate call (`alpha`: the α to use, else the config's number).

    Draws one number from torch's global RNG only when something is displaced (alpha > 0 and
    k > 0), so `alpha: 0` leaves the sampling stream exactly as plain GRPO's.
    """
    alpha = float(branching.alpha if alpha is None else alpha)
    k = branching.noisy_members(group_size)
    N = n_prompts * group_size
    flags = [g >= group_size - k for _ in range(n_prompts) for g in range(group_size)]
    seeds, signs = [0] * N, [0.0] * N
    if alpha > 0 and k > 0:
        base = int(torch.randint(0, 2 ** 62, (1,)))
        gen = torch.Generator().manual_seed(base)
        fresh = torch.randint(0, 2 ** 62, (N,), generator=gen).tolist()   # one candidate per row
        for b in range(n_prompts):
            rows = [b * group_size + g for g in range(group_size - k, group_size)]
            for j, r in enumerate(rows):
                if branching.noise == "independent":
                    seeds[r], signs[r] = fresh[r], 1.0
                elif branching.noise == "shared":
                    seeds[r], signs[r] = fresh[rows[0]], 1.0
                else:   # antithetic: (+ε, -ε) on consecutive noisy members; odd tail alone
                    seeds[r], signs[r] = fresh[rows[j - j % 2]], 1.0 if j % 2 == 0 else -1.0
    return NoisePlan(branching.site, alpha, group_size, flags, seeds, signs)


class BranchSiteError(RuntimeError):
    """The model has no recognisable text decoder to inject noise into."""


def find_decoder(model: nn.Module) -> nn.Module:
    """The text decoder stack: the module holding `embed_tokens`, `layers` and `norm`.

    Works through peft wrappers and for the known layouts: Qwen2-VL/2.5-VL
    `model.language_model`, Qwen2-Audio `model.language_model` (transformers 5) or
    `language_model.model` (4.x). Encoders (vision `blocks`, audio `layers` + `layer_norm`) lack
    `embed_tokens`/`norm` and are skipped.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    found = [(name, m) for name, m in base.named_modules()
             if isinstance(getattr(m, "layers", None), nn.ModuleList) and len(m.layers)
             and isinstance(getattr(m, "embed_tokens", None), nn.Module)
             and isinstance(getattr(m, "norm", None), nn.Module)]
    if len(found) > 1:
        found = [(n, m) for n, m in found if "language_model" in n] or found
    if len(found) != 1:
        names = [n for n, _ in found]
        raise BranchSiteError(
            f"latent-noise branching: cannot find the text decoder of {type(base).__name__} "
            f"(looked for one module with `embed_tokens`, a `layers` ModuleList and `norm`; "
            f"found {names or 'none'}). Extend mmrlvr.methods.ncgrpo.branching.find_decoder for this "
            f"architecture, or set rollout.branching.kind: none")
    return found[0][1]


class PrefillNoise:
    """The hook: displaces the first call's hidden states (the prefill), passes later calls through."""

    def __init__(self, plan: NoisePlan, prompt_mask: torch.Tensor):
        self.plan, self.prompt_mask = plan, prompt_mask
        self.calls = 0
        self.applied = 0

    def _apply(self, hidden: torch.Tensor) -> torch.Tensor | None:
        self.calls += 1
        if self.applied:
            return None                                  # decoding: untouched
        if tuple(hidden.shape[:2]) != tuple(self.prompt_mask.shape):
            raise RuntimeError(
                f"latent-noise branching expected the prefill pass first, with hidden states "
                f"[{self.prompt_mask.shape[0]}, {self.prompt_mask.shape[1]}, d]; got "
                f"{list(hidden.shape)} (chunked prefill or a reused cache is not supported)")
        self.applied += 1
        return self.plan.displace(hidden, self.prompt_mask)

    def pre_hook(self, module, args, kwargs):
        if args:
            new = self._apply(args[0])
            return None if new is None else ((new, *args[1:]), kwargs)
        new = self._apply(kwargs["hidden_states"])
        return None if new is None else (args, {**kwargs, "hidden_states": new})

    def post_hook(self, module, args, output):
        return self._apply(output)


@contextmanager
def latent_noise(model: nn.Module, plan: NoisePlan | None,
                 prompt_mask: torch.Tensor) -> Iterator[PrefillNoise | None]:
    """Displace the prefill of `plan`'s flagged rows for one `generate` call inside the block.

    `prompt_mask` [N, P] is the prompts' attention mask (1 on real tokens, 0 on left padding).
    Installs no hook at all when there is nothing to displace; the hook is removed on exit, also
    on exceptions.
    """
    if plan is None or not plan.active:
        yield None
        return
    decoder = find_decoder(model)
    hook = PrefillNoise(plan, prompt_mask)
    if plan.site == "last_layer_input":
        handle = decoder.layers[-1].register_forward_pre_hook(hook.pre_hook, with_kwargs=True)
    else:
        handle = decoder.norm.register_forward_hook(hook.post_hook)
    try:
        yield hook
    finally:
        handle.remove()
    if not hook.applied:
        raise RuntimeError("latent-noise branching: the hooked module never ran a prefill; "
                           f"site {plan.site!r} of {type(model).__name__} is not on the generate path")


def branch_metrics(rollouts, scores: Scores) -> dict[str, float]:
    """NC-GRPO's per-step figures of one batch of rollouts and their scores ([B][G] dicts),
    logged after the core's `rollout/*` ones (`mmrlvr.rollout.diversity.rollout_metrics`).

    With noisy members in the batch: `branch/{clean,noisy}_{reward,accuracy,
    first_token_entropy}`, `branch/{clean,noisy}_distinct_answers` and
    `branch/{clean,noisy}_pairwise_edit` (within the clean and within the noisy members of each
    group), and `branch/noisy_frac`; without any (fraction 0, or an eval batch): nothing.
    """
    branch = rollouts.branch
    if "noisy" not in branch:
        return {}
    groups = group_rows(rollouts)
    answers = final_answers(rollouts)
    seqs = completion_tokens(rollouts)
    flat = scores.flat                                                          # [N]
    entropy = rollouts.stats.get("first_token_entropy")                         # [N] or absent
    out = {"branch/noisy_frac": branch.count("noisy") / len(branch)}
    for tag in ("clean", "noisy"):
        rows = [i for i, b in enumerate(branch) if b == tag]
        if not rows:
            continue
        out[f"branch/{tag}_reward"] = float(np.mean([flat[i]["overall"] for i in rows]))
        if "accuracy" in flat[0]:
            out[f"branch/{tag}_accuracy"] = float(np.mean([flat[i]["accuracy"] for i in rows]))
        if entropy is not None:
            out[f"branch/{tag}_first_token_entropy"] = float(entropy[rows].mean())
        members = [[i for i in g if branch[i] == tag] for g in groups]
        out[f"branch/{tag}_distinct_answers"] = float(np.mean([distinct(answers, m)
                                                               for m in members if m]))
        edits = normalised_edit(seqs, group_pairs(members))
        if len(edits):
            out[f"branch/{tag}_pairwise_edit"] = float(edits.mean())
    return out
