"""String normalisation shared by every kind: Unicode, brace pairing, outer wrappers, free text.

``unwrap`` strips what means nothing around an answer (spaces, ``$...$``, ``\\boxed{}``,
``\\text{}``, markdown); ``norm_text`` reduces free text to its words; ``looks_like_math`` tells
a formula from prose.  Brace scans are one pass of one regex, linear however the braces nest.
"""
from __future__ import annotations

import re
import unicodedata

from rewards.verify.bounds import MAX_ANSWER_CHARS, MAX_BRACE_DEPTH, MAX_SPACE_RUN, Bounded

_UNICODE_MAP = {
    "\u2212": "-",  # minus sign
    "\u2013": "-",  # en dash
    "\u2014": "-",
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
    "\u200b": "",
    "\u00d7": "\\times ",
    "\u22c5": "\\cdot ",
    "\u00b7": "\\cdot ",
    "\u03c0": "\\pi ",
    "\u221e": "\\infty ",
    "\u221a": "\\sqrt",
    "\u2264": "\\le ",
    "\u2265": "\\ge ",
    "\u00b0": "^\\circ",
    "\u222a": "\\cup ",
    "\u2205": "\\emptyset ",
}
_UNICODE_TRANS = str.maketrans(_UNICODE_MAP)
_ASCII_RE = re.compile(r"[\x00-\x7f]*\Z")


def clean_unicode(s: str) -> str:
    if _ASCII_RE.match(s):
        return s
    s = unicodedata.normalize("NFKC", s.translate(_UNICODE_TRANS))
    return s


# A brace, or an escape that hides one (``\{``, ``\}``, ``\\``): scanning these tokens left to
# right reads braces as TeX does while stepping over everything else in C.
_BRACE_TOKEN_RE = re.compile(r"\\[\\{}]|[{}]")


def closing_braces(s: str, opens: set | None, start: int) -> dict:
    """``{i: j}``: the ``}`` at ``j`` closes the ``{`` at ``i``, for each ``i`` in ``opens``
    (every ``{`` if None).

    One left-to-right scan from ``start`` (an unescaped ``{``), so finding every box of a
    completion is linear in its length however the boxes nest.
    """
    out, stack = {}, []
    for m in _BRACE_TOKEN_RE.finditer(s, start):
        if m.group() == "{":
            stack.append(m.start())
        elif m.group() == "}" and stack:
            i = stack.pop()
            if opens is None or i in opens:
                out[i] = m.start()
    return out


def _too_deep(s: str) -> bool:
    """Whether unescaped ``{}`` in ``s`` nest deeper than ``MAX_BRACE_DEPTH``."""
    if s.count("{") <= MAX_BRACE_DEPTH:
        return False
    depth = 0
    for m in _BRACE_TOKEN_RE.finditer(s):
        if m.group() == "{":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return True
        elif m.group() == "}" and depth:
            depth -= 1
    return False


def check_size(s: str, what: str) -> None:
    """Raise ``Bounded`` when ``s`` is past ``MAX_ANSWER_CHARS`` or ``MAX_BRACE_DEPTH``."""
    if len(s) > MAX_ANSWER_CHARS:
        raise Bounded(f"{what}: {len(s)} characters > MAX_ANSWER_CHARS={MAX_ANSWER_CHARS}")
    if _too_deep(s):
        raise Bounded(f"{what}: braces nest deeper than MAX_BRACE_DEPTH={MAX_BRACE_DEPTH}")


_LONG_SPACE_RE = re.compile(r"(\s{%d})\s+" % MAX_SPACE_RUN)


def squeeze_space(s: str) -> str:
    """``s`` with every whitespace run cut to ``MAX_SPACE_RUN`` characters."""
    return _LONG_SPACE_RE.sub(r"\1", s) if len(s) > MAX_SPACE_RUN else s


_WRAP_CMD_RE = re.compile(
    r"\\(?:boxed|fbox|text|textbf|textit|textrm|textsf|texttt|textnormal|mathrm|"
    r"mathbf|mathit|mathsf|mathtt|mathnormal|mbox|hbox|operatorname|emph|bm|"
    r"boldsymbol)\s*\{"
)
# The trailing run of spaces, ``.``, ``;`` and TeX spacing (``\,``, ``\quad``...), matched at the
# start of the *reversed* string: ``(?:...)+\Z`` searched forwards retries every start inside a
# long run (quadratic); anchored on the reversed string it is one greedy pass.  Two-character
# tokens come first, so ``x\;`` loses both characters, as the forward search strips them.
_TRAIL_PUNCT_REV_RE = re.compile(r"(?:dauqq\\|dauq\\|[,;:! ]\\|\s|[.;])+")
_LEAD_SPACE_RE = re.compile(r"\A(?:\s|\\[,;:! ]|\\quad|\\qquad)+")
_DISPLAYSTYLE_RE = re.compile(r"\\(?:displaystyle|textstyle)\b\s*")


def unwrap(s: str) -> str:
    """Strip meaning-free outer wrappers, repeatedly, from an answer string."""
    s = clean_unicode(s)
    if "\\displaystyle" in s or "\\textstyle" in s:
        s = _DISPLAYSTYLE_RE.sub("", s)
    # Every step cuts s at its ends, so s is always base[lo:lo + len(s)] and one brace scan of
    # base (on the first wrapper command) answers "does this { close at the end?" for every layer.
    base, lo, closes = s, 0, None
    prev = None
    while s != prev:
        prev = s
        m = _TRAIL_PUNCT_REV_RE.match(s[::-1])
        if m:
            s = s[: len(s) - m.end()]
        m = _LEAD_SPACE_RE.match(s)
        if m:
            lo += m.end()
            s = s[m.end() :]
        n = len(s)
        if n < 2:
            break
        a, z = s[0], s[-1]
        if a == "$" and z == "$":
            if s.startswith("$$") and s.endswith("$$") and n >= 4 and "$" not in s[2:-2]:
                lo += 2
                s = s[2:-2]
                continue
            if "$" not in s[1:-1]:
                lo += 1
                s = s[1:-1]
                continue
        if a == "\\" and n >= 4:
            if (s.startswith("\\(") and s.endswith("\\)") and "\\(" not in s[2:-2]) or (
                s.startswith("\\[") and s.endswith("\\]") and "\\[" not in s[2:-2]
            ):
                lo += 2
                s = s[2:-2]
                continue
            m = _WRAP_CMD_RE.match(s)
            if m:
                if closes is None:
                    closes = closing_braces(base, None, 0)
                if closes.get(lo + m.end() - 1) == lo + n - 1:
                    lo += m.end()
                    s = s[m.end() : -1]
                    continue
        if a == z and a in "*_`" and (a != "_" or n > 2):      # **x**, __x__, `x`
            t = s.strip(a)
            if t and a not in t:
                lo += n - len(s.lstrip(a))
                s = t
                continue
        if a == '"' and z == '"' and n > 2 and '"' not in s[1:-1]:
            lo += 1
            s = s[1:-1]
            continue
    return s


_INNER_WRAP_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textsf|texttt|textnormal|mathrm|mathbf|mathit|"
    r"mathsf|mathtt|mbox|hbox|emph|boxed)\s*\{([^{}]*)\}"
)


def strip_inner_wrappers(s: str) -> str:
    prev = None
    while prev != s and "\\" in s:
        prev = s
        s = _INNER_WRAP_RE.sub(r"\1", s)
    return s


# -- free text: yes/no words, normalised prose, math or prose -----------------------------------

_YES = frozenset(("yes", "true"))
_NO = frozenset(("no", "false"))
_YESNO_WORDS = _YES | _NO

# punctuation -> space, except a sign/decimal point/comma that belongs to a number
_PUNCT_TO_SPACE = re.compile(r"(?:[\s;:!?()\[\]{}*_~`\"\\/|<>]|[.,](?!\d)|(?<!\d)[.,]|-(?![\d.]))+")
_APOSTROPHE_RE = re.compile(r"['\u2018\u2019\u02bc]")
_ARTICLES = frozenset(("a", "an", "the"))


def norm_text(s: str) -> str:
    """Normalise free text: wrappers, case, punctuation, articles, spacing."""
    s = unwrap(s)
    if "\\" in s:
        s = strip_inner_wrappers(s)
        s = s.replace("\\%", "%").replace("\\$", "$").replace("\\&", "&")
    s = _APOSTROPHE_RE.sub("", s.casefold())
    words = _PUNCT_TO_SPACE.sub(" ", s).split()
    return " ".join(w for w in words if w not in _ARTICLES)


def yesno_word(s: str) -> str | None:
    w = norm_text(s)
    return w if w in _YESNO_WORDS else None


_MATH_WORDS = frozenset(
    (
        "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh ln log exp sqrt pi inf infty "
        "oo cdot times frac dfrac tfrac left right mathrm text sqrt circ le ge leq geq lt gt ne neq "
        "cup cap emptyset varnothing in pm mp div binom theta alpha beta gamma delta phi mu lambda "
        "sigma omega tau rho epsilon varepsilon varphi psi chi eta zeta xi nu kappa iota Delta "
        "Gamma Theta Lambda Sigma Phi Omega Pi Psi dbinom mathbf quad qquad displaystyle boxed"
    ).split()
)
_ALPHA_RUN_RE = re.compile(r"[A-Za-z]+")
_MATHY_CHARS_RE = re.compile(r"[\d\\^_=+*/(){}\[\]<>|]")


_LATEX_CMD_RE = re.compile(
    r"\\(?!(?:text|textbf|textit|textrm|textsf|texttt|textnormal|mbox|hbox|emph)\b)[A-Za-z]+"
)


def looks_like_math(s: str) -> bool:
    """Heuristic: is ``s`` (already unwrapped) a formula rather than prose?"""
    if "\\" in s and _LATEX_CMD_RE.search(s):
        return True  # LaTeX math commands / environments: never prose
    first = {}  # where each 2-3 letter string first occurs in s (so far): s.find, kept linear
    for m in _ALPHA_RUN_RE.finditer(s):
        w = m.group()
        if len(w) < 2:
            continue
        # prose words make it text, unless a math word (sqrt, pi, ...) or a
        # run of single-letter variables such as ``xy`` in ``2xy``
        if w not in _MATH_WORDS and not _is_variable_run(w, s, first.get(w, m.start())):
            return False
        for k in (2, 3):
            for j in range(len(w) - k + 1):
                first.setdefault(w[j : j + k], m.start() + j)
    return bool(_MATHY_CHARS_RE.search(s)) or len(s.strip()) == 1


def _is_variable_run(w: str, s: str, i: int) -> bool:
    # a short all-lowercase run directly attached to a digit/operator, e.g. 2xy
    # (judged where ``w`` first occurs in ``s``, at ``i``)
    if len(w) > 3 or not w.islower():
        return False
    before = s[i - 1] if i > 0 else " "
    after = s[i + len(w)] if i + len(w) < len(s) else " "
    return (before.isdigit() or before in "^_+-*/(){}=") or (after in "^_+-*/(){}=")
