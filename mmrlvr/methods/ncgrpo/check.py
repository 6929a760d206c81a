"""NC-GRPO's mechanism check (`mmrlvr check-method ncgrpo`): does the latent noise move the
starting model's sampling and its answers?

Measured by `measure.measure_arm` (its own seeds) on the first rows of the data with the
method's branching (the run config's `rollout.branching` where `--config` gives one, else
latent noise at α 0.1; any key overridden by `--option alpha=0.3`, figures `arm/*`): the
first-step KL(noisy ‖ clean) over the clean entropy at the temperature, and the share of noisy
members whose greedy answer differs from their group's clean greedy answer. Inactive when either is at
its floor: noise below `KL_FLOOR` of the entropy is a displacement the sampler's own spread
swamps, and noise that changes no greedy answer explores nothing a clean group would not.
"""
from __future__ import annotations

from mmrlvr.core.method_check import CheckContext, CheckResult

KL_FLOOR = 0.01
"""First-step KL(noisy ‖ clean) / clean entropy below which the noise counts as inactive: 1 % of
the sampler's own spread (our choice)."""
CHANGED_FLOOR = 0.0
"""Share of noisy members whose greedy answer changed at or below which the noise is inactive."""
DEFAULT = {"kind": "latent_noise", "alpha": 0.1}
"""The branching checked where the run config has none (the defaults of docs/methods.md, NC-GRPO, for the rest)."""
ROWS = 16
"""Rows read by default (`--rows 0`)."""


def verdict(figures: dict[str, float]) -> tuple[str, str]:
    """(`active`/`inactive`, why) from `measure_arm`'s figures."""
    ratio = figures.get("ncgrpo/kl_over_entropy", 0.0)
    changed = figures.get("greedy_answer_changed_frac", 0.0)
    if not figures.get("noisy_members", 0.0):
        return "inactive", "no group member was sampled noisy (fraction·G rounds to 0 or alpha is 0)"
    if ratio < KL_FLOOR:
        return "inactive", (f"first-step KL/entropy {ratio:.4g} < {KL_FLOOR}: the noise moves "
                            "sampling less than the sampler's own spread")
    if changed <= CHANGED_FLOOR:
        return "inactive", (f"no noisy member's greedy answer changed (KL/entropy {ratio:.4g}): "
                            "the noise explores nothing a clean group would not")
    return "active", (f"first-step KL/entropy {ratio:.4g} >= {KL_FLOOR} and "
                      f"{changed:.0%} of noisy members' greedy answers changed")


def check(ctx: CheckContext) -> CheckResult:
    from mmrlvr.methods.ncgrpo.measure import measure_arm

    opts = ctx.options
    configured = dict(ctx.config.rollout.branching) if ctx.config is not None else {}
    base = configured if configured.get("kind", "none") != "none" else DEFAULT
    arm = {**base, **opts.method}
    policy = ctx.policy("ncgrpo")
    rows = ctx.rows(ROWS)
    batch = opts.prompting.encode(policy, rows)
    figures = measure_arm(policy, batch, arm, opts.group, opts.temperature, opts.max_new_tokens)
    figures["rows"] = float(len(rows))
    state, why = verdict(figures)
    figures.update({f"arm/{k}": float(v) for k, v in arm.items() if isinstance(v, (int, float))})
    return CheckResult("ncgrpo", state, why, figures,
                       {"kl_over_entropy": KL_FLOOR, "greedy_answer_changed_frac": CHANGED_FLOOR})
