"""OM-GRPO — no policy gradient on the answer span, so a label-free reward cannot simply
reinforce the voted answer's tokens.

Seed paper: OM-GRPO (label-free RLVR). Its reward is the group's soft consensus (the reward
"consensus", `rewards/consensus.py`); that reward would pay most directly for repeating whatever
answer the group already votes for, so the gradient on the answer tokens is masked and the
credit has to flow into the reasoning that produced the answer.

The answer span of a completion is `rewards.verify.answer_span`, the block the verifier's
`extract_answer` reads: the content of the last `<answer>...</answer>` block, else of the final
box (`\\boxed{...}` or a bare `\\boxed 5`); none where extraction fails closed on the block (an
unclosed `<answer>` or box) or the completion has neither (the "the answer is X" fallback is not
masked: our choice). One function for both, so masking and extraction cannot disagree. Characters are mapped onto tokens by decoding the
rollout's own `completion_ids` with the policy's tokenizer (`ctx.policy.tokenizer`), one token at
a time (prefix by prefix where single tokens do not decode to the whole text, e.g. a multi-byte
character split over tokens, whose tokens then all cover it); every completion token that
overlaps the span by one character or more gets token weight 0. The tags themselves keep their
gradient (the format reward trains them); `include_tags: true` masks `<answer>`/`</answer>` and
`\\boxed{`/`}` too.

Weights are not rescaled (our choice): the loss's normaliser is left alone (`grpo_loss`), so the
reasoning tokens keep exactly the gradient plain GRPO gives them and the answer tokens get none;
their KL term, where β > 0, stays. Logged: `masked_frac` (the share of the step's completion
tokens with weight 0) and `rows_masked_frac` (the share of completions with an answer span).

Test-time training on unlabelled questions: rows still need an `answer` to load, so give them a
placeholder (any non-empty string, e.g. "?"); the consensus reward never reads it for its score
(docs/om_grpo.md). Config: `algo.shaping: [{name: om_grpo}]` (option `include_tags`, default
false).
"""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.algo.shaping import ShapeContext, TokenCredit
from rewards.verify import answer_span


def token_offsets(tokenizer: Any, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of `ids` and each token's (start, end) characters in it."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    pieces = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True)
    if "".join(pieces) == text:
        offsets, start = [], 0
        for piece in pieces:
            offsets.append((start, start + len(piece)))
            start += len(piece)
        return text, offsets
    # byte-level pieces of one character do not decode alone: grow the prefix instead; the
    # tokens that only together complete a character all get its span
    offsets, end, pending = [(0, 0)] * len(ids), 0, []
    for k in range(len(ids)):
        prefix = tokenizer.decode(ids[:k + 1], skip_special_tokens=True)
        if not text.startswith(prefix):
            pending.append(k)                                  # an unfinished character
            continue
        for p in pending + [k]:
            offsets[p] = (end, len(prefix))
        end, pending = len(prefix), []
    return text, offsets


def answer_token_mask(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor,
                      include_tags: bool = False) -> torch.Tensor:
    """[N, C] bool: completion tokens (mask 1) that overlap their row's answer span."""
    out = torch.zeros_like(mask, dtype=torch.bool)                                 # [N, C]
    for row in range(ids.shape[0]):
        cols = mask[row].nonzero().flatten().tolist()
        text, offsets = token_offsets(tokenizer, ids[row, cols].tolist())
        span = answer_span(text, include_tags)
        if span is None:
            continue
        for col, (start, end) in zip(cols, offsets):
            out[row, col] = start < span[1] and end > span[0] and end > start
    return out


class OMGRPO:
    name = "om_grpo"
    stage = "tokens"

    def __init__(self, include_tags: bool = False):
        if not isinstance(include_tags, bool):
            raise TypeError(f"om_grpo: algo.shaping[].include_tags must be true or false, "
                            f"got {include_tags!r}")
        self.include_tags = include_tags

    def shape(self, credit: TokenCredit, ctx: ShapeContext) -> dict[str, float]:
        if ctx.policy is None:
            raise ValueError("om_grpo finds the answer span through the policy's tokenizer; "
                             "ShapeContext.policy is None")
        mask = ctx.mask.bool()                                                     # [N, C]
        answer = answer_token_mask(ctx.policy.tokenizer, ctx.rollouts.completion_ids, mask,
                                   self.include_tags)                              # [N, C]
        weights = (~answer).to(credit.advantages.dtype)                            # [N, C]
        credit.weights = weights if credit.weights is None else credit.weights * weights
        n = int(mask.sum())
        return {"masked_frac": int(answer.sum()) / max(n, 1),
                "rows_masked_frac": float(answer.any(dim=1).float().mean()) if mask.shape[0] else 0.0}
