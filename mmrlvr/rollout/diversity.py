"""Per-step exploration figures of a batch of rollouts: how different the members of a group are.

`rollout_metrics` is what the trainer logs every step: the core's `rollout/*` figures, then those
of the engine's rollout branching (`RolloutBranching.metrics`, e.g. NC-GRPO's `branch/*`), if
any. The helpers are public so a branching method can compute the same figures over a subset of
each group's members.
"""
from __future__ import annotations

import numpy as np

from mmrlvr.core.types import Rollouts, Scores
from mmrlvr.rollout.base import RolloutBranching

EDIT_MAX_TOKENS = 256
"""`rollout/pairwise_edit` compares the first this many tokens of each completion (our choice:
it bounds the cost, O(pairs·256²), on long GPU completions; the CPU runs' are shorter)."""


def normalised_edit(seqs: list[list[int]], pairs: list[tuple[int, int]]) -> np.ndarray:
    """Levenshtein distance of each pair (i, j) of `seqs`, divided by the longer length (0 for
    two empty ones): [len(pairs)] in [0, 1]. The O(n·m) dynamic programme, one row of the table
    at a time for every pair at once; each row's insertions are a running minimum
    (cur[j] = min over k <= j of cand[k] + j - k)."""
    if not pairs:
        return np.zeros(0)
    a = [seqs[i] for i, _ in pairs]
    b = [seqs[j] for _, j in pairs]
    la, lb = np.array([len(x) for x in a]), np.array([len(x) for x in b])    # [P]
    n, m = max(int(la.max()), 1), max(int(lb.max()), 1)
    A, B = np.full((len(pairs), n), -1), np.full((len(pairs), m), -2)        # distinct pads
    for p, (x, y) in enumerate(zip(a, b)):
        A[p, :len(x)], B[p, :len(y)] = x, y
    cols = np.arange(m + 1)
    prev = np.tile(cols, (len(pairs), 1))                                    # D[0, j] = j
    dist = np.where(la == 0, lb, 0)
    for i in range(1, int(la.max()) + 1):
        cand = np.empty_like(prev)                                           # [P, m+1]
        cand[:, 0] = i
        cand[:, 1:] = np.minimum(prev[:, :-1] + (A[:, i - 1:i] != B), prev[:, 1:] + 1)
        prev = np.minimum.accumulate(cand - cols, axis=1) + cols
        done = la == i
        dist[done] = prev[done, lb[done]]
    return dist / np.maximum(np.maximum(la, lb), 1)


def group_pairs(rows_by_group: list[list[int]]) -> list[tuple[int, int]]:
    """Every unordered pair of rows within each group."""
    return [(r[x], r[y]) for r in rows_by_group for x in range(len(r)) for y in range(x + 1, len(r))]


def group_rows(rollouts: Rollouts) -> list[list[int]]:
    """The rows of each group: [[0 … G-1], [G … 2G-1], …]."""
    G = rollouts.group_size
    return [list(range(start, start + G)) for start in range(0, len(rollouts.texts), G)]


def final_answers(rollouts: Rollouts) -> list[str | None]:
    """Each completion's extracted final answer, stripped (None where none parses). [N]"""
    from rewards.verify import extract_answer

    return [None if a is None else a.strip() for a in map(extract_answer, rollouts.texts)]


def distinct(answers: list[str | None], rows: list[int]) -> int:
    """How many distinct parsed answers `rows` gave (unparsed ones not counted)."""
    return len({answers[i] for i in rows if answers[i] is not None})


def completion_tokens(rollouts: Rollouts) -> list[list[int]]:
    """Each completion's kept tokens, its first `EDIT_MAX_TOKENS` of them. [N][≤ EDIT_MAX_TOKENS]"""
    kept = rollouts.completion_mask.bool()
    return [rollouts.completion_ids[r][kept[r]][:EDIT_MAX_TOKENS].tolist()
            for r in range(len(rollouts.texts))]


def rollout_metrics(rollouts: Rollouts, scores: Scores,
                    branching: RolloutBranching | None = None) -> dict[str, float]:
    """Per-step exploration figures of one batch of rollouts and their scores ([B][G] dicts).

    `rollout/distinct_answers` (mean over groups of distinct extracted final answers, unparsed
    ones not counted), `rollout/pairwise_edit` (mean over the pairs of members of one group of
    their token-level Levenshtein distance over the longer length; the first `EDIT_MAX_TOKENS`
    tokens) and `rollout/first_token_entropy` (mean entropy of the first sampled position, where
    the engine recorded it); where the rewards have an `accuracy` part, `rollout/pass_at_group`
    (share of groups with at least one member scoring accuracy > 0). Then `branching`'s own
    figures. The zero-spread group fraction is logged by the trainer (`reward/zero_spread_frac`).
    """
    groups = group_rows(rollouts)
    answers = final_answers(rollouts)
    flat = scores.flat                                                          # [N]
    out = {"rollout/distinct_answers": float(np.mean([distinct(answers, g) for g in groups]))}
    edits = normalised_edit(completion_tokens(rollouts), group_pairs(groups))
    if len(edits):
        out["rollout/pairwise_edit"] = float(edits.mean())
    if scores.has("accuracy"):
        out["rollout/pass_at_group"] = float(np.mean([any(flat[i]["accuracy"] > 0 for i in g)
                                                      for g in groups]))
    entropy = rollouts.stats.get("first_token_entropy")                         # [N] or absent
    if entropy is not None:
        out["rollout/first_token_entropy"] = float(entropy.mean())
    if branching is not None:
        out.update(branching.metrics(rollouts, scores))
    return out
