"""Metamorphic cases for verifiers: rewrites and near misses of gold answers, by construction.

Used by ``mmrlvr audit-verifier`` (``mmrlvr.audit.run``), ``tests/test_verify_metamorphic.py``,
``tests/test_verify.py`` and ``bench/verify.py``.  The families are built in ``cases_math.py``
(numbers, formulas) and ``cases_text.py`` (choice, yes/no, text, and the wrappers every
family shares).

Every generated :class:`Case` is a (gold, prediction) pair whose expected
verdict is known *by construction*: a *rewrite* is the gold answer changed in a
meaning-preserving way (must be accepted), a *near miss* is a different answer
close to the gold (must be rejected).  Cases come per answer family (``FAMILIES``)
and carry the name of the rewrite / near-miss kind, so a failure names both.

    >>> cases = generate_cases(n_per_family=5, seed=0)
    >>> {c.family for c in cases} == set(FAMILIES)
    True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mmrlvr.audit import cases_math as math_families
from mmrlvr.audit import cases_text as text_families

__all__ = [
    "COMPLETION_STYLES",
    "FAMILIES",
    "FAST_FAMILIES",
    "Case",
    "generate_cases",
    "wrap_completion",
]

FAMILIES = (
    "integer",
    "decimal",
    "fraction",
    "percent",
    "expression",
    "interval_set",
    "choice",
    "yesno",
    "text",
)

#: Families whose checks must never touch sympy (the fast path).
FAST_FAMILIES = ("integer", "decimal", "fraction", "percent", "choice", "yesno", "text")


@dataclass(frozen=True)
class Case:
    family: str
    kind: str  # name of the rewrite or of the near miss
    gold: str
    pred: str
    expect: bool  # True: rewrite (accept); False: near miss (reject)
    choices: tuple | None = None

    @property
    def group(self) -> str:
        """``family/rewrite/kind`` or ``family/near/kind``."""
        return f"{self.family}/{'rewrite' if self.expect else 'near'}/{self.kind}"


_GENERATORS = {**math_families.GENERATORS, **text_families.GENERATORS}


def generate_cases(n_per_family: int = 20, seed: int = 0, families=None) -> list:
    """``n_per_family`` gold answers per family, each with all its rewrites and
    near misses.  Deterministic for a given seed.  For ``integer``, item ``i``
    has magnitude ``10**(i % 31)``, so ``n_per_family >= 31`` covers 10^0..10^30.
    """
    out = []
    for fam in families or FAMILIES:
        rng = random.Random(f"{seed}:{fam}")
        gen = _GENERATORS[fam]
        for i in range(n_per_family):
            gold, choices, rw, near = gen(rng, i)
            for k, pred in rw:
                out.append(Case(fam, k, gold, pred, True, choices))
            for k, pred in near:
                if pred.strip() == gold.strip():  # pragma: no cover - construction guard
                    continue
                out.append(Case(fam, k, gold, pred, False, choices))
    return out


# ---------------------------------------------------------------------------
# completions (for extraction)
# ---------------------------------------------------------------------------

COMPLETION_STYLES = {
    "answer_tag": lambda p: f"<answer>{p}</answer>",
    "think_answer_tag": lambda p: (
        "<think>Let me work through it. Maybe the answer is 7? No, check again."
        f"</think>\n<answer>{p}</answer>"
    ),
    "boxed_sentence": lambda p: f"Step 1: simplify.\nSo the result is $\\boxed{{{p}}}$.",
    "answer_is": lambda p: f"We reason step by step.\nThe answer is {p}.",
}


def wrap_completion(pred: str, style: str) -> str:
    """A model completion whose final answer is ``pred``, in ``style``."""
    return COMPLETION_STYLES[style](pred)
