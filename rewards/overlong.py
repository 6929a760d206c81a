"""DAPO's soft overlong penalty: a completion pays for the tokens it spends in the last
`buffer` of its budget, linearly, and −1 past the budget.

    L ≤ max_tokens − buffer:               0
    max_tokens − buffer < L ≤ max_tokens:  −(L − (max_tokens − buffer)) / buffer
    L > max_tokens:                        −1

L is the completion's length in tokens (the trainer hands every reward the token ids), so the
reward needs them: it scores through `score_groups`, never from text alone. Set `max_tokens`
to `rollout.max_new_tokens` (a completion that reaches it was cut) and add the reward beside the
task's: `{name: overlong, weight: 1.0, max_tokens: 1024, buffer: 256}`.
"""
from __future__ import annotations

from mmrlvr.data import Example
from rewards.isolation import ScoresGroups


class OverlongReward(ScoresGroups):
    name = "overlong"

    def __init__(self, max_tokens: int | None = None, buffer: int = 256):
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError("reward overlong needs max_tokens, the token budget (set it to "
                             f"rollout.max_new_tokens), a whole number >= 1; got {max_tokens!r}")
        if not isinstance(buffer, int) or not 1 <= buffer <= max_tokens:
            raise ValueError(f"reward overlong: buffer must be a whole number in [1, max_tokens "
                             f"= {max_tokens}], got {buffer!r}")
        self.max_tokens, self.buffer = max_tokens, buffer

    def penalty(self, length: int) -> float:
        start = self.max_tokens - self.buffer
        if length <= start:
            return 0.0
        if length <= self.max_tokens:
            return -(length - start) / self.buffer
        return -1.0

    def score_groups(self, examples: list[Example], groups: list[list[str]], progress: float = 0.0,
                     completion_ids: list[list[list[int]]] | None = None
                     ) -> list[list[dict[str, float]]]:
        if completion_ids is None:
            raise ValueError("reward overlong scores token lengths and was given text only (an "
                             "eval with train.eval_reward passes no ids): leave it out of "
                             "eval_rewards")
        return [[{"overall": self.penalty(len(ids)), "tokens": float(len(ids))} for ids in group]
                for group in completion_ids]
