"""Cue-GRPO: rarity weights on positive advantages (docs/methods.md).

Shaper `cue_grpo`; off: not listed in `algo.shaping`.
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS

SHAPERS.register("cue_grpo", "mmrlvr.methods.cue_grpo.shaper:CueGRPO")
