"""GMTS: the top tokens of a completion by a gradient proxy carry its advantage (docs/methods.md).

Shaper `gmts`; off: not listed in `algo.shaping`.
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS

SHAPERS.register("gmts", "mmrlvr.methods.gmts.shaper:GMTS")
