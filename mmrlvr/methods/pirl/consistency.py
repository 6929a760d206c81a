"""PIRL's consistency regulariser: the policy should answer the same when the instruction wobbles.

    L = λ · mean_t KL( π(·|x, y<t) ‖ π(·|x+δ, y<t) )        over the sampled response tokens t

x is a rollout's prompt, y its sampled completion, and δ an adversarial perturbation of the input
embeddings of the instruction tokens only: the text of the user turn (question, options, format
instruction). Image/audio placeholders, chat-template and special tokens, the system prompt and
the response are never perturbed. λ is the objective's `weight` in the config.

δ comes from projected gradient ascent on the KL (VAT/TRADES style):
    δ₀   random direction at `init_scale`·r_t per token (the KL's gradient is exactly 0 at δ = 0)
    δ ← Π(δ + step_size · r_t · g_t / ‖g_t‖),  g = ∇_δ KL,   `steps` times (1-3)
(step_size 1: from the half-radius random start one ascent step lands on or near the bound), with the
per-token bound ‖δ_t‖ ≤ r_t = ε·‖e_t‖ (e_t the token's clean embedding). Per token rather
than one norm over the whole instruction, so no single word can take the whole budget and turn
into a different word; ε 0.05 by default (docs/methods.md).

Choices: the clean side π(·|x) is the target and carries no gradient (VAT's choice: the GRPO loss
already trains the clean path; the regulariser only pulls the perturbed one towards it). Logits
are at temperature 1 (the policy itself, not the sampling distribution). At most `max_rows`
rollouts per step are regularised (drawn with a generator seeded by the step, so runs and
resumes repeat exactly, and the global RNG is never touched).
"""
from __future__ import annotations

from typing import Any

import torch

from mmrlvr.objectives import sample_rows
from mmrlvr.core.types import select


def instruction_mask(input_ids: torch.Tensor, tokenizer: Any, excluded_ids: list[int],
                     mm_token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[N, T] bool: the text tokens of each row's last user turn, after its role header.

    The user turn is the one opened by the second-to-last `<|im_start|>` (the last opens the
    assistant's reply); its header is the role name up to the first newline. Special and added
    tokens, `excluded_ids` (media placeholders) and any position with a non-zero
    `mm_token_type_ids` are left out.
    """
    start_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    special = set(excluded_ids) | set(tokenizer.all_special_ids) | set(
        getattr(tokenizer, "added_tokens_decoder", {}) or {})
    mask = torch.zeros_like(input_ids, dtype=torch.bool)
    for i, row in enumerate(input_ids.tolist()):
        starts = [k for k, t in enumerate(row) if t == start_id]
        if len(starts) < 2:
            continue
        k = starts[-2] + 1
        while k < len(row) and "\n" not in tokenizer.decode([row[k]]):
            k += 1
        k += 1
        while k < len(row) and row[k] != end_id:
            mask[i, k] = row[k] not in special
            k += 1
    if mm_token_type_ids is not None:
        mask &= mm_token_type_ids.to(mask.device) == 0
    return mask


def project(delta: torch.Tensor, radius: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scale each token's δ_t into the ball ‖δ_t‖ ≤ radius_t and zero it off `mask`.

    delta [N, T, H], radius [N, T, 1], mask [N, T] -> [N, T, H]
    """
    norm = delta.norm(dim=-1, keepdim=True).clamp(min=1e-12)               # [N, T, 1]
    scale = torch.clamp(radius / norm, max=1.0)                            # [N, T, 1]
    return delta * scale * mask.unsqueeze(-1).to(delta.dtype)


def token_kl(p_logp: torch.Tensor, q_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens of KL(p ‖ q) = Σ_v p_v (log p_v − log q_v).

    p_logp, q_logp [N, C, V] log-probabilities; mask [N, C] -> scalar
    """
    kl = (p_logp.exp() * (p_logp - q_logp)).sum(-1)                         # [N, C]
    m = mask.to(kl.dtype)
    return (kl * m).sum() / m.sum().clamp(min=1.0)


class PirlConsistency:
    """The regulariser as an objective (`objectives: [{name: pirl_consistency, weight: λ}]`)."""

    name = "pirl_consistency"

    def __init__(self, epsilon: float = 0.05, steps: int = 1, step_size: float = 1.0,
                 init_scale: float = 0.5, max_rows: int = 16, seed: int = 0):
        if not 1 <= int(steps) <= 3:
            raise ValueError(f"pirl_consistency: steps must be 1, 2 or 3 (PGD steps), got {steps}")
        if epsilon < 0 or max_rows < 1:
            raise ValueError(f"pirl_consistency: need epsilon >= 0 and max_rows >= 1, "
                             f"got epsilon={epsilon}, max_rows={max_rows}")
        self.epsilon, self.steps, self.step_size = float(epsilon), int(steps), float(step_size)
        self.init_scale, self.max_rows, self.seed = float(init_scale), int(max_rows), int(seed)

    # -- pieces (public so tests can pin each one) ------------------------------------------
    def prepare(self, policy, rollouts, rows: list[int]) -> dict[str, Any]:
        """Model inputs for `rows` of the rollouts, their instruction mask and clean embeddings."""
        G = rollouts.group_size
        inputs, _ = select(rollouts.prompts, [r // G for r in rows])
        mask = rollouts.completion_mask[rows]
        width = max(int(mask.sum(dim=1).max()), 1)
        ids, mask = rollouts.completion_ids[rows, :width], mask[:, :width]
        full = policy.training_inputs(inputs, ids, mask)                      # ids, masks, positions
        P = inputs["input_ids"].shape[1]
        mm = full.get("mm_token_type_ids")
        instr = instruction_mask(full["input_ids"][:, :P], policy.tokenizer, policy.placeholder_ids,
                                 None if mm is None else mm[:, :P])           # [n, P]
        instr = torch.cat([instr, torch.zeros_like(ids, dtype=torch.bool, device=instr.device)],
                          dim=1)                                              # never the response
        with torch.no_grad():
            embeds = policy.base_model().get_input_embeddings()(full["input_ids"])   # [n, T, H]
        return {"full": full, "completion_ids": ids.to(policy.device),
                "completion_mask": mask.to(policy.device), "instr": instr, "embeds": embeds}

    @staticmethod
    def logprobs(policy, batch: dict[str, Any], delta: torch.Tensor | None, model=None,
                 grad_embeddings: bool = False) -> torch.Tensor:
        """Log π over the vocabulary at each completion position, embeddings + δ. -> [n, C, V]"""
        model = model if model is not None else policy.model
        embeds = batch["embeds"]
        if grad_embeddings:
            embeds = policy.base_model().get_input_embeddings()(batch["full"]["input_ids"])
        if delta is not None:
            embeds = embeds + delta.to(embeds.dtype)
        # input_ids stay in: the model finds image placeholders (and their features) by id
        return policy.vocab_logprobs(batch["full"], batch["completion_ids"].shape[1], model,
                                     inputs_embeds=embeds)

    def radius(self, batch: dict[str, Any]) -> torch.Tensor:
        """Per-token bound r_t = ε·‖e_t‖ on instruction tokens, 0 elsewhere. -> [n, T, 1]"""
        return self.epsilon * batch["embeds"].float().norm(dim=-1, keepdim=True) \
            * batch["instr"].unsqueeze(-1)

    def attack(self, policy, batch: dict[str, Any], clean: torch.Tensor,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """δ after `steps` projected gradient-ascent steps on the KL; detached. -> [n, T, H]"""
        instr, radius = batch["instr"], self.radius(batch)
        noise = torch.randn(batch["embeds"].shape, generator=generator).to(radius.device)
        unit = noise / noise.norm(dim=-1, keepdim=True).clamp(min=1e-12)       # [n, T, H]
        delta = unit * self.init_scale * radius                                # 0 off the mask
        for _ in range(self.steps):
            delta.requires_grad_(True)
            kl = token_kl(clean, self.logprobs(policy, batch, delta), batch["completion_mask"])
            (grad,) = torch.autograd.grad(kl, delta)
            unit = grad / grad.norm(dim=-1, keepdim=True).clamp(min=1e-12)
            delta = project(delta.detach() + self.step_size * radius * unit, radius, instr)
        return delta.detach()

    # -- the objective ------------------------------------------------------------------------
    def loss(self, ctx) -> tuple[torch.Tensor | None, dict[str, float]]:
        policy, rollouts = ctx.policy, ctx.rollouts
        rows, gen = sample_rows(rollouts, self.max_rows, self.seed, ctx.step)
        if not rows:
            return None, {"rows": 0.0}
        batch = self.prepare(policy, rollouts, rows)
        n_instr = int(batch["instr"].sum())
        if n_instr == 0:
            return None, {"rows": float(len(rows)), "instruction_tokens": 0.0}
        with torch.no_grad():
            clean = self.logprobs(policy, batch, None)                          # [n, C, V] target
        delta = self.attack(policy, batch, clean, gen)
        perturbed = self.logprobs(policy, batch, delta, model=policy.forward_model,
                                  grad_embeddings=True)
        kl = token_kl(clean, perturbed, batch["completion_mask"])
        e_norm = batch["embeds"].float().norm(dim=-1)[batch["instr"]]
        d_norm = delta.float().norm(dim=-1)[batch["instr"]]
        return kl, {"rows": float(len(rows)),
                    "instruction_tokens": n_instr / len(rows),
                    "delta_rel_norm": float((d_norm / e_norm.clamp(min=1e-12)).mean())}
