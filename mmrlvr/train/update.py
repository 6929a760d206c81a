"""The policy update of one GRPO step: PPO-style epochs over the rollouts in micro-batches,
the auxiliary objectives, and the guard that lets nothing non-finite reach the weights.

Token-level losses are normalised by the step's token count over all ranks and scaled by the
world size (DDP and FSDP2 average gradients over ranks): the ranks' gradients then add up to
the gradient one process would compute on the whole batch.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from mmrlvr import objectives as objectives_mod
from mmrlvr.algo import grpo_loss
from mmrlvr.algo.loss import rollout_correction
from mmrlvr.algo.shaping import TokenCredit
from mmrlvr.core.errors import TrainingError
from mmrlvr.train import parallel
from mmrlvr.train.packing import packed_padded_fraction
from mmrlvr.train.parallel import Dist
from mmrlvr.train.policy import Policy
from mmrlvr.train.setup import Run


def policy_update(run: Run, rollouts, advantages: torch.Tensor, scores, step: int,
                  credit: TokenCredit | None = None) -> dict[str, float]:
    """PPO-style epochs over the rollouts; one optimiser step per epoch.

    The token-level loss is normalised by the step's token count over all ranks, and scaled by
    the world size: DDP and FSDP2 average gradients over ranks, so the ranks' gradients then add
    up to the gradient of the whole batch, as one process with the whole batch would compute it.
    """
    update = Update(run, rollouts, advantages, scores, step, credit)
    cause = "" if torch.isfinite(advantages).all() else "non-finite advantages"
    for epoch in range(run.cfg.algo.ppo_epochs):
        cause = update.epoch(epoch, cause)
        if update.causes:
            break
    return update.summary()


class Update:
    """One step's update, set up once (rows, micro-batches, fixed logprobs, the step's token
    and sequence totals over all ranks), then run epoch by epoch."""

    def __init__(self, run: Run, rollouts, advantages: torch.Tensor, scores, step: int,
                 credit: TokenCredit | None):
        cfg, d = run.cfg, run.dist
        self.run, self.rollouts, self.advantages, self.scores, self.step = \
            run, rollouts, advantages, scores, step
        self.mask = rollouts.completion_mask                                        # [N, C]
        self.loss_mask = rollouts.train_mask            # [N, C]: tool turns attend, train not
        N = rollouts.completion_ids.shape[0]
        self.total_tokens = max(d.all_sum(float(self.loss_mask.sum())), 1.0)
        self.total_seqs = int(d.all_sum(float(N)))
        self.credit = credit or TokenCredit(advantages, None, cfg.algo.clip_low, cfg.algo.clip_high)
        self.behaviour = rollouts.behaviour_logprobs      # [N, C]: a batch sampled a step ahead
        self.rows = self._rows(N)
        mb = cfg.train.micro_batch
        self.micro = [self.rows[i:i + mb] for i in range(0, len(self.rows), mb)]
        self.old, self.ref = self._fixed_logprobs()
        self.stats: dict[str, list[float]] = {"loss/policy": [], "loss/clip_frac": [], "loss/kl": []}
        self.entropy_sum, self.gap_sum, self.gap_max, self.token_count = 0.0, 0.0, 0.0, 0.0
        self.grad_norm, self.causes = 0.0, []

    def _rows(self, N: int) -> list[int]:
        """The rows trained: every rank runs the same number of forwards and backwards, so under
        several processes (or with a KL term) zero-advantage rows, which add nothing, train too;
        objectives run their own."""
        cfg = self.run.cfg
        needs_all = cfg.algo.beta > 0 or self.run.dist.world > 1
        moved = self.credit.advantages != 0                                         # [N] or [N, C]
        moved = moved.any(dim=1) if moved.dim() == 2 else moved                     # [N]
        rows = [r for r in range(N) if needs_all or moved[r]]
        if cfg.train.length_buckets:      # longest first: each micro-batch as wide as its own rows
            lengths = self.mask.sum(dim=1).tolist()
            rows.sort(key=lambda r: (-lengths[r], r))
        return rows

    def forward(self, batch_rows: list[int], model=None, **kw):
        """((logprobs, entropy), width) of rows `batch_rows`, trimmed to their longest completion."""
        cfg, policy, rollouts = self.run.cfg, self.run.policy, self.rollouts
        ids, mask = rollouts.completion_ids, self.mask
        width = max(int(mask[batch_rows].sum(dim=1).max()), 1)                   # trim right padding
        args = (rollouts.prompts, [rollouts.prompt_row(r) for r in batch_rows],
                ids[batch_rows, :width], mask[batch_rows, :width], cfg.rollout.temperature)
        return policy.rollout_logprobs(*args, model=model, **kw), width   # packed: Policy.packing

    def _fixed_logprobs(self) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Per row, the logprobs before any update (several PPO epochs) and the reference's (KL)."""
        cfg, policy = self.run.cfg, self.run.policy
        old, ref = {}, {}
        with torch.no_grad():
            for part in self.micro:
                if cfg.algo.ppo_epochs > 1 and self.behaviour is None:
                    (lp, _), _ = self.forward(part)
                    old.update({r: lp[i].cpu() for i, r in enumerate(part)})
                if cfg.algo.beta > 0:
                    if policy.lora:
                        with policy.model.disable_adapter():
                            (lp, _), _ = self.forward(part)
                    else:
                        (lp, _), _ = self.forward(part, model=self.run.ref_model)
                    ref.update({r: lp[i].cpu() for i, r in enumerate(part)})
        return old, ref

    def epoch(self, epoch: int, cause: str) -> str:
        """Objectives, every micro-batch's backward, clipping and the optimiser step; returns the
        first cause to skip the step (this rank's); `causes` holds every rank's."""
        run, d, policy = self.run, self.run.dist, self.run.policy
        run.optimizer.zero_grad(set_to_none=True)
        # objectives first: the last backward of the epoch is then a micro-batch on every rank,
        # and DDP all-reduces once, there
        with sync_grads(d, policy, False):
            aux = _objective_losses(run, self.rollouts, self.scores, self.advantages, self.step)
        self.stats.update({k: [v] for k, v in aux.items()})
        for k, part in enumerate(self.micro):
            with sync_grads(d, policy, k == len(self.micro) - 1):
                loss = self.micro_batch(part, epoch)
            if not cause and not torch.isfinite(loss.detach()):
                cause = f"non-finite loss (epoch {epoch + 1}, micro-batch {k + 1})"
        self.grad_norm = clip_grad_norm(policy.trainable_parameters(),
                                        run.cfg.optim.max_grad_norm or float("inf"))
        if not cause and not math.isfinite(self.grad_norm):
            cause = "non-finite gradient norm"
        self.causes = [c for c in d.gather(cause) if c]   # one rank's NaN stops every rank's step
        if self.causes:
            run.optimizer.zero_grad(set_to_none=True)
            return cause
        run.optimizer.step()   # a no-op when every group had zero spread (no gradients)
        run.engine.mark_weights_changed()
        if not parallel.all_finite(d, policy.trainable_parameters()):
            raise TrainingError(f"step {self.step}: the optimiser step made weights non-finite (lr "
                                f"{run.scheduler.get_last_lr()[0]:g}, gradient norm "
                                f"{self.grad_norm:g}); stopping before anything is saved; the "
                                "last complete checkpoint is intact")
        return cause

    def micro_batch(self, part: list[int], epoch: int) -> torch.Tensor:
        """Forward and backward of rows `part`; returns its loss (logged)."""
        cfg, policy, stats = self.run.cfg, self.run.policy, self.stats
        policy.router_losses.clear()
        (logp, entropy), width = self.forward(part, with_entropy=epoch == 0)
        m = self.loss_mask[part, :width].to(logp.device).float()                   # [n, w]
        old_lp = self._old_logprobs(part, width, logp)
        ref_lp = torch.stack([self.ref[r][:width] for r in part]).to(logp.device) if self.ref else None
        shaped = {k: v.to(logp.device) if torch.is_tensor(v) else v
                  for k, v in self.credit.rows(part, width).items()}   # advantages, bounds
        correct_rollout(cfg.algo, shaped, old_lp, self.rollouts, part, m, stats)
        loss, st = grpo_loss(
            logp, old_lp, mask=m, **shaped, loss_agg=cfg.algo.loss_agg,
            norm_len=cfg.algo.norm_len or cfg.rollout.max_new_tokens, beta=cfg.algo.beta,
            ref_logp=ref_lp, kl_estimator=cfg.algo.kl_estimator,
            total_tokens=self.total_tokens, total_seqs=self.total_seqs, ratio=cfg.algo.ratio)
        loss = loss + router_loss(policy, cfg.algo.router_aux_coef, len(part), self.total_seqs,
                                  stats)
        (loss * self.run.dist.world).backward()
        stats["loss/policy"].append(float(loss.detach()))
        stats["loss/clip_frac"].append(st["clip_frac"])
        if "kl" in st:
            stats["loss/kl"].append(st["kl"])
        if epoch == 0:
            self._tally(part, width, logp, entropy, m)
        return loss

    def _old_logprobs(self, part: list[int], width: int, logp: torch.Tensor) -> torch.Tensor:
        """The ratio's denominator: the weights that sampled the rows (a batch generated a step
        ahead), else the logprobs before this update's first epoch, else these (ratio 1)."""
        if self.behaviour is not None:
            return self.behaviour[part, :width].to(logp.device, logp.dtype)
        if self.old:
            return torch.stack([self.old[r][:width] for r in part]).to(logp.device)
        return logp.detach()

    def _tally(self, part: list[int], width: int, logp: torch.Tensor, entropy: torch.Tensor,
               m: torch.Tensor) -> None:
        """The first epoch's token count, entropy and rollout-vs-trainer logprob gap."""
        self.token_count += float(m.sum())
        self.entropy_sum += float((entropy * m).sum())
        sample = self.rollouts.sample_logprobs
        if sample is not None:
            gap = (sample[part, :width].to(logp.device) - logp.detach()).abs()
            self.gap_sum += float((gap * m).sum())
            self.gap_max = max(self.gap_max, float((gap * m).max()))

    def summary(self) -> dict[str, float]:
        """The update's figures (this rank's; the policy loss summed over ranks)."""
        cfg, d, rollouts, micro = self.run.cfg, self.run.dist, self.rollouts, self.micro
        out = {k: (sum(v) if k == "loss/policy" else float(np.mean(v)))
               for k, v in self.stats.items() if v}
        out["update/skipped"] = float(bool(self.causes))
        if self.causes:
            out["update/skip_cause"] = self.causes[0]
        # this rank's part of the global loss; summed, it is the whole batch's loss
        out["loss/policy"] = d.all_sum(out.get("loss/policy", 0.0)) / max(cfg.algo.ppo_epochs, 1)
        out["optim/grad_norm"] = self.grad_norm
        out["update/trained_rows"] = len(self.rows)
        out["update/padded_frac"] = padded_fraction(self.mask, micro)
        if cfg.train.packing:        # what ran; the padded micro-batches' share stays beside it
            out["update/padded_frac_unpacked"] = out["update/padded_frac"]
            out["update/padded_frac"] = packed_padded_fraction(rollouts.prompts, self.mask, micro,
                                                               rollouts.group_size)
        # prompts run per epoch: a group split over micro-batches runs its prompt in each
        out["update/prompt_forwards"] = float(sum(len({r // rollouts.group_size for r in part})
                                                  for part in micro))
        if self.token_count:
            out["policy/entropy"] = self.entropy_sum / self.token_count
            if rollouts.sample_logprobs is not None:
                out["rollout/logprob_gap"] = self.gap_sum / self.token_count
                out["rollout/logprob_gap_max"] = self.gap_max
        return out


def router_loss(policy: Policy, coef: float, rows: int, total_seqs: int,
                stats: dict[str, list[float]]) -> torch.Tensor | float:
    """`algo.router_aux_coef` × the MoE router's load-balancing loss of this micro-batch's
    forwards (their mean), weighted by its share of the step's sequences so the micro-batches'
    terms add up to the step's mean; 0 when off."""
    if not policy.router_losses:
        return 0.0
    aux = torch.stack([a.float() for a in policy.router_losses]).mean()
    policy.router_losses.clear()
    stats.setdefault("loss/router_aux", []).append(float(aux.detach()))
    return coef * aux * rows / max(total_seqs, 1)


def correct_rollout(algo, shaped: dict, trainer_logp: torch.Tensor, rollouts, part: list[int],
                    mask: torch.Tensor, stats: dict[str, list[float]]) -> None:
    """`algo.rollout_correction`: scale the micro-batch's token weights by the importance
    weights of the trainer's logprobs against the rollout engine's (`algo.loss.rollout_correction`),
    and log them; nothing without a correction or without the engine's logprobs."""
    if algo.rollout_correction == "none":
        return
    if rollouts.sample_logprobs is None:
        stats.setdefault("rollout/correction_unavailable", []).append(1.0)
        return
    width = mask.shape[1]
    weights, st = rollout_correction(
        algo.rollout_correction, trainer_logp,
        rollouts.sample_logprobs[part, :width].to(trainer_logp.device), mask,
        algo.rollout_correction_cap)
    have = shaped.get("token_weights")
    shaped["token_weights"] = weights if have is None else have * weights
    for key, value in st.items():
        stats.setdefault(f"rollout/correction_{key}", []).append(value)


def padded_fraction(mask: torch.Tensor, micro: list[list[int]]) -> float:
    """Share of the completion positions the micro-batches run that are padding (each
    micro-batch is as wide as its longest completion)."""
    run = sum(len(part) * max(int(mask[part].sum(dim=1).max()), 1) for part in micro)
    return 1.0 - float(sum(mask[part].sum() for part in micro)) / run if run else 0.0


def sync_grads(d: Dist, policy: Policy, sync: bool) -> contextlib.AbstractContextManager:
    """DDP: skip the gradient all-reduce for this forward+backward unless `sync` (the last of
    the update). FSDP2 reduce-scatters each backward's gradients into the shards as it goes."""
    if d.strategy == "ddp" and not sync:
        return policy.forward_model.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the global gradient norm (sharded gradients too); returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(norm, "full_tensor"):          # FSDP2: a DTensor replicated on every rank
        norm = norm.full_tensor()
    return float(norm)


def _objective_losses(run: Run, rollouts, scores, advantages, step: int) -> dict[str, float]:
    if not run.objectives:
        return {}
    ctx = objectives_mod.StepContext(run.policy, rollouts, scores, advantages, step,
                                     run.cfg.train.steps, run.run_dir, run.ref_model)
    out = {}
    for weight, objective in run.objectives:
        loss, st = objective.loss(ctx)
        if loss is not None:
            # the objectives' own means are per rank: their gradients average over ranks
            (weight * loss).backward()
            out[f"objective/{objective.name}"] = float(loss.detach())
        out.update({f"objective/{objective.name}/{k}": v for k, v in st.items()})
    return out
