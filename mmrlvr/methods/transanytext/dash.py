"""DASH — divergence-gated backward aggregation of a self-distillation signal (for PWSD).

Seed paper: "DASH". Its mechanism, as the brief states it: for self-distillation objectives,
gates from each token's divergence gap to the sequence mean control a backward multi-step
aggregation of the distillation signal, with no extra forward pass. The formulas below are *our
reading* of that (the paper's exact equations were not available to us):

    d_t   = KL(π_S(·|x, y<t) ‖ π_T(·|x⁺, y<t))   PWSD's per-token divergence, stop-gradient
    d̄     = Σ_t M_t d_t / Σ_t M_t                  the sequence's masked mean
    g_t   = σ(β·(d_t − d̄))·M_t                     gate: above-average divergence opens it
    ŝ_t   = d_t + γ·g_{t+1}·ŝ_{t+1}                backward recursion, cut after `horizon` steps:
          = Σ_{k=0..H} γ^k (Π_{j=1..k} g_{t+j}) d_{t+k}
    u_t   = 1 + (ŝ_t − d_t) / d̄                    the stretch ahead, in units of the mean
    m_t   = M_t·u_t / (Σ_t M_t u_t / Σ_t M_t)      (normalize: true) masked mean 1 per sequence

PWSD then uses w_t·m_t in place of its w_t = σ(α·gap_t): L = Σ_t w_t m_t KL_t / Σ_t M_t. So a
token that leads into a high-divergence stretch takes a larger share of the sequence's
distillation weight; with normalisation the loss scale stays PWSD's (DASH moves weight between
tokens, it adds none). Padding neither receives (M_t = 0) nor passes (g_t = 0) signal. Everything
is computed from the detached KL that PWSD already has (no new forward; the weights carry no
gradient). γ = 0 gives m_t = 1 exactly, i.e. PWSD's loss bit for bit.

Defaults (all ours; the paper's are not known to us): β 1.0, γ 0.9, horizon 8 (with gates
around 0.5 the factor γ^k·Πg falls below 0.2 % by k = 8), normalize true.

Limit, stated: m_t rescales token t's own KL gradient. Where the student already matches the
teacher at t (KL_t ≈ 0, so its gradient ≈ 0) no weight can move token t; the redistribution
acts on tokens whose own divergence is non-zero.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(frozen=True)
class DashOptions:
    """`dash: {beta, gamma, horizon, normalize}` on the pwsd objective (module docstring)."""

    beta: float = 1.0          # gate sharpness in g_t = σ(β·(d_t − d̄))
    gamma: float = 0.9         # discount of the backward recursion
    horizon: int | None = 8    # tokens ahead that may pass signal back (None: to the sequence end)
    normalize: bool = True     # rescale m to masked mean 1 per sequence (keeps PWSD's loss scale)

    @classmethod
    def parse(cls, options: dict[str, Any] | None, where: str = "pwsd.dash") -> DashOptions | None:
        """Checked options from a config mapping (None: DASH off); errors name `where`."""
        if options is None:
            return None
        if not isinstance(options, dict):
            raise ValueError(f"{where} must be a mapping like {{gamma: 0.9}}, got {options!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"{where}: unknown option(s) {unknown}; known: {sorted(known)}")
        raw = cls(**options)
        if not isinstance(raw.normalize, bool):
            raise ValueError(f"{where}.normalize must be true or false, got {raw.normalize!r}")
        try:
            out = cls(float(raw.beta), float(raw.gamma),
                      None if raw.horizon is None else int(raw.horizon), raw.normalize)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err} (beta, gamma: numbers; horizon: integer or null)") from None
        if not 0.0 <= out.gamma <= 1.0:
            raise ValueError(f"{where}.gamma must be in [0, 1], got {out.gamma}")
        if out.horizon is not None and out.horizon < 1:
            raise ValueError(f"{where}.horizon must be >= 1 (or null: to the sequence end), "
                             f"got {out.horizon}")
        return out


def dash_gates(divergence: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """g_t = σ(β·(d_t − d̄))·M_t; divergence, mask [N, C] -> gates [N, C] (no gradient)."""
    m = mask.to(divergence.dtype)                                               # [N, C]
    d = divergence.detach() * m                                                 # [N, C]
    mean = d.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)       # [N, 1] d̄
    return torch.sigmoid(beta * (d - mean)) * m                                 # [N, C]


def dash_weights(divergence: torch.Tensor, mask: torch.Tensor, beta: float = 1.0,
                 gamma: float = 0.9, horizon: int | None = 8, normalize: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token multipliers m and gates g (module docstring), both [N, C] and detached.

    divergence [N, C] per-token divergence (≥ 0); mask [N, C] 1 on completion tokens.
    """
    m = mask.to(divergence.dtype)                                               # [N, C]
    d = divergence.detach() * m                                                 # [N, C]
    gates = dash_gates(d, m, beta)                                              # [N, C]
    mean = d.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)       # [N, 1]
    C = d.shape[1]
    H = C - 1 if horizon is None else min(int(horizon), C - 1)
    ahead = torch.zeros_like(d)                                                 # [N, C] ŝ_t − d_t
    prod = torch.ones_like(d)                                                   # [N, C] Π g_{t+j}
    for k in range(1, H + 1):                                                   # explicit sum: exact horizon cut
        prod = prod[:, :C - k] * gates[:, k:]                                   # [N, C-k]
        ahead[:, :C - k] += gamma ** k * prod * d[:, k:]
    u = (1.0 + ahead / mean.clamp(min=1e-12)) * m                               # [N, C]; d̄ = 0 -> ahead = 0
    if normalize:
        u = u / (u.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)).clamp(min=1e-12)
    return u, gates


def dash_stats(multipliers: torch.Tensor, gates: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Masked mean gate and the share of tokens whose weight rose (m_t > 1)."""
    m = mask.to(gates.dtype)
    tokens = m.sum().clamp(min=1.0)
    return {"dash_gate_mean": float((gates * m).sum() / tokens),
            "dash_rose_frac": float(((multipliers > 1.0).to(m.dtype) * m).sum() / tokens)}
