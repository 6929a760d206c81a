"""GMTS's mechanism check (`mmrlvr check-method gmts`): on the starting model's own groups, does
the shaper keep a strict subset of the tokens, and one that differs from a uniform-random pick?

GMTS keeps the top `fraction` of a step's completion tokens by g = H·|A| (`shaper.py`). That is
a different update from GRPO's only where it keeps a strict subset and where g tells tokens apart:
with every group's rewards equal (A = 0 everywhere) it keeps an arbitrary `fraction` of tokens
that carry no gradient, and with `fraction` near 1 it is plain GRPO. The check samples G
completions per question from the starting model (the HF engine, which keeps the per-token
entropies the shaper reads), scores them with the run's rewards (the `--config`'s `rewards`,
else the default accuracy + format), takes the group advantages (`algo.advantage`, else GRPO)
and runs the shaper itself through `mmrlvr.algo.shaping.token_credit`, as the trainer does.
From the weights it leaves it reports the kept fraction, the kept tokens' share with g > 0
(`kept_signal_frac`), and the kept tokens' mean g, |A| and entropy over all tokens' (the lifts;
a uniform-random pick of the same size has lift 1). Active when the kept fraction is under
`KEEP_CEILING`, the kept tokens carry signal and their g-lift reaches `LIFT_FLOOR`.
The fraction: `--option fraction=0.1`, else the config's gmts entry, else the shaper's 0.2.
"""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.core.method_check import CheckContext, CheckResult

KEEP_CEILING = 0.95
"""Kept fraction at or above which GMTS is (almost) plain GRPO: it drops under 5 % of the
gradient tokens, less than the truncation/length spread of one step already moves (our choice)."""
LIFT_FLOOR = 1.2
"""Kept tokens' mean g over all tokens' mean g below which the selection is not told apart from
a uniform-random pick (lift 1 in expectation). The top 20 % of any g with a real spread lifts far
more (an exponential g: 1 + ln 5 = 2.6); a near-constant g, whose top-k is a tie-break, lifts
about 1 (our choice: 20 % above the random pick's)."""
ROWS = 8
"""Rows read by default (`--rows 0`)."""


def fraction(ctx: CheckContext) -> float:
    """`--option fraction=`, else the config's `algo.shaping` gmts entry, else the shaper's."""
    if "fraction" in ctx.options.method:
        return float(ctx.options.method["fraction"])
    specs = getattr(getattr(ctx.config, "algo", None), "shaping", None) or []
    return float(next((s.get("fraction", 0.2) for s in specs if s.get("name") == "gmts"), 0.2))


def lift(values: torch.Tensor, kept: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of `values` over the kept tokens over its mean over all tokens (0 where that is 0)."""
    whole = float(values[mask].mean()) if mask.any() else 0.0
    return round(float(values[kept].mean()) / whole, 4) if kept.any() and whole > 0 else 0.0


def measure(rollouts: Any, scores: Any, examples: list[Any], frac: float,
            advantage: str = "grpo", eps: float = 1e-6) -> dict[str, float]:
    """What the shaper does on one step's rollouts and scores: its own stats and the lifts."""
    from mmrlvr.algo import group_advantages
    from mmrlvr.algo.shaping import ShapeContext, token_credit
    from mmrlvr.core.types import Scores
    from mmrlvr.methods.gmts.shaper import GMTS

    scores = scores if isinstance(scores, Scores) else Scores(scores)
    adv = group_advantages(scores.total, advantage, eps)                           # [B, G]
    mask = rollouts.completion_mask
    credit, stats = token_credit(adv.flatten(), mask, 0.2, 0.2, [GMTS(frac)],
                                 ShapeContext(rollouts, scores, mask, examples))
    m = mask.bool()
    kept = (credit.weights > 0) & m                                                # [N, C]
    entropy = rollouts.stats.get("token_entropy")
    entropy = (entropy if entropy is not None else -rollouts.sample_logprobs)[:, :m.shape[1]]
    abs_adv = credit.advantages.abs()
    proxy = entropy.to(abs_adv) * abs_adv
    n_kept = int(kept.sum())
    spread = scores.total.max(dim=1).values > scores.total.min(dim=1).values
    return {"tokens": float(m.sum()), "kept_frac": round(stats["shaping/gmts/kept_frac"], 4),
            "fraction": frac,
            "kept_signal_frac": round(float((proxy[kept] > 0).sum()) / max(n_kept, 1), 4),
            "proxy_mean": round(stats["shaping/gmts/proxy_mean"], 4),
            "proxy_kept_mean": round(stats["shaping/gmts/proxy_kept_mean"], 4),
            "proxy_lift": lift(proxy, kept, m), "abs_adv_lift": lift(abs_adv, kept, m),
            "entropy_lift": lift(entropy.float(), kept, m),
            "groups": float(len(scores)), "groups_with_spread": float(spread.sum())}


def verdict(figures: dict[str, float]) -> tuple[str, str]:
    """(`active`/`inactive`, why) from `measure`'s figures."""
    kept, signal, lifted = figures["kept_frac"], figures["kept_signal_frac"], figures["proxy_lift"]
    if not figures.get("tokens", 0.0):
        return "inactive", "no completion token was sampled: nothing to select"
    if kept >= KEEP_CEILING:
        return "inactive", (f"kept fraction {kept:.3f} >= {KEEP_CEILING}: GMTS keeps (almost) "
                            "every token, plain GRPO")
    if signal <= 0.0:
        return "inactive", (f"none of the kept tokens carries advantage (groups with reward "
                            f"spread: {figures['groups_with_spread']:g} of {figures['groups']:g}): "
                            "GMTS keeps nothing that has a gradient")
    if lifted < LIFT_FLOOR:
        return "inactive", (f"kept tokens' mean H·|A| is {lifted:.3f}x all tokens' (< {LIFT_FLOOR}): "
                            "the selection is not told apart from a uniform-random pick")
    return "active", (f"keeps {kept:.1%} of the tokens (< {KEEP_CEILING:.0%}), whose mean H·|A| "
                      f"is {lifted:.2f}x all tokens' (>= {LIFT_FLOOR}; |A| {figures['abs_adv_lift']:.2f}x, "
                      f"entropy {figures['entropy_lift']:.2f}x)")


def sample(ctx: CheckContext, rows: list[Any]) -> tuple[Any, Any]:
    """(rollouts, scores): G completions per row from the starting model, scored by the rewards."""
    from mmrlvr.config import Config
    from mmrlvr.core.types import Scores
    from mmrlvr.rollout import SamplingParams, make_engine
    from rewards import build_combined

    opts = ctx.options
    policy = ctx.policy("gmts")
    params = SamplingParams(n=opts.group, max_new_tokens=opts.max_new_tokens,
                            temperature=opts.temperature)
    torch.manual_seed(opts.seed)
    rollouts = make_engine("hf", policy, None).generate(opts.prompting.encode(policy, rows), params)
    reward = build_combined((ctx.config or Config()).rewards)
    groups = [range(b * opts.group, (b + 1) * opts.group) for b in range(len(rows))]
    ids, kept = rollouts.completion_ids, rollouts.completion_mask.bool()
    return rollouts, Scores(reward.score_groups(             # as the trainer's score_batch
        rows, [[rollouts.texts[r] for r in group] for group in groups], 0.0,
        [[ids[r][kept[r]].tolist() for r in group] for group in groups]))


def check(ctx: CheckContext) -> CheckResult:
    """The shaper on the starting model's sampled groups, and the verdict."""
    frac = fraction(ctx)
    rows = ctx.rows(ROWS)
    rollouts, scores = sample(ctx, rows)
    algo = getattr(ctx.config, "algo", None)
    figures = measure(rollouts, scores, rows, frac, getattr(algo, "advantage", "grpo"),
                      getattr(algo, "eps", 1e-6))
    figures["rows"] = float(len(rows))
    state, why = verdict(figures)
    return CheckResult("gmts", state, why, figures,
                       {"kept_frac": KEEP_CEILING, "proxy_lift": LIFT_FLOOR})
