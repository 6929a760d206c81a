"""StructReward: structured step rewards (docs/structreward.md).

Step alignment against reference steps, the gated reward (`steps.py`, reward `struct_steps`) and
rollout recycling as an auxiliary supervised loss (`recycling.py`, objective `recycling`), and
the check at data load of how far the reference reasoning can score (`reference_check.py`;
`check.py` runs it as `mmrlvr check-method structreward`), the
recycled comparison / self-correction tasks (`tasks.py`, recycling `form: tasks`) and the
reflection rewrite (`reflection.py`, objective `reflection`). Off:
neither named in the config.
"""
from __future__ import annotations

from mmrlvr.core.registry import METHOD_CHECKS
from mmrlvr.objectives import OBJECTIVES
from rewards import DATA_CHECKS, REWARDS

REWARDS.register("struct_steps", "mmrlvr.methods.structreward.steps:StructStepsReward")
OBJECTIVES.register("recycling", "mmrlvr.methods.structreward.recycling:Recycling")
DATA_CHECKS.register("struct_steps", "mmrlvr.methods.structreward.reference_check:check_reference_steps")
OBJECTIVES.register("reflection", "mmrlvr.methods.structreward.reflection:Reflection")
METHOD_CHECKS.register("structreward", "mmrlvr.methods.structreward.check:check")
