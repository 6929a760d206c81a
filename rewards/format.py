"""Format reward: `<think>…</think>` then `<answer>…</answer>` (or a final `\\boxed{}`)."""
from __future__ import annotations

import re

from mmrlvr.data import Example

_THINK_ANSWER = re.compile(r"^\s*<think>(.+?)</think>\s*<answer>(.+?)</answer>\s*$", re.DOTALL)
_THINK_BOXED = re.compile(r"^\s*<think>(.+?)</think>.*\\boxed\{.+\}\s*$", re.DOTALL)


def is_well_formatted(text: str, allow_boxed: bool = True) -> bool:
    """One think block, then exactly one non-empty answer block and nothing after it."""
    m = _THINK_ANSWER.match(text)
    if m:
        return (text.count("<think>") == 1 and text.count("<answer>") == 1
                and m.group(1).strip() != "" and m.group(2).strip() != "")
    return bool(allow_boxed and _THINK_BOXED.match(text) and text.count("<think>") == 1)


class FormatReward:
    """1 when the completion follows the think/answer format, else 0."""

    def __init__(self, allow_boxed: bool = True):
        self.name = "format"
        self.allow_boxed = allow_boxed

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        return [{"overall": float(is_well_formatted(c, self.allow_boxed))} for c in completions]
