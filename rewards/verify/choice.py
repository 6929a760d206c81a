"""Multiple choice, without sympy: an answer names option ``idx`` by its letter or its text."""
from __future__ import annotations

import re

from rewards.verify.numbers import parse_number
from rewards.verify.strings import check_size, norm_text, squeeze_space, strip_inner_wrappers, unwrap

_CHOICE_LABEL_RE = re.compile(r"\A\s*[\(\[]?\s*([A-Za-z])\s*(?:[\)\]]\s*[.:]?|[.:])\s+(?=\S)")
CHOICE_ANS_RE = re.compile(
    r"(?:(?:option|choice|answer)\s*[:\-]?\s*)?"
    r"(?:\(\s*(?P<p>[A-Za-z])\s*\)|\[\s*(?P<b>[A-Za-z])\s*\]|(?P<l>[A-Za-z])\s*\)?)\s*[.:]?\Z",
    re.IGNORECASE,
)
_CHOICE_WITH_TEXT_RE = re.compile(
    r"(?:(?:option|choice)\s*)?(?:\(\s*([A-Za-z])\s*\)|\[\s*([A-Za-z])\s*\]|([A-Za-z])\s*[.:)\-])\s*[.:\-]?\s*(\S.*)\Z",
    re.IGNORECASE | re.DOTALL,
)


def choice_text(c: str, i: int):
    """(normalised text, exact number or None) of option number ``i``.

    A leading label (``"B. "``, ``"(B) "``) is dropped only when it is this
    option's own letter, so an option such as ``"E. coli"`` keeps its text.
    """
    c = str(c)
    check_size(c, f"option {chr(65 + i)}")
    c = squeeze_space(c)
    m = _CHOICE_LABEL_RE.match(c)
    if m and m.group(1).upper() == chr(65 + i):
        c = c[m.end() :]
    num = parse_number(unwrap(c))
    return norm_text(c), (num.value if num is not None and not num.percent else None)


def label_hits(answer: str, labels: tuple) -> list:
    """Indices of the options whose text (or exact number) equals ``answer``."""
    na = norm_text(answer)
    hits = [i for i, (t, _) in enumerate(labels) if na and t == na]
    if not hits:
        num = parse_number(unwrap(answer))
        if num is not None and not num.percent:
            hits = [
                i
                for i, (_, v) in enumerate(labels)
                if v is not None and type(v) is type(num.value) and v == num.value
            ]
    return hits


def match_choice(answer: str, idx: int, labels: tuple | None) -> bool:
    a = unwrap(answer)
    if "\\" in a:
        a = unwrap(strip_inner_wrappers(a))
    a = a.strip()
    m = CHOICE_ANS_RE.match(a)
    if m:
        # a lone lowercase letter like "b" is still the letter B
        return ord((m.group("p") or m.group("b") or m.group("l")).upper()) - 65 == idx
    if labels:
        # the option's own text (checked before "X. text" so that an option
        # such as "C. elegans" is read as text, not as letter C)
        hits = label_hits(a, labels)
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
        return bool(label_hits(m.group(4), labels[idx : idx + 1]))
    return False
