"""A recursive-descent parser for a LaTeX math subset, into exact sympy objects.

Decimals become exact rationals, never floats.  Powers, factorials and binomials that would
build huge integers are refused while parsing (``Bounded``); anything outside the grammar
raises ``ParseError``.
"""
from __future__ import annotations

import math

from rewards.verify.bounds import MAX_DIGITS, MAX_EXPRESSION_DEPTH, MAX_FUNCTION_NESTING, Bounded, ParseError
from rewards.verify.latex import FUNC_NAMES, GREEK, Tok, get_sympy


class Parser:
    """Recursive-descent parser for a LaTeX math subset -> exact sympy."""

    def __init__(self, toks):
        self.t = toks
        self.i = 0
        self.sp = get_sympy()

    # -- token helpers ---------------------------------------------------
    def peek(self, k=0):
        j = self.i + k
        return self.t[j] if j < len(self.t) else None

    def at(self, text, kind=None):
        t = self.peek()
        return t is not None and t.text == text and (kind is None or t.kind == kind)

    def eat(self, text):
        t = self.peek()
        if t is None or t.text != text:
            raise ParseError(f"expected {text!r}")
        self.i += 1
        return t

    def done(self):
        return self.i >= len(self.t)

    # -- grammar -----------------------------------------------------------
    def expr(self):
        sp = self.sp
        terms = []
        sign = 1
        if self.at("-"):
            self.i += 1
            sign = -1
        elif self.at("+"):
            self.i += 1
        terms.append(sign * self.term())
        while True:
            t = self.peek()
            if t is None:
                break
            if t.text == "+" and t.kind == "chr":
                self.i += 1
                terms.append(self.term())
            elif t.text == "-" and t.kind == "chr":
                self.i += 1
                terms.append(-self.term())
            else:
                break
        return sp.Add(*terms) if len(terms) > 1 else terms[0]

    def term(self):
        sp = self.sp
        num = [self.unary()]
        den = []
        while True:
            t = self.peek()
            if t is None:
                break
            if t.kind == "chr" and t.text == "*" or t.kind == "cmd" and t.text in ("\\cdot", "\\times"):
                self.i += 1
                num.append(self.unary())
            elif t.kind == "chr" and t.text == "/" or t.kind == "cmd" and t.text == "\\div":
                self.i += 1
                den.append(self.unary())
            elif self._starts_implicit(t):
                prev_tok = self.t[self.i - 1] if self.i else None
                if prev_tok is not None and prev_tok.kind == "num" and t.text == "\\frac":
                    raise ParseError("mixed number is ambiguous")
                num.append(self.power())
            else:
                break
        out = sp.Mul(*num) if len(num) > 1 else num[0]
        for d in den:
            if d == 0:
                raise ParseError("division by zero")
            out = out / d
        return out

    def _starts_implicit(self, t):
        if t.kind in ("letter", "word"):
            return True
        if t.kind == "num":
            return False
        if t.kind == "cmd":
            return (
                t.text in ("\\pi", "\\sqrt", "\\frac", "\\infty", "\\binom", "\\lfloor", "\\lceil")
                or t.text[1:] in FUNC_NAMES
                or t.text[1:] in GREEK
            )
        return t.text in ("(",) or (t.text == "{" and t.kind == "chr")

    def unary(self):
        if self.at("-", "chr"):
            self.i += 1
            return -self.unary()
        if self.at("+", "chr"):
            self.i += 1
            return self.unary()
        return self.power()

    def power(self):
        base = self.postfix()
        if self.at("^", "chr"):
            self.i += 1
            exp = self.exponent()
            return self._pow(base, exp)
        return base

    def exponent(self):
        if self.at("-", "chr"):
            self.i += 1
            return -self.exponent()
        return self.arg()

    def _pow(self, base, exp):
        sp = self.sp
        if base.is_Number and exp.is_Number:
            if exp.is_Rational and base.is_Rational:
                if base == 0 and exp.is_negative:
                    raise ParseError("0 to a negative power")
                ab = abs(base)
                if ab not in (0, 1):
                    lg = abs(math.log10(abs(ab.p)) if ab.p else 0) + abs(math.log10(ab.q))
                    if abs(float(exp)) * max(lg, 0.31) > MAX_DIGITS:
                        raise Bounded("huge power")
        elif exp.is_Number and exp.is_Integer and abs(exp) > 1000:
            raise Bounded("huge exponent")
        return sp.Pow(base, exp)

    def postfix(self):
        x = self.primary()
        while self.at("!", "chr"):
            self.i += 1
            if x.is_Integer and x > 1000:
                raise Bounded("huge factorial")
            x = self.sp.factorial(x)
        return x

    def group(self):
        """``{ expr }``"""
        self.eat("{")
        e = self.expr()
        self.eat("}")
        return e

    def arg(self):
        """A TeX macro argument: ``{...}`` or one token (one digit)."""
        t = self.peek()
        if t is None:
            raise ParseError("missing argument")
        if t.kind == "chr" and t.text == "{":
            return self.group()
        if t.kind == "num":
            self.i += 1
            if len(t.text) > 1:
                # \frac12 -> 1 then 2: split off the first digit
                self.t.insert(self.i, Tok("num", t.text[1:]))
                return self.sp.Integer(int(t.text[0])) if t.text[0].isdigit() else self._number(t.text)
            return self._number(t.text)
        if t.kind in ("letter",):
            self.i += 1
            return self._symbol(t.text)
        if t.kind == "cmd":
            return self.primary()
        if t.kind == "chr" and t.text == "(":  # sqrt(2), ASCII style
            return self.primary()
        raise ParseError("bad argument")

    def _number(self, text):
        if len(text) > MAX_DIGITS:
            raise Bounded("long number")
        return self.sp.Rational(text)

    def _symbol(self, name):
        sp = self.sp
        if self.at("_", "chr"):
            self.i += 1
            t = self.peek()
            if t is None:
                raise ParseError("bad subscript")
            if t.kind == "chr" and t.text == "{":
                j = self.i + 1
                parts = []
                while j < len(self.t) and not (self.t[j].kind == "chr" and self.t[j].text == "}"):
                    parts.append(self.t[j].text)
                    j += 1
                if j >= len(self.t):
                    raise ParseError("bad subscript")
                self.i = j + 1
                sub = "".join(parts)
            else:
                self.i += 1
                sub = t.text
            return sp.Symbol(f"{name}_{sub}")
        if name == "e":
            return sp.E
        if name == "i":
            return sp.I
        return sp.Symbol(name)

    def primary(self):
        sp = self.sp
        t = self.peek()
        if t is None:
            raise ParseError("unexpected end")
        k, x = t.kind, t.text
        if k == "num":
            self.i += 1
            return self._number(x)
        if k == "letter":
            self.i += 1
            return self._symbol(x)
        if k == "chr":
            if x == "(":
                self.i += 1
                e = self.expr()
                self.eat(")")
                return e
            if x == "{":
                return self.group()
            if x == "[":
                self.i += 1
                e = self.expr()
                self.eat("]")
                return e
            if x == "|":
                self.i += 1
                e = self.expr()
                self.eat("|")
                return sp.Abs(e)
            raise ParseError(f"unexpected {x!r}")
        if k == "cmd":
            self.i += 1
            name = x[1:]
            if name == "pi":
                return sp.pi
            if name == "infty":
                return sp.oo
            if name == "frac":
                a = self.arg()
                b = self.arg()
                if b == 0:
                    raise ParseError("division by zero")
                return a / b
            if name == "binom":
                a = self.arg()
                b = self.arg()
                if a.is_Integer and abs(a) > 10000:
                    raise Bounded("huge binomial")
                return sp.binomial(a, b)
            if name == "sqrt":
                if self.at("[", "chr"):
                    self.i += 1
                    n = self.expr()
                    self.eat("]")
                    return sp.root(self.arg(), n)
                return sp.sqrt(self.arg())
            if name in ("lfloor", "lceil"):
                e = self.expr()
                self.eat("\\rfloor" if name == "lfloor" else "\\rceil")
                return sp.floor(e) if name == "lfloor" else sp.ceiling(e)
            if name in GREEK:
                return self._symbol(name)
            if name in FUNC_NAMES:
                return self._func(name)
            if name == "exp":
                return self._func(name)
            raise ParseError(f"unsupported command {x}")
        raise ParseError("unexpected token")

    def _func(self, name):
        sp = self.sp
        base = None
        power = None
        if name == "log" and self.at("_", "chr"):
            self.i += 1
            base = self.arg()
        if self.at("^", "chr"):
            self.i += 1
            power = self.exponent()
        t = self.peek()
        if t is not None and t.kind == "chr" and t.text == "(":
            self.i += 1
            a = self.expr()
            self.eat(")")
        else:
            a = self.power()
        f = {
            "sin": sp.sin,
            "cos": sp.cos,
            "tan": sp.tan,
            "cot": sp.cot,
            "sec": sp.sec,
            "csc": sp.csc,
            "arcsin": sp.asin,
            "arccos": sp.acos,
            "arctan": sp.atan,
            "sinh": sp.sinh,
            "cosh": sp.cosh,
            "tanh": sp.tanh,
            "ln": sp.log,
            "exp": sp.exp,
        }.get(name)
        if name == "log":
            out = sp.log(a, base) if base is not None else sp.log(a)
        else:
            out = f(a)
        if power is not None:
            if power == -1 and name in ("sin", "cos", "tan"):
                raise ParseError("ambiguous inverse")
            out = self._pow(out, power)
        return out


def parse_scalar(toks):
    if not toks:
        raise ParseError("empty")
    p = Parser(toks)
    e = p.expr()
    if not p.done():
        raise ParseError(f"trailing tokens at {p.peek()!r}")
    depth, functions = _shape(e)
    if depth > MAX_EXPRESSION_DEPTH or functions > MAX_FUNCTION_NESTING:
        raise Bounded("formula nests too deep")
    return e


def _shape(e) -> tuple[int, int]:
    """(depth of the sympy tree ``e``, deepest nesting of functions and non-integer powers)."""
    if e.is_Atom:
        return 0, 0
    inner = [_shape(a) for a in e.args]
    own = e.is_Function or (e.is_Pow and not e.exp.is_Integer)
    return 1 + max(d for d, _ in inner), own + max(f for _, f in inner)
