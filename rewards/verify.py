"""Answer extraction and exact answer matching for every accuracy reward.

Every accuracy reward in this project goes through this module.  It is built to
be *trustworthy*: a gold answer rewritten in a meaning-preserving way must be
accepted, and a near miss must be rejected, at every magnitude.

Public API
==========

``extract_answer(text: str) -> str | None``
    The final answer in a model completion, in this order of preference:

    1. the content of the last ``<answer>...</answer>`` block (if that content
       holds ``\\boxed{...}``, the boxed content);
    2. otherwise the last ``\\boxed{...}`` (nested braces handled; ``\\fbox``
       too);
    3. otherwise the last "the answer is X" / "final answer: X" sentence.

    Returns ``None`` (fail closed) when there is no answer, when it is empty or
    whitespace only, when the final answer is ambiguous (two different
    ``\\boxed{}`` in the final answer span, or "A or B" between two different
    atomic answers such as letters, numbers, yes/no or formulas), when the last
    ``<answer>`` tag is never closed, or when the last ``\\boxed{`` is never
    closed (truncated generation); and when the completion or its answer is
    past a bound (see below).

``extract_outcome(text: str) -> tuple[str | None, str]``
    ``(extract_answer(text), outcome)``: outcome ``"answer"``, ``"no_answer"``,
    or ``TOO_COMPLEX`` (``"too_complex"``: a bound cut the extraction short).

``match(answer: str | None, gold: str, choices: list[str] | None = None) -> bool``
    Whether ``answer`` is a correct answer for ``gold``.  ``match(None, gold)``
    is ``False``; so is any match against a missing or empty gold (``None``,
    ``""``, ``"$$"``): a bad row scores 0 mid-run instead of stopping it, and
    is counted in ``gold_missing`` (rows are meant to be rejected when loaded:
    ``detect_kind`` raises ``ValueError`` for them).  The kind of comparison
    comes from the gold (see ``detect_kind``):

    * ``"number"`` - integers, decimals, scientific notation, fractions
      (``\\frac``/``\\dfrac``/``\\tfrac``/``a/b``), percentages.  Compared
      *exactly* (``decimal.Decimal`` / ``fractions.Fraction`` built from the
      literal strings): there is no tolerance, so ``10**20`` and ``10**20 + 1``
      differ, ``3/4`` and ``4/3`` differ.  An answer that is not a plain
      number (``2^{10}``, ``\\sqrt{4}``) is compared symbolically.
    * ``"expression"`` - LaTeX / plain math: ``\\sqrt{2}``, ``2\\pi``,
      ``x^2+1``, tuples, intervals, sets (``\\{1,2\\}``), unions
      (``\\cup``), bare comma lists (unordered), ``a \\pm b`` (the set
      ``{a+b, a-b}``), equations (``lhs - rhs`` equal up to swapping sides).
      Parsed by a small LaTeX parser of this module into exact sympy objects
      (decimals become exact rationals, never floats) and accepted only when
      sympy proves the difference is exactly zero (high-precision evaluation
      is used only to *reject* quickly).  Never numeric tolerance.  Input
      outside the parser's grammar (matrices, ``\\le`` chains, mixed numbers
      such as ``2\\frac{1}{2}``) is compared as a whitespace-insensitive
      LaTeX string only, i.e. fails closed.
    * ``"choice"`` - gold is a single letter ``A``-``Z`` (``(B)``, ``B.`` also
      recognised) or ``choices`` are given.  Accepts ``B``, ``(B)``, ``B.``,
      ``B)``, ``Option B``, ``option b``, ``**B**``, ``b``, ``B: <text>``
      (with ``choices``: the text must be option B's), and the option's own
      text when ``choices`` are given (normalised compare).  ``choices`` are
      the option texts in order (A, B, ...); a leading ``"A. "``/``"(A) "``
      label on a choice is ignored when it is that option's own letter.
      Numeric option texts also compare exactly as numbers.  If the gold is not a letter, it may be
      the text of one of the choices.
    * ``"yesno"`` - gold yes/no (also true/false): case-insensitive,
      punctuation tolerant, yes<->no rejected.
    * ``"text"`` - short free text: case, whitespace, punctuation and the
      articles a/an/the are normalised, then the whole strings must be equal.
      Never substring matching.

    Meaning-preserving rewrites accepted for every kind: surrounding
    whitespace, trailing period/newline (and ``;``; a trailing ``!`` only for
    yes/no and text, since ``5!`` is a factorial), ``$...$``,
    ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``, ``\\boxed{}``, ``\\text{}``
    (``\\textbf``, ``\\mathrm``, ``\\mathbf``...), markdown ``**bold**`` and
    backticks, a leading ``x =`` / ``x \\in`` (single-letter variable).  For
    numbers additionally: thousands separators (``1,234,567``,
    ``1{,}234``, ``1\\,234``), trailing zeros (``3.50`` = ``3.5``, ``2.0`` =
    ``2``), missing leading zero (``.5``), unreduced fractions, ``50\\%`` =
    ``50%`` = ``50`` (the number in front of the percent sign is compared;
    ``0.5`` is *not* accepted for ``50%``), a degree sign (``30^\\circ``) and
    a currency ``\\$``.  Other units are not stripped (conservative).

``match_outcome(answer, gold, choices=None) -> str``
    ``"match"``, ``"no_match"``, or ``TOO_COMPLEX`` (a bound cut the check
    short; not a match).  ``match`` is ``match_outcome(...) == "match"``.

``detect_kind(gold: str, choices: list[str] | None = None) -> str``
    One of ``"number"``, ``"expression"``, ``"choice"``, ``"yesno"``,
    ``"text"``; used to log per-kind accuracy.

``stats() -> dict[str, int]`` / ``reset_stats() -> None``
    Module-level, thread-safe counters: ``extract_calls``, ``extract_none``
    (so ``extract_none / extract_calls`` is the parse-failure rate of
    completions), ``match_calls``, ``match_true``, ``match_none`` (answer was
    ``None``), ``answer_unparsed`` (answer could not be read as the gold's
    kind), ``gold_unparsed`` (an expression gold our parser cannot read;
    compared as normalised strings), ``symbolic_calls`` (matches that needed
    sympy), ``symbolic_bounded`` (symbolic checks cut short by a size /
    complexity bound and answered ``False``), ``symbolic_errors``,
    ``too_complex`` (calls of either function whose outcome is
    ``TOO_COMPLEX``), ``gold_missing``, and ``kind_<kind>`` per-kind match
    counts.

Thread safety and bounds
========================

No signals, no global mutable state other than the counters (behind a
``threading.Lock``) and ``functools.lru_cache`` caches.  Safe to call from
many threads.  Plain numbers, letters, yes/no and text never import or touch
sympy.

Every call is bounded by construction, without timeouts: past a bound the
outcome is ``TOO_COMPLEX``, which fails closed (no answer / no match) and is
counted, never an exception or a long computation.  Extraction reads at most
``MAX_TEXT_CHARS``; one left-to-right scan pairs every brace, so boxes cost
linear time however they nest.  An answer (extracted, or given to ``match``;
golds and option texts too) has at most ``MAX_ANSWER_CHARS`` characters and
``MAX_BRACE_DEPTH`` levels of braces; whitespace runs in it are cut to
``MAX_SPACE_RUN``, and the final-answer span compares at most
``MAX_ANSWER_BOXES`` boxes or "or" alternatives.  The symbolic path parses at
most ``MAX_SYMBOLIC_CHARS``, nested at most ``MAX_EXPRESSION_DEPTH`` deep with
at most ``MAX_FUNCTION_NESTING`` nested functions; powers/factorials that
would build huge integers are refused at parse time; numeric evaluation runs
only when no exponent or function argument exceeds ``10**MAX_DIGITS``;
``sympy.expand`` only when it would form at most ``MAX_EXPAND_TERMS`` terms
and ``sympy.simplify`` only on differences with at most ``MAX_SIMPLIFY_OPS``
operations and ``MAX_SIMPLIFY_FUNCS`` functions; two sets compare at most
``MAX_SET_CHECKS`` element pairs.  Symbolic checks cut off are also counted in
``symbolic_bounded``.  ``python bench/verify.py --adversarial`` times the
worst inputs found (each under 50 ms).
"""

from __future__ import annotations

import functools
import math
import re
import threading
import unicodedata
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "KINDS",
    "MAX_ANSWER_CHARS",
    "MAX_BRACE_DEPTH",
    "MAX_SIMPLIFY_OPS",
    "MAX_SYMBOLIC_CHARS",
    "MAX_TEXT_CHARS",
    "TOO_COMPLEX",
    "detect_kind",
    "extract_answer",
    "extract_outcome",
    "match",
    "match_outcome",
    "reset_stats",
    "stats",
]
KINDS = ("number", "expression", "choice", "yesno", "text")
#: The outcome of an extraction or a match cut short by one of the bounds below (fails closed).
TOO_COMPLEX = "too_complex"

#: Longest completion ``extract_answer`` reads (about 50 K tokens).
MAX_TEXT_CHARS = 200_000
#: Longest final answer: an extracted answer, or ``match``'s answer, gold or option text.
MAX_ANSWER_CHARS = 20_000
#: Deepest ``{}`` nesting in an answer.
MAX_BRACE_DEPTH = 50
#: Most ``\boxed{}`` the final-answer ambiguity check compares.
MAX_ANSWER_BOXES = 64
#: Longest whitespace run kept in a matched answer: longer runs are cut to this (they mean
#: nothing there, and a regex such as ``\s*x\s*y`` is quadratic in their length).
MAX_SPACE_RUN = 16

#: Longest (normalised) answer/gold string handed to the symbolic parser.
MAX_SYMBOLIC_CHARS = 600
#: Largest ``count_ops`` of a difference compared symbolically at all.
MAX_SYMBOLIC_OPS = 250
#: Largest ``count_ops`` of a difference that ``sympy.simplify`` may see (its time grows fast:
#: about 0.1 s at 40 operations with six trig functions, 20 s at 150).
MAX_SIMPLIFY_OPS = 40
#: Most function applications (sin, exp, ...) in a difference that ``sympy.simplify`` may see.
MAX_SIMPLIFY_FUNCS = 6
#: Deepest parsed formula: bracket nesting, and depth of its sympy tree.  sympy's numeric
#: evaluation can redo a whole subtree at each level (``x/(1+x/(1+...))`` 20 deep: 50 s).
MAX_EXPRESSION_DEPTH = 12
#: Deepest nesting of functions and roots in a parsed formula (``\log(\log(x))`` is 2): the
#: evaluation of nested logs of complex values doubles its work at each level.
MAX_FUNCTION_NESTING = 4
#: Most terms ``sympy.expand`` may form (estimated before it runs, from degrees and term counts).
MAX_EXPAND_TERMS = 20_000
#: Largest number of decimal digits a parsed number may have / produce.
MAX_DIGITS = 2000
#: Largest exponent of an exact decimal that is turned into a Fraction.
MAX_DECIMAL_EXPONENT = 4000
#: Most elements in a set/tuple/list answer.
MAX_ELEMENTS = 64
#: Most element comparisons when two sets are matched (identical elements pair off for free).
MAX_SET_CHECKS = 64

# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------


def _words(s: str) -> list:
    return s.split()


_STAT_KEYS = (
    "extract_calls",
    "extract_none",
    "match_calls",
    "match_true",
    "match_none",
    "answer_unparsed",
    "gold_unparsed",
    "symbolic_calls",
    "symbolic_bounded",
    "symbolic_errors",
    "too_complex",
    "gold_missing",
) + tuple("kind_" + k for k in KINDS)

_stats_lock = threading.Lock()
_stats = dict.fromkeys(_STAT_KEYS, 0)


def _count(key: str, n: int = 1) -> None:
    with _stats_lock:
        _stats[key] += n


def stats() -> dict:
    """A snapshot of the module-level counters (see module docstring)."""
    with _stats_lock:
        return dict(_stats)


def reset_stats() -> None:
    """Set every counter back to zero."""
    with _stats_lock:
        for k in _stats:
            _stats[k] = 0


class _Bounded(Exception):
    """A check refused because it would be too expensive: the outcome is ``TOO_COMPLEX``."""


class _GoldMissing(ValueError):
    """The gold answer is missing or empty."""


class _ParseError(Exception):
    """Input is outside the supported grammar."""


# ---------------------------------------------------------------------------
# low-level string helpers
# ---------------------------------------------------------------------------

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


def _clean_unicode(s: str) -> str:
    if _ASCII_RE.match(s):
        return s
    s = unicodedata.normalize("NFKC", s.translate(_UNICODE_TRANS))
    return s


# A brace, or an escape that hides one (``\{``, ``\}``, ``\\``): scanning these tokens left to
# right reads braces as TeX does while stepping over everything else in C.
_BRACE_TOKEN_RE = re.compile(r"\\[\\{}]|[{}]")


def _closing_braces(s: str, opens: set | None, start: int) -> dict:
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


def _check_size(s: str, what: str) -> None:
    """Raise ``_Bounded`` when ``s`` is past ``MAX_ANSWER_CHARS`` or ``MAX_BRACE_DEPTH``."""
    if len(s) > MAX_ANSWER_CHARS:
        raise _Bounded(f"{what}: {len(s)} characters > MAX_ANSWER_CHARS={MAX_ANSWER_CHARS}")
    if _too_deep(s):
        raise _Bounded(f"{what}: braces nest deeper than MAX_BRACE_DEPTH={MAX_BRACE_DEPTH}")


_LONG_SPACE_RE = re.compile(r"(\s{%d})\s+" % MAX_SPACE_RUN)


def _squeeze_space(s: str) -> str:
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


def _unwrap(s: str) -> str:
    """Strip meaning-free outer wrappers, repeatedly, from an answer string."""
    s = _clean_unicode(s)
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
                    closes = _closing_braces(base, None, 0)
                if closes.get(lo + m.end() - 1) == lo + n - 1:
                    lo += m.end()
                    s = s[m.end() : -1]
                    continue
        if a == "*" and z == "*":
            t = s.strip("*")
            if t and "*" not in t:
                lo += n - len(s.lstrip("*"))
                s = t
                continue
        if a == "_" and z == "_" and n > 2:
            t = s.strip("_")
            if t and "_" not in t:
                lo += n - len(s.lstrip("_"))
                s = t
                continue
        if a == "`" and z == "`":
            t = s.strip("`")
            if t and "`" not in t:
                lo += n - len(s.lstrip("`"))
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


def _strip_inner_wrappers(s: str) -> str:
    prev = None
    while prev != s and "\\" in s:
        prev = s
        s = _INNER_WRAP_RE.sub(r"\1", s)
    return s


# ---------------------------------------------------------------------------
# kind detection
# ---------------------------------------------------------------------------

_LETTER_GOLD_RE = re.compile(r"[\(\[]?\s*([A-Z])\s*[\)\]]?\s*[.:)]?\Z")
_YES = frozenset(("yes", "true"))
_NO = frozenset(("no", "false"))
_YESNO_WORDS = _YES | _NO

# punctuation -> space, except a sign/decimal point/comma that belongs to a number
_PUNCT_TO_SPACE = re.compile(r"(?:[\s;:!?()\[\]{}*_~`\"\\/|<>]|[.,](?!\d)|(?<!\d)[.,]|-(?![\d.]))+")
_APOSTROPHE_RE = re.compile(r"['\u2018\u2019\u02bc]")
_ARTICLES = frozenset(("a", "an", "the"))


def _norm_text(s: str) -> str:
    """Normalise free text: wrappers, case, punctuation, articles, spacing."""
    s = _unwrap(s)
    if "\\" in s:
        s = _strip_inner_wrappers(s)
        s = s.replace("\\%", "%").replace("\\$", "$").replace("\\&", "&")
    s = _APOSTROPHE_RE.sub("", s.casefold())
    words = _PUNCT_TO_SPACE.sub(" ", s).split()
    return " ".join(w for w in words if w not in _ARTICLES)


def _yesno_word(s: str) -> str | None:
    w = _norm_text(s)
    return w if w in _YESNO_WORDS else None


_MATH_WORDS = frozenset(
    _words(
        "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh ln log exp sqrt pi inf infty "
        "oo cdot times frac dfrac tfrac left right mathrm text sqrt circ le ge leq geq lt gt ne neq "
        "cup cap emptyset varnothing in pm mp div binom theta alpha beta gamma delta phi mu lambda "
        "sigma omega tau rho epsilon varepsilon varphi psi chi eta zeta xi nu kappa iota Delta "
        "Gamma Theta Lambda Sigma Phi Omega Pi Psi dbinom mathbf quad qquad displaystyle boxed"
    )
)
_ALPHA_RUN_RE = re.compile(r"[A-Za-z]+")
_MATHY_CHARS_RE = re.compile(r"[\d\\^_=+*/(){}\[\]<>|]")


_LATEX_CMD_RE = re.compile(
    r"\\(?!(?:text|textbf|textit|textrm|textsf|texttt|textnormal|mbox|hbox|emph)\b)[A-Za-z]+"
)


def _looks_like_math(s: str) -> bool:
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


@functools.lru_cache(maxsize=65536)
def _gold_spec(gold: str, choices: tuple | None):
    """Parse a gold answer once: (kind, payload).  Raises ``_Bounded`` past the size bounds."""
    _check_size(gold, "gold")
    g = _unwrap(_squeeze_space(gold))
    if not g.strip():
        raise _GoldMissing(f"gold answer {gold!r} is empty once its wrappers are removed")
    if choices:
        labels = [_choice_text(c, i) for i, c in enumerate(choices)]
        m = _LETTER_GOLD_RE.match(g.strip())
        if m and (ord(m.group(1)) - 65) < len(choices):
            return "choice", (ord(m.group(1)) - 65, tuple(labels))
        hits = _label_hits(g, tuple(labels))
        if len(hits) == 1:
            return "choice", (hits[0], tuple(labels))
        # gold is neither a letter nor one option's text: fall through
    m = _LETTER_GOLD_RE.match(g.strip())
    if m:
        return "choice", (ord(m.group(1)) - 65, None)
    yn = _yesno_word(g)
    if yn is not None:
        return "yesno", yn
    num = _parse_number(g)
    if num is not None:
        return "number", num
    eq = _strip_var_prefix(g)
    if _looks_like_math(eq):
        return "expression", eq
    # text; a gold that normalises to nothing (e.g. "the") is compared verbatim
    return "text", (_norm_text(g), g.strip().casefold())


def _check_gold(gold) -> str:
    """The gold as a non-empty string (ints/Fractions/Decimals/floats coerced)."""
    if isinstance(gold, (int, float, Fraction, Decimal)) and not isinstance(gold, bool):
        gold = str(gold)
    if not isinstance(gold, str) or not gold.strip():
        raise _GoldMissing(f"empty or non-string gold answer: {gold!r}")
    return gold


def detect_kind(gold: str, choices: list[str] | None = None) -> str:
    """The comparison kind for ``gold``: number/expression/choice/yesno/text.

    Raises ``ValueError`` for an empty gold, or one past ``MAX_ANSWER_CHARS`` /
    ``MAX_BRACE_DEPTH`` (with its options): such a row cannot be scored.
    """
    gold = _check_gold(gold)
    try:
        return _gold_spec(gold, tuple(choices) if choices else None)[0]
    except _Bounded as e:
        raise ValueError(f"gold answer cannot be verified, too complex: {e}") from None


# ---------------------------------------------------------------------------
# numbers (exact, fast path, no sympy)
# ---------------------------------------------------------------------------

_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NUM_RE = re.compile(_NUM + r"\Z")
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


def _strip_var_prefix(s: str) -> str:
    """``x = 5`` -> ``5``, ``x \\in [0, 1]`` -> ``[0, 1]`` (single-letter variable)."""
    if "=" not in s and "\\in" not in s:
        return s
    m = _VAR_PREFIX_RE.match(s)
    if m and "=" not in s[m.end() :]:
        return _unwrap(s[m.end() :])
    return s


def _dec(lit: str) -> Fraction | Decimal:
    d = Decimal(lit)
    exp = d.as_tuple().exponent
    if isinstance(exp, int) and -MAX_DECIMAL_EXPONENT <= exp <= MAX_DECIMAL_EXPONENT:
        if len(d.as_tuple().digits) > MAX_DIGITS:
            return d
        return Fraction(d)
    return d  # astronomically large/small: keep as Decimal (compared exactly)


class _Num:
    """An exact number with an optional percent sign."""

    __slots__ = ("percent", "value")

    def __init__(self, value, percent=False):
        self.value = value
        self.percent = percent

    def __repr__(self):  # pragma: no cover - debugging aid
        return f"_Num({self.value!r}, percent={self.percent})"


def _parse_number(s: str) -> _Num | None:
    """Exact value of a plain numeric literal, or ``None``.  Never uses floats."""
    if not s or len(s) > MAX_DIGITS + 64:
        return None
    s = s.strip()
    if "=" in s:
        s = _strip_var_prefix(s)
    percent = False
    if "%" in s or "percent" in s:
        t = _PERCENT_RE.sub("", s)
        if t != s:
            percent = True
            s = _unwrap(t)
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
        if _NUM_RE.match(s):
            return _Num(_dec(s), percent)
        if "," in s:
            m = _THOUSANDS_RE.match(s)
            if m:
                return _Num(_dec(m.group(1) + m.group(2).replace(",", "") + (m.group(3) or "")), percent)
            s2 = s.replace("{,}", ",")
            m = _THOUSANDS_RE.match(s2)
            if m:
                return _Num(_dec(m.group(1) + m.group(2).replace(",", "") + (m.group(3) or "")), percent)
            return None
        if "frac" in s:
            m = _FRAC_RE.match(s)
            if m:
                num = _dec(m.group(2) or m.group(3))
                den = _dec(m.group(4) or m.group(5))
                if not isinstance(num, Fraction) or not isinstance(den, Fraction) or den == 0:
                    return None
                v = num / den
                return _Num(-v if m.group(1) == "-" else v, percent)
            return None
        if "/" in s:
            m = _SLASH_RE.match(s)
            if m:
                num, den = _dec(m.group(1)), _dec(m.group(2))
                if not isinstance(num, Fraction) or not isinstance(den, Fraction) or den == 0:
                    return None
                return _Num(num / den, percent)
            return None
        if "10" in s:
            m = _SCI_RE.match(s)
            if m:
                exp = int(m.group(2) or m.group(3))
                if abs(exp) > MAX_DECIMAL_EXPONENT:
                    return _Num(Decimal(m.group(1)).scaleb(exp), percent)
                return _Num(_dec(m.group(1)) * Fraction(10) ** exp, percent)
    except (InvalidOperation, ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def _num_eq(a: _Num, b: _Num) -> bool | None:
    x, y = a.value, b.value
    if type(x) is type(y):
        return x == y
    # Fraction vs (huge-exponent) Decimal: equal only if both are Decimal-
    # representable; a bounded Fraction cannot equal an astronomically
    # large/small Decimal, and comparing would build giant integers.
    _count("symbolic_bounded")
    return None


# ---------------------------------------------------------------------------
# multiple choice / yes-no / text (fast path, no sympy)
# ---------------------------------------------------------------------------

_CHOICE_LABEL_RE = re.compile(r"\A\s*[\(\[]?\s*([A-Za-z])\s*(?:[\)\]]\s*[.:]?|[.:])\s+(?=\S)")
_CHOICE_ANS_RE = re.compile(
    r"(?:(?:option|choice|answer)\s*[:\-]?\s*)?"
    r"(?:\(\s*(?P<p>[A-Za-z])\s*\)|\[\s*(?P<b>[A-Za-z])\s*\]|(?P<l>[A-Za-z])\s*\)?)\s*[.:]?\Z",
    re.IGNORECASE,
)
_CHOICE_WITH_TEXT_RE = re.compile(
    r"(?:(?:option|choice)\s*)?(?:\(\s*([A-Za-z])\s*\)|\[\s*([A-Za-z])\s*\]|([A-Za-z])\s*[.:)\-])\s*[.:\-]?\s*(\S.*)\Z",
    re.IGNORECASE | re.DOTALL,
)


def _choice_text(c: str, i: int):
    """(normalised text, exact number or None) of option number ``i``.

    A leading label (``"B. "``, ``"(B) "``) is dropped only when it is this
    option's own letter, so an option such as ``"E. coli"`` keeps its text.
    """
    c = str(c)
    _check_size(c, f"option {chr(65 + i)}")
    c = _squeeze_space(c)
    m = _CHOICE_LABEL_RE.match(c)
    if m and m.group(1).upper() == chr(65 + i):
        c = c[m.end() :]
    num = _parse_number(_unwrap(c))
    return _norm_text(c), (num.value if num is not None and not num.percent else None)


def _label_hits(answer: str, labels: tuple) -> list:
    """Indices of the options whose text (or exact number) equals ``answer``."""
    na = _norm_text(answer)
    hits = [i for i, (t, _) in enumerate(labels) if na and t == na]
    if not hits:
        num = _parse_number(_unwrap(answer))
        if num is not None and not num.percent:
            hits = [
                i
                for i, (_, v) in enumerate(labels)
                if v is not None and type(v) is type(num.value) and v == num.value
            ]
    return hits


def _match_choice(answer: str, idx: int, labels: tuple | None) -> bool:
    a = _unwrap(answer)
    if "\\" in a:
        a = _unwrap(_strip_inner_wrappers(a))
    a = a.strip()
    m = _CHOICE_ANS_RE.match(a)
    if m:
        # a lone lowercase letter like "b" is still the letter B
        return ord((m.group("p") or m.group("b") or m.group("l")).upper()) - 65 == idx
    if labels:
        # the option's own text (checked before "X. text" so that an option
        # such as "C. elegans" is read as text, not as letter C)
        hits = _label_hits(a, labels)
        if hits:
            return len(hits) == 1 and hits[0] == idx
    m = _CHOICE_WITH_TEXT_RE.match(a)
    if m:
        letter = (m.group(1) or m.group(2) or m.group(3)).upper()
        if ord(letter) - 65 != idx:
            return False
        if labels is None:
            return True
        # the text after the letter must be that option's text
        return bool(_label_hits(m.group(4), labels[idx : idx + 1]))
    return False


# ---------------------------------------------------------------------------
# symbolic path: a small LaTeX parser into exact sympy objects
# ---------------------------------------------------------------------------

_sp = None
_sp_lock = threading.Lock()


def _sympy():
    global _sp
    if _sp is None:
        with _sp_lock:
            if _sp is None:
                import sympy

                _sp = sympy
    return _sp


_TOKEN_RE = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(\\[A-Za-z]+|\\.)|([A-Za-z]+)|(\S))")
_FUNC_NAMES = frozenset(_words("sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh ln log exp"))
_GREEK = frozenset(
    _words(
        "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu "
        "xi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma "
        "Upsilon Phi Psi Omega"
    )
)
_DROP_CMDS = frozenset(
    _words(
        "left right big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr displaystyle textstyle , ; : "
        "! quad qquad limits nolimits"
    )
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


def _canon_latex(s: str) -> str:
    """A whitespace/spelling-insensitive form of a LaTeX string."""
    for a, b in _PREP_SUBS:
        if a in s:
            s = s.replace(a, b)
    s = _CANON_WS_RE.sub("", s)
    if "{,}" in s:
        s = s.replace("{,}", ",")
    return s


class _Tok:
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


def _tokenize(s: str) -> list:
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
            toks.append(_Tok("num", num))
        elif cmd is not None:
            name = cmd[1:]
            if name in _DROP_CMDS:
                continue
            if name in ("operatorname", "mathrm", "text", "textrm", "mathit", "mathbf", "textbf", "mbox"):
                # \operatorname{sin} / \mathrm{e} / \text{ } -> payload if harmless
                m2 = _BRACE_PAYLOAD_RE.match(s, pos)
                if not m2:
                    raise _ParseError(cmd)
                payload = m2.group(1).strip()
                pos = m2.end()
                if not payload:
                    continue
                if payload in _FUNC_NAMES:
                    toks.append(_Tok("cmd", "\\" + payload))
                elif len(payload) == 1 and payload.isalpha():
                    toks.append(_Tok("letter", payload))
                elif _NUM_RE.match(payload):
                    toks.append(_Tok("num", payload))
                else:
                    raise _ParseError("text in formula")
                continue
            toks.append(_Tok("cmd", cmd))
        elif word is not None:
            lw = word
            if lw in _WORD_ALIASES:
                k, t = _WORD_ALIASES[lw]
                toks.append(_Tok(k, t))
            elif lw in _FUNC_NAMES:
                toks.append(_Tok("cmd", "\\" + lw))
            else:
                if len(lw) > 4:
                    raise _ParseError("word in formula")
                for c in lw:
                    toks.append(_Tok("letter", c))
        else:
            toks.append(_Tok("chr", ch))
    return toks


_OPEN = frozenset(("(", "[", "{", "\\{", "\\langle"))
_CLOSE = frozenset((")", "]", "}", "\\}", "\\rangle"))


def _is_open(t):
    return t.text in _OPEN and t.kind in ("chr", "cmd")


def _is_close(t):
    return t.text in _CLOSE and t.kind in ("chr", "cmd")


class _Parser:
    """Recursive-descent parser for a LaTeX math subset -> exact sympy."""

    def __init__(self, toks):
        self.t = toks
        self.i = 0
        self.sp = _sympy()

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
            raise _ParseError(f"expected {text!r}")
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
                    raise _ParseError("mixed number is ambiguous")
                num.append(self.power())
            else:
                break
        out = sp.Mul(*num) if len(num) > 1 else num[0]
        for d in den:
            if d == 0:
                raise _ParseError("division by zero")
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
                or t.text[1:] in _FUNC_NAMES
                or t.text[1:] in _GREEK
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
                    raise _ParseError("0 to a negative power")
                ab = abs(base)
                if ab not in (0, 1):
                    lg = abs(math.log10(abs(ab.p)) if ab.p else 0) + abs(math.log10(ab.q))
                    if abs(float(exp)) * max(lg, 0.31) > MAX_DIGITS:
                        raise _Bounded("huge power")
        elif exp.is_Number and exp.is_Integer and abs(exp) > 1000:
            raise _Bounded("huge exponent")
        return sp.Pow(base, exp)

    def postfix(self):
        x = self.primary()
        while self.at("!", "chr"):
            self.i += 1
            if x.is_Integer and x > 1000:
                raise _Bounded("huge factorial")
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
            raise _ParseError("missing argument")
        if t.kind == "chr" and t.text == "{":
            return self.group()
        if t.kind == "num":
            self.i += 1
            if len(t.text) > 1:
                # \frac12 -> 1 then 2: split off the first digit
                self.t.insert(self.i, _Tok("num", t.text[1:]))
                return self.sp.Integer(int(t.text[0])) if t.text[0].isdigit() else self._number(t.text)
            return self._number(t.text)
        if t.kind in ("letter",):
            self.i += 1
            return self._symbol(t.text)
        if t.kind == "cmd":
            return self.primary()
        if t.kind == "chr" and t.text == "(":  # sqrt(2), ASCII style
            return self.primary()
        raise _ParseError("bad argument")

    def _number(self, text):
        if len(text) > MAX_DIGITS:
            raise _Bounded("long number")
        return self.sp.Rational(text)

    def _symbol(self, name):
        sp = self.sp
        if self.at("_", "chr"):
            self.i += 1
            t = self.peek()
            if t is None:
                raise _ParseError("bad subscript")
            if t.kind == "chr" and t.text == "{":
                j = self.i + 1
                parts = []
                while j < len(self.t) and not (self.t[j].kind == "chr" and self.t[j].text == "}"):
                    parts.append(self.t[j].text)
                    j += 1
                if j >= len(self.t):
                    raise _ParseError("bad subscript")
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
            raise _ParseError("unexpected end")
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
            raise _ParseError(f"unexpected {x!r}")
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
                    raise _ParseError("division by zero")
                return a / b
            if name == "binom":
                a = self.arg()
                b = self.arg()
                if a.is_Integer and abs(a) > 10000:
                    raise _Bounded("huge binomial")
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
            if name in _GREEK:
                return self._symbol(name)
            if name in _FUNC_NAMES:
                return self._func(name)
            if name == "exp":
                return self._func(name)
            raise _ParseError(f"unsupported command {x}")
        raise _ParseError("unexpected token")

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
                raise _ParseError("ambiguous inverse")
            out = self._pow(out, power)
        return out


def _split_top(toks, sep_pred):
    """Split a token list on separators at bracket depth 0."""
    parts, cur, depth = [], [], 0
    for t in toks:
        if _is_open(t):
            depth += 1
        elif _is_close(t):
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
        if _is_open(toks[j]):
            depth += 1
        elif _is_close(toks[j]):
            depth -= 1
            if depth == 0:
                return j
    return -1


def _parse_scalar(toks):
    if not toks:
        raise _ParseError("empty")
    p = _Parser(toks)
    e = p.expr()
    if not p.done():
        raise _ParseError(f"trailing tokens at {p.peek()!r}")
    depth, functions = _shape(e)
    if depth > MAX_EXPRESSION_DEPTH or functions > MAX_FUNCTION_NESTING:
        raise _Bounded("formula nests too deep")
    return e


def _shape(e) -> tuple[int, int]:
    """(depth of the sympy tree ``e``, deepest nesting of functions and non-integer powers)."""
    if e.is_Atom:
        return 0, 0
    inner = [_shape(a) for a in e.args]
    own = e.is_Function or (e.is_Pow and not e.exp.is_Integer)
    return 1 + max(d for d, _ in inner), own + max(f for _, f in inner)


def _is_comma(t):
    return t.kind == "chr" and t.text == ","


def _parse_structure(toks):
    """-> ('scalar', e) | ('seq', open, close, elems) | ('set', elems) | ('union', sympy_set)
    | ('eq', lhs - rhs)."""
    if not toks:
        raise _ParseError("empty")
    parts = _split_top(toks, lambda t: t.kind == "cmd" and t.text == "\\cup")
    if len(parts) > 1:
        sp = _sympy()
        sets = []
        for p in parts:
            sets.append(_to_sympy_set(_parse_structure(p)))
        return ("union", sp.Union(*sets))
    pm = [i for i, t in enumerate(toks) if t.kind == "cmd" and t.text in ("\\pm", "\\mp")]
    if pm:
        # a \pm b -> the two-element set {a + b, a - b}
        if len(pm) > 1:
            raise _ParseError("several \\pm")
        i = pm[0]
        plus = toks[:i] + [_Tok("chr", "+")] + toks[i + 1 :]
        minus = toks[:i] + [_Tok("chr", "-")] + toks[i + 1 :]
        return ("set", (_parse_scalar(plus), _parse_scalar(minus)))
    sides = _split_top(toks, lambda t: t.kind == "chr" and t.text == "=")
    if len(sides) == 2:
        return ("eq", _parse_scalar(sides[0]) - _parse_scalar(sides[1]))
    if len(sides) > 2:
        raise _ParseError("chained equation")
    first, last = toks[0], toks[-1]
    if first.kind == "cmd" and first.text == "\\emptyset" and len(toks) == 1:
        return ("set", ())
    if first.text == "\\{" and last.text == "\\}" and _close_index(toks, 0) == len(toks) - 1:
        inner = toks[1:-1]
        if not inner:
            return ("set", ())
        elems = _split_top(inner, _is_comma)
        if len(elems) > MAX_ELEMENTS:
            raise _Bounded("too many elements")
        return ("set", tuple(_parse_scalar(e) for e in elems))
    if (
        first.text in ("(", "[", "\\langle")
        and last.text in (")", "]", "\\rangle")
        and _close_index(toks, 0) == len(toks) - 1
    ):
        elems = _split_top(toks[1:-1], _is_comma)
        if len(elems) > 1:
            if len(elems) > MAX_ELEMENTS:
                raise _Bounded("too many elements")
            return ("seq", first.text, last.text, tuple(_parse_scalar(e) for e in elems))
    elems = _split_top(toks, _is_comma)
    if len(elems) > 1:
        if len(elems) > MAX_ELEMENTS:
            raise _Bounded("too many elements")
        return ("set", tuple(_parse_scalar(e) for e in elems))
    return ("scalar", _parse_scalar(toks))


def _to_sympy_set(st):
    sp = _sympy()
    kind = st[0]
    if kind == "set":
        return sp.FiniteSet(*st[1])
    if kind == "union":
        return st[1]
    if kind == "seq" and len(st[3]) == 2 and st[1] in "([" and st[2] in ")]":
        a, b = st[3]
        if a.is_extended_real is False or b.is_extended_real is False:
            raise _ParseError("complex interval")
        return sp.Interval(a, b, left_open=st[1] == "(", right_open=st[2] == ")")
    if kind == "scalar":
        return sp.FiniteSet(st[1])
    raise _ParseError("not a set")


@functools.lru_cache(maxsize=16384)
def _parse_expression(s: str):
    """Parse an (unwrapped) math string to a structure; raises on failure."""
    s = _canon_for_parse(s)
    if len(s) > MAX_SYMBOLIC_CHARS:
        raise _Bounded("input too long")
    toks = _tokenize(s)
    depth = 0
    for t in toks:  # refused before sympy builds anything
        if _is_open(t):
            depth += 1
            if depth > MAX_EXPRESSION_DEPTH:
                raise _Bounded("brackets nest too deep")
        elif _is_close(t):
            depth -= 1
    return _parse_structure(toks)


_DEG_ANY_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree")


def _canon_for_parse(s: str) -> str:
    s = _clean_unicode(s)
    for a, b in _PREP_SUBS:
        if a in s:
            s = s.replace(a, b)
    if "circ" in s or "degree" in s:
        s = _DEG_ANY_RE.sub("", s)
    if "{,}" in s:
        s = s.replace("{,}", "")  # 1{,}000 inside a formula is a thousands separator
    return s.strip()


# -- equality of parsed structures ------------------------------------------

_PROBE_POINTS = ("7/5", "-13/11", "29/17")


def _evalf_is_cheap(d, subs) -> bool:
    """Whether ``d.evalf(subs=subs)`` stays cheap.

    sympy raises its working precision by the size of every exponent and function argument, so
    ``e^{e^{e^{x}}}`` would run for hours; each is evaluated (innermost first, at 15 digits)
    and must stay below ``10**MAX_DIGITS``.
    """
    sp = _sympy()
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
    sp = _sympy()
    for p in d.atoms(sp.Pow):
        e = p.exp
        if e.is_Integer and abs(e) > 40 and not (p.base.is_Atom):
            return True
    return False


# The matchers from here on return True, False, or None: not shown equal because a bound cut the
# check short (``TOO_COMPLEX``).  None is falsy, so it fails closed wherever it is tested.


def _scalar_eq(a, b) -> bool | None:
    sp = _sympy()
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
        _count("symbolic_bounded")
        return None
    subs = {s: sp.Rational(_PROBE_POINTS[k % 3]) + k for k, s in enumerate(sorted(fs, key=str))}
    if not _evalf_is_cheap(d, subs):
        _count("symbolic_bounded")
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
        _count("symbolic_bounded")
        return None
    # Exact acceptance: the difference must simplify to exactly zero.
    if sp.expand(d) == 0:
        return True
    if sp.count_ops(d) > MAX_SIMPLIFY_OPS or len(d.atoms(sp.Function)) > MAX_SIMPLIFY_FUNCS:
        _count("symbolic_bounded")
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
                        _count("symbolic_bounded")
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
            return _to_sympy_set(g) == _to_sympy_set(a)
        except _ParseError:
            return False
    return False


def _dedupe(elems):
    out = []
    for e in elems:
        if not any(e == o for o in out):
            out.append(e)
    return out


def _resolve(x):
    return x() if callable(x) else _parse_expression(x)


def _match_symbolic(answer, gold) -> bool | None:
    """Exact symbolic comparison; bounded; never raises.

    ``answer`` and ``gold`` are each a math string (parsed with a cache) or a
    zero-argument callable returning an already parsed structure.
    """
    _count("symbolic_calls")
    try:
        g = _resolve(gold)
    except (_Bounded, RecursionError):
        _count("symbolic_bounded")
        return None
    except Exception:  # noqa: BLE001 - fail closed, counted
        _count("gold_unparsed")
        return False
    try:
        a = _resolve(answer)
    except (_Bounded, RecursionError):
        _count("symbolic_bounded")
        return None
    except Exception:  # noqa: BLE001 - fail closed, counted
        _count("answer_unparsed")
        return False
    try:
        return _struct_eq(g, a)
    except (_Bounded, RecursionError):
        _count("symbolic_bounded")
        return None
    except Exception:  # noqa: BLE001 - fail closed, counted
        _count("symbolic_errors")
        return False


def _rational_struct(v: Fraction):
    return lambda: ("scalar", _sympy().Rational(v.numerator, v.denominator))


_HAS_DIGIT_OR_CMD_RE = re.compile(r"[\d\\]")


def _match_number(answer: str, gnum: _Num) -> bool | None:
    a = _unwrap(answer)
    anum = _parse_number(a)
    if anum is not None:
        # ``50%`` / ``50\\%`` / ``50``: the numbers in front of the sign compare
        return _num_eq(gnum, anum)
    # Not a plain literal.  A rational gold can only equal something that has a
    # digit or a command in it (letters alone are variables/e/pi/i).
    a = _strip_var_prefix(a)
    if not _HAS_DIGIT_OR_CMD_RE.search(a) or "%" in a or not _looks_like_math(a):
        _count("answer_unparsed")
        return False
    v = gnum.value
    if not isinstance(v, Fraction):
        _count("symbolic_bounded")
        return None
    return _match_symbolic(a, _rational_struct(v))


def _match_expression(answer: str, gold_expr: str) -> bool | None:
    a = _strip_var_prefix(_unwrap(answer))
    if not a:
        return False
    if _canon_latex(a) == _canon_latex(gold_expr):
        return True
    anum = _parse_number(a)
    if anum is not None:
        # a plain number (thousands separators etc. read exactly) vs a formula
        if anum.percent:
            return False
        if not isinstance(anum.value, Fraction):
            return None  # past MAX_DIGITS / MAX_DECIMAL_EXPONENT: never turned into a sympy number
        return _match_symbolic(_rational_struct(anum.value), gold_expr)
    return _match_symbolic(a, gold_expr)


# ---------------------------------------------------------------------------
# match
# ---------------------------------------------------------------------------


def match(answer: str | None, gold: str, choices: list[str] | None = None) -> bool:
    """Whether ``answer`` is a correct answer for ``gold`` (see module doc)."""
    return match_outcome(answer, gold, choices) == "match"


def match_outcome(answer: str | None, gold: str, choices: list[str] | None = None) -> str:
    """``"match"``, ``"no_match"``, or ``TOO_COMPLEX`` (a bound cut the check short; no match)."""
    try:
        kind, payload = _gold_spec(_check_gold(gold), tuple(choices) if choices else None)
    except (_GoldMissing, _Bounded) as e:
        # a bad row must not stop a run: it scores 0, counted (rows are checked when loaded)
        with _stats_lock:
            _stats["match_calls"] += 1
            _stats["gold_missing" if isinstance(e, _GoldMissing) else TOO_COMPLEX] += 1
        return "no_match" if isinstance(e, _GoldMissing) else TOO_COMPLEX
    with _stats_lock:
        _stats["match_calls"] += 1
        _stats["kind_" + kind] += 1
        if answer is None:
            _stats["match_none"] += 1
    if answer is None or not isinstance(answer, str) or not answer.strip():
        return "no_match"
    try:
        if len(answer) > MAX_ANSWER_CHARS:
            _count("symbolic_bounded")
        _check_size(answer, "answer")
        ok = _match_kind(_squeeze_space(answer), kind, payload)
    except _Bounded:
        ok = None
    if ok:
        _count("match_true")
        return "match"
    if ok is None:
        _count(TOO_COMPLEX)
        return TOO_COMPLEX
    return "no_match"


def _match_kind(answer: str, kind: str, payload) -> bool | None:
    if kind == "number":
        return _match_number(answer, payload)
    if kind == "choice":
        return _match_choice(answer, payload[0], payload[1])
    if kind == "yesno":
        return _yesno_word(answer) == payload
    if kind == "expression":
        return _match_expression(answer, payload)
    norm, raw = payload
    return _norm_text(answer) == norm if norm else _unwrap(answer).strip().casefold() == raw


# ---------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------

_ANSWER_OPEN_RE = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_ANSWER_CLOSE_RE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)
# ``\boxed`` and, looked at without consuming it (boxes may sit inside a bare box's token):
# group 1 up to the brace of ``\boxed {``, else group 2 the token of ``\boxed 5``.
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\b(?=([ \t]*\{)|\s+([^\s$]+)|)")
_ANSWER_IS_TAIL_RE = re.compile(r"\s*(?:is\b|:|=)\s*:?\s*", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"\.(?=\s|\Z)(?!\d)|\n")
_OR_SPLIT_RE = re.compile(
    r"\s+or\s+|\s*\\(?:text|mathrm)\s*\{\s*or\s*\}\s*|\s*\\quad\s*\\text\s*\{\s*or\s*\}\s*\\quad\s*",
    re.IGNORECASE,
)


def _find_boxed(text: str) -> list:
    """The boxes of ``text`` in order, as (start, end, content start, content end).

    ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces handled) or ``\\boxed 5`` (one token).
    The list ends at the first box never closed, whose content start is -1.  One scan for all
    boxes, so it is linear in ``len(text)`` however they nest.
    """
    marks = list(_BOXED_RE.finditer(text))
    opens = {m.end(1) - 1 for m in marks if m.group(1) is not None}
    closes = _closing_braces(text, opens, min(opens)) if opens else {}
    out = []
    for m in marks:
        if m.group(1) is not None:
            i = m.end(1) - 1
            j = closes.get(i, -1)
            if j < 0:
                out.append((m.start(), len(text), -1, -1))
                break
            out.append((m.start(), j + 1, i + 1, j))
        elif m.group(2) is not None:
            out.append((m.start(), m.end(2), m.start(2), m.end(2)))
    return out


def _box_contents(text: str, boxes) -> set:
    """The distinct normalised contents of ``boxes``; ``_Bounded`` past the size bounds."""
    if len(boxes) > MAX_ANSWER_BOXES:
        raise _Bounded(f"{len(boxes)} boxes in the final answer > MAX_ANSWER_BOXES={MAX_ANSWER_BOXES}")
    if sum(b[3] - b[2] for b in boxes) > MAX_ANSWER_CHARS:
        raise _Bounded(f"boxed answers longer than MAX_ANSWER_CHARS={MAX_ANSWER_CHARS} in all")
    contents = set()
    for b in boxes:
        c = text[b[2] : b[3]]
        _check_size(c, "boxed answer")
        contents.add(_canon_latex(_unwrap(c)).casefold())
    return contents


def _final_boxed(text: str, boxes):
    """(found, content) for the final boxed answer; content None when invalid."""
    if not boxes:
        return False, None
    last = boxes[-1]
    if last[2] < 0:
        return True, None  # truncated \boxed{ : fail closed
    # the final answer span: boxes chained together without a newline between
    first = len(boxes) - 1
    while (
        first > 0
        and len(boxes) - first <= MAX_ANSWER_BOXES
        and text.find("\n", boxes[first - 1][1], boxes[first][0]) < 0
    ):
        first -= 1
    if len(_box_contents(text, boxes[first:])) > 1:
        return True, None
    return True, text[last[2] : last[3]]


def _is_atomic(part: str) -> bool:
    p = _unwrap(part)
    if not p:
        return False
    if _CHOICE_ANS_RE.match(p) or _yesno_word(p) is not None or _parse_number(p) is not None:
        return True
    return len(p) <= 60 and _looks_like_math(p)


def _ambiguous(candidate: str) -> bool:
    parts = [p for p in _OR_SPLIT_RE.split(candidate) if p.strip()]
    if len(parts) < 2:
        return False
    for k, p in enumerate(parts):
        if not _is_atomic(p):
            return False
        if k == MAX_ANSWER_BOXES:
            raise _Bounded(f"more than MAX_ANSWER_BOXES={MAX_ANSWER_BOXES} answers joined by 'or'")
    return len({_canon_latex(_unwrap(p)).casefold() for p in parts}) > 1


def _finish(candidate: str | None) -> str | None:
    if candidate is None:
        return None
    c = candidate.strip()
    if not c:
        return None
    _check_size(c, "answer")
    if not _unwrap(c).strip():
        return None
    if _ambiguous(_squeeze_space(c)):
        return None
    return c


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, or ``None`` (see module doc)."""
    return extract_outcome(text)[0]


def extract_outcome(text: str) -> tuple[str | None, str]:
    """``(answer, outcome)``: ``"answer"``, ``"no_answer"``, or ``TOO_COMPLEX`` (answer None)."""
    try:
        answer = _extract(text)
        outcome = "no_answer" if answer is None else "answer"
    except _Bounded:
        answer, outcome = None, TOO_COMPLEX
    with _stats_lock:
        _stats["extract_calls"] += 1
        if answer is None:
            _stats["extract_none"] += 1
        if outcome == TOO_COMPLEX:
            _stats[TOO_COMPLEX] += 1
    return answer, outcome


def _last(pattern: re.Pattern, text: str):
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - only the last one is wanted
        pass
    return last


def _extract(text) -> str | None:
    if not isinstance(text, str) or not text:
        return None
    if len(text) > MAX_TEXT_CHARS:
        raise _Bounded(f"completion: {len(text)} characters > MAX_TEXT_CHARS={MAX_TEXT_CHARS}")
    lower = text.lower()
    if "answer" in lower and "<" in text:
        last_open = _last(_ANSWER_OPEN_RE, text)
        if last_open:
            last_close = _last(_ANSWER_CLOSE_RE, text)
            if not last_close or last_close.start() < last_open.end():
                return None  # unclosed trailing <answer>: fail closed
            # the last <answer> that opens before the last </answer>
            content = text[last_open.end() : last_close.start()]
            boxes = _find_boxed(content)
            found, boxed = _final_boxed(content, boxes)
            if found:
                if boxed is None:
                    return None
                # ambiguity among *all* boxes inside the answer block
                if len(_box_contents(content, boxes)) > 1:
                    return None
                return _finish(boxed)
            return _finish(content)
    if "\\boxed" in text or "\\fbox" in text:
        found, boxed = _final_boxed(text, _find_boxed(text))
        if found:
            return _finish(boxed)
    # the last "answer is X" / "answer: X": scan backwards for the word
    pos = len(lower)
    while True:
        pos = lower.rfind("answer", 0, pos)
        if pos < 0:
            return None
        m = _ANSWER_IS_TAIL_RE.match(text, pos + 6)
        if m:
            break
    e = _SENTENCE_END_RE.search(text, m.end())
    return _finish(text[m.end() : e.start() if e else len(text)])
