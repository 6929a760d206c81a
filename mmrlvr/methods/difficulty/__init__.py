"""Difficulty-aware prompt sampling (docs/difficulty_sampling.md).

Sampler `difficulty` (`train.sampler: difficulty`, options in `train.sampler_options`); off:
`train.sampler: uniform`, the seeded permutations.
"""
from __future__ import annotations

from mmrlvr.train.sampler import SAMPLERS

SAMPLERS.register("difficulty", "mmrlvr.methods.difficulty.sampler:build")
