"""OPDVR: a ReLU-gated on-policy distillation reward from a teacher (docs/opdvr.md).

Shaper `opdvr`; off: not listed in `algo.shaping`.
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS

SHAPERS.register("opdvr", "mmrlvr.methods.opdvr.shaper:OPDVR")
