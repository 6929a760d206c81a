"""Accuracy reward: the extracted answer matches the gold through `rewards.verify` (fails closed)."""
from __future__ import annotations

from mmrlvr.data import Example
from rewards.verify import TOO_COMPLEX, extract_outcome, match_outcome


class AccuracyReward:
    """1 when `extract_answer(completion)` matches the gold, else 0.

    `parsed` logs extraction; `too_complex` marks a completion or answer cut short by one of the
    verifier's size bounds (scored 0 like any wrong answer, so its rate shows degenerate rollouts).
    """

    def __init__(self):
        self.name = "accuracy"

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        out = []
        for text in completions:
            answer, extracted = extract_outcome(text)
            verdict = extracted if answer is None else match_outcome(answer, example.answer, example.choices)
            out.append({"overall": float(verdict == "match"), "parsed": float(answer is not None),
                        "too_complex": float(verdict == TOO_COMPLEX)})
        return out
