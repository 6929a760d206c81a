"""The GRPO trainer: rollout → rewards → advantages → clipped-surrogate update, step after step.

One step (DESIGN.md):
    Examples ─► adapter.encode ─► PromptBatch (B prompts, processed once)
      ─► engine.generate(n=G) ─► Rollouts (B·G completions, sample logprobs)
      ─► reward.score per group ─► rewards [B, G] ─► advantages [B, G]
      ─► policy logprobs in micro-batches ─► GRPO loss (+ KL, + objectives) ─► AdamW step

What it leaves out on purpose: value functions, reward models, sequence packing. Groups whose
rewards have zero spread contribute no gradient; single-process runs without KL skip their
policy forward entirely (exactly the same update, less work; objectives run their own).

Under several processes (torchrun or accelerate launch; `mmrlvr.parallel`) each rank takes its
share of the step's prompts, the loss is normalised by the step's global token count, gradients
are summed over ranks by DDP or FSDP2 (`train.strategy`), and eval is spread over the ranks.
Weights are fp32 masters; the forward runs in `model.dtype` (`mmrlvr.policy`).
"""
from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import modalities
from mmrlvr import objectives as objectives_mod
from mmrlvr import parallel
from mmrlvr.algo import group_advantages, grpo_loss, zero_spread_fraction
from mmrlvr.checkpoint import (latest_checkpoint, load_sharded, load_trainer_state, rng_state,
                               save_checkpoint, set_rng_state, sharded_state)
from mmrlvr.config import Config, ConfigError, check_model_path, save_config, to_dict
from mmrlvr.data import LoadReport, load_split
from mmrlvr.errors import TrainingError
from mmrlvr.evaluate import aggregate, score_examples
from mmrlvr.logger import RunLogger, read_metrics
from mmrlvr.parallel import Dist, LaunchError
from mmrlvr.policy import Policy, bf16_update_warning, load_model
from mmrlvr.report import write_report
from mmrlvr.rundir import RunDirError, claim
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.rollout.branching import branch_metrics
from mmrlvr.sampler import PromptSampler
from mmrlvr.templates import apply_templates
from modalities.base import select
from rewards.base import RewardError, build_combined
from rewards.verify import reset_stats, stats as verify_stats


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def warmup_cosine(warmup: int, total: int, floor: float = 0.1, schedule: str = "cosine"):
    """LR multiplier: linear warm-up, then cosine decay to `floor` (or constant)."""
    total = max(total, 1)

    def fn(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return fn


@dataclass
@dataclass
class Skips:
    """Steps skipped for a non-finite loss or gradient: how many in a row, and the first cause."""

    in_a_row: int = 0
    total: int = 0
    first: str = ""


@dataclass
class Run:
    """Everything a step needs, built once."""

    cfg: Config
    dist: Dist
    policy: Policy
    engine: Any
    reward: Any
    objectives: list
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train_data: list
    eval_data: list
    sampler: PromptSampler
    ref_model: torch.nn.Module | None
    run_dir: Path
    skipped_rows: int
    lock: Any = None
    skips: Skips = None


def start_processes(cfg: Config, batch: int, what: str = "train.batch_prompts") -> Dist:
    """Join the launcher's processes and settle the strategy; every check that needs no model
    runs here, before anything loads."""
    d = parallel.init(cfg.train.device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if batch % d.world:
        raise LaunchError(f"{what} ({batch}) must divide evenly over the {d.world} processes")
    plan = None
    if d.device.type == "cuda":                  # GPU memory is what the planner counts
        from mmrlvr.plan import make_plan

        plan = make_plan(cfg, gpus=d.world)
        if d.main:
            print(plan.table(), file=sys.stderr)
    if d.world == 1:
        d.strategy = "single"
    elif cfg.train.strategy == "auto":
        d.strategy = plan.choose_strategy() if plan else "ddp"
    else:
        d.strategy = cfg.train.strategy
    if plan is not None:
        try:
            plan.check("ddp" if d.strategy == "single" else d.strategy)
        except ConfigError as err:
            if cfg.train.check_memory:
                raise ConfigError(f"{err} (train.check_memory=false runs it anyway)") from None
            if d.main:
                print(f"warning: {err}", file=sys.stderr)
    if d.strategy == "fsdp2":
        if cfg.model.lora.r > 0:
            raise LaunchError("train.strategy fsdp2 with LoRA is not supported: LoRA trains few "
                              "weights and its frozen base fits each GPU; use train.strategy ddp")
        if any(o.get("name") == "pirl_consistency" for o in cfg.objectives):
            raise LaunchError("objective pirl_consistency perturbs the input embeddings outside "
                              "the model's forward, which FSDP2 shards; use train.strategy ddp")
    return d


def load_policy(cfg: Config, d: Dist, init: str | None = None, ckpt: Path | None = None
                ) -> Policy:
    """The policy on this rank's device, wrapped for the strategy (DDP, FSDP2 or none)."""
    adapter = modalities.get(cfg.model.modality, min_pixels=cfg.model.min_pixels,
                             max_pixels=cfg.model.max_pixels)
    if ckpt is not None and cfg.model.lora.r > 0:
        policy = Policy.load(cfg.model, adapter, d.device, adapter_dir=ckpt / "adapter")
    else:
        policy = Policy.load(cfg.model, adapter, d.device, path=str(ckpt) if ckpt else init)
    if cfg.model.param_dtype == "bfloat16" and d.main:
        print(f"warning: {bf16_update_warning(policy.trainable_parameters(), cfg.optim.lr)}",
              file=sys.stderr)
    if d.strategy == "ddp":
        policy.forward_model = parallel.wrap_ddp(policy.model, d.device)
    elif d.strategy == "fsdp2":
        parallel.fully_shard_model(policy.base_model(), policy.compute_dtype, _probe(policy))
        policy.sharded = True
    return policy


def _probe(policy: Policy) -> dict[str, torch.Tensor]:
    """One short text row: the forward that makes the FSDP2 root lazily initialise."""
    ids = torch.tensor([[policy.eos_ids[0]]], device=policy.device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def load_reference(cfg: Config, d: Dist, policy: Policy) -> torch.nn.Module:
    """The frozen model.path weights in the compute dtype (sharded too under FSDP2)."""
    ref = load_model(cfg.model.path, policy.compute_dtype, cfg.model.attn_implementation)
    ref.to(d.device).eval().requires_grad_(False)
    if d.strategy == "fsdp2":
        parallel.fully_shard_model(ref, policy.compute_dtype, _probe(policy))
    return ref


def claim_run_dir(d: Dist, run_dir: Path, cfg: Config, resume: bool = False,
                  overwrite: bool = False, force: bool = False):
    """Rank 0 locks the run dir (`mmrlvr.rundir`); every rank raises the same error if it may
    not be written. Returns the lock (None on other ranks)."""
    lock, error = None, None
    if d.main:
        try:
            lock = claim(run_dir, resume=resume, overwrite=overwrite, force=force,
                         cfg=to_dict(cfg))
        except RunDirError as err:
            error = str(err)
    error = d.gather(error)[0]
    if error:
        raise RunDirError(error)
    return lock


def build_run(cfg: Config, resume: bool = False, overwrite: bool = False,
              force: bool = False) -> tuple[Run, int]:
    """Load data, policy, optimiser; restore the last complete checkpoint when resuming."""
    check_model_path(cfg.model.path)     # before the run dir is touched
    d = start_processes(cfg, cfg.train.batch_prompts)
    seed_everything(cfg.train.seed)      # every rank builds the same weights (LoRA init too)
    run_dir = Path(cfg.train.out_dir)
    lock = claim_run_dir(d, run_dir, cfg, resume, overwrite, force)
    try:
        return _build(cfg, d, run_dir, lock, resume)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build(cfg: Config, d: Dist, run_dir: Path, lock, resume: bool) -> tuple[Run, int]:
    if d.main:
        save_config(cfg, run_dir / "config.yaml")

    report = LoadReport()
    train_data = load_split(cfg.data, "train", report)
    eval_data = load_split(cfg.data, "eval")
    if d.main:
        report.write(run_dir)                  # skipped_rows.jsonl: file, row, id, reason

    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {run_dir}/checkpoints")
    policy = load_policy(cfg, d, ckpt=ckpt)
    objectives = objectives_mod.build(cfg.objectives)
    wants_ref = [o.name for _, o in objectives if getattr(o, "needs_ref_model", False)]
    if wants_ref and cfg.model.lora.r > 0:
        raise ValueError(f"objective {wants_ref[0]!r} asks for the frozen model.path weights, which "
                         f"a LoRA run does not hold apart (merge the adapter first)")
    ref_model = None
    if (cfg.algo.beta > 0 or wants_ref) and cfg.model.lora.r == 0:
        ref_model = load_reference(cfg, d, policy)

    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.optim.lr,
                                  betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(
        cfg.optim.warmup_steps, cfg.train.steps, cfg.optim.min_lr_ratio, cfg.optim.schedule))
    sampler = PromptSampler(len(train_data), cfg.train.seed)
    start_step = 0
    if ckpt is not None:
        state = load_trainer_state(ckpt)
        if d.strategy == "fsdp2":
            load_sharded(ckpt, policy.base_model(), optimizer)
        else:
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if len(state["rng"]) == d.world:
            set_rng_state(state["rng"][d.rank])
        else:   # the weights and optimizer reshard; the random streams cannot
            seed_everything(cfg.train.seed + d.rank + 7919 * state["step"])
            if d.main:
                print(f"warning: {ckpt} was written by {len(state['rng'])} processes and this run "
                      f"has {d.world}: it continues from the same weights, optimizer and data "
                      "position, but its sampling is not the one the original run would have "
                      "drawn", file=sys.stderr)
        sampler.cursor = state["cursor"]
        start_step = state["step"]
    elif d.world > 1:
        seed_everything(cfg.train.seed + d.rank)   # each rank samples its own rollouts

    engine = make_engine(cfg.rollout.backend, policy, cfg.rollout.branching,
                         cfg.rollout.vllm_gpu_memory_utilization, seed=cfg.train.seed)
    errors = run_dir / ("reward_errors.jsonl" if d.world == 1 else f"reward_errors.rank{d.rank}.jsonl")
    run = Run(cfg, d, policy, engine,
              build_combined(cfg.rewards, error_log=errors), objectives, optimizer, scheduler,
              train_data, eval_data, sampler, ref_model, run_dir, len(report.skipped), lock,
              Skips())
    return run, start_step


def grpo_step(run: Run, step: int) -> dict[str, float]:
    """One GRPO step on this process's share of the next `batch_prompts` prompts."""
    cfg, policy, d = run.cfg, run.policy, run.dist
    t0 = time.perf_counter()
    indices = run.sampler.next(cfg.train.batch_prompts)[d.rank::d.world]
    examples = [run.train_data[i] for i in indices]
    template_rng = random.Random(f"templates-{cfg.train.seed}-{step}")   # per step: resumes exactly
    examples = apply_templates(examples, cfg.data.templates, template_rng)
    prompts = policy.adapter.encode(examples, policy.processor, system_prompt=cfg.data.system_prompt,
                                    format_prompt=cfg.data.format_prompt)
    params = SamplingParams(n=cfg.rollout.group_size, max_new_tokens=cfg.rollout.max_new_tokens,
                            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            top_k=cfg.rollout.top_k)
    run.engine.wake_up()
    rollouts = run.engine.generate(prompts, params)
    run.engine.sleep()
    t1 = time.perf_counter()

    G = cfg.rollout.group_size
    if hasattr(run.reward, "set_progress"):
        run.reward.set_progress(step / max(cfg.train.steps, 1))
    reset_stats()   # the verifier's counters now cover exactly this step's scoring
    scores = [run.reward.score(ex, rollouts.texts[b * G:(b + 1) * G]) for b, ex in enumerate(examples)]
    vstats = verify_stats()
    failures = d.gather(run.reward.all_failed(scores))   # decided together: no rank waits alone
    if all(failures):
        raise RewardError(failures[0])
    rewards = torch.tensor([[s["overall"] for s in group] for group in scores])   # [B, G]
    nonfinite = ~torch.isfinite(rewards)                  # user rewards were caught already
    rewards = rewards.masked_fill(nonfinite, 0.0)
    advantages = group_advantages(rewards, cfg.algo.advantage, cfg.algo.eps)       # [B, G]
    t2 = time.perf_counter()

    update = policy_update(run, rollouts, advantages.flatten(), scores, step)
    t3 = time.perf_counter()

    metrics = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
               "reward/zero_spread_frac": zero_spread_fraction(rewards)}
    if nonfinite.any():
        metrics["reward/nonfinite_frac"] = float(nonfinite.float().mean())
    for key in scores[0][0]:
        if key != "overall":
            metrics[f"reward/{key}"] = float(np.mean([s[key] for g in scores for s in g]))
    lengths = rollouts.completion_mask.sum(dim=1).float()
    metrics.update({
        "response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max()),
        "response/truncated_frac": rollouts.stats["rollout/truncated_frac"],
        "rollout/placeholder_scrubbed": rollouts.stats["rollout/placeholder_scrubbed"],
        "time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/update_s": t3 - t2,
        "time/step_s": t3 - t0, "perf/rollout_tokens_per_s": rollouts.stats["rollout/tokens"] / (t1 - t0),
        "optim/lr": run.scheduler.get_last_lr()[0], **update})
    metrics.update(branch_metrics(rollouts, scores))
    if vstats.get("extract_calls"):
        metrics["verify/parse_fail_rate"] = vstats["extract_none"] / vstats["extract_calls"]
    run.scheduler.step()
    return mean_over_ranks(d, metrics)


def mean_over_ranks(d: Dist, metrics: dict[str, Any]) -> dict[str, Any]:
    """Each numeric metric averaged over the ranks that report it (all of them, usually); a
    text one (a skip's cause) as the first rank that has it reports it."""
    if d.world == 1:
        return metrics
    merged: dict[str, list[float]] = {}
    texts: dict[str, str] = {}
    for part in d.gather(metrics):
        for key, value in part.items():
            if isinstance(value, str):
                texts.setdefault(key, value)
            elif value is not None:
                merged.setdefault(key, []).append(float(value))
    return {**{key: float(np.mean(values)) for key, values in merged.items()}, **texts}


def policy_update(run: Run, rollouts, advantages: torch.Tensor, scores, step: int) -> dict[str, float]:
    """PPO-style epochs over the rollouts; one optimiser step per epoch.

    The token-level loss is normalised by the step's token count over all ranks, and scaled by
    the world size: DDP and FSDP2 average gradients over ranks, so the ranks' gradients then add
    up to the gradient of the whole batch, as one process with the whole batch would compute it.
    """
    cfg, policy, d = run.cfg, run.policy, run.dist
    G, T = rollouts.group_size, cfg.rollout.temperature
    ids, mask = rollouts.completion_ids, rollouts.completion_mask                 # [N, C]
    N = ids.shape[0]
    total_tokens = max(d.all_sum(float(mask.sum())), 1.0)
    total_seqs = int(d.all_sum(float(N)))
    # every rank runs the same number of forwards and backwards: under several processes
    # zero-advantage rows (which add nothing) are trained too; objectives run their own
    needs_all = cfg.algo.beta > 0 or d.world > 1
    rows = [r for r in range(N) if needs_all or advantages[r] != 0]
    mb = cfg.train.micro_batch
    micro = [rows[i:i + mb] for i in range(0, len(rows), mb)]

    def forward(batch_rows, model=None, **kw):
        prompt_rows = [r // G for r in batch_rows]
        inputs, _ = select(rollouts.prompts, prompt_rows)
        media = policy.shared_media(rollouts.prompts, prompt_rows, model)
        width = max(int(mask[batch_rows].sum(dim=1).max()), 1)                 # trim right padding
        return policy.completion_logprobs(inputs, ids[batch_rows, :width], mask[batch_rows, :width],
                                          T, model=model, media=media, **kw), width

    old, ref = {}, {}
    with torch.no_grad():
        for part in micro:
            if cfg.algo.ppo_epochs > 1:
                (lp, _), _ = forward(part)
                old.update({r: lp[i].cpu() for i, r in enumerate(part)})
            if cfg.algo.beta > 0:
                if policy.lora:
                    with policy.model.disable_adapter():
                        (lp, _), _ = forward(part)
                else:
                    (lp, _), _ = forward(part, model=run.ref_model)
                ref.update({r: lp[i].cpu() for i, r in enumerate(part)})

    stats: dict[str, list[float]] = {"loss/policy": [], "loss/clip_frac": [], "loss/kl": []}
    entropy_sum, gap_sum, gap_max, token_count = 0.0, 0.0, 0.0, 0.0
    grad_norm, cause = 0.0, ""
    if not torch.isfinite(advantages).all():
        cause = "non-finite advantages"
    for epoch in range(cfg.algo.ppo_epochs):
        run.optimizer.zero_grad(set_to_none=True)
        # objectives first: the last backward of the epoch is then a micro-batch on every rank,
        # and DDP all-reduces once, there
        with sync_grads(d, policy, False):
            aux = _objective_losses(run, rollouts, scores, advantages, step)
        stats.update({k: [v] for k, v in aux.items()})
        for k, part in enumerate(micro):
            with sync_grads(d, policy, k == len(micro) - 1):
                (logp, entropy), width = forward(part, with_entropy=epoch == 0)
                m = mask[part, :width].to(logp.device).float()                    # [n, w]
                old_lp = torch.stack([old[r][:width] for r in part]).to(logp.device) if old \
                    else logp.detach()
                ref_lp = torch.stack([ref[r][:width] for r in part]).to(logp.device) if ref else None
                loss, st = grpo_loss(
                    logp, old_lp, advantages[part].to(logp.device), m, clip_low=cfg.algo.clip_low,
                    clip_high=cfg.algo.clip_high, loss_agg=cfg.algo.loss_agg,
                    norm_len=cfg.algo.norm_len or cfg.rollout.max_new_tokens, beta=cfg.algo.beta,
                    ref_logp=ref_lp, kl_estimator=cfg.algo.kl_estimator,
                    total_tokens=total_tokens, total_seqs=total_seqs)
                (loss * d.world).backward()
            if not cause and not torch.isfinite(loss.detach()):
                cause = f"non-finite loss (epoch {epoch + 1}, micro-batch {k + 1})"
            stats["loss/policy"].append(float(loss.detach()))
            stats["loss/clip_frac"].append(st["clip_frac"])
            if "kl" in st:
                stats["loss/kl"].append(st["kl"])
            if epoch == 0:
                n_tok = float(m.sum())
                token_count += n_tok
                entropy_sum += float((entropy * m).sum())
                if rollouts.sample_logprobs is not None:
                    gap = (rollouts.sample_logprobs[part, :width].to(logp.device) - logp.detach()).abs()
                    gap_sum += float((gap * m).sum())
                    gap_max = max(gap_max, float((gap * m).max()))
        grad_norm = clip_grad_norm(policy.trainable_parameters(),
                                   cfg.optim.max_grad_norm or float("inf"))
        if not cause and not math.isfinite(grad_norm):
            cause = "non-finite gradient norm"
        causes = [c for c in d.gather(cause) if c]        # one rank's NaN stops every rank's step
        if causes:
            run.optimizer.zero_grad(set_to_none=True)
            break
        run.optimizer.step()   # a no-op when every group had zero spread (no gradients)
        run.engine.mark_weights_changed()
        if not parallel.all_finite(d, policy.trainable_parameters()):
            raise TrainingError(f"step {step}: the optimiser step made weights non-finite (lr "
                                f"{run.scheduler.get_last_lr()[0]:g}, gradient norm {grad_norm:g}); "
                                "stopping before anything is saved; the last complete checkpoint "
                                "is intact")
    out = {k: (sum(v) if k == "loss/policy" else float(np.mean(v))) for k, v in stats.items() if v}
    out["update/skipped"] = float(bool(causes))
    if causes:
        out["update/skip_cause"] = causes[0]
    # this rank's part of the global loss; summed, it is the whole batch's loss
    out["loss/policy"] = d.all_sum(out.get("loss/policy", 0.0)) / max(cfg.algo.ppo_epochs, 1)
    out["optim/grad_norm"] = grad_norm
    out["update/trained_rows"] = len(rows)
    if token_count:
        out["policy/entropy"] = entropy_sum / token_count
        if rollouts.sample_logprobs is not None:
            out["rollout/logprob_gap"] = gap_sum / token_count
            out["rollout/logprob_gap_max"] = gap_max
    return out


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


def run_eval(run: Run, progress: bool = False) -> dict[str, float]:
    """Held-out figures; every rank scores its share, rank 0 gets the figures ({} elsewhere)."""
    cfg, d = run.cfg, run.dist
    # eval samples (pass@k) come from the clean model: branching shapes exploration only
    engine = run.engine.without_branching()
    run.engine.wake_up()
    records = score_examples(run.policy, engine, run.eval_data[d.rank::d.world],
                             max_new_tokens=cfg.rollout.max_new_tokens,
                             batch_size=cfg.train.eval_batch, samples=cfg.train.eval_samples,
                             temperature=cfg.rollout.temperature,
                             system_prompt=cfg.data.system_prompt,
                             format_prompt=cfg.data.format_prompt, progress=progress and d.main,
                             reward=build_combined(cfg.eval_rewards or cfg.rewards)
                             if cfg.train.eval_reward else None)
    run.engine.sleep()
    gathered = [r for part in d.gather(records) for r in part]
    if not d.main:
        return {}
    result = aggregate(gathered, samples=cfg.train.eval_samples)
    return {f"eval/{k}": v for k, v in result.items()}


def train(cfg: Config, resume: bool = False, progress: bool = True, overwrite: bool = False,
          force: bool = False) -> dict[str, Any]:
    """Run (or continue) GRPO as configured; returns the run's summary (on rank 0).

    `overwrite` lets a fresh run replace an earlier run in `train.out_dir`; `force` lets a
    resume go on with another model or data than the run started with (`mmrlvr.rundir`).
    """
    run, start_step = build_run(cfg, resume, overwrite, force)
    try:
        return _train(run, start_step, resume, progress)
    finally:
        if run.lock is not None:
            run.lock.release()


def _train(run: Run, start_step: int, resume: bool, progress: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    cfg, d = run.cfg, run.dist
    logger = RunLogger(run.run_dir, enabled=d.main, resume_step=start_step if resume else None)
    # the run's shape goes in its first metrics row: step 0 where eval runs first, else step 1
    first = {"run/world_size": d.world, "run/strategy": d.strategy} if start_step == 0 else {}
    if run.eval_data and start_step == 0:
        logger.log(0, {**first, **run_eval(run, progress)})
        first = {}

    bar = tqdm(range(start_step + 1, cfg.train.steps + 1), desc="grpo", disable=not (progress and d.main),
               initial=start_step, total=cfg.train.steps)
    for step in bar:
        metrics = {**first, **grpo_step(run, step)}
        first = {}
        note_skip(run, step, metrics)
        if metrics.get("data/skipped_rows") is None and run.skipped_rows:
            metrics["data/skipped_rows"] = run.skipped_rows
        last = step == cfg.train.steps
        if run.eval_data and (last or (cfg.train.eval_every and step % cfg.train.eval_every == 0)):
            metrics.update(run_eval(run))
        logger.log(step, metrics)
        shown = {"reward": metrics["reward/mean"], "acc": metrics.get("reward/accuracy"),
                 "eval": metrics.get("eval/reward" if cfg.train.eval_reward else "eval/accuracy")}
        bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if v is not None})
        if last or (cfg.train.save_every and step % cfg.train.save_every == 0):
            _save(run, step)
    logger.close()
    in_sync = ranks_in_sync(run)
    summary = summarize(run, in_sync) if d.main else {}
    if d.main:
        write_report(run.run_dir, summary, title=f"GRPO run {run.run_dir.name}")
    run.policy.save(run.run_dir / "final", main=d.main)
    d.barrier()
    return summary


def note_skip(run: Run, step: int, metrics: dict[str, Any]) -> None:
    """Count a skipped update; stop after `train.max_skipped_steps` of them in a row."""
    skips = run.skips
    if not metrics.get("update/skipped"):
        skips.in_a_row = 0
        return
    skips.in_a_row += 1
    skips.total += 1
    if skips.in_a_row == 1:
        skips.first = f"step {step}: {metrics.get('update/skip_cause', 'unknown')}"
    metrics["update/skipped_total"] = skips.total
    if run.dist.main:
        print(f"warning: step {step} skipped, no optimiser step: "
              f"{metrics.get('update/skip_cause')}", file=sys.stderr)
    if skips.in_a_row >= run.cfg.train.max_skipped_steps:
        raise TrainingError(f"{skips.in_a_row} steps in a row were skipped for non-finite values "
                            f"(first at {skips.first}); the weights are unchanged since, and the "
                            f"last complete checkpoint is intact. Check the rewards "
                            f"(reward_errors.jsonl), optim.lr and the data")


def ranks_in_sync(run: Run) -> bool | None:
    """DDP: do all ranks hold bit-identical weights? (None where there is nothing to compare.)"""
    if run.dist.strategy != "ddp":
        return None
    prints = run.dist.gather(parallel.weights_fingerprint(run.policy.model))
    if len(set(prints)) > 1:
        raise RuntimeError(f"DDP ranks hold different weights after training (fingerprints "
                           f"{prints}): a rank trained on different gradients; report this")
    return True


def _save(run: Run, step: int) -> None:
    d = run.dist
    rng = d.gather(rng_state())
    state = {"step": step, "scheduler": run.scheduler.state_dict(), "rng": rng,
             "cursor": run.sampler.cursor, "world_size": d.world, "strategy": d.strategy}
    sharded = None
    if d.strategy == "fsdp2":
        sharded = sharded_state(run.policy.base_model(), run.optimizer)
    else:
        state["optimizer"] = run.optimizer.state_dict()
    save_checkpoint(run.run_dir, step, run.policy, state, keep=run.cfg.train.keep_checkpoints,
                    dist=d, sharded=sharded)


def summarize(run: Run, ranks_in_sync: bool | None = None) -> dict[str, Any]:
    rows = read_metrics(run.run_dir / "metrics.jsonl")
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    trained = [r for r in rows if r.get("reward/mean") is not None]
    summary: dict[str, Any] = {"steps": run.cfg.train.steps, "model": run.cfg.model.path,
                               "train_rows": len(run.train_data), "eval_rows": len(run.eval_data),
                               "world_size": run.dist.world, "strategy": run.dist.strategy}
    if ranks_in_sync is not None:
        summary["ranks_in_sync"] = ranks_in_sync
    if evals:
        summary["accuracy_start"] = evals[0]["eval/accuracy"]
        summary["accuracy_end"] = evals[-1]["eval/accuracy"]
        summary["accuracy_gain"] = summary["accuracy_end"] - summary["accuracy_start"]
        for key in ("format_rate", "mean_length"):
            if f"eval/{key}" in evals[-1]:
                summary[f"{key}_end"] = evals[-1][f"eval/{key}"]
        if "eval/reward" in evals[0]:                      # train.eval_reward
            summary["reward_start"] = evals[0]["eval/reward"]
            summary["reward_end"] = evals[-1]["eval/reward"]
            summary["reward_gain"] = summary["reward_end"] - summary["reward_start"]
    if trained:
        tail = trained[-10:]
        summary["train_reward_last10"] = float(np.mean([r["reward/mean"] for r in tail]))
        summary["seconds_per_step"] = float(np.median([r["time/step_s"] for r in trained]))
    return summary
