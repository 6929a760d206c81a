"""`GRPOTrainer.evaluate()`: a model dir's held-out figures with the run's eval settings.

What the run's own eval computes (`mmrlvr.train.trainer.run_eval`: greedy accuracy, format rate,
pass@k with `train.eval_samples`, the graded reward with `train.eval_reward`),
for a model dir the run wrote (`final/`, a checkpoint) or any other; keyed as the run logs it.
Under several processes it runs as the run's eval does (`evaluate_ranks`): each rank scores its
share of the rows and the figures are of them all, so they are those of one process on the same
rows (greedy decoding; pass@k samples are drawn on each rank).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import modalities
from mmrlvr.config import Config, ConfigError, resolve_model_defaults
from mmrlvr.core.prompting import Prompting
from mmrlvr.rollout import make_engine
from mmrlvr.train.evaluate import evaluate_ranks
from mmrlvr.train.parallel import Dist, pick_device
from mmrlvr.train.policy import Policy
from mmrlvr.train.setup import load_eval_sets, video_options
from rewards import build_combined


def evaluate_model(cfg: Config, model_dir: str | Path, sets: Any = None,
                   dist: Dist | None = None) -> dict[str, Any]:
    """`model_dir` evaluated on `sets` (a `data.eval` value; default the config's own): the
    first set's figures as `eval/<metric>`, each other set's as `eval/<name>/<metric>`. `dist`:
    this process's place in a launch (every rank must call it; every rank gets the figures)."""
    data_cfg = dataclasses.replace(cfg.data, eval=sets) if sets is not None else cfg.data
    if not data_cfg.eval:
        raise ConfigError("evaluate: no eval data; pass eval_dataset= to the trainer or to "
                          "evaluate(), or set data.eval")
    cfg = resolve_model_defaults(dataclasses.replace(cfg, data=data_cfg), str(model_dir))
    d = dist or Dist(device=pick_device(cfg.train.device))
    adapter = modalities.get(cfg.model.modality, min_pixels=cfg.model.min_pixels,
                             max_pixels=cfg.model.max_pixels, **video_options(cfg.data))
    policy = Policy.load(cfg.model, adapter, d.device, path=str(model_dir))
    engine = make_engine(cfg.rollout.backend, policy, None,
                         cfg.rollout.vllm_gpu_memory_utilization, seed=cfg.train.seed,
                         decode=cfg.rollout.decode)
    reward = build_combined(cfg.eval_rewards or cfg.rewards) if cfg.train.eval_reward else None
    out: dict[str, Any] = {}
    for i, (name, examples) in enumerate(load_eval_sets(cfg.data)):
        result, _ = evaluate_ranks(
            d, policy, engine, list(examples), max_new_tokens=cfg.rollout.max_new_tokens,
            batch_size=cfg.train.eval_batch, samples=cfg.train.eval_samples,
            temperature=cfg.rollout.temperature, prompting=Prompting.of(cfg).plain(),
            reward=reward)     # rank 0's; {} elsewhere
        prefix = "eval/" if i == 0 else f"eval/{name}/"
        out.update({f"{prefix}{k}": v for k, v in result.items()})
    return d.gather(out)[0]                  # rank 0's figures, on every rank
