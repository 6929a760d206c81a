"""The research methods, one folder each, on a floor above the GRPO core (docs/methods.md).

A method reaches the core only through the hooks the core defines, each a registry the core
reads by name from the config:

| hook | registry | config key |
|---|---|---|
| rollout branching | `mmrlvr.rollout.base.BRANCHINGS` | `rollout.branching.kind` |
| reward | `rewards.REWARDS` | `rewards[].name` |
| advantage shaping / token credit | `mmrlvr.algo.shaping.SHAPERS` | `algo.shaping[].name` |
| auxiliary objective | `mmrlvr.objectives.OBJECTIVES` | `objectives[].name` |
| prompt sampler | `mmrlvr.train.sampler.SAMPLERS` | `train.sampler` |
| prompt transform | `mmrlvr.core.prompting.PROMPT_TRANSFORMS` | `data.prompt_transforms[].name` |

Importing this package imports every method's `__init__`, which registers its plug-ins (as lazy
`"module:attribute"` strings: nothing heavy loads until a run names it). The core's registries
import this package the first time they are asked for a name they do not hold
(`mmrlvr.core.registry.PLUGINS`). A method imports the core and no other method;
tests/test_architecture.py checks both walls.
"""
from __future__ import annotations

from mmrlvr.methods import (audio_rubrics, cliff, cue_grpo, difficulty, gapo, gmts,  # noqa: F401
                            ncgrpo, om_grpo, opd, opdvr, pirl, structreward, transanytext)

METHODS = ("ncgrpo", "pirl", "structreward", "audio_rubrics", "transanytext", "gapo", "cue_grpo",
           "gmts", "om_grpo", "opdvr", "opd", "cliff", "difficulty")
"""Every method folder, in docs/methods.md's order."""
