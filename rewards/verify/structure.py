"""The shapes an answer formula takes: scalar, tuple/interval, set, union, ``a \\pm b``, equation.

``parse_expression`` (cached) splits a formula at its top-level commas, ``\\cup``, ``\\pm``
and ``=`` and parses each piece with ``parser.parse_scalar``.
"""
from __future__ import annotations

import functools

from rewards.verify.bounds import MAX_ELEMENTS, MAX_EXPRESSION_DEPTH, MAX_SYMBOLIC_CHARS, Bounded, ParseError
from rewards.verify.latex import Tok, canon_for_parse, get_sympy, is_close, is_open, tokenize
from rewards.verify.parser import parse_scalar


def _split_top(toks, sep_pred):
    """Split a token list on separators at bracket depth 0."""
    parts, cur, depth = [], [], 0
    for t in toks:
        if is_open(t):
            depth += 1
        elif is_close(t):
            depth -= 1
        if depth == 0 and sep_pred(t):
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    parts.append(cur)
    return parts


def _close_index(toks, i):
    depth = 0
    for j in range(i, len(toks)):
        if is_open(toks[j]):
            depth += 1
        elif is_close(toks[j]):
            depth -= 1
            if depth == 0:
                return j
    return -1


def _is_comma(t):
    return t.kind == "chr" and t.text == ","


def _parse_structure(toks):
    """-> ('scalar', e) | ('seq', open, close, elems) | ('set', elems) | ('union', sympy_set)
    | ('eq', lhs - rhs)."""
    if not toks:
        raise ParseError("empty")
    parts = _split_top(toks, lambda t: t.kind == "cmd" and t.text == "\\cup")
    if len(parts) > 1:
        sp = get_sympy()
        sets = []
        for p in parts:
            sets.append(to_sympy_set(_parse_structure(p)))
        return ("union", sp.Union(*sets))
    pm = [i for i, t in enumerate(toks) if t.kind == "cmd" and t.text in ("\\pm", "\\mp")]
    if pm:
        # a \pm b -> the two-element set {a + b, a - b}
        if len(pm) > 1:
            raise ParseError("several \\pm")
        i = pm[0]
        plus = toks[:i] + [Tok("chr", "+")] + toks[i + 1 :]
        minus = toks[:i] + [Tok("chr", "-")] + toks[i + 1 :]
        return ("set", (parse_scalar(plus), parse_scalar(minus)))
    sides = _split_top(toks, lambda t: t.kind == "chr" and t.text == "=")
    if len(sides) == 2:
        return ("eq", parse_scalar(sides[0]) - parse_scalar(sides[1]))
    if len(sides) > 2:
        raise ParseError("chained equation")
    first, last = toks[0], toks[-1]
    if first.kind == "cmd" and first.text == "\\emptyset" and len(toks) == 1:
        return ("set", ())
    if first.text == "\\{" and last.text == "\\}" and _close_index(toks, 0) == len(toks) - 1:
        inner = toks[1:-1]
        if not inner:
            return ("set", ())
        elems = _split_top(inner, _is_comma)
        if len(elems) > MAX_ELEMENTS:
            raise Bounded("too many elements")
        return ("set", tuple(parse_scalar(e) for e in elems))
    if (
        first.text in ("(", "[", "\\langle")
        and last.text in (")", "]", "\\rangle")
        and _close_index(toks, 0) == len(toks) - 1
    ):
        elems = _split_top(toks[1:-1], _is_comma)
        if len(elems) > 1:
            if len(elems) > MAX_ELEMENTS:
                raise Bounded("too many elements")
            return ("seq", first.text, last.text, tuple(parse_scalar(e) for e in elems))
    elems = _split_top(toks, _is_comma)
    if len(elems) > 1:
        if len(elems) > MAX_ELEMENTS:
            raise Bounded("too many elements")
        return ("set", tuple(parse_scalar(e) for e in elems))
    return ("scalar", parse_scalar(toks))


def to_sympy_set(st):
    sp = get_sympy()
    kind = st[0]
    if kind == "set":
        return sp.FiniteSet(*st[1])
    if kind == "union":
        return st[1]
    if kind == "seq" and len(st[3]) == 2 and st[1] in "([" and st[2] in ")]":
        a, b = st[3]
        if a.is_extended_real is False or b.is_extended_real is False:
            raise ParseError("complex interval")
        return sp.Interval(a, b, left_open=st[1] == "(", right_open=st[2] == ")")
    if kind == "scalar":
        return sp.FiniteSet(st[1])
    raise ParseError("not a set")


@functools.lru_cache(maxsize=16384)
def parse_expression(s: str):
    """Parse an (unwrapped) math string to a structure; raises on failure."""
    s = canon_for_parse(s)
    if len(s) > MAX_SYMBOLIC_CHARS:
        raise Bounded("input too long")
    toks = tokenize(s)
    depth = 0
    for t in toks:  # refused before sympy builds anything
        if is_open(t):
            depth += 1
            if depth > MAX_EXPRESSION_DEPTH:
                raise Bounded("brackets nest too deep")
        elif is_close(t):
            depth -= 1
    return _parse_structure(toks)
