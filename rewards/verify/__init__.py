"""Answer extraction and exact answer matching for every accuracy reward.

Every accuracy reward in this project goes through this package.  It is built to
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
    ``""``, ``"$$"``): a bad row scores 0 mid-run instead of stopping it
    (rows are meant to be rejected when loaded: ``detect_kind`` raises
    ``ValueError`` for them).  The kind of comparison
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
      Parsed by a small LaTeX parser of this package into exact sympy objects
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

Thread safety and bounds
========================

No signals, no counters, no global mutable state other than two
``functools.lru_cache`` caches (parsed golds and parsed formulas).  Safe to
call from many threads.  What a call found is in what it returns:
``extract_outcome`` says whether an answer was read, ``match_outcome``
whether a bound cut the check short; a missing gold is a ``ValueError`` from
``detect_kind`` when rows are loaded.  Plain numbers, letters, yes/no and text
never import or touch sympy.

Every call is bounded by construction, without timeouts: past a bound the
outcome is ``TOO_COMPLEX``, which fails closed (no answer / no match), never
an exception or a long computation.  Extraction reads at most
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
``MAX_SET_CHECKS`` element pairs (all in ``rewards/verify/bounds.py``).
``python bench/verify.py --adversarial`` times the worst inputs found (each
under 50 ms).

Layout
======

One file per stage; each imports only files above it in this list:

    bounds.py     the limits above, ``TOO_COMPLEX``, the exceptions that carry a refusal
    strings.py    Unicode, brace pairing, outer wrappers, free-text normalisation
    numbers.py    exact numbers (fast path, no sympy)
    choice.py     multiple choice (fast path, no sympy)
    kinds.py      ``detect_kind``: a gold answer parsed once into its kind
    latex.py      sympy (imported on first use), LaTeX tokens and spellings
    parser.py     recursive-descent parser of a LaTeX subset into exact sympy
    structure.py  tuples, intervals, sets, unions, ``\\pm``, equations
    symbolic.py   symbolic equality with bounds
    matching.py   ``match`` / ``match_outcome``, by the gold's kind
    extract.py    ``extract_answer`` / ``extract_outcome``
"""
from __future__ import annotations

from rewards.verify.bounds import (
    KINDS,
    MAX_ANSWER_CHARS,
    MAX_BRACE_DEPTH,
    MAX_SIMPLIFY_OPS,
    MAX_SYMBOLIC_CHARS,
    MAX_TEXT_CHARS,
    TOO_COMPLEX,
)
from rewards.verify.extract import answer_span, extract_answer, extract_outcome
from rewards.verify.kinds import detect_kind
from rewards.verify.matching import match, match_outcome

__all__ = [
    "answer_span",
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
]
