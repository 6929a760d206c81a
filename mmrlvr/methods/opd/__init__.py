"""OPD-then-RL: on-policy distillation as a stage before GRPO (docs/opd.md).

The objective `opd` (`loss.py`): the student samples, the teacher's per-token reverse KL on
those tokens is the loss. `mmrlvr opd CONFIG` (`stage.py`, `cli.py`) runs it as a stage with
the rewards weighted 0, evaluates every `opd.eval_every` steps, switches to GRPO when the
validation score stops improving or reaches `opd.threshold`, and continues with GRPO from the
best checkpoint. Off: `mmrlvr train` (no stage), and `opd` not in `objectives`.
"""
from __future__ import annotations

from mmrlvr.objectives import OBJECTIVES

OBJECTIVES.register("opd", "mmrlvr.methods.opd.loss:OPDLoss")
