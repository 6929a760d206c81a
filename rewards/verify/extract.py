"""``extract_answer`` / ``extract_outcome``: the final answer of a completion, or none.

The last ``<answer>`` block, else the last ``\\boxed{}``, else the last "the answer is X"; none
when that answer is empty, ambiguous or unclosed.  Linear in the completion's length: one scan
pairs every brace, tags are found by a regex without nested repetition, and the answer-is search
runs backwards from the end.
"""
from __future__ import annotations

import re

from rewards.verify.bounds import MAX_ANSWER_BOXES, MAX_ANSWER_CHARS, MAX_TEXT_CHARS, TOO_COMPLEX, Bounded
from rewards.verify.choice import CHOICE_ANS_RE
from rewards.verify.latex import canon_latex
from rewards.verify.numbers import parse_number
from rewards.verify.strings import (
    check_size,
    closing_braces,
    looks_like_math,
    squeeze_space,
    unwrap,
    yesno_word,
)

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
    closes = closing_braces(text, opens, min(opens)) if opens else {}
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
    """The distinct normalised contents of ``boxes``; ``Bounded`` past the size bounds."""
    if len(boxes) > MAX_ANSWER_BOXES:
        raise Bounded(f"{len(boxes)} boxes in the final answer > MAX_ANSWER_BOXES={MAX_ANSWER_BOXES}")
    if sum(b[3] - b[2] for b in boxes) > MAX_ANSWER_CHARS:
        raise Bounded(f"boxed answers longer than MAX_ANSWER_CHARS={MAX_ANSWER_CHARS} in all")
    contents = set()
    for b in boxes:
        c = text[b[2] : b[3]]
        check_size(c, "boxed answer")
        contents.add(canon_latex(unwrap(c)).casefold())
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
    p = unwrap(part)
    if not p:
        return False
    if CHOICE_ANS_RE.match(p) or yesno_word(p) is not None or parse_number(p) is not None:
        return True
    return len(p) <= 60 and looks_like_math(p)


def _ambiguous(candidate: str) -> bool:
    parts = [p for p in _OR_SPLIT_RE.split(candidate) if p.strip()]
    if len(parts) < 2:
        return False
    for k, p in enumerate(parts):
        if not _is_atomic(p):
            return False
        if k == MAX_ANSWER_BOXES:
            raise Bounded(f"more than MAX_ANSWER_BOXES={MAX_ANSWER_BOXES} answers joined by 'or'")
    return len({canon_latex(unwrap(p)).casefold() for p in parts}) > 1


def _finish(candidate: str | None) -> str | None:
    if candidate is None:
        return None
    c = candidate.strip()
    if not c:
        return None
    check_size(c, "answer")
    if not unwrap(c).strip():
        return None
    if _ambiguous(squeeze_space(c)):
        return None
    return c


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, or ``None`` (see ``rewards.verify``)."""
    return extract_outcome(text)[0]


def extract_outcome(text: str) -> tuple[str | None, str]:
    """``(answer, outcome)``: ``"answer"``, ``"no_answer"``, or ``TOO_COMPLEX`` (answer None)."""
    try:
        answer = _extract(text)
        outcome = "no_answer" if answer is None else "answer"
    except Bounded:
        answer, outcome = None, TOO_COMPLEX
    return answer, outcome


def answer_span(text: str, include_tags: bool = False) -> tuple[int, int] | None:
    """``(start, end)`` characters of the block ``extract_answer`` reads the final answer from.

    The content of the last ``<answer>...</answer>`` (the last opening tag before the last
    closing one), else of the final box (``\\boxed{...}`` with nested braces, or the token of a
    bare ``\\boxed 5``). ``None`` wherever extraction fails closed on the block (an unclosed last
    ``<answer>``, a box never closed, an earlier box never closed) and where the completion has
    neither (the "the answer is X" fallback has no span). ``include_tags`` widens the span to
    the tags or the whole ``\\boxed{...}``. Inside the span the extractor may still reject
    the answer (ambiguous, too long); the span is where it looked.
    """
    if not isinstance(text, str) or not text:
        return None
    block = _answer_block(text)
    if block is not None:
        last_open, close = block
        if close is None:
            return None
        return (last_open.start(), close.end()) if include_tags else (last_open.end(), close.start())
    boxes = _find_boxed(text)
    if not boxes or boxes[-1][2] < 0:
        return None
    start, end, content_start, content_end = boxes[-1]
    return (start, end) if include_tags else (content_start, content_end)


def _answer_block(text: str):
    """The last ``<answer>`` and the last ``</answer>`` after it: ``(open, close)``, close
    ``None`` when that tag is never closed; ``None`` without an ``<answer>`` tag."""
    last_open = _last(_ANSWER_OPEN_RE, text)
    if last_open is None:
        return None
    close = _last(_ANSWER_CLOSE_RE, text)
    return last_open, (None if close is None or close.start() < last_open.end() else close)


def _last(pattern: re.Pattern, text: str):
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - only the last one is wanted
        pass
    return last


def _extract(text) -> str | None:
    if not isinstance(text, str) or not text:
        return None
    if len(text) > MAX_TEXT_CHARS:
        raise Bounded(f"completion: {len(text)} characters > MAX_TEXT_CHARS={MAX_TEXT_CHARS}")
    lower = text.lower()
    if "answer" in lower and "<" in text:
        block = _answer_block(text)
        if block is not None:
            last_open, last_close = block
            if last_close is None:
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
