"""PIRL's dynamic trinary reward: format and content scored apart (docs/methods.md, "PIRL").

    r = 1       the answer is correct and the completion is well formatted
                (`<think>…</think><answer>…</answer>`, `rewards.format.is_well_formatted`)
    r = r_mid   the content is correct but the format is broken: a lenient extractor still finds
                the right answer (no think block, an unclosed `<answer>`, a bare last line, ...)
    r = 0       wrong, or no answer found at all (fails closed like every verifier here)

"Dynamic" (our reading of the paper): `r_mid` anneals linearly from `r_mid_start` (0.5) to
`r_mid_end` (0) as training progresses, so early on a correct but sloppy answer still earns
credit and by the end only the full format does. The trainer passes `progress = step / steps`
to every `score` call (the Reward protocol, `mmrlvr.core.types.Reward`).

`levels` says which value each of the four cells (well formatted or not) x (content correct or
not) gets; a value is a number or `"r_mid"` (the annealed middle value):

    content_first (default, the reading above)  1 | wrong, formatted 0     | correct, misformatted r_mid | wrong, misformatted 0
    format_first                                1 | wrong, formatted r_mid | correct, misformatted 0     | wrong, misformatted 0

`format_first` ranks a well-formatted wrong answer above any misformatted one (the middle rung
rewards the format instead of the content). A mapping with the keys of `CELLS` sets each cell.
"""
from __future__ import annotations

import re

from mmrlvr.data import Example
from rewards.format import is_well_formatted
from rewards.verify import extract_answer, match

_THINK_OPEN = re.compile(r"<\s*think\s*>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"<\s*/\s*think\s*>", re.IGNORECASE)
_OPEN_ANSWER = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_TAG = re.compile(r"<\s*/?\s*(?:think|answer)\s*>", re.IGNORECASE)
_PREFIX = re.compile(r"^(?:final answer|the answer is|answer)\s*[:\-]?\s*", re.IGNORECASE)
MAX_LENIENT_CHARS = 80
"""A lenient candidate longer than this is prose, not an answer: it scores 0."""


def lenient_extract(text: str, strict: str | None = None) -> str | None:
    """An answer from a completion whose format may be broken; None when none can be read.

    In order: the strict `rewards.verify.extract_answer` result (pass it as `strict` when already
    computed, so each completion is parsed once); the text after a last `<answer>` that is never
    closed; else, with closed think blocks and stray tags removed, the last non-empty line without
    an "Answer:" prefix. A completion that is all thinking (an unclosed `<think>`) gives None, and
    so does anything over `MAX_LENIENT_CHARS`.
    """
    if strict is None:
        strict = extract_answer(text)
    if strict is not None:
        return strict
    if not isinstance(text, str) or not text.strip():
        return None
    body = _drop_think_blocks(text)
    if _THINK_OPEN.search(body):
        return None
    opens = list(_OPEN_ANSWER.finditer(body))
    if opens:
        body = body[opens[-1].end():]
    lines = [ln.strip() for ln in _TAG.sub("\n", body).splitlines() if ln.strip()]
    if not lines:
        return None
    candidate = _PREFIX.sub("", lines[0] if opens else lines[-1]).strip().rstrip(".").strip()
    if not candidate or len(candidate) > MAX_LENIENT_CHARS:
        return None
    return candidate


def _drop_think_blocks(text: str) -> str:
    """`text` with each closed think block (an open tag through the first close after it) made a
    newline, as `re.sub(r"<think>.*?</think>", "\\n", text)` would (tags case-insensitive, spaces
    allowed), in one scan: that regex retries its lazy search from every open tag, quadratic in a
    flood of unclosed ones (`"<think>" * 20000`: 21 s)."""
    parts, pos = [], 0
    while (start := _THINK_OPEN.search(text, pos)) is not None:
        end = _THINK_CLOSE.search(text, start.end())
        if end is None:       # no close after this open, so none after any later open either
            break
        parts += [text[pos:start.start()], "\n"]
        pos = end.end()
    parts.append(text[pos:])
    return "".join(parts)


CELLS = ("formatted_correct", "formatted_wrong", "misformatted_correct", "misformatted_wrong")
"""The four outcomes a completion can have: (well formatted or not) x (content correct or not)."""
LEVELS: dict[str, dict[str, float | str]] = {
    "content_first": {"formatted_correct": 1.0, "formatted_wrong": 0.0,
                      "misformatted_correct": "r_mid", "misformatted_wrong": 0.0},
    "format_first": {"formatted_correct": 1.0, "formatted_wrong": "r_mid",
                     "misformatted_correct": 0.0, "misformatted_wrong": 0.0},
}
"""Named `levels`: the default is our documented reading of the paper; `format_first` the variant
that ranks well-formatted-wrong above misformatted."""


def parse_levels(levels: str | dict[str, float | str]) -> dict[str, float | str]:
    """A `levels` option (a name of `LEVELS` or a mapping over `CELLS`) as the cell -> value table."""
    if isinstance(levels, str):
        if levels not in LEVELS:
            raise ValueError(f"pirl reward: levels {levels!r} is not one of {sorted(LEVELS)} (or "
                             f"give a mapping over {list(CELLS)})")
        return dict(LEVELS[levels])
    table = dict(levels or {})
    wrong = sorted(set(table) ^ set(CELLS))
    bad = [f"{k}={v!r}" for k, v in table.items()
           if v != "r_mid" and not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0)]
    if wrong or bad:
        raise ValueError(f"pirl reward: levels must give every one of {list(CELLS)} a number in "
                         f"[0, 1] or 'r_mid'; " + (f"missing or unknown keys {wrong}" if wrong
                                                   else f"bad values {bad}"))
    return table


class PirlReward:
    """The cell values of `levels` (default 1 / r_mid / 0 as above); components: `correct`
    (content), `format`, `r_mid` (current value)."""

    def __init__(self, r_mid_start: float = 0.5, r_mid_end: float = 0.0, allow_boxed: bool = True,
                 levels: str | dict[str, float | str] = "content_first"):
        if not 0.0 <= r_mid_end <= 1.0 or not 0.0 <= r_mid_start <= 1.0:
            raise ValueError(f"pirl reward: r_mid_start ({r_mid_start}) and r_mid_end ({r_mid_end}) "
                             "must lie in [0, 1]")
        self.name = "pirl"
        self.r_mid_start, self.r_mid_end, self.allow_boxed = r_mid_start, r_mid_end, allow_boxed
        self.levels = parse_levels(levels)

    def r_mid(self, progress: float) -> float:
        """`r_mid` at training progress in [0, 1] (clamped): linear from start to end."""
        progress = min(max(float(progress), 0.0), 1.0)
        return self.r_mid_start + (self.r_mid_end - self.r_mid_start) * progress

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        r_mid, out = self.r_mid(progress), []
        for text in completions:
            strict = extract_answer(text)
            formatted = is_well_formatted(text, self.allow_boxed)
            if formatted and strict is not None and match(strict, example.answer, example.choices):
                correct = 1.0
            else:
                loose = lenient_extract(text, strict)
                correct = float(loose is not None and match(loose, example.answer, example.choices))
            cell = f"{'' if formatted else 'mis'}formatted_{'correct' if correct else 'wrong'}"
            level = self.levels[cell]
            value = r_mid if level == "r_mid" else float(level)
            out.append({"overall": value, "correct": correct, "format": float(formatted),
                        "r_mid": r_mid})
        return out
