"""The GRPO trainer: rollout → rewards → advantages → clipped-surrogate update, step after step.

One step (DESIGN.md):
    Examples ─► adapter.encode ─► PromptBatch (B prompts, processed once)
      ─► engine.generate(n=G) ─► Rollouts (B·G completions, sample logprobs)
      ─► reward.score per group ─► rewards [B, G] ─► advantages [B, G]
      ─► policy logprobs in micro-batches ─► GRPO loss (+ KL, + objectives) ─► AdamW step

What it leaves out on purpose: value functions, reward models, sequence packing. Groups whose
rewards have zero spread contribute no gradient; single-process runs without KL skip their
policy forward entirely (exactly the same update, less work; objectives run their own).
Under `accelerate launch` each process takes its share of the step's prompts and gradients are
averaged by accelerate's DDP wrapper.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import modalities
from mmrlvr import objectives as objectives_mod
from mmrlvr.algo import group_advantages, grpo_loss, zero_spread_fraction
from mmrlvr.checkpoint import (latest_checkpoint, load_trainer_state, rng_state,
                               save_checkpoint, set_rng_state)
from mmrlvr.config import Config, save_config
from mmrlvr.data import DataError, LoadReport, load_dataset
from mmrlvr.evaluate import evaluate
from mmrlvr.logger import RunLogger, read_metrics
from mmrlvr.policy import Policy, load_model, pick_device
from mmrlvr.report import write_report
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.rollout.branching import branch_metrics
from mmrlvr.sampler import PromptSampler
from mmrlvr.templates import apply_templates
from modalities.base import select
from rewards.base import build_combined
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
class Run:
    """Everything a step needs, built once."""

    cfg: Config
    accelerator: Any
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


def build_run(cfg: Config, resume: bool = False) -> tuple[Run, int]:
    """Load data, policy, optimiser; restore the last complete checkpoint when resuming."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)]
    accelerator = Accelerator(cpu=pick_device(cfg.train.device).type == "cpu",
                              kwargs_handlers=handlers)
    seed_everything(cfg.train.seed + accelerator.process_index)
    run_dir = Path(cfg.train.out_dir)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")

    adapter = modalities.get(cfg.model.modality, min_pixels=cfg.model.min_pixels,
                             max_pixels=cfg.model.max_pixels)
    report = LoadReport()
    if not cfg.data.train:
        raise DataError("data.train is empty: give a JSONL file (see `mmrlvr data --help`)")
    train_data = load_dataset(cfg.data.train, on_error=cfg.data.on_error, report=report)
    eval_data = load_dataset(cfg.data.eval, on_error=cfg.data.on_error) if cfg.data.eval else []
    if cfg.data.eval_limit:
        eval_data = eval_data[:cfg.data.eval_limit]

    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {run_dir}/checkpoints")
    device = accelerator.device
    if ckpt is not None and cfg.model.lora.r > 0:
        policy = Policy.load(cfg.model, adapter, device, adapter_dir=ckpt / "adapter")
    else:
        policy = Policy.load(cfg.model, adapter, device, path=str(ckpt) if ckpt else None)
    objectives = objectives_mod.build(cfg.objectives)
    wants_ref = [o.name for _, o in objectives if getattr(o, "needs_ref_model", False)]
    if wants_ref and cfg.model.lora.r > 0:
        raise ValueError(f"objective {wants_ref[0]!r} asks for the frozen model.path weights, which "
                         f"a LoRA run does not hold apart (merge the adapter first)")
    ref_model = None
    if (cfg.algo.beta > 0 or wants_ref) and cfg.model.lora.r == 0:
        ref_model = load_model(cfg.model.path, policy.dtype, cfg.model.attn_implementation)
        ref_model.to(device).eval().requires_grad_(False)

    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.optim.lr,
                                  betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(
        cfg.optim.warmup_steps, cfg.train.steps, cfg.optim.min_lr_ratio, cfg.optim.schedule))
    if accelerator.num_processes > 1:
        if cfg.train.batch_prompts % accelerator.num_processes:
            raise ValueError(f"train.batch_prompts ({cfg.train.batch_prompts}) must divide "
                             f"evenly over {accelerator.num_processes} processes")
        policy.forward_model, optimizer = accelerator.prepare(policy.model, optimizer)

    sampler = PromptSampler(len(train_data), cfg.train.seed)
    start_step = 0
    if ckpt is not None:
        state = load_trainer_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"][accelerator.process_index])
        sampler.cursor = state["cursor"]
        start_step = state["step"]

    engine = make_engine(cfg.rollout.backend, policy, cfg.rollout.branching,
                         cfg.rollout.vllm_gpu_memory_utilization)
    run = Run(cfg, accelerator, policy, engine,
              build_combined(cfg.rewards), objectives, optimizer, scheduler,
              train_data, eval_data, sampler, ref_model, run_dir, len(report.skipped))
    return run, start_step


def grpo_step(run: Run, step: int) -> dict[str, float]:
    """One GRPO step on this process's share of the next `batch_prompts` prompts."""
    cfg, policy, acc = run.cfg, run.policy, run.accelerator
    t0 = time.perf_counter()
    indices = run.sampler.next(cfg.train.batch_prompts)[acc.process_index::acc.num_processes]
    examples = [run.train_data[i] for i in indices]
    template_rng = random.Random(f"templates-{cfg.train.seed}-{step}")   # per step: resumes exactly
    examples = apply_templates(examples, cfg.data.templates, template_rng)
    prompts = policy.adapter.encode(examples, policy.processor, system_prompt=cfg.data.system_prompt,
                                    format_prompt=cfg.data.format_prompt)
    params = SamplingParams(n=cfg.rollout.group_size, max_new_tokens=cfg.rollout.max_new_tokens,
                            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            top_k=cfg.rollout.top_k)
    rollouts = run.engine.generate(prompts, params)
    t1 = time.perf_counter()

    G = cfg.rollout.group_size
    if hasattr(run.reward, "set_progress"):
        run.reward.set_progress(step / max(cfg.train.steps, 1))
    reset_stats()   # the verifier's counters now cover exactly this step's scoring
    scores = [run.reward.score(ex, rollouts.texts[b * G:(b + 1) * G]) for b, ex in enumerate(examples)]
    vstats = verify_stats()
    rewards = torch.tensor([[s["overall"] for s in group] for group in scores])   # [B, G]
    advantages = group_advantages(rewards, cfg.algo.advantage, cfg.algo.eps)       # [B, G]
    t2 = time.perf_counter()

    update = policy_update(run, rollouts, advantages.flatten(), scores, step)
    t3 = time.perf_counter()

    metrics = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
               "reward/zero_spread_frac": zero_spread_fraction(rewards)}
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
    if acc.num_processes > 1:
        keys = sorted(k for k, v in metrics.items() if v is not None)
        values = acc.reduce(torch.tensor([float(metrics[k]) for k in keys], device=acc.device), "mean")
        metrics.update(dict(zip(keys, values.tolist())))
    return metrics


def policy_update(run: Run, rollouts, advantages: torch.Tensor, scores, step: int) -> dict[str, float]:
    """PPO-style epochs over the rollouts; one optimiser step per epoch."""
    cfg, policy, acc = run.cfg, run.policy, run.accelerator
    G, T = rollouts.group_size, cfg.rollout.temperature
    ids, mask = rollouts.completion_ids, rollouts.completion_mask                 # [N, C]
    N = ids.shape[0]
    total_tokens = float(mask.sum().clamp(min=1))
    needs_all = cfg.algo.beta > 0 or acc.num_processes > 1      # objectives run their own forward
    rows = [r for r in range(N) if needs_all or advantages[r] != 0]
    mb = cfg.train.micro_batch
    micro = [rows[i:i + mb] for i in range(0, len(rows), mb)]

    def forward(batch_rows, model=None, **kw):
        prompt_rows = [r // G for r in batch_rows]
        inputs, _ = select(rollouts.prompts, prompt_rows)
        media = policy.adapter.shared_media(
            (model or policy.base_model()), rollouts.prompts, prompt_rows, policy.device, policy.dtype)
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
    grad_norm = 0.0
    for epoch in range(cfg.algo.ppo_epochs):
        run.optimizer.zero_grad(set_to_none=True)
        for k, part in enumerate(micro):
            (logp, entropy), width = forward(part, with_entropy=epoch == 0)
            m = mask[part, :width].to(logp.device).float()                        # [n, w]
            old_lp = torch.stack([old[r][:width] for r in part]).to(logp.device) if old \
                else logp.detach()
            ref_lp = torch.stack([ref[r][:width] for r in part]).to(logp.device) if ref else None
            loss, st = grpo_loss(
                logp, old_lp, advantages[part].to(logp.device), m, clip_low=cfg.algo.clip_low,
                clip_high=cfg.algo.clip_high, loss_agg=cfg.algo.loss_agg,
                norm_len=cfg.algo.norm_len or cfg.rollout.max_new_tokens, beta=cfg.algo.beta,
                ref_logp=ref_lp, kl_estimator=cfg.algo.kl_estimator,
                total_tokens=total_tokens, total_seqs=N)
            sync_now = k == len(micro) - 1
            with (acc.no_sync(policy.forward_model) if not sync_now and acc.num_processes > 1
                  else contextlib.nullcontext()):
                acc.backward(loss)
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
        aux = _objective_losses(run, rollouts, scores, advantages, step)
        stats.update({k: [v] for k, v in aux.items()})
        if cfg.optim.max_grad_norm > 0:
            grad_norm = float(acc.clip_grad_norm_(policy.trainable_parameters(),
                                                  cfg.optim.max_grad_norm))
        run.optimizer.step()   # a no-op when every group had zero spread (no gradients)
    out = {k: (sum(v) if k == "loss/policy" else float(np.mean(v))) for k, v in stats.items() if v}
    out["loss/policy"] = out.get("loss/policy", 0.0) / max(cfg.algo.ppo_epochs, 1)
    out["optim/grad_norm"] = grad_norm
    out["update/trained_rows"] = len(rows)
    if token_count:
        out["policy/entropy"] = entropy_sum / token_count
        if rollouts.sample_logprobs is not None:
            out["rollout/logprob_gap"] = gap_sum / token_count
            out["rollout/logprob_gap_max"] = gap_max
    return out


def _objective_losses(run: Run, rollouts, scores, advantages, step: int) -> dict[str, float]:
    if not run.objectives:
        return {}
    ctx = objectives_mod.StepContext(run.policy, rollouts, scores, advantages, step,
                                     run.cfg.train.steps, run.run_dir, run.ref_model)
    out = {}
    for weight, objective in run.objectives:
        loss, st = objective.loss(ctx)
        if loss is not None:
            run.accelerator.backward(weight * loss)
            out[f"objective/{objective.name}"] = float(loss.detach())
        out.update({f"objective/{objective.name}/{k}": v for k, v in st.items()})
    return out


def run_eval(run: Run, progress: bool = False) -> dict[str, float]:
    cfg = run.cfg
    # eval samples (pass@k) come from the clean model: branching shapes exploration only
    engine = make_engine("hf", run.policy) if run.cfg.rollout.backend == "hf" else run.engine
    result = evaluate(run.policy, engine, run.eval_data, max_new_tokens=cfg.rollout.max_new_tokens,
                      batch_size=cfg.train.eval_batch, samples=cfg.train.eval_samples,
                      temperature=cfg.rollout.temperature, system_prompt=cfg.data.system_prompt,
                      format_prompt=cfg.data.format_prompt, progress=progress,
                      reward=build_combined(cfg.eval_rewards or cfg.rewards)
                      if cfg.train.eval_reward else None)
    return {f"eval/{k}": v for k, v in result.items()}


def train(cfg: Config, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run (or continue) GRPO as configured; returns the run's summary."""
    from tqdm.auto import tqdm

    run, start_step = build_run(cfg, resume)
    acc, main = run.accelerator, run.accelerator.is_main_process
    logger = RunLogger(run.run_dir, enabled=main, resume_step=start_step if resume else None)
    if main and run.eval_data and start_step == 0:
        logger.log(0, run_eval(run, progress))
    acc.wait_for_everyone()

    bar = tqdm(range(start_step + 1, cfg.train.steps + 1), desc="grpo", disable=not (progress and main),
               initial=start_step, total=cfg.train.steps)
    for step in bar:
        metrics = grpo_step(run, step)
        if metrics.get("data/skipped_rows") is None and run.skipped_rows:
            metrics["data/skipped_rows"] = run.skipped_rows
        last = step == cfg.train.steps
        if main and run.eval_data and (last or (cfg.train.eval_every and step % cfg.train.eval_every == 0)):
            metrics.update(run_eval(run))
        logger.log(step, metrics)
        shown = {"reward": metrics["reward/mean"], "acc": metrics.get("reward/accuracy"),
                 "eval": metrics.get("eval/reward" if cfg.train.eval_reward else "eval/accuracy")}
        bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if v is not None})
        if last or (cfg.train.save_every and step % cfg.train.save_every == 0):
            _save(run, step)
    logger.close()
    summary = summarize(run) if main else {}
    if main:
        write_report(run.run_dir, summary, title=f"GRPO run {run.run_dir.name}")
        run.policy.save(run.run_dir / "final")
    acc.wait_for_everyone()
    return summary


def _save(run: Run, step: int) -> None:
    acc = run.accelerator
    rng = acc.gather_for_metrics([rng_state()], use_gather_object=True) \
        if acc.num_processes > 1 else [rng_state()]
    if acc.is_main_process:
        state = {"step": step, "optimizer": run.optimizer.state_dict(),
                 "scheduler": run.scheduler.state_dict(), "rng": rng, "cursor": run.sampler.cursor}
        save_checkpoint(run.run_dir, step, run.policy, state, keep=run.cfg.train.keep_checkpoints)
    acc.wait_for_everyone()


def summarize(run: Run) -> dict[str, Any]:
    rows = read_metrics(run.run_dir / "metrics.jsonl")
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    trained = [r for r in rows if r.get("reward/mean") is not None]
    summary: dict[str, Any] = {"steps": run.cfg.train.steps, "model": run.cfg.model.path,
                               "train_rows": len(run.train_data), "eval_rows": len(run.eval_data)}
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
