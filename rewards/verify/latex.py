"""The LaTeX front end of the symbolic path: sympy (imported on first use), tokens, spellings.

``tokenize`` turns a formula into ``Tok``s for ``parser.Parser``; ``canon_latex`` is the
whitespace- and spelling-insensitive string form every formula is compared by first.
"""
from __future__ import annotations

import re
import threading

from rewards.verify.bounds import ParseError
from rewards.verify.numbers import NUM_RE
from rewards.verify.strings import clean_unicode

_sp = None
_sp_lock = threading.Lock()


def get_sympy():
    global _sp
    if _sp is None:
        with _sp_lock:
            if _sp is None:
                import sympy

                _sp = sympy
    return _sp


_TOKEN_RE = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(\\[A-Za-z]+|\\.)|([A-Za-z]+)|(\S))")
FUNC_NAMES = frozenset("sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh ln log exp".split())
GREEK = frozenset(
    (
        "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu "
        "xi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma "
        "Upsilon Phi Psi Omega"
    ).split()
)
_DROP_CMDS = frozenset(
    (
        "left right big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr displaystyle textstyle , ; : "
        "! quad qquad limits nolimits"
    ).split()
)
_PREP_SUBS = (
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("\\dbinom", "\\binom"),
    ("\\tbinom", "\\binom"),
    ("\\lbrace", "\\{"),
    ("\\rbrace", "\\}"),
    ("\\leqslant", "\\le"),
    ("\\geqslant", "\\ge"),
    ("\\leq", "\\le"),
    ("\\geq", "\\ge"),
    ("\\varnothing", "\\emptyset"),
    ("\\infin", "\\infty"),
    ("\\left.", ""),
    ("\\right.", ""),
    ("\\lvert", "|"),
    ("\\rvert", "|"),
    ("\\vert", "|"),
)
_CANON_WS_RE = re.compile(r"\s+|\\[,;:! ]|\\quad|\\qquad|\\left|\\right|\\displaystyle")


def canon_latex(s: str) -> str:
    """A whitespace/spelling-insensitive form of a LaTeX string."""
    for a, b in _PREP_SUBS:
        if a in s:
            s = s.replace(a, b)
    s = _CANON_WS_RE.sub("", s)
    if "{,}" in s:
        s = s.replace("{,}", ",")
    return s


class Tok:
    __slots__ = ("kind", "text")

    def __init__(self, kind, text):
        self.kind = kind  # 'num', 'cmd', 'word', 'letter', 'chr'
        self.text = text

    def __repr__(self):  # pragma: no cover
        return f"{self.kind}:{self.text}"


_WORD_ALIASES = {
    "pi": ("cmd", "\\pi"),
    "sqrt": ("cmd", "\\sqrt"),
    "inf": ("cmd", "\\infty"),
    "infty": ("cmd", "\\infty"),
    "infinity": ("cmd", "\\infty"),
    "oo": ("cmd", "\\infty"),
}


_BRACE_PAYLOAD_RE = re.compile(r"\s*\{([^{}]*)\}")


def tokenize(s: str) -> list:
    toks = []
    pos = 0
    n = len(s)
    while pos < n:
        m = _TOKEN_RE.match(s, pos)
        if not m:
            break
        pos = m.end()
        num, cmd, word, ch = m.groups()
        if num is not None:
            toks.append(Tok("num", num))
        elif cmd is not None:
            name = cmd[1:]
            if name in _DROP_CMDS:
                continue
            if name in ("operatorname", "mathrm", "text", "textrm", "mathit", "mathbf", "textbf", "mbox"):
                # \operatorname{sin} / \mathrm{e} / \text{ } -> payload if harmless
                m2 = _BRACE_PAYLOAD_RE.match(s, pos)
                if not m2:
                    raise ParseError(cmd)
                payload = m2.group(1).strip()
                pos = m2.end()
                if not payload:
                    continue
                if payload in FUNC_NAMES:
                    toks.append(Tok("cmd", "\\" + payload))
                elif len(payload) == 1 and payload.isalpha():
                    toks.append(Tok("letter", payload))
                elif NUM_RE.match(payload):
                    toks.append(Tok("num", payload))
                else:
                    raise ParseError("text in formula")
                continue
            toks.append(Tok("cmd", cmd))
        elif word is not None:
            lw = word
            if lw in _WORD_ALIASES:
                k, t = _WORD_ALIASES[lw]
                toks.append(Tok(k, t))
            elif lw in FUNC_NAMES:
                toks.append(Tok("cmd", "\\" + lw))
            else:
                if len(lw) > 4:
                    raise ParseError("word in formula")
                for c in lw:
                    toks.append(Tok("letter", c))
        else:
            toks.append(Tok("chr", ch))
    return toks


_OPEN = frozenset(("(", "[", "{", "\\{", "\\langle"))
_CLOSE = frozenset((")", "]", "}", "\\}", "\\rangle"))


def is_open(t):
    return t.text in _OPEN and t.kind in ("chr", "cmd")


def is_close(t):
    return t.text in _CLOSE and t.kind in ("chr", "cmd")


_DEG_ANY_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree")


def canon_for_parse(s: str) -> str:
    s = clean_unicode(s)
    for a, b in _PREP_SUBS:
        if a in s:
            s = s.replace(a, b)
    if "circ" in s or "degree" in s:
        s = _DEG_ANY_RE.sub("", s)
    if "{,}" in s:
        s = s.replace("{,}", "")  # 1{,}000 inside a formula is a thousands separator
    return s.strip()
