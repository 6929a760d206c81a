"""Kind detection: what a gold answer is (number, expression, choice, yes/no, text), parsed once."""
from __future__ import annotations

import functools
import re
from decimal import Decimal
from fractions import Fraction

from rewards.verify.bounds import Bounded, GoldMissing
from rewards.verify.choice import choice_text, label_hits
from rewards.verify.numbers import parse_number, strip_var_prefix
from rewards.verify.strings import check_size, looks_like_math, norm_text, squeeze_space, unwrap, yesno_word

_LETTER_GOLD_RE = re.compile(r"[\(\[]?\s*([A-Z])\s*[\)\]]?\s*[.:)]?\Z")


@functools.lru_cache(maxsize=65536)
def gold_spec(gold: str, choices: tuple | None):
    """Parse a gold answer once: (kind, payload).  Raises ``Bounded`` past the size bounds."""
    check_size(gold, "gold")
    g = unwrap(squeeze_space(gold))
    if not g.strip():
        raise GoldMissing(f"gold answer {gold!r} is empty once its wrappers are removed")
    if choices:
        labels = [choice_text(c, i) for i, c in enumerate(choices)]
        m = _LETTER_GOLD_RE.match(g.strip())
        if m and (ord(m.group(1)) - 65) < len(choices):
            return "choice", (ord(m.group(1)) - 65, tuple(labels))
        hits = label_hits(g, tuple(labels))
        if len(hits) == 1:
            return "choice", (hits[0], tuple(labels))
        # gold is neither a letter nor one option's text: fall through
    m = _LETTER_GOLD_RE.match(g.strip())
    if m:
        return "choice", (ord(m.group(1)) - 65, None)
    yn = yesno_word(g)
    if yn is not None:
        return "yesno", yn
    num = parse_number(g)
    if num is not None:
        return "number", num
    eq = strip_var_prefix(g)
    if looks_like_math(eq):
        return "expression", eq
    # text; a gold that normalises to nothing (e.g. "the") is compared verbatim
    return "text", (norm_text(g), g.strip().casefold())


def check_gold(gold) -> str:
    """The gold as a non-empty string (ints/Fractions/Decimals/floats coerced)."""
    if isinstance(gold, (int, float, Fraction, Decimal)) and not isinstance(gold, bool):
        gold = str(gold)
    if not isinstance(gold, str) or not gold.strip():
        raise GoldMissing(f"empty or non-string gold answer: {gold!r}")
    return gold


def detect_kind(gold: str, choices: list[str] | None = None) -> str:
    """The comparison kind for ``gold``: number/expression/choice/yesno/text.

    Raises ``ValueError`` for an empty gold, or one past ``MAX_ANSWER_CHARS`` /
    ``MAX_BRACE_DEPTH`` (with its options): such a row cannot be scored.
    """
    gold = check_gold(gold)
    try:
        return gold_spec(gold, tuple(choices) if choices else None)[0]
    except Bounded as e:
        raise ValueError(f"gold answer cannot be verified, too complex: {e}") from None
