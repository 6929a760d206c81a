"""Consensus reward — OM-GRPO's label-free reward: the group votes, the gold is never read.

Seed paper: OM-GRPO (label-free RLVR). A soft consensus over the group's own answers replaces
the gold answer, plus a contrast term from pairwise comparisons of the group's trajectories;
the answer-span gradient mask that goes with it is `mmrlvr/methods/om_grpo/shaper.py` (shaper "om_grpo").

Per group of G completions of one example:

    a_i        = extract_answer(completion_i)            (None: unparsed)
    agree(i,j) = match(a_i, a_j, choices) or match(a_j, a_i, choices) or a_i == a_j
                 (both parsed; `match` is asymmetric, its kind comes from the "gold" side)
    support_i  = #{j parsed : agree(i, j)}               (itself included; 0 when unparsed)
    soft_i     = support_i / #parsed                     (0 when unparsed or none parsed)
    o_ij       = 1/2 if agree(i, j), else 1 / 1/2 / 0 as support_i >, =, < support_j
    contrast_i = mean_{j != i} o_ij − 1/2                in [−1/2, 1/2], zero mean per group
    overall_i  = soft_i + contrast_weight · contrast_i

The soft consensus is the paper's. The contrast term is our choice: each pair of trajectories is
a contest won by the one whose answer more of the group holds (a parsed answer always beats an
unparsed one; two that agree draw), so a trajectory's contrast is its win rate over the rest of
its group, centred. It sharpens the gap between the voted answer and the runners-up where their
soft shares are close, and it sums to zero over the group. `contrast_weight` 0.5 is our choice
(0 turns it off: the reward is then the soft consensus alone).

The gold answer is read only for two diagnostics, never for `overall`:
`majority_correct` (does the voted answer match the gold: among the parsed answers with the
highest support, the share that `match` the gold; 0 when nothing parsed) and `has_gold` (1 unless
the row's answer is a placeholder); with the reward named `consensus` they log as
`reward/consensus/majority_correct` etc. `agree_frac` is max support / G: how much of the group
stands behind the vote. `parsed` and `too_complex` are the verifier's, as in `accuracy`.

Unlabelled data (test-time training): a row still needs an `answer` to load (data loading is
unchanged), so give unlabelled rows a placeholder answer, any non-empty string such as "?". This
reward never reads it for the score; rows whose answer is one of `placeholders` (default ["?"])
report `has_gold` 0 and `majority_correct` 0. Any other placeholder string works for training,
but then `majority_correct` compares the vote against it: list it in `placeholders`.
Config: `rewards: [{name: consensus, weight: 0.9, contrast_weight: 0.5}, {name: format, weight: 0.1}]`.
"""
from __future__ import annotations

from mmrlvr.data import Example
from rewards.verify import TOO_COMPLEX, extract_outcome, match


class ConsensusReward:
    """Soft group consensus + pairwise contrast; the gold only feeds diagnostics."""

    def __init__(self, contrast_weight: float = 0.5, placeholders: list[str] | tuple[str, ...] = ("?",)):
        if not contrast_weight >= 0:
            raise ValueError(f"consensus: rewards[].contrast_weight must be >= 0, got {contrast_weight}")
        if isinstance(placeholders, str):
            raise TypeError("consensus: rewards[].placeholders must be a list of strings, "
                            f"got the string {placeholders!r}")
        self.name = "consensus"
        self.contrast_weight = float(contrast_weight)
        self.placeholders = {p.strip() for p in placeholders}

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        outcomes = [extract_outcome(text) for text in completions]
        answers = [a for a, _ in outcomes]
        soft, contrast, support = consensus_scores(answers, example.choices)
        gold = (example.answer or "").strip()
        has_gold = bool(gold) and gold not in self.placeholders
        top = max(support, default=0)
        voted = [a for a, s in zip(answers, support) if a is not None and s == top]
        majority_correct = (sum(match(a, example.answer, example.choices) for a in voted) / len(voted)
                            if has_gold and voted else 0.0)
        agree_frac = top / len(completions) if completions else 0.0
        return [{"overall": s + self.contrast_weight * c, "soft": s, "contrast": c,
                 "parsed": float(a is not None), "too_complex": float(outcome == TOO_COMPLEX),
                 "majority_correct": float(majority_correct), "agree_frac": agree_frac,
                 "has_gold": float(has_gold)}
                for s, c, a, (_, outcome) in zip(soft, contrast, answers, outcomes)]


def agreement(answers: list[str | None], choices: list[str] | None = None) -> list[list[bool]]:
    """[G][G] whether two parsed answers agree (symmetric; unparsed agree with nothing)."""
    G = len(answers)
    out = [[False] * G for _ in range(G)]
    for i in range(G):
        for j in range(i, G):
            a, b = answers[i], answers[j]
            if a is None or b is None:
                continue
            same = a.strip() == b.strip() or match(a, b, choices) or match(b, a, choices)
            out[i][j] = out[j][i] = same
    return out


def consensus_scores(answers: list[str | None], choices: list[str] | None = None
                     ) -> tuple[list[float], list[float], list[int]]:
    """(soft consensus, contrast, support) of one group's answers (module docstring)."""
    G = len(answers)
    agree = agreement(answers, choices)
    parsed = sum(a is not None for a in answers)
    support = [sum(row) for row in agree]                       # 0 for an unparsed answer
    soft = [s / parsed if parsed else 0.0 for s in support]
    contrast = []
    for i in range(G):
        wins = 0.0
        for j in range(G):
            if j == i:
                continue
            if agree[i][j] or support[i] == support[j]:
                wins += 0.5
            elif support[i] > support[j]:
                wins += 1.0
        contrast.append(wins / (G - 1) - 0.5 if G > 1 else 0.0)
    return soft, contrast, support
