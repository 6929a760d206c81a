"""PIRL: prompt-invariant RLVR (docs/pirl.md).

A trinary reward (`reward.py`, reward `pirl`: 1 correct and well formatted, an annealed middle
value for correct content in a broken format, 0 wrong) and an adversarial consistency objective
(`consistency.py`, objective `pirl_consistency`: KL between the policy on the prompt and on the
prompt with its instruction-token embeddings perturbed), trained over a pool of prompt templates
(`data.templates`). `check.py`: `mmrlvr check-method pirl` (how often a template swap changes the
starting model's greedy answer). Off: neither named in the config.
"""
from __future__ import annotations

from mmrlvr.core.registry import METHOD_CHECKS
from mmrlvr.objectives import OBJECTIVES
from rewards import REWARDS

REWARDS.register("pirl", "mmrlvr.methods.pirl.reward:PirlReward")
OBJECTIVES.register("pirl_consistency", "mmrlvr.methods.pirl.consistency:PirlConsistency")
METHOD_CHECKS.register("pirl", "mmrlvr.methods.pirl.check:check")
