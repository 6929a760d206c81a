"""Dynamic sampling (DAPO; EasyR1 `online_filtering`, verl `filter_groups`): a step trains
`batch_prompts` groups whose rewards have spread, drawing more prompts while it has fewer.

A group whose members all score the same gives GRPO no gradient. With `train.dynamic_sampling`
the step draws its prompts, rolls out and scores them, keeps the groups with spread, and while it
holds fewer than its share draws another batch of prompts (at most `train.dynamic_max_draws`
extra draws). Under several processes every rank draws again while any rank is short (a
generate under FSDP2 gathers the sharded weights: every rank must make the same calls), and
after the last draw a rank still short fills its share with zero-spread groups, so every rank
trains the same number of groups. The groups kept are put back into one batch: their examples
encoded again together (padding invariance makes that exact) and their completions re-padded.
Every group drawn is seen by a sampler that learns from outcomes (`observe`), kept or not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from mmrlvr.core.types import Rollouts, Scores
from mmrlvr.rollout.base import truncated_rows


@dataclass
class Drawn:
    """What one step collected: its examples, their dataset indices, rollouts and scores."""

    examples: list[Any]
    indices: list[int]
    rollouts: Rollouts
    scores: Scores
    stats: dict[str, float] = field(default_factory=dict)


def has_spread(group: list[dict[str, float]]) -> bool:
    values = [s["overall"] for s in group]
    return max(values) != min(values)


def collect(run: Any, draw, share: int) -> Drawn:
    """`share` groups from `draw()` (one batch: a `Drawn`), the ones with reward spread first."""
    d, cfg = run.dist, run.cfg
    kept: list[tuple[Drawn, int]] = []          # (batch, group index) of groups with spread
    flat: list[tuple[Drawn, int]] = []          # the zero-spread ones, to fill with at the end
    draws, seconds = 0, {"time/rollout_s": 0.0, "time/reward_s": 0.0}
    while True:
        batch = draw()
        draws += 1
        for key in seconds:
            seconds[key] += batch.stats.get(key, 0.0)
        for b, group in enumerate(batch.scores.parts):
            (kept if has_spread(group) else flat).append((batch, b))
        short = d.gather(len(kept) < share)
        if not any(short) or draws > cfg.train.dynamic_max_draws:
            break
    chosen = (kept + flat)[:share]
    out = merge(run, chosen)
    out.stats = {**seconds, "sampling/draws": float(draws), "sampling/spread_groups": float(min(len(kept), share)),
                 "sampling/filled_flat": float(max(share - len(kept), 0))}
    return out


def merge(run: Any, chosen: list[tuple[Drawn, int]]) -> Drawn:
    """One batch of the chosen groups: examples encoded again together, rows re-padded."""
    policy = run.policy
    G = chosen[0][0].rollouts.group_size
    examples = [batch.examples[b] for batch, b in chosen]
    prompts = run.prompting.encode(policy, examples)     # already transformed: encoded as drawn
    rows = [(batch.rollouts, b * G + g) for batch, b in chosen for g in range(G)]
    width = max(r.completion_ids.shape[1] for r, _ in rows)
    ids = torch.stack([_pad(r.completion_ids[i], width, policy.pad_id) for r, i in rows])
    mask = torch.stack([_pad(r.completion_mask[i], width, 0) for r, i in rows])
    logp = None
    if all(r.sample_logprobs is not None for r, _ in rows):
        logp = torch.stack([_pad(r.sample_logprobs[i], width, 0.0) for r, i in rows])
    distinct = list({id(r): r for r, _ in rows}.values())    # the draws the groups come from
    stats = dict(distinct[0].stats)
    for key in ("rollout/tokens", "rollout/prefill_tokens", "rollout/placeholder_scrubbed",
                "rollout/time_s"):
        if key in stats:
            stats[key] = sum(r.stats.get(key, 0) for r in distinct)
    stats["rollout/truncated_frac"] = float(truncated_rows(ids, mask, policy.eos_ids).float().mean())
    for key in ("first_token_entropy", "token_entropy"):      # per-row tensors some shapers read
        if all(key in r.stats for r, _ in rows):
            parts = [r.stats[key][i] for r, i in rows]
            stats[key] = torch.stack(parts) if parts[0].dim() == 0 else \
                torch.stack([_pad(p, width, 0.0) for p in parts])
        else:
            stats.pop(key, None)
    rollouts = Rollouts(prompts=prompts, group_size=G, completion_ids=ids, completion_mask=mask,
                        sample_logprobs=logp, texts=[r.texts[i] for r, i in rows],
                        branch=[r.branch[i] for r, i in rows], stats=stats)
    return Drawn(examples, [batch.indices[b] for batch, b in chosen], rollouts,
                 Scores([batch.scores.parts[b] for batch, b in chosen]))


def _pad(row: torch.Tensor, width: int, value: float) -> torch.Tensor:
    return F.pad(row, (0, width - row.shape[0]), value=value)
