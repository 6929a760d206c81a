"""OPDVR — on-policy distillation's token reward, gated by the verifier, added to GRPO's credit.

On each sampled completion token y_t (the student's own rollout) on-policy distillation's
implicit reward is the teacher's and the student's log-probability gap,

    d_t = log π_T(y_t | x, y<t) − log π_S(y_t | x, y<t)

and OPDVR keeps only the part that agrees with the verifier (a ReLU gate by trajectory
correctness): a correct rollout takes the teacher's approval, an incorrect one its disapproval,

    g_t = max(d_t, 0)  if the rollout is correct       g_t = min(d_t, 0)  otherwise
    A_t ← A_t + g_t                                    (on completion tokens; padding untouched)

so the teacher never pushes up a token of a wrong answer, nor down a token of a right one.
Rows of a zero-spread group (GRPO advantage 0) still learn from g_t.

Options (`algo.shaping: [{name: opdvr, teacher: PATH}]`):
- `teacher`: a local model dir with the policy's tokenizer (loaded once, on the first step,
  through mmrlvr.train.policy's loaders, frozen, eval mode, in the policy's compute dtype on its
  device; a different vocabulary is an error), or `privileged`: the policy itself reading the
  privileged prompt (`adapter.encode_privileged`, as TransAnyText's PWSD teacher; only the
  image_translation modality has one). Required.
- `coef` (default null): null is the paper's form above, g_t added as it is, with no
  coefficient. A number λ adds λ·g_t instead (`coef: 0.1` was mmrlvr's earlier default, our
  choice then: GRPO advantages are about unit scale, d_t is in nats and a stronger teacher's gap
  runs to several nats on the tokens it disagrees with; docs/evidence-question-level.md's OPDVR figure was
  measured with it).
- `correct_threshold` 0.5 (our choice): a rollout is correct when its `accuracy` reward
  component, else its `overall` reward, is >= it (accuracy is 0/1).
- `micro_batch` 16 (our choice): rollouts per no-grad forward (bounds the [n, C, V] logits).
- `sample_temperature` (default null): how the student's log-probabilities are taken. Those the
  rollout engine recorded are at the sampling temperature and from the generation path, so by
  default the student is recomputed at temperature 1 with the same function as the teacher
  (`Policy.rollout_logprobs`, no grad: one extra forward), and with a same-weights teacher
  d_t is exactly 0. Setting it to rollout.temperature reuses the sampled log-probabilities and
  scores the teacher at that temperature instead (saves the student forward; the gap then
  carries the generation path's numerical drift, logged as rollout/logprob_gap).

Cost per step: one no-grad teacher forward over (prompt, completion) of every rollout, plus the
student's (unless reused). Stats: `d_correct_mean` / `d_incorrect_mean` (mean gated d over the
tokens of correct / incorrect rollouts), `d_mean` (ungated), `changed_frac` (share of tokens
whose advantage moved), `correct_frac`, `teacher_s` (teacher forwards, seconds; the first step
includes loading), `student_s`.
"""
from __future__ import annotations

import time

import torch

from mmrlvr.algo.shaping import ShapeContext, TokenCredit

PRIVILEGED = "privileged"


def gated_gap(teacher_logp: torch.Tensor, student_logp: torch.Tensor, correct: torch.Tensor,
              mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gated g [N, C], raw d [N, C]) from per-token log-probabilities [N, C] of the sampled
    tokens, per-rollout correctness [N] (bool) and the completion mask [N, C]; 0 on padding."""
    m = mask.bool()
    d = (teacher_logp - student_logp).masked_fill(~m, 0.0)                      # [N, C]
    gated = torch.where(correct.bool().unsqueeze(1), d.clamp(min=0.0), d.clamp(max=0.0))  # [N, C]
    return gated, d


class OPDVR:
    name = "opdvr"
    stage = "advantage"

    def __init__(self, teacher: str | None = None, coef: float | None = None,
                 correct_threshold: float = 0.5,
                 micro_batch: int = 16, sample_temperature: float | None = None):
        if not teacher:
            raise ValueError("opdvr: `teacher` is required (algo.shaping[opdvr].teacher): a local "
                             "model dir with the policy's tokenizer, or 'privileged'")
        if coef is not None and not coef >= 0:
            raise ValueError(f"opdvr: coef must be >= 0 (or null: the paper's form, no "
                             f"coefficient), got {coef}")
        if micro_batch < 1:
            raise ValueError(f"opdvr: micro_batch must be >= 1, got {micro_batch}")
        if sample_temperature is not None and not sample_temperature > 0:
            raise ValueError(f"opdvr: sample_temperature must be > 0 (or null), got {sample_temperature}")
        self.teacher = str(teacher)
        self.coef = None if coef is None else float(coef)
        self.threshold, self.micro_batch = float(correct_threshold), int(micro_batch)
        self.sample_temperature = sample_temperature
        self.model: torch.nn.Module | None = None     # the loaded teacher (a path teacher)

    def shape(self, credit: TokenCredit, ctx: ShapeContext) -> dict[str, float]:
        mask = ctx.mask.bool()                                                      # [N, C]
        correct = ctx.scores.correct("accuracy", self.threshold).flatten()          # [N]
        teacher, student, times = self.token_logprobs(ctx)                          # [N, C] each
        gated, d = gated_gap(teacher, student, correct, mask)
        added = gated if self.coef is None else self.coef * gated   # the paper's form; `coef: λ`
        credit.advantages += added.to(credit.advantages)
        ok, bad = mask & correct.unsqueeze(1), mask & ~correct.unsqueeze(1)
        mean = lambda t, m: float(t[m].mean()) if m.any() else 0.0
        return {"d_correct_mean": mean(gated, ok), "d_incorrect_mean": mean(gated, bad),
                "d_mean": mean(d, mask), "changed_frac": mean((added != 0).float(), mask),
                "correct_frac": float(correct.float().mean()), **times}

    def token_logprobs(self, ctx: ShapeContext) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Teacher and student log-probabilities [N, C] (CPU float32) of the sampled tokens."""
        policy, rollouts = ctx.policy, ctx.rollouts
        if policy is None:
            raise ValueError("opdvr needs the step's policy (ShapeContext.policy) to score tokens")
        t0 = time.perf_counter()
        temperature = self.sample_temperature or 1.0
        if self.teacher == PRIVILEGED:
            teacher = self._logprobs(policy, rollouts, self._privileged_prompts(policy, rollouts),
                                     temperature, None)
        else:
            teacher = self._logprobs(policy, rollouts, rollouts.prompts, temperature,
                                     self._teacher_model(policy))
        t1 = time.perf_counter()
        reuse = self.sample_temperature is not None and rollouts.sample_logprobs is not None
        if reuse:
            student = rollouts.sample_logprobs[:, :teacher.shape[1]].float().cpu()
        else:
            student = self._logprobs(policy, rollouts, rollouts.prompts, 1.0, None)
        return teacher, student, {"teacher_s": t1 - t0, "student_s": time.perf_counter() - t1,
                                  "student_recomputed": float(not reuse)}

    def _logprobs(self, policy, rollouts, prompts, temperature: float,
                  model: torch.nn.Module | None) -> torch.Tensor:
        """`Policy.rollout_logprobs` (the training forward) without gradients, in micro-batches
        trimmed to their longest completion -> [N, C] on the CPU, 0 past each width."""
        ids, mask, G = rollouts.completion_ids, rollouts.completion_mask, rollouts.group_size
        out = torch.zeros(ids.shape, dtype=torch.float32)                          # [N, C]
        with torch.no_grad():
            for start in range(0, ids.shape[0], self.micro_batch):
                rows = list(range(start, min(start + self.micro_batch, ids.shape[0])))
                width = max(int(mask[rows].sum(dim=1).max()), 1)
                lp, _ = policy.rollout_logprobs(prompts, [r // G for r in rows], ids[rows, :width],
                                                mask[rows, :width], temperature, model=model)
                out[rows, :width] = lp.float().cpu()
        return out

    def _privileged_prompts(self, policy, rollouts):
        """The rollouts' prompts as the privileged teacher reads them (same system/format prompts)."""
        prompts = rollouts.prompts
        if hasattr(policy.adapter, "encode_privileged"):
            return policy.adapter.encode_privileged(list(prompts.examples), policy.processor,
                                                    **prompts.prompt_options)
        raise ValueError(f"opdvr teacher 'privileged' needs a modality adapter with a privileged "
                         f"prompt (encode_privileged; image_translation has one); the policy's "
                         f"adapter {policy.adapter.name!r} has none: set "
                         "algo.shaping[opdvr].teacher to a model dir instead")

    def _teacher_model(self, policy) -> torch.nn.Module:
        """The teacher, loaded on first use: frozen, eval mode, the policy's compute dtype and
        device, the policy's attention implementation; its vocabulary must be the policy's."""
        if self.model is not None:
            return self.model
        from mmrlvr.train.teacher import load_teacher

        self.model = load_teacher(self.teacher, policy,
                                  "opdvr teacher (algo.shaping[opdvr].teacher)", "OPDVR")
        return self.model


__all__ = ["OPDVR", "gated_gap"]
