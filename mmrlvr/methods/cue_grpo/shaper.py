"""Cue-GRPO — a rare correct solution is not drowned by a frequent one.

Within each group, the verified-correct completions with a positive advantage are partitioned by
a deterministic strategy cue: the final answer's form (integer, decimal, fraction, expression,
text) plus the sequence of operations in the reasoning (the arithmetic signs it writes, repeats
collapsed). Their positive advantages are redistributed by the rarity of their cluster,

    w_i = |cluster(i)|^(−α)          A_i ← A_i · w_i · Σ_j A_j / Σ_j A_j·w_j

(sums over the group's correct, positive completions), so the group's total positive credit is
unchanged and only its split moves towards rare strategies. α 0.5 is our choice. A completion is
correct when its score holds `correct_key` (the accuracy reward's 0/1) >= `threshold`.
Config: `algo.shaping: [{name: cue_grpo, alpha: 0.5}]`.
"""
from __future__ import annotations

import re
from collections import Counter

from mmrlvr.algo.shaping import ShapeContext, TokenCredit
from rewards.verify import extract_answer

_OPS = re.compile(r"[+\-*/×÷=<>^]")
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def answer_form(answer: str | None) -> str:
    if answer is None:
        return "none"
    a = answer.strip().strip("$")
    if re.fullmatch(r"-?\d+", a):
        return "integer"
    if re.fullmatch(r"-?\d*\.\d+", a):
        return "decimal"
    if re.fullmatch(r"-?\d+\s*/\s*\d+", a) or a.startswith(("\\frac", "\\dfrac")):
        return "fraction"
    if re.search(r"[\\^_{}()+\-*/=]", a):
        return "expression"
    return "text"


def strategy_cue(text: str) -> tuple[str, str]:
    """(answer form, operation signature) of one completion."""
    reasoning = _THINK.search(text)
    ops = _OPS.findall(reasoning.group(1) if reasoning else text)
    collapsed = [op for k, op in enumerate(ops) if k == 0 or op != ops[k - 1]]
    return answer_form(extract_answer(text)), "".join(collapsed)


class CueGRPO:
    name = "cue_grpo"
    stage = "advantage"

    def __init__(self, alpha: float = 0.5, correct_key: str = "accuracy", threshold: float = 0.5):
        if not alpha >= 0:
            raise ValueError(f"cue_grpo: alpha must be >= 0, got {alpha}")
        self.alpha, self.correct_key, self.threshold = float(alpha), correct_key, float(threshold)

    def shape(self, credit: TokenCredit, ctx: ShapeContext) -> dict[str, float]:
        G = ctx.rollouts.group_size
        adv = credit.advantages                                                     # [N, C]
        clusters, moved = [], 0
        correct = ctx.scores.correct(self.correct_key, self.threshold)             # [B, G]
        for b in range(len(ctx.scores)):
            rows = [b * G + g for g in range(G) if correct[b, g] and adv[b * G + g, 0] > 0]
            if len(rows) < 2:
                continue
            cues = {r: strategy_cue(ctx.rollouts.texts[r]) for r in rows}
            sizes = Counter(cues.values())
            clusters.append(len(sizes))
            if len(sizes) == 1:
                continue
            weights = {r: sizes[cues[r]] ** -self.alpha for r in rows}
            total = sum(float(adv[r, 0]) for r in rows)
            weighted = sum(float(adv[r, 0]) * weights[r] for r in rows)
            for r in rows:
                adv[r] = adv[r] * (weights[r] * total / weighted)
            moved += 1
        return {"clusters_mean": sum(clusters) / len(clusters) if clusters else 0.0,
                "groups_reweighted": float(moved)}
