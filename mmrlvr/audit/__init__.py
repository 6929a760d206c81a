"""Verifier audit: metamorphic testing of a reward or verifier (`mmrlvr audit-verifier`).

`cases` (with `cases_math`, `cases_text`) builds (gold, prediction) pairs whose verdict is known
by construction: meaning-preserving rewrites of the gold (must be accepted) and near misses (must
be rejected), per answer family. `run` puts them through any reward — ours, math-verify, or a
user's `file.py:function` — and reports acceptance per family, errors apart from rejections, and
off-by-one acceptance by magnitude. Importing this package imports only the case generators.
"""
from mmrlvr.audit.cases import (
                                COMPLETION_STYLES,
                                FAMILIES,
                                FAST_FAMILIES,
                                Case,
                                generate_cases,
                                wrap_completion,
)

__all__ = ["COMPLETION_STYLES", "FAMILIES", "FAST_FAMILIES", "Case", "generate_cases",
           "wrap_completion"]
