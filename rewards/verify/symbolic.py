"""Symbolic equality with bounds: two parsed formulas are equal only when sympy proves it.

High-precision evaluation at a few rational points only *rejects* quickly; acceptance needs the
difference to expand or simplify to exactly zero.  Every costly step is sized first (evaluation,
expansion, simplification, set pairing) and refused past its bound: the matchers here return
True, False, or None for ``TOO_COMPLEX``.
"""
from __future__ import annotations

from rewards.verify.bounds import (
    MAX_DIGITS,
    MAX_EXPAND_TERMS,
    MAX_SET_CHECKS,
    MAX_SIMPLIFY_FUNCS,
    MAX_SIMPLIFY_OPS,
    MAX_SYMBOLIC_OPS,
    Bounded,
    ParseError,
)
from rewards.verify.latex import get_sympy
from rewards.verify.structure import parse_expression, to_sympy_set

_PROBE_POINTS = ("7/5", "-13/11", "29/17")


def _evalf_is_cheap(d, subs) -> bool:
    """Whether ``d.evalf(subs=subs)`` stays cheap.

    sympy raises its working precision by the size of every exponent and function argument, so
    ``e^{e^{e^{x}}}`` would run for hours; each is evaluated (innermost first, at 15 digits)
    and must stay below ``10**MAX_DIGITS``.
    """
    sp = get_sympy()
    limit = sp.Float(10) ** MAX_DIGITS
    for node in sp.postorder_traversal(d):
        if node.is_Pow:
            args = () if node.exp.is_Integer else (node.exp,)
        elif isinstance(node, sp.Function):
            args = node.args
        else:
            continue
        for arg in args:
            if arg.is_Number and abs(arg) < limit:
                continue
            try:
                parts = arg.evalf(15, subs=subs).as_real_imag()
            except Exception:  # noqa: BLE001 - cannot size it: treat it as too big
                return False
            if not all(p.is_Number and p.is_finite and abs(p) < limit for p in parts):
                return False
    return True


def _expand_work(e) -> int:
    """About how many terms ``sympy.expand(e)`` forms: without this, ``(x+y+z+w+1)^{40}`` times
    anything would build 135,751 of them.  Products count their terms as expanded factor by
    factor, each result capped by the monomials its degrees allow; a function argument or a
    fractional power is expanded on its own and is one opaque variable outside."""
    work = [0]

    def size(e) -> tuple[int, dict]:  # (terms once expanded, degree of each variable)
        if e.is_Number:
            return 1, {}
        if e.is_Atom:
            return 1, {e: 1}
        if e.is_Add:
            parts = [size(a) for a in e.args]
            deg = {}
            for _, d in parts:
                for k, n in d.items():
                    deg[k] = max(deg.get(k, 0), n)
            return _capped(sum(t for t, _ in parts), deg), deg
        if e.is_Mul:
            terms, deg = 1, {}
            for a in e.args:
                t, d = size(a)
                for k, n in d.items():
                    deg[k] = deg.get(k, 0) + n
                work[0] += terms * t
                terms = _capped(terms * t, deg)
            return terms, deg
        if e.is_Pow and e.exp.is_Integer:
            t, d = size(e.base)
            n = abs(int(e.exp))
            deg = {k: n * m for k, m in d.items()}
            raw = 1
            for i in range(1, min(n, t - 1) + 1):  # C(n + t - 1, n) terms, counted up to the bound
                raw = raw * (n + t - 1 - min(n, t - 1) + i) // i
                if raw > MAX_EXPAND_TERMS:
                    break
            work[0] += raw
            return _capped(raw, deg), deg
        for a in e.args:
            size(a)
        return 1, {e: 1}

    size(e)
    return work[0]


def _capped(terms: int, deg: dict) -> int:
    """``terms``, or fewer: no more than the monomials of the given degrees."""
    bound = 1
    for n in deg.values():
        bound *= n + 1
        if bound >= terms:
            return terms
    return bound


def _too_heavy(d) -> bool:
    sp = get_sympy()
    for p in d.atoms(sp.Pow):
        e = p.exp
        if e.is_Integer and abs(e) > 40 and not (p.base.is_Atom):
            return True
    return False


# The matchers from here on return True, False, or None: not shown equal because a bound cut the
# check short (``TOO_COMPLEX``).  None is falsy, so it fails closed wherever it is tested.


def _scalar_eq(a, b) -> bool | None:
    sp = get_sympy()
    if a == b:
        return True
    if a.has(sp.oo, -sp.oo, sp.zoo, sp.nan) or b.has(sp.oo, -sp.oo, sp.zoo, sp.nan):
        return False
    d = a - b
    if d == 0:
        return True
    if d.is_Number:
        return False  # exact rational/integer arithmetic: nonzero number
    fs = d.free_symbols
    if len(fs) > 8 or sp.count_ops(d) > MAX_SYMBOLIC_OPS:
        return None
    subs = {s: sp.Rational(_PROBE_POINTS[k % 3]) + k for k, s in enumerate(sorted(fs, key=str))}
    if not _evalf_is_cheap(d, subs):
        return None
    # Cheap *rejection* by high-precision evaluation (never used to accept).
    try:
        if fs:
            v = d.evalf(40, subs=subs)
        else:
            v = d.evalf(40)
        if v.is_Number and v.is_finite and v != 0:
            if abs(v) > sp.Float("1e-25", 40):
                return False
        elif v.is_number and v.is_finite:
            re_, im_ = v.as_real_imag()
            if re_.is_Number and im_.is_Number and (abs(re_) > 1e-25 or abs(im_) > 1e-25):
                return False
    except Exception:  # noqa: BLE001, S110 - evaluation trouble only skips the shortcut
        pass
    if _too_heavy(d) or _expand_work(d) > MAX_EXPAND_TERMS:
        return None
    # Exact acceptance: the difference must simplify to exactly zero.
    if sp.expand(d) == 0:
        return True
    if sp.count_ops(d) > MAX_SIMPLIFY_OPS or len(d.atoms(sp.Function)) > MAX_SIMPLIFY_FUNCS:
        return None
    return sp.simplify(d) == 0


def _struct_eq(g, a) -> bool | None:
    kg, ka = g[0], a[0]
    if kg == "scalar" and ka == "scalar":
        return _scalar_eq(g[1], a[1])
    if kg == "eq" and ka == "eq":
        # lhs - rhs equal, or equal up to swapping the two sides
        same = _scalar_eq(g[1], a[1])
        if same:
            return True
        swapped = _scalar_eq(g[1], -a[1])
        return swapped if swapped or same is not None else None
    if kg == "seq" and ka == "seq":
        if (g[1], g[2]) != (a[1], a[2]) or len(g[3]) != len(a[3]):
            return False
        for x, y in zip(g[3], a[3]):
            same = _scalar_eq(x, y)
            if not same:
                return same
        return True
    if kg == "set" and ka == "set":
        ge, ae = _dedupe(g[1]), _dedupe(a[1])
        if len(ge) != len(ae):
            return False
        # identical elements pair off at once; the others greedily, at most MAX_SET_CHECKS
        # comparisons (each may evaluate numerically: 64 x 64 of them take seconds)
        gs, as_ = set(ge), set(ae)
        ge, ae = [x for x in ge if x not in as_], [y for y in ae if y not in gs]
        used = [False] * len(ae)
        checks = 0
        for x in ge:
            cut_short = False
            for j, y in enumerate(ae):
                if not used[j]:
                    checks += 1
                    if checks > MAX_SET_CHECKS:
                        return None
                    same = _scalar_eq(x, y)
                    if same:
                        used[j] = True
                        break
                    cut_short = cut_short or same is None
            else:
                return None if cut_short else False
        return True
    if "union" in (kg, ka):
        try:
            return to_sympy_set(g) == to_sympy_set(a)
        except ParseError:
            return False
    return False


def _dedupe(elems):
    out = []
    for e in elems:
        if not any(e == o for o in out):
            out.append(e)
    return out


def _resolve(x):
    return x() if callable(x) else parse_expression(x)


def match_symbolic(answer, gold) -> bool | None:
    """Exact symbolic comparison; bounded; never raises.

    ``answer`` and ``gold`` are each a math string (parsed with a cache) or a
    zero-argument callable returning an already parsed structure.
    """
    try:
        g = _resolve(gold)
    except (Bounded, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - fail closed
        return False
    try:
        a = _resolve(answer)
    except (Bounded, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - fail closed
        return False
    try:
        return _struct_eq(g, a)
    except (Bounded, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - fail closed
        return False
