"""The verifier's bounds: every size and work limit, the outcome past one, and its exceptions.

Past any bound the outcome is ``TOO_COMPLEX`` (no answer / no match), never a long computation or
an exception out of the public functions.  ``Bounded`` carries that refusal inside the package;
``ParseError`` marks input outside the LaTeX grammar (compared as strings, fails closed);
``GoldMissing`` an empty gold.
"""
from __future__ import annotations

#: The comparison kinds ``detect_kind`` returns.
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


class Bounded(Exception):
    """A check refused because it would be too expensive: the outcome is ``TOO_COMPLEX``."""


class GoldMissing(ValueError):
    """The gold answer is missing or empty."""


class ParseError(Exception):
    """Input is outside the supported grammar."""
