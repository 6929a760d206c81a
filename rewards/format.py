"""Format reward: `<think>…</think>` then `<answer>…</answer>` (or a final `\\boxed{}`)."""
from __future__ import annotations

import re

from mmrlvr.data import Example

_LEAD = re.compile(r"\s*<think>")
_GAP_ANSWER = re.compile(r"\s*<answer>")


def is_well_formatted(text: str, allow_boxed: bool = True) -> bool:
    """One think block, then exactly one non-empty answer block and nothing after it."""
    blocks = _think_answer(text)
    if blocks is not None:
        think, answer = blocks
        return (text.count("<think>") == 1 and text.count("<answer>") == 1
                and think.strip() != "" and answer.strip() != "")
    return bool(allow_boxed and _think_boxed(text) and text.count("<think>") == 1)


# The two shapes below are what the regexes `^\s*<think>(.+?)</think>\s*<answer>(.+?)</answer>\s*$`
# and `^\s*<think>(.+?)</think>.*\\boxed\{.+\}\s*$` (DOTALL) accept, read by a scan: their nested
# lazy and greedy repetitions backtrack quadratically (`</think><answer>b</answer>x` 8,000 times:
# 11 s) or worse (`</think>\boxed{` 3,000 times: 58 s).


def _think_answer(text: str) -> tuple[str, str] | None:
    """(think, answer) of `<think>think</think> <answer>answer</answer>` filling `text` up to
    surrounding whitespace (each part at least one character; the think block ends at the first
    `</think>` that blank space and `<answer>` follow); None when `text` is not that shape."""
    lead = _LEAD.match(text)
    end = len(text.rstrip())
    if lead is None or not text.endswith("</answer>", 0, end):
        return None
    think_end = text.find("</think>", lead.end() + 1)
    while think_end >= 0 and (gap := _GAP_ANSWER.match(text, think_end + len("</think>"))) is None:
        think_end = text.find("</think>", think_end + 1)
    answer_end = end - len("</answer>")
    # a later </think> would leave a shorter answer: if this one leaves none, so do they all
    if think_end < 0 or answer_end <= gap.end():
        return None
    return text[lead.end():think_end], text[gap.end():answer_end]


def _think_boxed(text: str) -> bool:
    """Whether `text` is `<think>…</think>`, anything, `\\boxed{…}` ending it up to whitespace (each
    part but the middle at least one character; a `}` closes the box, balanced or not)."""
    lead = _LEAD.match(text)
    last = len(text.rstrip()) - 1
    if lead is None or text[last] != "}":
        return False
    think_end = text.find("</think>", lead.end() + 1)
    box = text.find("\\boxed{", think_end + len("</think>")) if think_end >= 0 else -1
    return box >= 0 and last >= box + len("\\boxed{") + 1


class FormatReward:
    """1 when the completion follows the think/answer format, else 0."""

    def __init__(self, allow_boxed: bool = True):
        self.name = "format"
        self.allow_boxed = allow_boxed

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        return [{"overall": float(is_well_formatted(c, self.allow_boxed))} for c in completions]
