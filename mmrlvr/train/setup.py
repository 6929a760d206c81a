"""Everything a run is built from, before its first step: the processes and their strategy,
the run dir, the data, the policy (wrapped for DDP or FSDP2), the reference model, the optimiser
and, on resume, the state of the last complete checkpoint. Every check that needs no model runs
before anything loads.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import modalities
from mmrlvr import objectives as objectives_mod
from mmrlvr.objectives import Objective
from mmrlvr.config import (Config, ConfigError, DataConfig, check_model_path, eval_sets,
                           resolve_model_defaults, save_config, to_dict)
from mmrlvr.core.prompting import Prompting
from mmrlvr.data import Example, LoadReport, load_split
from mmrlvr.algo import shaping
from mmrlvr.algo.shaping import Shaper
from mmrlvr.rollout import make_engine
from mmrlvr.rollout.base import RolloutEngine
from mmrlvr.rollout.multiturn import with_tools
from mmrlvr.train import parallel
from mmrlvr.train.async_rollout import Prefetcher
from mmrlvr.train.lengths import prompt_budget
from mmrlvr.train.checkpoint import latest_checkpoint, load_sharded, load_trainer_state, set_rng_state
from mmrlvr.train.parallel import Dist, LaunchError
from mmrlvr.train.policy import Policy, bf16_update_warning, load_model
from mmrlvr.train.rundir import RunDirError, RunLock, claim
from mmrlvr.train import sampler as sampler_mod
from mmrlvr.train.sampler import Sampler
from mmrlvr.train.options import check_plugins
from rewards import DATA_CHECKS, Combined, build_combined


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


def apply_optim_config(optimizer: torch.optim.Optimizer, scheduler, optim) -> None:
    """The config's lr, betas and weight decay over what a checkpoint restored: a resume with
    `optim.lr=...` runs at that lr (its schedule continuing where it was), never at the saved one
    while config.yaml records the new. Without overrides every value is the saved one."""
    scheduler.base_lrs = [optim.lr for _ in scheduler.base_lrs]
    for group, schedule in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group.update(initial_lr=optim.lr, betas=tuple(optim.betas),
                     weight_decay=optim.weight_decay, lr=optim.lr * schedule(scheduler.last_epoch))
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


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
    engine: RolloutEngine
    """The HF or vLLM engine (`rollout.backend`), wrapped for tools when `rollout.tools` is set."""
    reward: Combined
    objectives: list[tuple[float, Objective]]
    """(weight, objective) per `objectives` entry."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_data: Sequence[Example]
    eval_data: Sequence[Example]
    sampler: Sampler
    """`PromptSampler`, or the sampler `train.sampler` names (`mmrlvr.train.sampler`)."""
    ref_model: torch.nn.Module | None
    run_dir: Path
    report: LoadReport
    shapers: list[Shaper] = field(default_factory=list)
    lock: RunLock | None = None
    """The run dir's lock (main process only)."""
    skips: Skips = field(default_factory=Skips)
    extra_evals: dict[str, Sequence[Example]] = field(default_factory=dict)
    """The `data.eval` sets after the first, by name (`eval_data` is the first)."""
    prefetch: Prefetcher | None = None
    """`train.async_rollouts: one_step_off`: the behaviour copy and the batch in flight
    (`mmrlvr.train.async_rollout.Prefetcher`); None: every step generates its own batch."""
    prompting: Prompting = field(default_factory=Prompting)
    """The system turn, format instruction and prompt transforms (`mmrlvr.core.prompting`)."""


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
        from mmrlvr.train.plan import make_plan

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
        if cfg.rollout.decode == "compiled":
            raise LaunchError("rollout.decode compiled is not supported under train.strategy "
                              "fsdp2 (generate gathers the sharded model per call, which a "
                              "compiled graph would capture); use decode: static or eager, or "
                              "train.strategy ddp")
    return d


def video_options(data: Any) -> dict[str, Any]:
    """The vision adapter's video settings from the `data` section (fps, frames, frame area)."""
    return {"video_fps": data.video_fps, "max_frames": data.max_frames,
            "max_video_pixels": data.max_video_pixels}


def load_policy(cfg: Config, d: Dist, init: str | None = None, ckpt: Path | None = None
                ) -> Policy:
    """The policy on this rank's device, wrapped for the strategy (DDP, FSDP2 or none)."""
    adapter = modalities.get(cfg.model.modality, min_pixels=cfg.model.min_pixels,
                             max_pixels=cfg.model.max_pixels, **video_options(cfg.data))
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
        if cfg.train.async_rollouts == "one_step_off":   # its behaviour copy stays unsharded
            policy.behaviour_template = copy.deepcopy(policy.model)
        parallel.fully_shard_model(policy.base_model(), policy.compute_dtype, _probe(policy),
                                   policy.family)
        policy.sharded = True
    policy.packing = cfg.train.packing   # one logprob path for every forward (train.packing)
    if cfg.algo.router_aux_coef > 0:
        if not policy.family.moe:
            raise ValueError(f"algo.router_aux_coef is {cfg.algo.router_aux_coef:g}, but the "
                             f"{policy.family.name} model has no router (a dense model): set it to 0")
        policy.router_aux = True
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
        parallel.fully_shard_model(ref, policy.compute_dtype, _probe(policy), policy.family)
    return ref


def load_eval_sets(data_cfg: DataConfig, budget=None) -> list[tuple[str, Sequence[Example]]]:
    """Every `data.eval` set as (name, examples), in config order, each loaded with the data
    options (and the prompt `budget`) and cut to `data.eval_limit` rows on its own; [] without
    eval data."""
    return [(name, load_split(dataclasses.replace(data_cfg, eval=path), "eval", budget=budget))
            for name, path in eval_sets(data_cfg.eval)]


def claim_run_dir(d: Dist, run_dir: Path, cfg: Config, resume: bool = False,
                  overwrite: bool = False, force: bool = False) -> RunLock | None:
    """Rank 0 locks the run dir (`mmrlvr.train.rundir`); every rank raises the same error if it may
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
              force: bool = False, trust_checkpoint: bool = False) -> tuple[Run, int]:
    """Load data, policy, optimiser; restore the last complete checkpoint when resuming
    (`trust_checkpoint`: also one whose trainer state is an old-format pickle)."""
    check_plugins(cfg)                   # every plug-in's options: before anything loads
    check_model_path(cfg.model.path)     # before the run dir is touched
    cfg = resolve_model_defaults(cfg)    # pixel bounds, token budget: the model's unless set
    d = start_processes(cfg, cfg.train.batch_prompts)
    seed_everything(cfg.train.seed)      # every rank builds the same weights (LoRA init too)
    run_dir = Path(cfg.train.out_dir)
    lock = claim_run_dir(d, run_dir, cfg, resume, overwrite, force)
    try:
        return _build(cfg, d, run_dir, lock, resume, trust_checkpoint)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def make_sampler(cfg: Config, train_data) -> Sampler:
    """`train.sampler`: the uniform order, or a registered sampler (`mmrlvr.train.sampler`)."""
    return sampler_mod.make_sampler(cfg.train.sampler, train_data, cfg.train.seed,
                                    cfg.train.sampler_options)


def _build(cfg: Config, d: Dist, run_dir: Path, lock, resume: bool,
           trust_checkpoint: bool = False) -> tuple[Run, int]:
    if d.main:
        save_config(cfg, run_dir / "config.yaml")

    prompting = Prompting.of(cfg)           # a transform's unknown name: before anything loads
    report, budget = LoadReport(), prompt_budget(cfg)   # prompts over the context: bad at load
    train_data = load_split(cfg.data, "train", report, budget)
    (_, eval_data), *extra_evals = load_eval_sets(cfg.data, budget) or [("eval", [])]
    if d.main:
        report.write(run_dir)                  # skipped_rows.jsonl: file, row, id, reason

    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {run_dir}/checkpoints")
    state = load_trainer_state(ckpt, trust_checkpoint) if ckpt is not None else None  # before weights
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
    sampler = make_sampler(cfg, train_data)
    start_step = 0
    if state is not None:
        if d.strategy == "fsdp2":
            load_sharded(ckpt, policy.base_model(), optimizer)
        else:
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        apply_optim_config(optimizer, scheduler, cfg.optim)
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
        if "sampler" in state:
            sampler.load_state_dict(state["sampler"])
        start_step = state["step"]
    elif d.world > 1:
        seed_everything(cfg.train.seed + d.rank)   # each rank samples its own rollouts

    engine = make_engine(cfg.rollout.backend, policy, cfg.rollout.branching,
                         cfg.rollout.vllm_gpu_memory_utilization, seed=cfg.train.seed,
                         decode=cfg.rollout.decode)
    engine = with_tools(engine, policy, cfg.rollout)        # multi-turn with rollout.tools
    if state is not None and state.get("branching") and engine.branching is not None:
        saved = state["branching"]
        engine.branching.load_state_dict(saved[d.rank] if len(saved) == d.world else saved[0])
    errors = run_dir / ("reward_errors.jsonl" if d.world == 1 else f"reward_errors.rank{d.rank}.jsonl")
    shapers = shaping.build(cfg.algo.shaping)
    clips = [s.name for s in shapers if s.stage == "clip"]
    if clips and cfg.algo.ppo_epochs == 1 and d.main:
        print(f"warning: algo.shaping {clips[0]!r} only moves clip bounds, and with algo.ppo_epochs 1 "
              "every update is on-policy (ratio 1): no bound is ever reached and it changes nothing. "
              "Set algo.ppo_epochs >= 2 for it to act.", file=sys.stderr)
    if d.main:                              # a reward that checks the rows it will score
        for spec in cfg.rewards:
            if spec.get("name") in DATA_CHECKS:
                DATA_CHECKS.get(spec["name"])(train_data, spec, run_dir)
    run = Run(cfg, d, policy, engine,
              build_combined(cfg.rewards, error_log=errors), objectives, optimizer, scheduler,
              train_data, eval_data, sampler, ref_model, run_dir, report, shapers, lock,
              Skips(), dict(extra_evals), prefetcher(cfg, d, policy), prompting)
    return run, start_step


def prefetcher(cfg: Config, d: Dist, policy: Policy) -> Prefetcher | None:
    """The behaviour copy of `train.async_rollouts: one_step_off`, else None."""
    if cfg.train.async_rollouts != "one_step_off":
        return None
    return Prefetcher(policy, make_engine, cfg.rollout.decode, cfg.rollout.temperature,
                      cfg.train.micro_batch)
