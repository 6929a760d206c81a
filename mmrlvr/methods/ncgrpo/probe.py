"""What the noise did to one generate call: the first-step next-token distributions of the noisy
members against the clean ones of the same group (docs/ncgrpo.md, "Seeing it work").

`FirstStep` is a read-only forward hook on the model's top module (the HF engine's `generate`
runs it): it keeps the last position's logits of the first forward that processes all N = B·G
rows at once, which is the distribution the first completion token is sampled from, whether
each row was prefilled whole (a noisy plan) or the prompt's prefix was prefilled once and
repeated (`alpha: 0`: the first N-row forward is then the last prompt token of every member).
A prefix forward over the B prompts is skipped by its row count. Nothing it does changes a
number the model computes.

From those logits at the sampling temperature T (p = softmax(z/T)), per noisy row r of group b
with the group's first clean row c:

    KL_r = Σ_v p_r(v) · (log p_r(v) − log p_c(v))            (nat/token; KL(noisy ‖ clean))
    H_b  = −Σ_v p_c(v) · log p_c(v)                            (the clean sampling entropy)

KL(noisy ‖ clean) is the expected first-token log-ratio log p_noisy/p_clean of a noisy sample:
how far off the clean policy, whose logprobs the update uses, the noisy members start. Groups
with no clean member (fraction 1) give no figure. top-p/top-k truncation is not applied.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


class FirstStep:
    """The hook: the first N-row forward's last-position logits, [N, V] float32 on the CPU."""

    def __init__(self, rows: int):
        self.rows = rows
        self.logits: torch.Tensor | None = None

    def __call__(self, module, args, output):
        if self.logits is not None:
            return None
        logits = output.logits if hasattr(output, "logits") else output[0]
        if logits.shape[0] == self.rows:
            self.logits = logits[:, -1].detach().float().cpu()                 # [N, V]
        return None


def top_module(model: nn.Module) -> nn.Module:
    """The HF model under any peft wrapper (the module whose output carries `logits`)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextmanager
def first_step(model: nn.Module, rows: int) -> Iterator[FirstStep]:
    """Keep the first-step logits of one `generate` call over `rows` rows; the hook is removed
    on exit, also on errors."""
    probe = FirstStep(rows)
    handle = top_module(model).register_forward_hook(probe)
    try:
        yield probe
    finally:
        handle.remove()


def first_step_figures(logits: torch.Tensor | None, flags: list[bool], group_size: int,
                       temperature: float) -> dict[str, float]:
    """`ncgrpo/*` figures of one call from its first-step logits [N, V] and noisy flags [N].

    `ncgrpo/first_step_kl` mean KL(noisy ‖ clean) over noisy rows (nat/token), `.._kl_max` the
    largest, `ncgrpo/clean_entropy` mean clean sampling entropy H over groups,
    `ncgrpo/kl_over_entropy` their ratio, `ncgrpo/first_token_changed_frac` the share of noisy
    rows whose most likely first token is not the clean row's. Empty when nothing was captured
    or no group has both kinds of member.
    """
    if logits is None:
        return {}
    logp = F.log_softmax(logits / max(temperature, 1e-6), dim=-1)               # [N, V]
    kls, entropies, changed = [], [], []
    for start in range(0, len(flags), group_size):
        rows = range(start, start + group_size)
        clean = [r for r in rows if not flags[r]]
        noisy = [r for r in rows if flags[r]]
        if not clean or not noisy:
            continue
        ref = logp[clean[0]]                                                     # [V]
        entropies.append(float(-(ref.exp() * ref).sum()))
        for r in noisy:
            kls.append(float((logp[r].exp() * (logp[r] - ref)).sum().clamp_min(0.0)))
            changed.append(float(int(logp[r].argmax()) != int(ref.argmax())))
    if not kls:
        return {}
    kl = sum(kls) / len(kls)
    entropy = sum(entropies) / len(entropies)
    return {"ncgrpo/first_step_kl": kl, "ncgrpo/first_step_kl_max": max(kls),
            "ncgrpo/clean_entropy": entropy,
            "ncgrpo/kl_over_entropy": kl / entropy if entropy > 0 else 0.0,
            "ncgrpo/first_token_changed_frac": sum(changed) / len(changed)}


def answers_differ(answers: list[str | None], branch: list[str], group_size: int) -> dict[str, float]:
    """Share of groups whose noisy members' answers differ from the clean members': the set of
    parsed final answers differs (`ncgrpo/answers_differ_frac`), and some noisy member reached a
    parsed answer no clean member did (`ncgrpo/noisy_new_answer_frac`). Under sampling both
    include sampling's own spread; an `alpha: 0` run (placebo) measures that floor."""
    differ, new = [], []
    for start in range(0, len(branch), group_size):
        rows = range(start, start + group_size)
        clean = {answers[r] for r in rows if branch[r] == "clean" and answers[r] is not None}
        noisy = {answers[r] for r in rows if branch[r] == "noisy" and answers[r] is not None}
        if not any(branch[r] == "clean" for r in rows) or not any(branch[r] == "noisy" for r in rows):
            continue
        differ.append(float(clean != noisy))
        new.append(float(bool(noisy - clean)))
    if not differ:
        return {}
    return {"ncgrpo/answers_differ_frac": sum(differ) / len(differ),
            "ncgrpo/noisy_new_answer_frac": sum(new) / len(new)}
