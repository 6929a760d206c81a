"""Cliff: first-mistake token advantages (docs/cliff.md).

Shaper `cliff`; off: not listed in `algo.shaping`. `check.py`: `mmrlvr check-method cliff` (where
the starting model's wrong completions have their cliffs, by the shaper's own judge).
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS
from mmrlvr.core.registry import METHOD_CHECKS

SHAPERS.register("cliff", "mmrlvr.methods.cliff.shaper:Cliff")
METHOD_CHECKS.register("cliff", "mmrlvr.methods.cliff.check:check")
