"""OM-GRPO: answer-span gradient masking, with the consensus reward (docs/om_grpo.md).

Shaper `om_grpo`; off: not listed in `algo.shaping`.
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS

SHAPERS.register("om_grpo", "mmrlvr.methods.om_grpo.shaper:OMGRPO")
