"""GAPO: an adaptive clip per completion, ε_i = ε₀(1 + κ|A_i|) (docs/methods.md).

Shaper `gapo` (`algo.shaping: [{name: gapo, kappa: 0.5}]`); off: not listed.
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS

SHAPERS.register("gapo", "mmrlvr.methods.gapo.shaper:GAPO")
