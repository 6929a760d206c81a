"""Supervised warm start: teacher-forced cross-entropy on `<think>reasoning</think><answer>…</answer>`.

Uses the same adapter, prompts and logprob code as GRPO, so what SFT teaches is exactly what
the RL phase samples from. The loss covers completion tokens only (never the prompt or media).

TransAnyText (`model.modality: image_translation`) adds two things:
  * `sft.privileged_fraction`: that share of each batch is shown with the privileged teacher
    prompt (image + source-language patch), so the one model can later play PWSD's teacher;
  * `sft.pwsd.steps > 0`: after SFT, a PWSD stage (`run_pwsd`): GRPO-style student rollouts
    distilled towards the privileged teacher by the `pwsd` objective alone (rewards weighted 0,
    still logged and evaluated), saved to `sft.pwsd.out_dir/final` — the checkpoint GRPO starts
    from and keeps its KL to.

Under several processes (as `mmrlvr train`, see `mmrlvr.train.parallel`) every rank draws the same
batch and trains its share of it; the loss is normalised by the batch's token count over all
ranks, so the update equals one process's on the whole batch.
"""
from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from mmrlvr.config import Config, check_model_path, resolve_model_defaults, save_config, to_dict
from mmrlvr.data import DataError, Example, LoadReport, load_split
from mmrlvr.train.evaluate import evaluate_ranks, write_records
from mmrlvr.train.logger import RunLogger
from mmrlvr.train.report import SFT_PANELS, write_report
from mmrlvr.rollout import make_engine
from mmrlvr.train.sampler import PromptSampler
from mmrlvr.train.lengths import prompt_budget
from mmrlvr.train.setup import (claim_run_dir, load_eval_sets, load_policy, seed_everything,
                                start_processes, warmup_cosine)
from mmrlvr.train.trainer import train
from mmrlvr.train.sft_tools import gold_turns, tool_runner, trajectory_targets
from mmrlvr.rollout.multiturn import with_tools
from mmrlvr.train.update import clip_grad_norm, sync_grads
from mmrlvr.train.writes import save_final
from mmrlvr.core.prompting import Prompting
from mmrlvr.core.types import ModalityAdapter, select
from rewards import build_combined


def sft_target(ex: Example) -> str:
    """The supervised completion for one example (think + answer, the format reward's shape)."""
    if not ex.reasoning:
        raise DataError(f"sample {ex.id}: SFT needs a 'reasoning' field (the <think> part)")
    return f"<think>{ex.reasoning}</think><answer>{ex.answer}</answer>"


def encode_targets(tokenizer, texts: list[str], eos_id: int, pad_id: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded target ids [N, C] (each ending in EOS) and their mask [N, C]."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos_id] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


def privileged_rows(adapter: ModalityAdapter, batch: list[Example], fraction: float,
                    rng: random.Random) -> list[Example]:
    """`batch` with round(fraction·len) rows (a seeded draw) switched to the teacher's prompt."""
    if fraction > 0 and not hasattr(adapter, "privileged_example"):
        raise ValueError(f"sft.privileged_fraction needs a modality with a privileged teacher "
                         f"prompt (image_translation); model.modality is {adapter.name!r}")
    k = round(fraction * len(batch))
    chosen = set(rng.sample(range(len(batch)), k)) if k else set()
    return [adapter.privileged_example(ex) if i in chosen else ex
            for i, ex in enumerate(batch)]


def pwsd_config(cfg: Config, init: str | Path) -> Config:
    """The GRPO-trainer config of the PWSD stage that follows SFT (see the module docstring)."""
    stage = cfg.sft.pwsd
    out = copy.deepcopy(cfg)
    out.model.path = str(init)
    out.rewards = [{**spec, "weight": 0.0} for spec in cfg.rewards]      # logged, no gradient
    out.eval_rewards = cfg.eval_rewards or cfg.rewards                   # eval keeps the weights
    out.objectives = [{"name": "pwsd", "weight": 1.0, "alpha": stage.alpha,
                       "max_rows": stage.max_rows, "seed": cfg.train.seed, "teacher": stage.teacher,
                       **({"dash": stage.dash} if stage.dash is not None else {})}]
    out.algo.beta = 0.0
    out.optim.lr = stage.lr
    out.rollout.group_size = stage.group_size
    out.rollout.temperature = stage.temperature
    out.train.steps = stage.steps
    out.train.batch_prompts = stage.batch_prompts
    out.train.out_dir = stage.out_dir
    return out


def run_pwsd(cfg: Config, init: str | Path, progress: bool = True,
             overwrite: bool = False) -> dict[str, Any]:
    """The PWSD stage from the SFT model `init`; returns the trainer's summary."""
    if cfg.model.modality != "image_translation":
        raise ValueError(f"sft.pwsd needs model.modality image_translation (the privileged "
                         f"teacher prompt), got {cfg.model.modality!r}")
    stage = pwsd_config(cfg, init)
    summary = train(stage, progress=progress, overwrite=overwrite)
    if summary:                  # the main process: the trainer's report, titled for PWSD
        run_dir = Path(stage.train.out_dir)
        late = " (preempted)" if "preempted" in summary else ""
        write_report(run_dir, summary, title=f"PWSD stage {run_dir.name}{late}")
    return summary


def sft(cfg: Config, progress: bool = True, overwrite: bool = False,
        callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train `cfg.model.path` on the reference completions of `cfg.data.train` (then PWSD, if
    `sft.pwsd.steps` > 0). `overwrite` lets it replace an earlier run in its out dirs; `callbacks`
    (the Python API's) get `on_log(step, metrics)` for each SFT metrics row (`RunLogger`)."""
    if cfg.sft.privileged_fraction and cfg.model.modality != "image_translation":
        raise ValueError(f"sft.privileged_fraction needs model.modality image_translation, "
                         f"got {cfg.model.modality!r}")
    check_model_path(cfg.sft.init or cfg.model.path)      # before the out dir is touched
    cfg = resolve_model_defaults(cfg, cfg.sft.init or cfg.model.path)
    d = start_processes(cfg, cfg.sft.batch_size, "sft.batch_size")
    seed_everything(cfg.train.seed)
    out_dir = Path(cfg.sft.out_dir)
    lock = claim_run_dir(d, out_dir, cfg, overwrite=overwrite)
    try:
        summary = _sft(cfg, d, out_dir, progress, callbacks)
    finally:
        if lock is not None:
            lock.release()
    if cfg.sft.pwsd.steps > 0:
        summary["pwsd"] = run_pwsd(cfg, out_dir / "final", progress, overwrite)
    return summary if d.main else {}


def _sft(cfg: Config, d, out_dir: Path, progress: bool,
         callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    from tqdm.auto import tqdm

    if d.main:
        save_config(cfg, out_dir / "config.yaml")
    data, eval_data, report, runner = _sft_data(cfg, d, out_dir)
    policy = load_policy(cfg, d, init=cfg.sft.init or None)
    adapter = policy.adapter
    engine = with_tools(make_engine("hf", policy), policy, cfg.rollout)   # eval calls the tools
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.sft.lr,
                            weight_decay=cfg.optim.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(cfg.sft.warmup_steps, cfg.sft.steps, cfg.optim.min_lr_ratio))
    logger = RunLogger(out_dir, enabled=d.main, report_to=cfg.train.report_to, config=to_dict(cfg),
                       callbacks=callbacks)
    sampler = PromptSampler(len(data), cfg.train.seed)

    def run_eval(step: int) -> dict[str, float]:
        result, records = evaluate_ranks(
            d, policy, engine, eval_data, max_new_tokens=cfg.rollout.max_new_tokens,
            batch_size=cfg.train.eval_batch, prompting=Prompting.of(cfg).plain(),
            reward=build_combined(cfg.eval_rewards or cfg.rewards) if cfg.train.eval_reward else None)
        if d.main:
            write_records(out_dir / "eval" / f"step-{step}.jsonl", records)
        return {f"eval/{k}": v for k, v in result.items()}

    summary: dict[str, Any] = {"steps": cfg.sft.steps, "model": cfg.sft.init or cfg.model.path,
                               "train_rows": len(data), "world_size": d.world,
                               "strategy": d.strategy}
    if eval_data:
        first = run_eval(0)
        logger.log(0, first)
        if d.main:
            summary["accuracy_start"] = first["eval/accuracy"]
            if "eval/reward" in first:
                summary["reward_start"] = first["eval/reward"]
    eos = policy.eos_ids[0]
    bar = tqdm(range(1, cfg.sft.steps + 1), desc="sft", disable=not (progress and d.main))
    t_start = time.perf_counter()
    view_rng = random.Random(f"sft-views-{cfg.train.seed}")
    for step in bar:
        batch = [data[i] for i in sampler.next(cfg.sft.batch_size)]
        if cfg.sft.privileged_fraction:
            batch = privileged_rows(adapter, batch, cfg.sft.privileged_fraction, view_rng)
        share = batch[d.rank * len(batch) // d.world:(d.rank + 1) * len(batch) // d.world]
        metrics = _sft_step(cfg, d, policy, opt, sched, share, runner, eos)
        loss_sum = metrics["sft/loss"]
        if step == cfg.sft.steps and eval_data:
            metrics.update(run_eval(step))
        logger.log(step, metrics)
        bar.set_postfix(loss=f"{loss_sum:.3f}")
    logger.close()
    summary["seconds"] = time.perf_counter() - t_start
    if eval_data and d.main:
        summary["accuracy_end"] = metrics["eval/accuracy"]
        if "eval/reward" in metrics:
            summary["reward_end"] = metrics["eval/reward"]
    if report.skipped:
        summary["skipped_rows"] = len(report.skipped)
    # final/ first, checked for space and renamed in whole: summary.json never claims an
    # unsaved model, and a full disk leaves no half-written final/ for GRPO to start from
    save_final(out_dir, policy, d, note=" mmrlvr sft keeps no checkpoints: rerun it once there "
                                        "is room.")
    if d.main:                 # report.md, plots/ and summary.json, as a GRPO run writes them
        write_report(out_dir, summary, title=f"SFT run {out_dir.name}", panels=SFT_PANELS,
                     xlabel="SFT step")
    d.barrier()
    return summary


def _sft_data(cfg: Config, d, out_dir: Path) -> tuple[Sequence[Any], Sequence[Any], LoadReport, Any]:
    """The train rows (every one's target checked now: every row of a loaded split, 256 of a
    lazy one), the first eval set, the load report (written) and the tool runner or None."""
    report = LoadReport()
    budget = prompt_budget(cfg, cfg.sft.init or None)   # prompts over the context: bad rows
    data = load_split(cfg.data, "train", report, budget)
    if d.main:
        report.write(out_dir)                  # skipped_rows.jsonl: file, row, id, reason
    runner = tool_runner(cfg.rollout)      # rollout.tools: the rows' gold trajectories (sft_tools)
    for i in range(0, len(data), max(1, len(data) // 256)):
        sft_target(data[i]) if runner is None else gold_turns(data[i])
    eval_data = (load_eval_sets(cfg.data, budget) or [("eval", [])])[0][1]  # SFT: the first set
    return data, eval_data, report, runner


def _sft_step(cfg: Config, d, policy, opt, sched, share: list, runner, eos: int) -> dict[str, float]:
    """One optimiser step of token-mean NLL on this rank's rows `share` (all ranks' tokens in
    the mean); its loss, gradient norm and learning rate."""
    prompts = Prompting.of(cfg).plain().encode(policy, share)      # SFT: questions as written
    if runner is None:
        ids, mask = encode_targets(policy.tokenizer, [sft_target(ex) for ex in share], eos,
                                   policy.pad_id)
        train_mask = mask
    else:                  # tool turns attend but get no loss (train_mask 0 there)
        prompts, ids, mask, train_mask = trajectory_targets(policy, share, prompts, runner)
    total_tokens = d.all_sum(float(train_mask.sum()))
    opt.zero_grad(set_to_none=True)
    loss_sum = 0.0
    mb = cfg.train.micro_batch
    starts = range(0, len(share), mb)
    for start in starts:
        rows = list(range(start, min(start + mb, len(share))))
        with sync_grads(d, policy, start == starts[-1]):
            inputs, _ = select(prompts, rows)
            logp, _ = policy.completion_logprobs(inputs, ids[rows], mask[rows])      # [n, C]
            m = train_mask[rows].to(logp.device).float()
            loss = -(logp * m).sum() / total_tokens                         # token-mean NLL
            (loss * d.world).backward()      # DDP/FSDP2 average over ranks: sum instead
        loss_sum += float(loss.detach())
    loss_sum = d.all_sum(loss_sum)
    grad_norm = clip_grad_norm(policy.trainable_parameters(),
                               cfg.optim.max_grad_norm or float("inf"))
    opt.step()
    sched.step()
    return {"sft/loss": loss_sum, "optim/grad_norm": grad_norm, "optim/lr": sched.get_last_lr()[0]}
