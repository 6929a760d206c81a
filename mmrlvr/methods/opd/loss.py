"""OPD's loss: the teacher's per-token reverse KL on the student's own samples (docs/opd.md).

On each completion token y_t the student sampled (y ~ π_S, the stage's rollouts),

    k_t = log π_S(y_t | x, y<t) − log π_T(y_t | x, y<t)

is a one-sample estimate of the reverse KL(π_S ‖ π_T) at position t, the per-token loss of
on-policy distillation. Two estimators (`opd.estimator`):

- `sampled` (default; on-policy distillation's own form): k_t is a per-token cost minimised by
  policy gradient with no credit to later tokens (discount 0),

      L = Σ_t stopgrad(k_t) · log π_S(y_t | x, y<t) / Σ_t 1          (token mean, masked)

  whose gradient Σ_t k_t ∇log π_S(y_t) is the gradient of E_{y_t ~ π_S}[k_t] (the term
  E[∇log π_S] vanishes). Differentiating the mean of k_t itself would give only that
  zero-mean term, not the KL's gradient.
- `full`: the exact KL over the vocabulary at each sampled prefix,
  Σ_v π_S(v)(log π_S(v) − log π_T(v)), differentiated directly: no sampling noise at a
  position, one [n, C, V] softmax of each model more.

Both are at temperature 1 (the models as they are); the stage samples at `opd.temperature`
(1 by default, so the samples follow π_S). The teacher runs without gradients; its vocabulary
must be the policy's. Logged (`objective/opd/...`, and `opd/reverse_kl` by the stage):
`reverse_kl` (the mean k_t; for `full` the mean exact KL), `rows`, `tokens`, `teacher_s`.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from mmrlvr.core.types import select
from mmrlvr.objectives import sample_rows

ESTIMATORS = ("sampled", "full")


def sampled_reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(surrogate loss, mean k_t) from the sampled tokens' log-probabilities [n, C] (the
    student's with gradient, the teacher's without) and the completion mask [n, C]."""
    m = mask.to(student_logp.dtype)
    tokens = m.sum().clamp(min=1.0)
    k = (student_logp.detach() - teacher_logp) * m                                 # [n, C]
    loss = (k * student_logp * m).sum() / tokens
    return loss, k.sum() / tokens


def full_reverse_kl(student_vocab: torch.Tensor, teacher_vocab: torch.Tensor, mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, its value) of the exact per-position KL(π_S ‖ π_T) from full-vocabulary
    log-probabilities [n, C, V] and the completion mask [n, C]."""
    kl = (student_vocab.exp() * (student_vocab - teacher_vocab)).sum(-1)           # [n, C]
    m = mask.to(kl.dtype)
    loss = (kl * m).sum() / m.sum().clamp(min=1.0)
    return loss, loss.detach()


class OPDLoss:
    """The objective `opd` (`objectives: [{name: opd, teacher: DIR}]`); `mmrlvr opd` builds it
    for its stage, with the rewards weighted 0 so this is the whole loss."""

    name = "opd"

    def __init__(self, teacher: str = "", estimator: str = "sampled", max_rows: int = 64,
                 seed: int = 0):
        if not teacher:
            raise ValueError("opd: `teacher` is required (opd.teacher): a local model dir with the "
                             "policy's tokenizer")
        if estimator not in ESTIMATORS:
            raise ValueError(f"opd: estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if max_rows < 1:
            raise ValueError(f"opd: max_rows must be >= 1, got {max_rows}")
        self.teacher, self.estimator = str(teacher), estimator
        self.max_rows, self.seed = int(max_rows), int(seed)
        self.model: torch.nn.Module | None = None          # the teacher, loaded on first use

    def loss(self, ctx) -> tuple[torch.Tensor | None, dict[str, float]]:
        policy, rollouts = ctx.policy, ctx.rollouts
        rows, _ = sample_rows(rollouts, self.max_rows, self.seed, ctx.step)
        if not rows:
            return None, {"rows": 0.0}
        t0 = time.perf_counter()
        teacher = self.teacher_model(policy)
        G = rollouts.group_size
        prompt_rows = [r // G for r in rows]
        mask = rollouts.completion_mask[rows]
        width = max(int(mask.sum(dim=1).max()), 1)
        ids, mask = rollouts.completion_ids[rows, :width], mask[:, :width]        # [n, C]
        if self.estimator == "sampled":
            with torch.no_grad():
                t_lp, _ = policy.rollout_logprobs(rollouts.prompts, prompt_rows, ids, mask, 1.0,
                                                  model=teacher)                   # [n, C]
            t1 = time.perf_counter()
            s_lp, _ = policy.rollout_logprobs(rollouts.prompts, prompt_rows, ids, mask, 1.0)
            m = mask.to(s_lp.device)
            loss, kl = sampled_reverse_kl(s_lp.float(), t_lp.float().to(s_lp.device), m)
        else:
            inputs, _ = select(rollouts.prompts, prompt_rows)
            full = policy.training_inputs(inputs, ids, mask)
            with torch.no_grad():
                t_vocab = policy.vocab_logprobs(full, width, model=teacher)        # [n, C, V]
            t1 = time.perf_counter()
            s_vocab = policy.vocab_logprobs(full, width)                           # [n, C, V]
            m = mask.to(s_vocab.device)
            loss, kl = full_reverse_kl(s_vocab.float(), t_vocab.float().to(s_vocab.device), m)
        return loss, {"reverse_kl": float(kl), "rows": float(len(rows)),
                      "tokens": float(m.sum()), "teacher_s": t1 - t0}

    def teacher_model(self, policy: Any) -> torch.nn.Module:
        """The teacher, loaded once: frozen, eval mode, the policy's compute dtype, device and
        attention implementation; its vocabulary must be the policy's."""
        if self.model is not None:
            return self.model
        from mmrlvr.train.teacher import load_teacher

        self.model = load_teacher(self.teacher, policy, "opd teacher (opd.teacher)",
                                  "the reverse KL")
        return self.model


__all__ = ["OPDLoss", "full_reverse_kl", "sampled_reverse_kl"]
