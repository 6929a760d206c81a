"""Machine checks of rubrics: the claims a reasoning makes, read from its text.

A rubric's `check` is a small dict the rule-based judge evaluates on a rollout's reasoning:

    {"kind": "count", "value": N}                      states N as the count of the sounds
    {"kind": "order", "attribute": A, "winner": W}     says part W (first | second) has more A
                                                       (pitch, loudness, tempo, duration)
    {"kind": "mentions", "words": [...]}               talks about what it heard
    {"kind": "max_words", "value": N}                  at most N words

A count is read only where the text states it as the count of the counted sounds (`count_claims`):
a number attached to a counted noun ("I hear 3 beeps", "three short tones", "it beeps 3 times")
or to the word count ("the count is 3", "number of beeps: three"). Any other number is not a
count: an option ("option (3)", "A is 3", "the answer is 3"), a frequency ("300 Hz", "3 kHz
tones"), a time ("3 s"), a ratio ("3 times louder"), a hedge ("2 or 3 beeps"), a negation ("not 3
beeps") or a part ("the last 2 beeps"). Before this, any matching number anywhere passed, so
restating the options satisfied every count rubric.
"""
from __future__ import annotations

import re
from typing import Any

from mmrlvr.methods.audio_rubrics.evidence import ATTRIBUTES, order_facts

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve")
_NUMBER_WORDS = {w: i for i, w in enumerate(NUMBER_WORDS)}
_RELATIONS = {"higher": ("pitch", 1), "lower": ("pitch", -1), "louder": ("loudness", 1),
              "quieter": ("loudness", -1), "softer": ("loudness", -1), "faster": ("tempo", 1),
              "quicker": ("tempo", 1), "slower": ("tempo", -1), "longer": ("duration", 1),
              "shorter": ("duration", -1)}
_POSITIONS = {"first": "first", "1st": "first", "earlier": "first", "second": "second",
              "2nd": "second", "last": "second", "later": "second"}
_OTHER = {"first": "second", "second": "first"}
_WORD = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")


class JudgeError(RuntimeError):
    """A judge or rubric-writer call that failed or answered something unusable, or a rubric
    check that cannot be evaluated (none, an unknown kind, malformed)."""


def reasoning_of(text: str) -> str:
    """The `<think>` part of a completion, else the text before `<answer>`, else all of it."""
    m = _THINK.search(text or "")
    if m:
        return m.group(1).strip()
    return re.split(r"<answer>", text or "", flags=re.IGNORECASE)[0].strip()


def numbers_in(text: str) -> set[int]:
    """Every whole number in a text, digits or words up to twelve (not only counts)."""
    out = set()
    for w in _WORD.findall(text.lower()):
        if w.isdigit():
            out.add(int(w))
        elif w in _NUMBER_WORDS:
            out.add(_NUMBER_WORDS[w])
    return out


# -- counts -------------------------------------------------------------------------------------
_NUM = r"(?<![\w.,])(\d{1,3}|" + "|".join(NUMBER_WORDS) + r")(?![\w]|[.,]\d)"
_NOUN = (r"(?:beeps?|tones?|sounds?|clicks?|onsets?|notes?|events?|pulses?|bursts?|knocks?|"
         r"chirps?|blips?|pings?|ticks?|taps?|hits?)")
_MOD = (r"(?:distinct|separate|short|long|brief|quick|loud|quiet|soft|high|low|identical|similar|"
        r"equal|clear|single|individual|discrete|sharp|faint|pure|audible|repeated)")
_UNIT = r"(?:s|sec|secs|seconds?|ms|milliseconds?|hz|khz|db|percent|%|x|times)\b"
_FORWARD = re.compile(rf"{_NUM}[\s-]+(?:{_MOD}[\s,-]+){{0,2}}(?:{_NOUN}\b|times\b(?!\s+(?:as|more|less|the|\w+er)\b))")
_BACKWARD = re.compile(
    rf"\b(?:count|number\s+of\s+(?:{_MOD}\s+){{0,2}}{_NOUN}|{_NOUN}\s*[:=])"
    rf"\s*(?:is|was|=|:|of|equals|comes\s+to)?\s*{_NUM}(?!\s*{_UNIT})")
_NOT_A_COUNT_BEFORE = [
    re.compile(r"\b(?:option|choice|answer|letter)\s*\(?\s*[a-f]?\s*\)?\s*(?:is|=|:)?\s*\(?\s*$"),
    re.compile(r"\(\s*$"),                                           # "(3)"
    re.compile(rf"{_NUM}\s*(?:or|to|-|–|/)\s*$"),                    # "2 or 3 beeps", "2-3 beeps"
    re.compile(r"\b(?:not|no|never|nor|than|instead\s+of)\s+(?:\w+\s+){0,2}$"),
    re.compile(r"n't\s+(?:\w+\s+){0,2}$"),                           # "don't hear 3 beeps"
    re.compile(r"\b(?:first|last|next|other|remaining|final|initial|previous)\s+$"),
]
_OPTION_LETTER = re.compile(r"(?:^|[\s,;(])[A-F]\s*(?:is|=|:|\.|\))\s*$")   # "A is 3", "C. 3"


def count_claims(text: str) -> set[int]:
    """The counts a text states as the count of the sounds it heard (see the module doc)."""
    out = set()
    lowered = text.lower()
    for pattern in (_FORWARD, _BACKWARD):
        for m in pattern.finditer(lowered):
            before = lowered[max(0, m.start() - 40):m.start()]
            before_cased = text[max(0, m.start() - 40):m.start()]
            if pattern is _FORWARD and (any(p.search(before) for p in _NOT_A_COUNT_BEFORE)
                                        or _OPTION_LETTER.search(before_cased)):
                continue
            word = m.group(1)
            out.add(int(word) if word.isdigit() else _NUMBER_WORDS[word])
    return out


# -- comparisons --------------------------------------------------------------------------------
def order_claims(text: str) -> set[tuple[str, str]]:
    """Comparisons a text makes, as (attribute, which part has more of it).

    Per clause: the first position word and the first relation word; "the second tone is
    higher" and "the first is lower than the second" both give ("pitch", "second"). A position
    after "than" names the part with less.
    """
    claims = set()
    for clause in re.split(r"[.;!?\n]|\bbut\b|\bwhile\b|\bwhereas\b", text.lower()):
        words = _WORD.findall(clause)
        pos = rel = None
        for i, w in enumerate(words):
            if pos is None and w in _POSITIONS:
                pos = _POSITIONS[w]
                if i > 0 and words[i - 1] == "than" or i > 1 and words[i - 2] == "than":
                    pos = _OTHER[pos]
            if rel is None and w in _RELATIONS:
                rel = _RELATIONS[w]
        if pos and rel:
            attribute, sign = rel
            claims.add((attribute, pos if sign > 0 else _OTHER[pos]))
    return claims


# -- checks -------------------------------------------------------------------------------------
def check_satisfied(check: dict[str, Any] | None, reasoning: str) -> bool:
    """Whether `reasoning` passes a rubric's machine check."""
    if not check:
        raise JudgeError("this rubric has no machine check; only an LLM judge can judge it")
    kind = check.get("kind")
    if kind == "count":
        return int(check["value"]) in count_claims(reasoning)
    if kind == "order":
        return (check["attribute"], check["winner"]) in order_claims(reasoning)
    if kind == "mentions":
        words = set(_WORD.findall(reasoning.lower()))
        return any(w.lower() in words for w in check["words"])
    if kind == "max_words":
        n = len(reasoning.split())
        return 0 < n <= int(check["value"])
    raise JudgeError(f"unknown rubric check kind {kind!r}")


def valid_check(check: Any) -> dict[str, Any]:
    """`check` if it is a well-formed check dict (see the module doc), else JudgeError saying why."""
    if not isinstance(check, dict):
        raise JudgeError(f"a check must be an object, got {check!r}")
    kind, keys = check.get("kind"), set(check)
    shapes = {"count": {"kind", "value"}, "order": {"kind", "attribute", "winner"},
              "mentions": {"kind", "words"}, "max_words": {"kind", "value"}}
    if kind not in shapes or keys != shapes[kind]:
        raise JudgeError(f"check {check!r}: expected one of {sorted(shapes)} with keys "
                         f"{sorted(shapes.get(kind, {'kind'}))}")
    if kind in ("count", "max_words"):
        value = check["value"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
            raise JudgeError(f"check {check!r}: value must be a whole number in [0, 1000]")
    elif kind == "order" and (check["attribute"] not in ATTRIBUTES
                              or check["winner"] not in ("first", "second")):
        raise JudgeError(f"check {check!r}: attribute in {ATTRIBUTES}, winner first or second")
    elif kind == "mentions" and (not isinstance(check["words"], list) or not check["words"]
                                 or not all(isinstance(w, str) and w for w in check["words"])):
        raise JudgeError(f"check {check!r}: words must be a non-empty list of words")
    return check


def infer_check(criterion: str) -> dict[str, Any] | None:
    """The check a free-text criterion names, when it names exactly one count or one comparison
    ("States that there are 3 beeps", "Says the second tone is higher"); else None."""
    counts, orders = count_claims(criterion), order_claims(criterion)
    if len(counts) == 1 and not orders:
        return {"kind": "count", "value": next(iter(counts))}
    if len(orders) == 1 and not counts:
        attribute, winner = next(iter(orders))
        return {"kind": "order", "attribute": attribute, "winner": winner}
    return None


def check_is_true(check: dict[str, Any], evidence: dict[str, Any]) -> bool | None:
    """Whether a count or order check states what the measured evidence shows (None: it cannot
    tell, or the check is of another kind)."""
    if check.get("kind") == "count" and evidence.get("onset_count") is not None:
        return int(check["value"]) == int(evidence["onset_count"])
    if check.get("kind") == "order":
        facts = order_facts(evidence)
        return facts[check["attribute"]] == check["winner"] if check["attribute"] in facts else None
    return None


__all__ = ["JudgeError", "check_is_true", "check_satisfied", "count_claims", "infer_check",
           "numbers_in", "order_claims", "reasoning_of", "valid_check"]
