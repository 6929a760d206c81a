"""The clipped surrogate, its aggregation over tokens, and KL estimators.

Per token t of completion i, with ratio ρ = exp(logp_new − logp_old):
    L_it = −min(ρ·A_i, clip(ρ, 1−ε_low, 1+ε_high)·A_i) + β·KL_it
`ratio: sequence` (GSPO, in its GSPO-token form): the ratio is the sequence's length-normalised
likelihood ratio s_i = exp(Σ_t M_it·(logp_new − logp_old) / Σ_t M_it), carried per token as
s_it = sg(s_i)·π_new(y_t)/sg(π_new(y_t)): its value is s_i and its gradient that of GSPO's (with
`loss_agg: seq`, exactly; GSPO clips with bounds of order 1e-3, not PPO's 0.2).
Aggregation over the mask M (completion tokens):
    token:        Σ_it L_it·M_it / Σ_it M_it
    seq:          mean_i( Σ_t L_it·M_it / Σ_t M_it )
    seq-sum-norm: Σ_it L_it·M_it / (N_seq · norm_len)       (Dr.GRPO: a constant normaliser)
"""
from __future__ import annotations

import torch


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimate from samples of π. [N, T] -> [N, T].

    k1 = logp − ref_logp;  k3 = exp(ref_logp − logp) − (ref_logp − logp) − 1  (≥ 0, unbiased).
    """
    if kind == "k1":
        return logp - ref_logp
    if kind == "k3":
        diff = ref_logp - logp
        return torch.exp(diff) - diff - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; use 'k1' or 'k3'")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token",
              norm_len: int | None = None, total_tokens: float | None = None,
              total_seqs: int | None = None) -> torch.Tensor:
    """Reduce per-token values [N, T] over the completion mask [N, T] to a scalar.

    `total_tokens`/`total_seqs` are the counts over the whole batch when [N, T] is one
    micro-batch of it: the micro-batch results then add up to the whole-batch value exactly.
    """
    mask = mask.to(values.dtype)
    n_seqs = total_seqs if total_seqs is not None else values.shape[0]
    if mode == "token":
        n_tokens = total_tokens if total_tokens is not None else mask.sum().clamp(min=1.0)
        return (values * mask).sum() / n_tokens
    if mode == "seq":
        per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)   # [N]
        return per_seq.sum() / n_seqs
    if mode == "seq-sum-norm":
        if not norm_len:
            raise ValueError("loss_agg 'seq-sum-norm' needs norm_len (the token budget)")
        return (values * mask).sum() / (n_seqs * norm_len)
    raise ValueError(f"unknown loss aggregation {mode!r}; use 'token', 'seq' or 'seq-sum-norm'")


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token's ratio [N, T]: the value of s_i = exp(mean_t M·(logp − old_logp)) on every
    token of completion i, the gradient of π_new(y_t)/sg(π_new(y_t)) times s_i."""
    m = mask.to(logp.dtype)
    log_s = ((logp - old_logp) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)     # [N]
    return torch.exp(logp - logp.detach() + log_s.detach().unsqueeze(1))         # [N, T]


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float | torch.Tensor = 0.2, clip_high: float | torch.Tensor = 0.28,
                      ratio: str = "token", mask: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss (to minimise) and a clipped-token indicator.

    logp, old_logp: [N, T]; advantages: [N] (one per completion, broadcast over its tokens) or
    [N, T] (per token); clip bounds: numbers or [N, 1] (per completion); `ratio` `token` (PPO)
    or `sequence` (GSPO, needs `mask` [N, T]). Returns ([N, T], [N, T]).
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages   # [N, 1] or [N, T]
    if ratio == "token":
        ratio = torch.exp(logp - old_logp)                         # [N, T]
    elif ratio == "sequence":
        if mask is None:
            raise ValueError("ratio 'sequence' needs the completion mask")
        ratio = sequence_ratio(logp, old_logp, mask)               # [N, T]
    else:
        raise ValueError(f"unknown ratio {ratio!r}; use 'token' or 'sequence'")
    unclipped = ratio * adv                                        # [N, T]
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)                      # [N, T]
    was_clipped = (clipped < unclipped).to(logp.dtype)             # [N, T] the clip bound was active
    return loss, was_clipped


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_low: float | torch.Tensor = 0.2,
              clip_high: float | torch.Tensor = 0.28, token_weights: torch.Tensor | None = None,
              loss_agg: str = "token", norm_len: int | None = None, beta: float = 0.0,
              ref_logp: torch.Tensor | None = None, kl_estimator: str = "k3",
              total_tokens: float | None = None, total_seqs: int | None = None,
              ratio: str = "token") -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss over one micro-batch and its diagnostics (clip fraction, KL).

    logp/old_logp/ref_logp/mask: [N, T]; advantages: [N] or [N, T] (token-level credit,
    `mmrlvr.algo.shaping`); clip bounds numbers or [N, 1]. `token_weights` [N, T] scale each
    token's surrogate term (not its KL) and leave the normaliser alone, so a weight of 0 removes
    a token's policy gradient and nothing else. With `total_tokens`/`total_seqs` of the whole
    batch, micro-batch losses sum to the whole-batch loss (gradient accumulation). `ratio`:
    `token` (PPO's per-token ratio) or `sequence` (GSPO).
    """
    per_token, was_clipped = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high,
                                               ratio, mask)
    if token_weights is not None:
        per_token = per_token * token_weights                     # [N, T]
    stats: dict[str, float] = {}
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs reference logprobs")
        kl = kl_estimate(logp, ref_logp, kl_estimator)            # [N, T]
        per_token = per_token + beta * kl
        stats["kl"] = float(aggregate(kl.detach(), mask, "token"))
    loss = aggregate(per_token, mask, loss_agg, norm_len, total_tokens, total_seqs)
    with torch.no_grad():
        stats["clip_frac"] = float(aggregate(was_clipped, mask, "token"))
        stats["approx_kl_old"] = float(aggregate(kl_estimate(logp, old_logp, "k3"), mask, "token"))
    return loss, stats


def rollout_correction(kind: str, trainer_logp: torch.Tensor, rollout_logp: torch.Tensor,
                       mask: torch.Tensor, cap: float = 2.0
                       ) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Token weights [N, T] (no gradient) correcting for the rollout engine sampling from a
    slightly different distribution than the trainer scores (kernels, precision, vLLM), with
    w = π_trainer/π_rollout = exp(trainer_logp − rollout_logp) per sampled token:

        tis:  min(w, cap)                       truncated importance sampling
        mis:  1 where 1/cap <= w <= cap, else 0 masked importance sampling
        none: None (no weights; the loss is unchanged)

    Returns (weights or None, stats: the mean ratio and the share of tokens capped or masked).
    """
    if kind == "none":
        return None, {}
    m = mask.bool()
    w = torch.exp((trainer_logp - rollout_logp).detach().float())                # [N, T]
    if kind == "tis":
        out, hit = torch.clamp(w, max=cap), w > cap
    elif kind == "mis":
        keep = (w <= cap) & (w >= 1.0 / cap)
        out, hit = keep.float(), ~keep
    else:
        raise ValueError(f"unknown rollout correction {kind!r}; use 'none', 'tis' or 'mis'")
    n = max(int(m.sum()), 1)
    return out * m, {"ratio_mean": float(w[m].sum()) / n, "capped_frac": float(hit[m].sum()) / n}
