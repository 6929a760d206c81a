"""Numbers, compared exactly and without sympy: integers, decimals, fractions, percentages.

Literals become ``fractions.Fraction`` (or, past ``MAX_DECIMAL_EXPONENT``, ``decimal.Decimal``)
built from their strings: never a float, never a tolerance.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from rewards.verify.bounds import MAX_DECIMAL_EXPONENT, MAX_DIGITS
from rewards.verify.strings import unwrap

_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
NUM_RE = re.compile(_NUM + r"\Z")
_THOUSANDS_RE = re.compile(r"([+-]?)(\d{1,3}(?:,\d{3})+)(\.\d+)?\Z")
_SCI_RE = re.compile(
    r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*\\?(?:times|cdot|\*|x)\s*10\s*\^\s*(?:\{\s*([+-]?\d+)\s*\}|([+-]?\d))\Z"
)
_FRAC_RE = re.compile(
    r"([+-]?)\s*\\[dt]?frac\s*(?:\{\s*(" + _NUM + r")\s*\}|(\d))\s*(?:\{\s*(" + _NUM + r")\s*\}|(\d))\Z"
)
_SLASH_RE = re.compile(r"(" + _NUM + r")\s*/\s*(" + _NUM + r")\Z")
_PERCENT_RE = re.compile(r"(?:\\?%|\\text\{\s*\\?%\s*\}|\s*percent)\Z")
_DEGREE_RE = re.compile(r"\s*(?:\^\s*\{?\s*\\circ\s*\}?|\\degree|\^\s*\{\s*o\s*\})\Z")
_CURRENCY_RE = re.compile(r"\A\\?\$\s*")
_VAR_PREFIX_RE = re.compile(r"\A\s*[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*(?:=|\\in\b)\s*(?=\S)")
_SPACING_CMD_RE = re.compile(r"\\[,;:! ]")


def strip_var_prefix(s: str) -> str:
    """``x = 5`` -> ``5``, ``x \\in [0, 1]`` -> ``[0, 1]`` (single-letter variable)."""
    if "=" not in s and "\\in" not in s:
        return s
    m = _VAR_PREFIX_RE.match(s)
    if m and "=" not in s[m.end() :]:
        return unwrap(s[m.end() :])
    return s


def _dec(lit: str) -> Fraction | Decimal:
    d = Decimal(lit)
    exp = d.as_tuple().exponent
    if isinstance(exp, int) and -MAX_DECIMAL_EXPONENT <= exp <= MAX_DECIMAL_EXPONENT:
        if len(d.as_tuple().digits) > MAX_DIGITS:
            return d
        return Fraction(d)
    return d  # astronomically large/small: keep as Decimal (compared exactly)


class Num:
    """An exact number with an optional percent sign."""

    __slots__ = ("percent", "value")

    def __init__(self, value, percent=False):
        self.value = value
        self.percent = percent

    def __repr__(self):  # pragma: no cover - debugging aid
        return f"Num({self.value!r}, percent={self.percent})"


def parse_number(s: str) -> Num | None:
    """Exact value of a plain numeric literal, or ``None``.  Never uses floats."""
    if not s or len(s) > MAX_DIGITS + 64:
        return None
    s = s.strip()
    if "=" in s:
        s = strip_var_prefix(s)
    percent = False
    if "%" in s or "percent" in s:
        t = _PERCENT_RE.sub("", s)
        if t != s:
            percent = True
            s = unwrap(t)
    if "circ" in s or "degree" in s or "{o}" in s:
        s = _DEGREE_RE.sub("", s).strip()
    if s[:1] in "\\$" and s:
        s = _CURRENCY_RE.sub("", s)
    if "\\" in s:
        if "{,}" in s or "\\," in s:
            s = s.replace("{,}", ",").replace("\\,", ",")
        if "\\left" in s:
            s = s.replace("\\left", "").replace("\\right", "")
        s = _SPACING_CMD_RE.sub("", s)
    s = s.strip()
    if not s:
        return None
    try:
        if NUM_RE.match(s):
            return Num(_dec(s), percent)
        if "," in s:
            m = _THOUSANDS_RE.match(s)
            if m:
                return Num(_dec(m.group(1) + m.group(2).replace(",", "") + (m.group(3) or "")), percent)
            s2 = s.replace("{,}", ",")
            m = _THOUSANDS_RE.match(s2)
            if m:
                return Num(_dec(m.group(1) + m.group(2).replace(",", "") + (m.group(3) or "")), percent)
            return None
        if "frac" in s:
            m = _FRAC_RE.match(s)
            if m:
                num = _dec(m.group(2) or m.group(3))
                den = _dec(m.group(4) or m.group(5))
                if not isinstance(num, Fraction) or not isinstance(den, Fraction) or den == 0:
                    return None
                v = num / den
                return Num(-v if m.group(1) == "-" else v, percent)
            return None
        if "/" in s:
            m = _SLASH_RE.match(s)
            if m:
                num, den = _dec(m.group(1)), _dec(m.group(2))
                if not isinstance(num, Fraction) or not isinstance(den, Fraction) or den == 0:
                    return None
                return Num(num / den, percent)
            return None
        if "10" in s:
            m = _SCI_RE.match(s)
            if m:
                exp = int(m.group(2) or m.group(3))
                if abs(exp) > MAX_DECIMAL_EXPONENT:
                    return Num(Decimal(m.group(1)).scaleb(exp), percent)
                return Num(_dec(m.group(1)) * Fraction(10) ** exp, percent)
    except (InvalidOperation, ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def num_eq(a: Num, b: Num) -> bool | None:
    x, y = a.value, b.value
    if type(x) is type(y):
        return x == y
    # Fraction vs (huge-exponent) Decimal: equal only if both are Decimal-
    # representable; a bounded Fraction cannot equal an astronomically
    # large/small Decimal, and comparing would build giant integers.
    return None
