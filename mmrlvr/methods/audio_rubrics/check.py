"""AudioRubrics' mechanism check (`mmrlvr check-method audio_rubrics`): do the rubric criteria
spread the scores of the starting model's groups?

(Not `checks.py`, which holds the rubrics' own machine checks: the claims a reasoning makes.)

GRPO reads a reward only through its spread within a group: a criterion every completion meets,
or none does, adds the same to every member and moves no advantage, and the reward drops it
(`reward.evolve`: zero spread, not kept). The check samples G completions per audio question from
the starting model (the HF engine, clean, as `om_grpo`'s check), scores every group with the
reward itself (`AudioRubricsReward`, the offline path: `writer: rules`, `judge: rule`, no network;
`--option` sets its other options, e.g. `top_k=3`), and reads the reward's audit records (every
group's criteria with their verdicts and σ_k, and its rubric reward R_rubric). Figures: the share
of criteria whose verdicts differ within their group (σ_k > 0), the share of groups whose R_rubric
has spread, its mean within-group σ, the share of groups scored by the static fallback, and the
share of groups where R_rubric spreads but accuracy does not (there the rubric term is the group's
only signal). Inactive when no row has audio, or either share is under its floor.
"""
from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mmrlvr.config import ConfigError
from mmrlvr.core.method_check import CheckContext, CheckResult

CRITERION_FLOOR = 0.2
"""Share of judged criteria whose verdicts differ within their group under which AudioRubrics is
inactive (our choice): a sample carries up to five templated criteria (`static_rubrics`), so under
one in five splitting a group, a typical group has none to keep and R_rubric is the flat 0.5."""
GROUP_FLOOR = 0.25
"""Share of groups whose rubric reward has spread under which AudioRubrics is inactive (our
choice): the term moves advantages only in those groups, and with under one in four the run is,
in the other three, the accuracy-and-format reward alone."""
ROWS = 16
"""Audio rows read by default (`--rows 0`)."""
BATCH = 4
"""Prompts per generate call."""
OFFLINE = ("writer", "judge")
"""Reward options the check keeps at their offline defaults (`rules` / `rule`): no network."""


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def reward_of(options: dict[str, Any], log_path: Path) -> Any:
    """The reward on its offline path, auditing every group to `log_path`."""
    from mmrlvr.methods.audio_rubrics.reward import AudioRubricsReward
    from mmrlvr.methods.audio_rubrics.roles import is_rules

    online = {k: options[k] for k in OFFLINE if k in options and not is_rules(options[k])}
    if online:
        raise ConfigError(f"check-method audio_rubrics measures the offline rule path; drop "
                          f"--option {', '.join(f'{k}={v}' for k, v in online.items())}")
    return AudioRubricsReward(**{**options, "log_path": str(log_path)})


def figures_of(records: list[dict[str, Any]]) -> dict[str, float]:
    """The spread figures from the reward's audit records, one per group."""
    criteria = [r.get("std", 0.0) or 0.0 for rec in records for r in rec["rubrics"]]
    spreads = [_std(rec["rubric_reward"]) for rec in records]
    acc = [_std([float(c) for c in rec["correct"]]) for rec in records]
    n = len(records)
    ratio = lambda a, b: round(a / b, 4) if b else 0.0  # noqa: E731
    return {"groups": float(n), "criteria": float(len(criteria)),
            "criterion_split_frac": ratio(sum(s > 0 for s in criteria), len(criteria)),
            "group_spread_frac": ratio(sum(s > 0 for s in spreads), n),
            "rubric_std_mean": ratio(sum(spreads), n),
            "rubric_only_frac": ratio(sum(s > 0 and a == 0 for s, a in zip(spreads, acc)), n),
            "fallback_frac": ratio(sum(rec.get("source") == "static_fallback" for rec in records), n),
            "accuracy": ratio(sum(sum(map(float, rec["correct"])) for rec in records),
                              sum(len(rec["correct"]) for rec in records))}


def measure(examples: Sequence[Any], groups: list[list[str]],
            options: dict[str, Any] | None = None) -> dict[str, float]:
    """Score `groups` (one list of completions per example) with the reward and read its spread."""
    with tempfile.TemporaryDirectory(prefix="audio-rubrics-check-") as tmp:
        log = Path(tmp) / "rubrics.jsonl"
        reward_of(dict(options or {}), log).score_groups(list(examples), groups)
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] \
            if log.is_file() else []
    return figures_of(records)


def verdict(figures: dict[str, float]) -> tuple[str, str]:
    """(`active`/`inactive`, why) from `measure`'s figures."""
    if not figures.get("groups", 0.0):
        return "inactive", "no row has audio: there is no group for the rubrics to score"
    split, spread = figures["criterion_split_frac"], figures["group_spread_frac"]
    if split < CRITERION_FLOOR:
        return "inactive", (f"only {split:.3f} of criteria split their group (< {CRITERION_FLOOR}): "
                            "every completion meets or misses the same criteria")
    if spread < GROUP_FLOOR:
        return "inactive", (f"only {spread:.3f} of groups have a rubric reward with spread "
                            f"(< {GROUP_FLOOR}): the rubric term moves almost no advantage")
    return "active", (f"{split:.3f} of criteria split their group (>= {CRITERION_FLOOR}) and "
                      f"{spread:.3f} of groups have rubric-reward spread (>= {GROUP_FLOOR})")


def check(ctx: CheckContext) -> CheckResult:
    """Sample the starting model's groups on the first audio rows and measure the criterion spread."""
    from mmrlvr.rollout import SamplingParams, make_engine

    opts = ctx.options
    rows = [ex for ex in ctx.rows(ROWS) if ex.audios]
    groups: list[list[str]] = []
    if rows:
        policy = ctx.policy("audio_rubrics")
        engine = make_engine("hf", policy, None)
        params = SamplingParams(n=opts.group, max_new_tokens=opts.max_new_tokens,
                                temperature=opts.temperature)
        torch.manual_seed(opts.seed)
        for start in range(0, len(rows), BATCH):
            texts = engine.generate(opts.prompting.encode(policy, rows[start:start + BATCH]),
                                    params).texts
            groups += [texts[g:g + opts.group] for g in range(0, len(texts), opts.group)]
    figures = measure(rows, groups, opts.method) if rows else figures_of([])
    figures["rows"] = float(len(rows))
    state, why = verdict(figures)
    return CheckResult("audio_rubrics", state, why, figures,
                       {"criterion_split_frac": CRITERION_FLOOR, "group_spread_frac": GROUP_FLOOR})
