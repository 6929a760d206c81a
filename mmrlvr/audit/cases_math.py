"""Case generators, part 1: the number and formula families (integer, decimal, fraction,
percent, expression, interval_set).  Imported by ``mmrlvr.audit.cases.generate_cases``."""

from __future__ import annotations

import random
from fractions import Fraction
from math import gcd

from mmrlvr.audit.cases_text import rewrites

# ---------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------


def _group3(digits: str, sep: str) -> str:
    out = []
    while len(digits) > 3:
        out.append(digits[-3:])
        digits = digits[:-3]
    out.append(digits)
    return sep.join(reversed(out))


def _int_item(rng: random.Random, i: int):
    k = i % 31  # magnitudes 10^0 .. 10^30
    v = rng.randint(10**k, 10 ** (k + 1) - 1)
    if i % 4 == 3:
        v = -v
    gold = str(v)
    sign = "-" if v < 0 else ""
    digits = str(abs(v))
    rw = rewrites(gold, textish=True)
    if abs(v) >= 1000:
        rw += [
            ("thousands_comma", sign + _group3(digits, ",")),
            ("thousands_brace", sign + _group3(digits, "{,}")),
            ("thousands_thinspace", sign + _group3(digits, "\\,")),
            ("thousands_in_dollars", f"${sign}{_group3(digits, '{,}')}$"),
        ]
    rw += [
        ("trailing_zero", gold + ".0"),
        ("trailing_zeros", gold + ".000"),
        ("frac_unreduced", f"{sign}\\frac{{{2 * abs(v)}}}{{2}}"),
        ("dfrac_unreduced", f"\\dfrac{{{3 * v}}}{{3}}"),
        ("tfrac_unreduced", f"\\tfrac{{{7 * v}}}{{7}}"),
        ("slash_unreduced", f"{5 * v}/5"),
        ("var_equals", f"x = {gold}"),
    ]
    if v > 0:
        rw.append(("plus_sign", "+" + gold))
    near = [
        ("plus_one", str(v + 1)),
        ("minus_one", str(v - 1)),
        ("sign_flip", str(-v)),
        ("times_ten", str(v * 10)),
        ("plus_one_thousands", ("-" if v + 1 < 0 else "") + _group3(str(abs(v + 1)), ",")),
        ("minus_one_boxed", f"\\boxed{{{v - 1}}}"),
        ("plus_one_frac", f"\\frac{{{2 * (v + 1)}}}{{2}}"),
        ("plus_one_trailing_zero", f"{v + 1}.0"),
    ]
    if abs(v) >= 10:
        near.append(("dropped_digit", sign + digits[:-1]))
    return gold, None, rw, near


def _fmt_dec(x: Fraction, places: int) -> str:
    sign = "-" if x < 0 else ""
    x = abs(x)
    scaled = x * 10**places
    assert scaled.denominator == 1
    n = scaled.numerator
    ip, fp = divmod(n, 10**places)
    return f"{sign}{ip}.{str(fp).zfill(places)}"


def _dec_item(rng: random.Random, i: int):
    places = 1 + i % 4
    k = i % 9  # integer part magnitude
    ip = 0 if i % 3 == 0 else rng.randint(10 ** (k - 1) if k else 1, 10**k)
    last = rng.randint(1, 9)
    fp = rng.randint(0, 10 ** (places - 1) - 1) * 10 + last
    x = Fraction(ip) + Fraction(fp, 10**places)
    if i % 5 == 4:
        x = -x
    gold = _fmt_dec(x, places)
    ulp = Fraction(1, 10**places)
    rw = rewrites(gold, textish=True) + [
        ("trailing_zero", gold + "0"),
        ("trailing_zeros", gold + "000"),
        ("frac_exact", ("-" if x < 0 else "") + f"\\frac{{{abs(x).numerator}}}{{{x.denominator}}}"),
        ("slash_exact", f"{x.numerator}/{x.denominator}"),
        ("frac_unreduced", f"\\dfrac{{{int(x * 10**places)}}}{{{10**places}}}"),
        ("sci_times", _sci(x, places)),
        ("var_equals", f"y = {gold}"),
    ]
    if abs(x) < 1:
        rw.append(("missing_leading_zero", gold.replace("0.", ".", 1)))
    near = [
        ("last_digit_plus", _fmt_dec(x + ulp, places)),
        ("last_digit_minus", _fmt_dec(x - ulp, places)),
        ("sign_flip", _fmt_dec(-x, places)),
        ("decimal_shift_left", _fmt_dec(x / 10, places + 1)),
        ("decimal_shift_right", _fmt_dec(x * 10, places)),
        ("inserted_zero", _fmt_dec(_insert_zero(x, places), places + 1)),
        ("plus_ulp_trailing_zero", _fmt_dec(x + ulp, places) + "0"),
    ]
    return gold, None, rw, near


def _sci(x: Fraction, places: int) -> str:
    mant = x * 10**places
    return f"{mant.numerator} \\times 10^{{-{places}}}"


def _insert_zero(x: Fraction, places: int) -> Fraction:
    # 3.25 -> 3.025 (a zero inserted right after the decimal point)
    sign = -1 if x < 0 else 1
    x = abs(x)
    ip = x.numerator // x.denominator
    return sign * (ip + (x - ip) / 10)


def _frac_item(rng: random.Random, i: int):
    while True:
        q = rng.randint(2, 10 ** (1 + i % 4))
        p = rng.randint(1, 3 * q)
        if gcd(p, q) == 1 and p != q:
            break
    neg = i % 3 == 2
    s = "-" if neg else ""
    v = Fraction(-p if neg else p, q)
    gold = f"{s}\\frac{{{p}}}{{{q}}}"
    rw = rewrites(gold) + [
        ("dfrac", f"{s}\\dfrac{{{p}}}{{{q}}}"),
        ("tfrac", f"{s}\\tfrac{{{p}}}{{{q}}}"),
        ("slash", f"{s}{p}/{q}"),
        ("slash_spaced", f"{s}{p} / {q}"),
        ("unreduced", f"{s}\\frac{{{3 * p}}}{{{3 * q}}}"),
        ("spaced_braces", f"{s}\\frac{{ {p} }}{{ {q} }}"),
        ("var_equals", f"x={gold}"),
    ]
    if neg:
        rw.append(("sign_inside", f"\\frac{{-{p}}}{{{q}}}"))
        rw.append(("sign_in_denominator", f"\\frac{{{p}}}{{-{q}}}"))
    if p < 10 and q < 10:
        rw.append(("short_frac", f"{s}\\frac{p}{q}"))
    qq = q
    for f in (2, 5):
        while qq % f == 0:
            qq //= f
    if qq == 1:
        places = 0
        while (v * 10**places).denominator != 1:
            places += 1
        rw.append(("terminating_decimal", _fmt_dec(v, places)))
        rw.append(("terminating_decimal_trailing_zero", _fmt_dec(v, places) + "0"))
    near = [
        ("swapped", f"{s}\\frac{{{q}}}{{{p}}}"),
        ("swapped_slash", f"{s}{q}/{p}"),
        ("numerator_plus_one", f"{s}\\frac{{{p + 1}}}{{{q}}}"),
        ("denominator_plus_one", f"{s}\\frac{{{p}}}{{{q + 1}}}"),
        ("sign_flip", f"{'' if neg else '-'}\\frac{{{p}}}{{{q}}}"),
        ("numerator_only", f"{s}{p}"),
    ]
    return gold, None, rw, near


def _percent_item(rng: random.Random, i: int):
    if i % 2:
        p = str(rng.randint(1, 10 ** (1 + i % 6)))
    else:
        p = f"{rng.randint(0, 99)}.{rng.randint(1, 9)}"
    gold = f"{p}\\%"
    rw = rewrites(gold, textish=False) + [
        ("plain_percent", f"{p}%"),
        ("percent_space", f"{p} %"),
        ("bare_number", p),
        ("trailing_zero", f"{p}.0\\%" if "." not in p else f"{p}0\\%"),
        ("text_percent", f"{p}\\text{{%}}"),
    ]
    pv = Fraction(p)
    up = pv + 1
    up_s = str(up.numerator) if up.denominator == 1 else _fmt_dec(up, 1)
    near = [
        ("plus_one", f"{up_s}\\%"),
        ("plus_one_plain", f"{up_s}%"),
        ("sign_flip", f"-{p}\\%"),
        ("times_ten", f"{_fmt_num(pv * 10)}\\%"),
    ]
    return gold, None, rw, near


def _fmt_num(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    places = 0
    while (x * 10**places).denominator != 1:
        places += 1
    return _fmt_dec(x, places)


# ---------------------------------------------------------------------------
# LaTeX expressions
# ---------------------------------------------------------------------------

_SQUAREFREE = (2, 3, 5, 6, 7, 10, 11, 13, 14, 15, 17, 19, 21, 22, 23)


def _expr_item(rng: random.Random, i: int):
    gold, rw, near = _EXPR_KINDS[i % len(_EXPR_KINDS)](rng)
    return gold, None, rewrites(gold) + rw, near


def _expr_root_coefficient(rng: random.Random):
    """a√b: the gold form, its rewrites, its near misses."""
    a = rng.randint(2, 12)
    b = rng.choice(_SQUAREFREE)
    gold = f"{a}\\sqrt{{{b}}}"
    rw = [
        ("spaced", f"{a} \\sqrt{{ {b} }}"),
        ("cdot", f"{a} \\cdot \\sqrt{{{b}}}"),
        ("commuted", f"\\sqrt{{{b}}} \\cdot {a}"),
        ("single_radical", f"\\sqrt{{{a * a * b}}}"),
        ("frac_unreduced", f"\\frac{{{2 * a}\\sqrt{{{b}}}}}{{2}}"),
        ("dfrac_unreduced", f"\\dfrac{{{3 * a}\\sqrt{{{b}}}}}{{3}}"),
        ("ascii_sqrt", f"{a}*sqrt({b})"),
    ]
    if b < 10:
        rw.append(("sqrt_no_braces", f"{a}\\sqrt {b}"))
    near = [
        ("coefficient_plus_one", f"{a + 1}\\sqrt{{{b}}}"),
        ("radicand_plus_one", f"{a}\\sqrt{{{b + 1}}}"),
        ("sign_flip", f"-{a}\\sqrt{{{b}}}"),
        ("coefficient_inside", f"\\sqrt{{{a * b}}}"),
        ("plus_one", f"{a}\\sqrt{{{b}}}+1"),
    ]
    return gold, rw, near


def _expr_pi_fraction(rng: random.Random):
    """kπ/m: the gold form, its rewrites, its near misses."""
    m = rng.randint(2, 12)
    k = rng.randint(1, 11)
    while gcd(k, m) != 1:
        k += 1
    kk = "" if k == 1 else str(k)
    gold = f"\\frac{{{kk}\\pi}}{{{m}}}"
    rw = [
        ("coefficient_outside", f"\\frac{{{k}}}{{{m}}}\\pi"),
        ("slash", f"{kk}\\pi/{m}"),
        ("dfrac", f"\\dfrac{{{kk}\\pi}}{{{m}}}"),
        ("tfrac", f"\\tfrac{{{kk} \\pi}}{{{m}}}"),
        ("pi_first", f"\\pi \\cdot \\frac{{{k}}}{{{m}}}"),
        ("unreduced", f"\\frac{{{2 * k}\\pi}}{{{2 * m}}}"),
        ("unicode_pi", f"{kk}π/{m}"),
    ]
    near = [
        ("coefficient_plus_one", f"\\frac{{{k + 1}\\pi}}{{{m}}}"),
        ("denominator_plus_one", f"\\frac{{{kk}\\pi}}{{{m + 1}}}"),
        ("missing_pi", f"\\frac{{{k}}}{{{m}}}"),
        ("sign_flip", f"-\\frac{{{kk}\\pi}}{{{m}}}"),
        ("reciprocal", f"\\frac{{{m}}}{{{kk}\\pi}}"),
    ]
    return gold, rw, near


def _expr_quadratic(rng: random.Random):
    """(x − r1)(x − r2) expanded: the gold form, its rewrites, its near misses."""
    r1 = rng.randint(-9, 9) or 1
    r2 = rng.randint(-9, 9) or -2
    if r1 + r2 == 0:
        r2 += 1 if r2 != -1 else 2
    b, c = -(r1 + r2), r1 * r2
    gold = f"x^2{_signed(b)}x{_signed(c)}"
    rw = [
        ("braced_exponent", f"x^{{2}}{_signed(b)}x{_signed(c)}"),
        ("reordered", f"{c}{_signed(b)}x+x^2"),
        ("spaced", f"x^2 {_signed(b, spaced=True)} x {_signed(c, spaced=True)}"),
        ("factored", f"(x{_signed(-r1)})(x{_signed(-r2)})"),
        ("cdot", f"x \\cdot x{_signed(b)} \\cdot x{_signed(c)}"),
        ("left_right", f"\\left(x{_signed(-r1)}\\right)\\left(x{_signed(-r2)}\\right)"),
    ]
    near = [
        ("constant_plus_one", f"x^2{_signed(b)}x{_signed(c + 1)}"),
        ("linear_sign_flip", f"x^2{_signed(-b)}x{_signed(c)}"),
        ("cubic", f"x^3{_signed(b)}x{_signed(c)}"),
        ("factor_sign_flip", f"(x{_signed(r1)})(x{_signed(-r2)})"),
        ("variable_renamed", f"y^2{_signed(b)}y{_signed(c)}"),
    ]
    return gold, rw, near


def _expr_root_fraction(rng: random.Random):
    """√a / b: the gold form, its rewrites, its near misses."""
    a = rng.choice(_SQUAREFREE)
    b = rng.randint(2, 9)
    gold = f"\\frac{{\\sqrt{{{a}}}}}{{{b}}}"
    rw = [
        ("slash", f"\\sqrt{{{a}}}/{b}"),
        ("coefficient_outside", f"\\frac{{1}}{{{b}}}\\sqrt{{{a}}}"),
        ("dfrac", f"\\dfrac{{\\sqrt{{{a}}}}}{{{b}}}"),
        ("rationalised_inverse", f"\\frac{{{a}}}{{{b}\\sqrt{{{a}}}}}"),
        ("single_radical", f"\\sqrt{{\\frac{{{a}}}{{{b * b}}}}}"),
    ]
    if a < 10:
        rw.append(("sqrt_no_braces", f"\\frac{{\\sqrt {a}}}{{{b}}}"))
    near = [
        ("swapped", f"\\frac{{{b}}}{{\\sqrt{{{a}}}}}"),
        ("radicand_plus_one", f"\\frac{{\\sqrt{{{a + 1}}}}}{{{b}}}"),
        ("denominator_plus_one", f"\\frac{{\\sqrt{{{a}}}}}{{{b + 1}}}"),
        ("missing_sqrt", f"\\frac{{{a}}}{{{b}}}"),
        ("sign_flip", f"-\\frac{{\\sqrt{{{a}}}}}{{{b}}}"),
    ]
    return gold, rw, near


def _expr_e_power(rng: random.Random):
    """e^k: the gold form, its rewrites, its near misses."""
    k = rng.randint(2, 9)
    gold = f"e^{{{k}}}"
    rw = [
        ("no_braces", f"e^{k}"),
        ("exp", f"\\exp({k})"),
        ("mathrm_e", f"\\mathrm{{e}}^{{{k}}}"),
        ("product", f"e^{{{k - 1}}} \\cdot e"),
        ("reciprocal_negative", f"\\frac{{1}}{{e^{{-{k}}}}}"),
    ]
    near = [
        ("exponent_plus_one", f"e^{{{k + 1}}}"),
        ("exponent_sign_flip", f"e^{{-{k}}}"),
        ("swapped", f"{k}^{{e}}"),
        ("product_not_power", f"{k}e"),
    ]
    return gold, rw, near


def _expr_power_of_two(rng: random.Random):
    """2^n: the gold form, its rewrites, its near misses."""
    n = rng.randint(3, 40)
    gold = f"2^{{{n}}}"
    rw = [
        ("value", str(2**n)),
        ("value_thousands", _group3(str(2**n), ",")),
        ("no_braces_if_short", f"2^{n}" if n < 10 else f"2^{{{n}}}"),
        ("power_of_four", f"4^{{{n // 2}}}" + ("\\cdot 2" if n % 2 else "")),
        ("product", f"2 \\cdot 2^{{{n - 1}}}"),
    ]
    near = [
        ("value_plus_one", str(2**n + 1)),
        ("value_minus_one", str(2**n - 1)),
        ("exponent_plus_one", f"2^{{{n + 1}}}"),
    ]
    if n**2 != 2**n:  # 2^4 == 4^2 is not a near miss
        near.append(("swapped", f"{n}^{{2}}"))
    return gold, rw, near


_EXPR_KINDS = (_expr_root_coefficient, _expr_pi_fraction, _expr_quadratic, _expr_root_fraction,
               _expr_e_power, _expr_power_of_two)
"""Item i is of kind i mod 6."""


def _signed(n: int, spaced: bool = False) -> str:
    sp = " " if spaced else ""
    return f"{sp}-{sp}{-n}" if n < 0 else f"{sp}+{sp}{n}"


def _interval_item(rng: random.Random, i: int):
    t = i % 4
    a = rng.randint(-20, 10)
    b = a + rng.randint(1, 15)
    if t == 0:  # finite interval
        lo, hi = rng.choice("(["), rng.choice(")]")
        gold = f"{lo}{a}, {b}{hi}"
        rw = [
            ("no_space", f"{lo}{a},{b}{hi}"),
            ("spaced", f"{lo} {a} , {b} {hi}"),
            ("left_right", f"\\left{lo}{a}, {b}\\right{hi}"),
            ("fraction_endpoint", f"{lo}\\frac{{{2 * a}}}{{2}}, {b}{hi}"),
        ]
        flip = {"(": "[", "[": "(", ")": "]", "]": ")"}
        near = [
            ("left_bracket_flip", f"{flip[lo]}{a}, {b}{hi}"),
            ("right_bracket_flip", f"{lo}{a}, {b}{flip[hi]}"),
            ("left_endpoint_minus_one", f"{lo}{a - 1}, {b}{hi}"),
            ("right_endpoint_plus_one", f"{lo}{a}, {b + 1}{hi}"),
            ("swapped_endpoints", f"{lo}{b}, {a}{hi}"),
        ]
    elif t == 1:  # half line
        lo = rng.choice("([")
        gold = f"{lo}{a}, \\infty)"
        rw = [
            ("no_space", f"{lo}{a},\\infty)"),
            ("plus_infinity", f"{lo}{a}, +\\infty)"),
            ("left_right", f"\\left{lo}{a}, \\infty\\right)"),
            ("unicode_infinity", f"{lo}{a}, ∞)"),
        ]
        near = [
            ("bracket_flip", f"{'[' if lo == '(' else '('}{a}, \\infty)"),
            ("endpoint_plus_one", f"{lo}{a + 1}, \\infty)"),
            ("other_side", f"(-\\infty, {a}{']' if lo == '[' else ')'}"),
            ("negated_endpoint", f"{lo}{-a if a else 1}, \\infty)"),
        ]
    elif t == 2:  # finite set
        elems = rng.sample(range(-30, 30), 3)
        es = [str(e) for e in elems]
        gold = "\\{" + ", ".join(es) + "\\}"
        perm = es[1:] + es[:1]
        rw = [
            ("reordered", "\\{" + ", ".join(perm) + "\\}"),
            ("no_space", "\\{" + ",".join(es) + "\\}"),
            ("left_right", "\\left\\{" + ", ".join(es) + "\\right\\}"),
            ("bare_list_reordered", ", ".join(reversed(es))),
            ("lbrace", "\\lbrace " + ", ".join(es) + " \\rbrace"),
        ]
        bumped = [es[0], es[1], str(elems[2] + 1)]
        extra = max(elems) + 1
        near = [
            ("element_plus_one", "\\{" + ", ".join(bumped) + "\\}"),
            ("missing_element", "\\{" + ", ".join(es[:2]) + "\\}"),
            ("extra_element", "\\{" + ", ".join(es + [str(extra)]) + "\\}"),
            (
                "element_sign_flip",
                "\\{" + ", ".join([es[0], es[1], str(-elems[2] if elems[2] else 31)]) + "\\}",
            ),
        ]
    else:  # union of two rays
        gold = f"(-\\infty, {a}) \\cup ({b}, \\infty)"
        rw = [
            ("swapped_order", f"({b}, \\infty) \\cup (-\\infty, {a})"),
            ("no_space", f"(-\\infty,{a})\\cup({b},\\infty)"),
            ("left_right", f"\\left(-\\infty, {a}\\right) \\cup \\left({b}, \\infty\\right)"),
            ("unicode_cup", f"(-∞, {a}) ∪ ({b}, ∞)"),
        ]
        near = [
            ("endpoint_plus_one", f"(-\\infty, {a + 1}) \\cup ({b}, \\infty)"),
            ("bracket_flip", f"(-\\infty, {a}] \\cup ({b}, \\infty)"),
            ("one_ray_only", f"(-\\infty, {a})"),
            ("cap_not_cup", f"(-\\infty, {a}) \\cap ({b}, \\infty)"),
        ]
    rw = rewrites(gold) + rw
    return gold, None, rw, near


GENERATORS = {
    "integer": _int_item,
    "decimal": _dec_item,
    "fraction": _frac_item,
    "percent": _percent_item,
    "expression": _expr_item,
    "interval_set": _interval_item,
}
