"""Accuracy reward: the extracted answer matches the gold through `rewards.verify` (fails closed)."""
from __future__ import annotations

from mmrlvr.data import Example
from rewards import register
from rewards.verify import extract_answer, match


class AccuracyReward:
    """1 when `extract_answer(completion)` matches the gold, else 0; `parsed` logs extraction."""

    def __init__(self):
        self.name = "accuracy"

    def score(self, example: Example, completions: list[str]) -> list[dict[str, float]]:
        out = []
        for text in completions:
            answer = extract_answer(text)
            ok = answer is not None and match(answer, example.answer, example.choices)
            out.append({"overall": float(ok), "parsed": float(answer is not None)})
        return out


register("accuracy")(AccuracyReward)
