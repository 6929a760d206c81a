"""OM-GRPO's mechanism check (`mmrlvr check-method om_grpo`): is the starting model's group
vote right more often than not?

OM-GRPO trains on the group's consensus instead of the gold (`rewards/consensus.py`); that pays
for right answers only where the voted answer is right more often than wrong, the gold-free
premise. The check samples G completions per question from the starting model (the HF engine,
clean), votes them as the consensus reward does (its `majority_correct`: among the parsed answers
with the most support, the share that match the gold), and averages over the questions that
carry a gold answer. Inactive at or under `PREMISE` (0.5), or where no row has a gold answer.
Also reported: the single-sample accuracy (what the vote improves on), the parsed share and the
mean `agree_frac` (how much of a group stands behind its vote).
"""
from __future__ import annotations

from mmrlvr.core.method_check import CheckContext, CheckResult
from mmrlvr.rollout.groups import sample_groups

PREMISE = 0.5
"""Majority-vote accuracy the consensus reward needs to beat (the gold-free premise)."""
ROWS = 32
"""Rows read by default (`--rows 0`)."""
BATCH = 8
"""Prompts per generate call."""


def verdict(figures: dict[str, float]) -> tuple[str, str]:
    """(`active`/`inactive`, why) from the vote's figures."""
    if not figures.get("rows_with_gold", 0.0):
        return "inactive", "no row has a gold answer (all placeholders): the vote cannot be scored"
    acc = figures["majority_vote_acc"]
    if acc <= PREMISE:
        return "inactive", (f"majority-vote accuracy {acc:.3f} <= {PREMISE}: the consensus "
                            "reward pays wrong answers at least as often as right ones")
    return "active", f"majority-vote accuracy {acc:.3f} > {PREMISE}"


def vote(examples: list, texts: list[str], group: int) -> dict[str, float]:
    """The vote's figures over prompt-major groups of `group` completions per example."""
    from rewards.consensus import ConsensusReward
    from rewards.verify import extract_answer, match

    reward = ConsensusReward()
    majority, single, parsed, agree = [], [], [], []
    for b, ex in enumerate(examples):
        members = texts[b * group:(b + 1) * group]
        scores = reward.score(ex, members)
        parsed += [s["parsed"] for s in scores]
        agree.append(scores[0]["agree_frac"])
        if scores[0]["has_gold"]:
            majority.append(scores[0]["majority_correct"])
            answers = [extract_answer(t) for t in members]
            single += [float(a is not None and match(a, ex.answer, ex.choices)) for a in answers]
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return {"majority_vote_acc": round(mean(majority), 4), "sample_acc": round(mean(single), 4),
            "parsed_frac": round(mean(parsed), 4), "agree_frac": round(mean(agree), 4),
            "rows": float(len(examples)), "rows_with_gold": float(len(majority))}


def check(ctx: CheckContext) -> CheckResult:
    opts = ctx.options
    rows = ctx.rows(ROWS)
    texts = [text for out in sample_groups(ctx.policy("om_grpo"), opts, rows, BATCH)
             for text in out.texts]
    figures = vote(rows, texts, opts.group)
    state, why = verdict(figures)
    return CheckResult("om_grpo", state, why, figures, {"majority_vote_acc": PREMISE})
