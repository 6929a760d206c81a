"""GMTS: the top tokens of a completion by a gradient proxy carry its advantage (docs/methods.md).

Shaper `gmts`; `check.py`: `mmrlvr check-method gmts` (the kept-token fraction on the starting
model's groups, and how far the kept tokens' H·|A| stands above all tokens'); off: not listed in
`algo.shaping`.
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS
from mmrlvr.core.registry import METHOD_CHECKS

SHAPERS.register("gmts", "mmrlvr.methods.gmts.shaper:GMTS")
METHOD_CHECKS.register("gmts", "mmrlvr.methods.gmts.check:check")
