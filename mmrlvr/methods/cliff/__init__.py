"""Cliff: first-mistake token advantages (docs/cliff.md).

Shaper `cliff`; off: not listed in `algo.shaping`.
"""
from __future__ import annotations

from mmrlvr.algo.shaping import SHAPERS

SHAPERS.register("cliff", "mmrlvr.methods.cliff.shaper:Cliff")
