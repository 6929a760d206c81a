"""The GRPO trainer: rollout → rewards → advantages → clipped-surrogate update, step after step.

One step (docs/grpo-step.md):
    Examples ─► prompting.draw(step) (prompt transforms: the template pool)
      ─► prompting.encode (system turn, format instruction; adapter.encode) ─► PromptBatch
      ─► engine.generate(n=G) ─► Rollouts (B·G completions, sample logprobs)
      ─► reward.score per group ─► rewards [B, G] ─► advantages [B, G]
      ─► policy logprobs in micro-batches ─► GRPO loss (+ KL, + objectives) ─► AdamW step

What it leaves out on purpose: value functions, reward models (`train.packing` packs each
group's completions after its prompt, `mmrlvr.train.packing`; off by default). Groups whose
rewards have zero spread contribute no gradient; single-process runs without KL skip their
policy forward entirely (exactly the same update, less work; objectives run their own).

Under several processes (torchrun or accelerate launch; `mmrlvr.train.parallel`) each rank takes its
share of the step's prompts, the loss is normalised by the step's global token count, gradients
are summed over ranks by DDP or FSDP2 (`train.strategy`), and eval is spread over the ranks.
Weights are fp32 masters; the forward runs in `model.dtype` (`mmrlvr.train.policy`).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import torch

from mmrlvr.algo import group_advantages, zero_spread_fraction
from mmrlvr.algo.shaping import ShapeContext, token_credit
from mmrlvr.config import Config, to_dict
from mmrlvr.core.errors import TrainingError
from mmrlvr.core.prompting import Draw
from mmrlvr.core.types import Scores
from mmrlvr.rollout import SamplingParams
from mmrlvr.rollout.base import truncated_rows
from mmrlvr.rollout.diversity import rollout_metrics
from mmrlvr.train import dynamic, parallel
from mmrlvr.train.async_rollout import plans_ahead
from mmrlvr.train.checkpoint import rng_state, save_checkpoint, sharded_state
from mmrlvr.train.evaluate import evaluate_ranks, write_records
from mmrlvr.train.logger import RunLogger, read_metrics
from mmrlvr.train.parallel import Dist
from mmrlvr.train.preempt import Preemption
from mmrlvr.train.report import write_report
from mmrlvr.train.setup import Run, build_run
from mmrlvr.train.update import policy_update
from mmrlvr.train.writes import save_final
from rewards import RewardError, build_combined


def grpo_step(run: Run, step: int) -> dict[str, float]:
    """One GRPO step on this process's share of the next `batch_prompts` prompts."""
    cfg, policy, d = run.cfg, run.policy, run.dist
    t0 = time.perf_counter()
    draw = run.prompting.draw(step)        # the step's prompt transforms: resumes exactly
    if cfg.train.dynamic_sampling:         # groups with reward spread, drawing more while short
        share = len(range(d.rank, cfg.train.batch_prompts, d.world))
        drawn = dynamic.collect(run, lambda: draw_batch(run, step, draw), share)
    elif run.prefetch is not None:         # this step's batch was generated during the last update
        drawn = draw_ahead(run, step, draw)
    else:
        drawn = draw_batch(run, step, draw)
    examples, rollouts, scores = drawn.examples, drawn.rollouts, drawn.scores
    prompts = rollouts.prompts
    t1 = t0 + drawn.stats["time/rollout_s"]

    rewards, nonfinite = scores.total, scores.nonfinite                         # [B, G]
    advantages = group_advantages(rewards, cfg.algo.advantage, cfg.algo.eps, d.all_sum)  # [B, G]
    if cfg.algo.mask_truncated:           # DAPO's overlong filtering: no gradient from them
        cut = truncated_rows(rollouts.completion_ids, rollouts.completion_mask, policy.eos_ids)
        advantages = advantages.masked_fill(cut.view_as(advantages), 0.0)
    t2 = time.perf_counter()
    progress = step / max(cfg.train.steps, 1)

    credit, shaped = token_credit(advantages.flatten(), rollouts.completion_mask, cfg.algo.clip_low,
                                  cfg.algo.clip_high, run.shapers,
                                  ShapeContext(rollouts, scores, rollouts.completion_mask,
                                               examples, prompts, policy, progress))
    update = policy_update(run, rollouts, advantages.flatten(), scores, step, credit)
    t3 = time.perf_counter()

    metrics = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
               "reward/zero_spread_frac": zero_spread_fraction(rewards),
               **{k: v for k, v in drawn.stats.items() if k.startswith(("sampling/", "async/"))}}
    if nonfinite.any():
        metrics["reward/nonfinite_frac"] = float(nonfinite.float().mean())
    if cfg.algo.mask_truncated:
        metrics["update/truncated_masked_frac"] = float(cut.float().mean())
    for key in scores.keys:
        metrics[f"reward/{key}"] = float(np.mean(scores.values(key)))
    lengths = rollouts.completion_mask.sum(dim=1).float()
    metrics.update({
        "response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max()),
        "response/truncated_frac": rollouts.stats["rollout/truncated_frac"],
        "rollout/placeholder_scrubbed": rollouts.stats["rollout/placeholder_scrubbed"],
        "time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/update_s": t3 - t2,
        "time/step_s": t3 - t0, "perf/rollout_tokens_per_s": rollouts.stats["rollout/tokens"] / (t1 - t0),
        "optim/lr": run.scheduler.get_last_lr()[0], **update, **shaped})
    metrics.update(rollout_metrics(rollouts, scores, run.engine.branching))
    metrics.update({k: v for k, v in rollouts.stats.items() if k.startswith("tools/")})  # multi-turn
    metrics.update(verifier_metrics(scores))
    run.scheduler.step()
    return mean_over_ranks(d, metrics)


def draw_batch(run: Run, step: int, draw: Draw) -> dynamic.Drawn:
    """This rank's share of the next `batch_prompts` prompts, rolled out and scored; a sampler
    that learns from outcomes sees them (every rank the whole draw, so all keep one state)."""
    t0 = time.perf_counter()
    indices, examples, prompts = next_prompts(run, draw)
    run.engine.wake_up()
    rollouts = run.engine.generate(prompts, sampling_params(run.cfg))
    run.engine.sleep()
    return score_batch(run, step, indices, examples, rollouts, t0)


def draw_ahead(run: Run, step: int, draw: Draw) -> dynamic.Drawn:
    """`train.async_rollouts: one_step_off`: the batch generated for this step during the last
    update (else one generated now), scored; then, unless a checkpoint, an eval or the end
    follows this step, the next step's prompts start generating from the weights as they are
    before this update (mmrlvr/train/async_rollout.py)."""
    t0 = time.perf_counter()
    ahead = run.prefetch.take(step)
    if ahead is None:
        drawn = draw_batch(run, step, draw)
    else:
        indices, examples, rollouts, waited = ahead
        drawn = score_batch(run, step, indices, examples, rollouts, t0)
        drawn.stats["async/wait_s"] = waited
    drawn.stats["async/stale"] = float(ahead is not None)
    if plans_ahead(run.cfg, step):
        indices, examples, prompts = next_prompts(run, run.prompting.draw(step + 1))
        run.prefetch.start(step + 1, indices, examples, prompts, sampling_params(run.cfg))
    return drawn


def next_prompts(run: Run, draw: Draw) -> tuple[list[int], list, Any]:
    """This rank's share of the sampler's next `batch_prompts` prompts: (dataset indices, the
    examples as the step's prompt transforms rewrote them, the encoded PromptBatch)."""
    d = run.dist
    indices = run.sampler.next(run.cfg.train.batch_prompts)[d.rank::d.world]
    examples = draw([run.train_data[i] for i in indices])
    return indices, examples, run.prompting.encode(run.policy, examples)


def sampling_params(cfg: Config) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(n=r.group_size, max_new_tokens=r.max_new_tokens,
                          temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)


def score_batch(run: Run, step: int, indices: list[int], examples: list, rollouts,
                t0: float) -> dynamic.Drawn:
    """The rewards of a rolled-out batch (every group's calls at once); `t0`: when its rollout
    began (for time/rollout_s)."""
    cfg, d = run.cfg, run.dist
    t1 = time.perf_counter()
    G = cfg.rollout.group_size
    rows = [range(b * G, (b + 1) * G) for b in range(len(examples))]
    ids, kept = rollouts.completion_ids, rollouts.completion_mask.bool()
    scores = Scores(run.reward.score_groups(     # a user reward's async calls: every group at once
        examples, [[rollouts.texts[r] for r in group] for group in rows],
        progress=step / max(cfg.train.steps, 1),
        completion_ids=[[ids[r][kept[r]].tolist() for r in group] for group in rows]))
    failures = d.gather(run.reward.all_failed(scores.parts))   # decided together: no rank waits alone
    if all(failures):
        raise RewardError(failures[0])
    if hasattr(run.sampler, "observe"):
        observe_outcomes(run, indices, scores)
    return dynamic.Drawn(examples, indices, rollouts, scores,
                         {"time/rollout_s": t1 - t0, "time/reward_s": time.perf_counter() - t1})


def verifier_metrics(scores: Scores) -> dict[str, float]:
    """What the verifier saw this step, from the accuracy-style parts' own outputs (`parsed`,
    `too_complex`): the share of completions with no extractable answer, and of answers past its
    size caps."""
    flat = scores.flat
    out = {}
    for field, metric in (("parsed", "verify/parse_fail_rate"), ("too_complex", "verify/too_complex_rate")):
        keys = [k for k in flat[0] if k.endswith(f"/{field}")] if flat else []
        if keys:
            out[metric] = float(np.mean([1.0 - s[k] if field == "parsed" else s[k]
                                         for s in flat for k in keys]))
    return out


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


def run_eval(run: Run, step: int, progress: bool = False) -> dict[str, float]:
    """Held-out figures of every `data.eval` set; every rank scores its share, rank 0 gets the
    figures ({} elsewhere) and writes each question's outcome (what `mmrlvr compare` pairs). The
    first set logs `eval/<metric>` and writes `eval/step-N.jsonl`; each other set logs
    `eval/<name>/<metric>` and writes `eval/<name>/step-N.jsonl`."""
    cfg = run.cfg
    # eval samples (pass@k) come from the clean model: branching shapes exploration only
    engine = run.engine.without_branching()
    run.engine.wake_up()
    out: dict[str, float] = {}
    # sampled eval (pass@k) draws from its own copy of the random streams: the training run
    # after it samples exactly what it would with any other eval setting
    devices = [run.policy.device.index or 0] if run.policy.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for name, data in [("", run.eval_data), *run.extra_evals.items()]:
            result, records = evaluate_ranks(
                run.dist, run.policy, engine, data, max_new_tokens=cfg.rollout.max_new_tokens,
                batch_size=cfg.train.eval_batch, samples=cfg.train.eval_samples,
                temperature=cfg.rollout.temperature, prompting=run.prompting.plain(),
                progress=progress and run.dist.main,
                reward=build_combined(cfg.eval_rewards or cfg.rewards) if cfg.train.eval_reward
                else None)
            if run.dist.main:
                prefix = f"eval/{name}/" if name else "eval/"
                write_records(run.run_dir / prefix / f"step-{step}.jsonl", records)
                out.update({f"{prefix}{k}": v for k, v in result.items()})
    run.engine.sleep()
    return out


def train(cfg: Config, resume: bool = False, progress: bool = True, overwrite: bool = False,
          force: bool = False, trust_checkpoint: bool = False,
          until: Callable[[int, dict[str, Any]], bool] | None = None,
          callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Run (or continue) GRPO as configured; returns the run's summary (on rank 0).

    `overwrite` lets a fresh run replace an earlier run in `train.out_dir`; `force` lets a
    resume go on with another model or data than the run started with (`mmrlvr.train.rundir`);
    `trust_checkpoint` lets a resume read an old-format (pickled) trainer state, which can run
    code planted in it (`mmrlvr.train.checkpoint`). `until(step, metrics)`, asked on rank 0
    after each step (its eval included), ends the run there when it answers True, as if that
    step were the last (a stage that stops on its validation score: `mmrlvr opd`). `callbacks`
    (the Python API's) get `on_log(step, metrics)` for each metrics row (`RunLogger`).
    """
    run, start_step = build_run(cfg, resume, overwrite, force, trust_checkpoint)
    try:
        return _train(run, start_step, resume, progress, until, callbacks)
    finally:
        if run.lock is not None:
            run.lock.release()


def _train(run: Run, start_step: int, resume: bool, progress: bool,
           until: Callable[[int, dict[str, Any]], bool] | None = None,
           callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    from tqdm.auto import tqdm

    cfg, d = run.cfg, run.dist
    logger = RunLogger(run.run_dir, enabled=d.main, resume_step=start_step if resume else None,
                       report_to=cfg.train.report_to, config=to_dict(cfg), callbacks=callbacks)
    # the run's shape goes in its first metrics row: step 0 where eval runs first, else step 1
    first = {"run/world_size": d.world, "run/strategy": d.strategy} if start_step == 0 else {}
    if run.eval_data and start_step == 0:
        logger.log(0, {**first, **run_eval(run, 0, progress)})
        first = {}

    bar = tqdm(range(start_step + 1, cfg.train.steps + 1), desc="grpo", disable=not (progress and d.main),
               initial=start_step, total=cfg.train.steps)
    with Preemption() as stop:
        stopped = _steps(run, bar, logger, first, stop, until)
    logger.close()
    if d.main:       # a lazy split records rows skipped when drawn: rewrite skipped_rows.jsonl
        run.report.write(run.run_dir)
    in_sync = ranks_in_sync(run)
    summary = summarize(run, in_sync) if d.main else {}
    if stopped is not None:          # preempted: the checkpoint is the run's state, no final/
        step, name = stopped
        if d.main:
            summary["preempted"] = {"signal": name, "step": step}
            print(f"{name}: stopped after step {step} of {cfg.train.steps}; checkpoint saved; "
                  f"continue with `mmrlvr train --resume {run.run_dir}`", file=sys.stderr)
            write_report(run.run_dir, summary, title=f"GRPO run {run.run_dir.name} (preempted)")
        d.barrier()
        return summary
    save_final(run.run_dir, run.policy, d)   # first: summary.json never claims an unsaved final/
    if d.main:
        write_report(run.run_dir, summary, title=f"GRPO run {run.run_dir.name}")
    d.barrier()
    return summary


def _steps(run: Run, bar, logger: RunLogger, first: dict[str, Any], stop: Preemption,
           until: Callable[[int, dict[str, Any]], bool] | None = None) -> tuple[int, str] | None:
    """The training steps of `bar`; (step, signal) when a signal stopped them after `step`."""
    cfg = run.cfg
    for step in bar:
        metrics = {**first, **grpo_step(run, step)}
        first = {}
        note_skip(run, step, metrics)
        if metrics.get("data/skipped_rows") is None and run.report.skipped:
            metrics["data/skipped_rows"] = len(run.report.skipped)
        last = step == cfg.train.steps
        if run.eval_data and (last or (cfg.train.eval_every and step % cfg.train.eval_every == 0)):
            metrics.update(run_eval(run, step))
        if until is not None:            # rank 0's verdict (eval figures live there)
            ended = run.dist.gather(bool(until(step, metrics)) if run.dist.main else False)[0]
            last = last or ended
        logger.log(step, metrics)
        shown = {"reward": metrics["reward/mean"], "acc": metrics.get("reward/accuracy"),
                 "eval": metrics.get("eval/reward" if cfg.train.eval_reward else "eval/accuracy")}
        bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if v is not None})
        saved = last or (cfg.train.save_every and step % cfg.train.save_every == 0)
        if saved:
            _save(run, step)
        name = stop.asked(run.dist)
        if name and not last:            # the step is whole: keep it, and stop
            if run.prefetch is not None:  # the batch in flight for the next step is dropped
                run.prefetch.drop()
            if not saved:
                _save(run, step)
            return step, name
        if last:                         # `until` ended the run early (or the loop is done)
            if run.prefetch is not None:
                run.prefetch.drop()
            return None
    return None


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


def observe_outcomes(run: Run, indices: list[int], scores: Scores) -> None:
    """Feed a sampler that learns from outcomes (`train.sampler: difficulty`) each prompt's
    successes: the `accuracy` part of its members' rewards where the run scores one, else the
    total clipped to [0, 1]."""
    key = "accuracy" if scores.has("accuracy") else "overall"
    wins = [sum(min(max(s[key], 0.0), 1.0) for s in group) for group in scores.parts]
    parts = run.dist.gather((indices, wins))
    run.sampler.observe([i for p in parts for i in p[0]], [w for p in parts for w in p[1]],
                        run.cfg.rollout.group_size)


def _save(run: Run, step: int) -> None:
    d = run.dist
    rng = d.gather(rng_state())
    state = {"step": step, "scheduler": run.scheduler.state_dict(), "rng": rng,
             "cursor": run.sampler.cursor, "world_size": d.world, "strategy": d.strategy}
    if hasattr(run.sampler, "state_dict"):
        state["sampler"] = run.sampler.state_dict()
    if run.engine.branching is not None:          # e.g. NC-GRPO's alpha: auto controller
        state["branching"] = d.gather(run.engine.branching.state_dict())
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
    for name, data in run.extra_evals.items():      # the other data.eval sets, by name
        summary[f"{name}/eval_rows"] = len(data)
        points = [r[f"eval/{name}/accuracy"] for r in rows
                  if r.get(f"eval/{name}/accuracy") is not None]
        if points:
            summary[f"{name}/accuracy_start"], summary[f"{name}/accuracy_end"] = points[0], points[-1]
            summary[f"{name}/accuracy_gain"] = points[-1] - points[0]
    if trained:
        tail = trained[-10:]
        summary["train_reward_last10"] = float(np.mean([r["reward/mean"] for r in tail]))
        summary["seconds_per_step"] = float(np.median([r["time/step_s"] for r in trained]))
    return summary
