"""``match`` / ``match_outcome``: an answer against a gold, by the gold's kind."""
from __future__ import annotations

import re
from fractions import Fraction

from rewards.verify.bounds import TOO_COMPLEX, Bounded, GoldMissing
from rewards.verify.choice import match_choice
from rewards.verify.kinds import check_gold, gold_spec
from rewards.verify.latex import canon_latex, get_sympy
from rewards.verify.numbers import Num, num_eq, parse_number, strip_var_prefix
from rewards.verify.strings import check_size, looks_like_math, norm_text, squeeze_space, unwrap, yesno_word
from rewards.verify.symbolic import match_symbolic


def match(answer: str | None, gold: str, choices: list[str] | None = None) -> bool:
    """Whether ``answer`` is a correct answer for ``gold`` (see ``rewards.verify``)."""
    return match_outcome(answer, gold, choices) == "match"


def match_outcome(answer: str | None, gold: str, choices: list[str] | None = None) -> str:
    """``"match"``, ``"no_match"``, or ``TOO_COMPLEX`` (a bound cut the check short; no match)."""
    try:
        kind, payload = gold_spec(check_gold(gold), tuple(choices) if choices else None)
    except GoldMissing:
        return "no_match"  # a bad row must not stop a run: it scores 0 (rows are checked when loaded)
    except Bounded:
        return TOO_COMPLEX
    if answer is None or not isinstance(answer, str) or not answer.strip():
        return "no_match"
    try:
        check_size(answer, "answer")
        ok = _match_kind(squeeze_space(answer), kind, payload)
    except Bounded:
        ok = None
    if ok:
        return "match"
    return TOO_COMPLEX if ok is None else "no_match"


def _match_kind(answer: str, kind: str, payload) -> bool | None:
    if kind == "number":
        return _match_number(answer, payload)
    if kind == "choice":
        return match_choice(answer, payload[0], payload[1])
    if kind == "yesno":
        return yesno_word(answer) == payload
    if kind == "expression":
        return _match_expression(answer, payload)
    norm, raw = payload
    return norm_text(answer) == norm if norm else unwrap(answer).strip().casefold() == raw


def _rational_struct(v: Fraction):
    return lambda: ("scalar", get_sympy().Rational(v.numerator, v.denominator))


_HAS_DIGIT_OR_CMD_RE = re.compile(r"[\d\\]")


def _match_number(answer: str, gnum: Num) -> bool | None:
    a = unwrap(answer)
    anum = parse_number(a)
    if anum is not None:
        # ``50%`` / ``50\\%`` / ``50``: the numbers in front of the sign compare
        return num_eq(gnum, anum)
    # Not a plain literal.  A rational gold can only equal something that has a
    # digit or a command in it (letters alone are variables/e/pi/i).
    a = strip_var_prefix(a)
    if not _HAS_DIGIT_OR_CMD_RE.search(a) or "%" in a or not looks_like_math(a):
        return False
    v = gnum.value
    if not isinstance(v, Fraction):
        return None
    return match_symbolic(a, _rational_struct(v))


def _match_expression(answer: str, gold_expr: str) -> bool | None:
    a = strip_var_prefix(unwrap(answer))
    if not a:
        return False
    if canon_latex(a) == canon_latex(gold_expr):
        return True
    anum = parse_number(a)
    if anum is not None:
        # a plain number (thousands separators etc. read exactly) vs a formula
        if anum.percent:
            return False
        if not isinstance(anum.value, Fraction):
            return None  # past MAX_DIGITS / MAX_DECIMAL_EXPONENT: never turned into a sympy number
        return match_symbolic(_rational_struct(anum.value), gold_expr)
    return match_symbolic(a, gold_expr)
