"""OM-GRPO: answer-span gradient masking, with the consensus reward (docs/om_grpo.md).

Shaper `om_grpo`; `check.py`: `mmrlvr check-method om_grpo` (the starting model's majority-vote
accuracy, which the gold-free premise needs above 0.5); off: not listed in `algo.shaping`.
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS
from mmrlvr.core.registry import METHOD_CHECKS

SHAPERS.register("om_grpo", "mmrlvr.methods.om_grpo.shaper:OMGRPO")
METHOD_CHECKS.register("om_grpo", "mmrlvr.methods.om_grpo.check:check")
