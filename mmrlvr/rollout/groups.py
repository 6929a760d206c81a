"""Sampled groups of a starting model, as the mechanism checks draw them (`mmrlvr check-method`):
G completions of each row from the hf engine, with the check's prompting, temperature and
length, torch seeded first so a check repeats exactly."""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.rollout import SamplingParams, make_engine


def sample_groups(policy: Any, options: Any, rows: list[Any], batch: int) -> list[Any]:
    """`options.group` completions of each row (`options`: a `CheckOptions`), `batch` prompts a
    generate call: one `Rollouts` per call, in row order."""
    engine = make_engine("hf", policy, None)
    params = SamplingParams(n=options.group, max_new_tokens=options.max_new_tokens,
                            temperature=options.temperature)
    torch.manual_seed(options.seed)
    return [engine.generate(options.prompting.encode(policy, rows[start:start + batch]), params)
            for start in range(0, len(rows), batch)]
