"""StructReward: structured step rewards (docs/structreward.md).

Step alignment against reference steps, the gated reward (`steps.py`, reward `struct_steps`) and
rollout recycling as an auxiliary supervised loss (`recycling.py`, objective `recycling`). Off:
neither named in the config.
"""
from __future__ import annotations

from mmrlvr.objectives import OBJECTIVES
from rewards import REWARDS

REWARDS.register("struct_steps", "mmrlvr.methods.structreward.steps:StructStepsReward")
OBJECTIVES.register("recycling", "mmrlvr.methods.structreward.recycling:Recycling")
