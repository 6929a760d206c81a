"""PWSD — privilege-gap weighted self-distillation (TransAnyText).

One model plays both parts. The teacher sees privileged input (the image plus the
source-language patch, `ImageTranslationAdapter.encode_privileged`); the student sees the image
and the target language only. On the student's own rollouts y:

    gap_t = log π_T(y_t | x⁺, y<t) − log π_S(y_t | x, y<t)
    w_t   = stopgrad(σ(α·gap_t))                                 α = 1 (docs/methods.md, our choice)
    L     = Σ_t w_t · KL(π_S(·| x, y<t) ‖ π_T(·| x⁺, y<t)) / Σ_t 1          (token mean, masked)

so tokens the privileged teacher finds much likelier than the student does (where the source
text would help) weigh most. The teacher pass runs without gradients (it is a fixed target
each step); the KL is over the full vocabulary at temperature 1. Tokens are averaged over the
batch, as the GRPO loss aggregates by default. At most `max_rows` rollouts are distilled per
step (a seeded draw, so resumes repeat exactly).

`teacher: live` (the default) scores with the model being trained, so the teacher moves with the
student; `teacher: frozen` scores with the weights PWSD started from (model.path, the SFT model),
which the trainer then loads once. Measured on the CPU banners chain: with a live teacher, lr 1e-4
degenerated both into repeated phrases within 100 steps (the KL stayed small — the teacher had
degenerated too); a frozen teacher cannot follow the student there.

`dash: {beta, gamma, horizon, normalize}` (default off) multiplies w_t by DASH's per-token
weights m_t from the same detached KL (mmrlvr/methods/transanytext/dash.py); off is the loss above bit for bit.

Every step also logs the gap, weight and loss per token class (`<class>/token_frac`, `gap_mean`,
`weight_mean`, `loss` for style, layout, text and other; `token_classes.py`): the paper's claim is
about style and layout tokens, and these say where the teacher's privilege lands. They are read
from the detached tensors after the loss is formed; the loss does not depend on them.
"""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.objectives import sample_rows
from mmrlvr.methods.transanytext.dash import DashOptions, dash_stats, dash_weights
from mmrlvr.methods.transanytext.token_classes import class_stats, token_classes
from mmrlvr.core.types import select


def pwsd_loss(student_logp: torch.Tensor, teacher_logp: torch.Tensor, ids: torch.Tensor,
              mask: torch.Tensor, alpha: float = 1.0, dash: DashOptions | None = None
              ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The PWSD loss from full-vocabulary log-probabilities.

    student_logp, teacher_logp [N, C, V]; ids [N, C] sampled tokens; mask [N, C] -> scalar loss
    and stats (`weights`, `gap` and `kl` [N, C] tensors, detached, plus their masked means; with
    `dash`, `weights` are w_t·m_t and the DASH stats are added).
    """
    idx = ids.unsqueeze(-1)                                                     # [N, C, 1]
    gap = (teacher_logp.gather(-1, idx) - student_logp.gather(-1, idx)).squeeze(-1)   # [N, C]
    weights = torch.sigmoid(alpha * gap).detach()                               # [N, C]
    kl = (student_logp.exp() * (student_logp - teacher_logp)).sum(-1)           # [N, C] KL(S‖T)
    m = mask.to(kl.dtype)
    extra: dict[str, float] = {}
    if dash is not None:
        mult, gates = dash_weights(kl.detach(), m, dash.beta, dash.gamma, dash.horizon,
                                   dash.normalize)                              # [N, C] each
        weights = weights * mult
        extra = dash_stats(mult, gates, m)
    tokens = m.sum().clamp(min=1.0)
    loss = (weights * kl * m).sum() / tokens
    return loss, {"weights": weights, "gap": gap.detach(), "kl": kl.detach(),
                  "weight_mean": float((weights * m).sum() / tokens),
                  "gap_mean": float((gap.detach() * m).sum() / tokens),
                  "kl_mean": float((kl.detach() * m).sum() / tokens), **extra}


class PWSD:
    """The objective (`objectives: [{name: pwsd, weight: 1.0, alpha: 1.0}]`, DASH with
    `dash: {gamma: 0.9}`); needs the `image_translation` modality (its adapter builds the
    teacher's privileged prompts)."""

    name = "pwsd"

    def __init__(self, alpha: float = 1.0, max_rows: int = 16, seed: int = 0, teacher: str = "live",
                 dash: dict[str, Any] | None = None):
        if max_rows < 1:
            raise ValueError(f"pwsd: max_rows must be >= 1, got {max_rows}")
        if teacher not in ("live", "frozen"):
            raise ValueError(f"pwsd: teacher must be 'live' or 'frozen', got {teacher!r}")
        self.alpha, self.max_rows, self.seed = float(alpha), int(max_rows), int(seed)
        self.teacher = teacher
        self.dash = DashOptions.parse(dash, "objectives[pwsd].dash")
        self.needs_ref_model = teacher == "frozen"      # the trainer loads model.path once

    def prepare(self, policy, rollouts, rows: list[int]) -> dict[str, Any]:
        """Student and teacher inputs for `rows` of the rollouts, with their completions."""
        G = rollouts.group_size
        prompt_rows = [r // G for r in rows]
        student, _ = select(rollouts.prompts, prompt_rows)
        distinct = list(dict.fromkeys(prompt_rows))
        if not hasattr(policy.adapter, "encode_privileged"):
            raise ValueError(f"pwsd needs the image_translation modality (model.modality), "
                             f"got {policy.adapter.name!r}, which has no privileged prompt")
        teacher_batch = policy.adapter.encode_privileged(        # same system/format prompts
            [rollouts.prompts.examples[i] for i in distinct], policy.processor,
            **rollouts.prompts.prompt_options)
        teacher, _ = select(teacher_batch, [distinct.index(i) for i in prompt_rows])
        mask = rollouts.completion_mask[rows]
        width = max(int(mask.sum(dim=1).max()), 1)
        return {"student": student, "teacher": teacher, "ids": rollouts.completion_ids[rows, :width],
                "mask": mask[:, :width]}

    def loss(self, ctx) -> tuple[torch.Tensor | None, dict[str, float]]:
        policy, rollouts = ctx.policy, ctx.rollouts
        rows, _ = sample_rows(rollouts, self.max_rows, self.seed, ctx.step)
        if not rows:
            return None, {"rows": 0.0}
        batch = self.prepare(policy, rollouts, rows)
        model = policy.base_model()
        if self.teacher == "frozen":
            if ctx.ref_model is None:
                raise ValueError("pwsd teacher 'frozen' needs the trainer's frozen model.path copy "
                                 "(StepContext.ref_model), which this run did not load")
            model = ctx.ref_model
        ids, C = batch["ids"], batch["ids"].shape[1]
        with torch.no_grad():
            teacher = policy.vocab_logprobs(policy.training_inputs(batch["teacher"], ids, batch["mask"]),
                                            C, model=model)                       # [n, C, V]
        student = policy.vocab_logprobs(policy.training_inputs(batch["student"], ids, batch["mask"]),
                                        C)                                        # [n, C, V]
        mask = batch["mask"].to(student.device)
        loss, st = pwsd_loss(student, teacher, batch["ids"].to(student.device), mask, self.alpha,
                             self.dash)
        classes = token_classes(policy.tokenizer, batch["ids"], batch["mask"])   # [n, C]
        return loss, {"rows": float(len(rows)), "weight_mean": st["weight_mean"],
                      "gap_mean": st["gap_mean"], "kl_mean": st["kl_mean"],
                      **{k: v for k, v in st.items() if k.startswith("dash_")},
                      **class_stats(classes, mask, st["gap"], st["weights"], st["kl"])}
