"""`mmrlvr opd`: on-policy distillation first, then GRPO from the checkpoint the held-out score picks.

Stage 1, OPD, is a run of the GRPO trainer in `opd.out_dir` whose rewards are weighted 0 (scored
and logged, no policy-gradient term) and whose one objective is `opd` (loss.py: the teacher's
per-token reverse KL on the student's samples). Shapers, KL to a reference, branching, dynamic
sampling and one-step-off rollouts are off in it; the student samples `opd.group_size` completions
per prompt at `opd.temperature`.

The switch (`SwitchRule`; docs/opd.md states it):
  - the held-out set is scored at step 0 and every `opd.eval_every` steps (each with a
    checkpoint), and `opd.metric` of those rows is the validation score;
  - the best score so far (step 0 counts) moves only on a gain > `opd.min_delta`;
  - OPD ends at the first eval where the score reaches `opd.threshold` (when set), or after
    `opd.patience` evals in a row without a gain, or at `opd.steps`;
  - GRPO starts from the checkpoint of the best eval (`checkpoints/step-B`; the OPD run keeps
    `patience + 1` checkpoints, which always holds it), or from `model.path` when no OPD step
    beat step 0.
Stage 2 is the config as given (`train.*`, `rewards`, `algo`, ...) with `model.path` set to that
checkpoint, in `train.out_dir`; with `algo.beta` > 0 its reference is that checkpoint too.
`OPD_DIR/switch.json` records every eval's score, the best, why OPD ended and where GRPO began.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrlvr.config import Config, ConfigError
from mmrlvr.methods.opd.loss import ESTIMATORS
from mmrlvr.train.logger import read_metrics


@dataclass
class SwitchRule:
    """When OPD hands over to GRPO, from the validation score of each eval (module docstring)."""

    metric: str = "eval/accuracy"
    patience: int = 2
    min_delta: float = 0.0
    threshold: float | None = None
    run_dir: Path | None = None            # where the step-0 eval row is read from
    evals: list[tuple[int, float]] = field(default_factory=list)
    best: tuple[int, float] | None = None
    since_best: int = 0
    reason: str = ""

    def observe(self, step: int, score: float) -> bool:
        """Take one eval's score; True when OPD should end here."""
        self.evals.append((step, float(score)))
        if self.best is None or score > self.best[1] + self.min_delta:
            self.best, self.since_best = (step, float(score)), 0
        else:
            self.since_best += 1
        if self.threshold is not None and score >= self.threshold:
            self.reason = f"{self.metric} {score:.4f} reached the threshold {self.threshold:g}"
        elif step > 0 and self.since_best >= self.patience:
            self.reason = (f"{self.patience} eval(s) in a row without a gain over the best "
                           f"{self.metric} {self.best[1]:.4f} (step {self.best[0]})")
        return bool(self.reason)

    def __call__(self, step: int, metrics: dict[str, Any]) -> bool:
        """The trainer's `until` hook: adds `opd/reverse_kl`, and at evals `opd/val_score` and
        `opd/best_score`, to the step's metrics; True ends the OPD run after this step."""
        if "objective/opd/reverse_kl" in metrics:
            metrics["opd/reverse_kl"] = metrics["objective/opd/reverse_kl"]
        if not self.evals and self.run_dir is not None:          # the step-0 eval, logged already
            first = [r for r in read_metrics(self.run_dir / "metrics.jsonl") if r.get("step") == 0]
            if first:
                self.observe(0, self._score(first[0], 0))
                if self.reason:                   # step 0 already good enough: end after step 1
                    return True
        if not any(k.startswith("eval/") for k in metrics):
            return False
        ended = self.observe(step, self._score(metrics, step))
        metrics["opd/val_score"] = self.evals[-1][1]
        metrics["opd/best_score"] = self.best[1]
        return ended

    def _score(self, row: dict[str, Any], step: int) -> float:
        if row.get(self.metric) is None:
            have = sorted(k for k in row if k.startswith("eval/"))
            raise ConfigError(f"opd.metric {self.metric!r} is not in the eval row of OPD step "
                              f"{step} (it has {have}); set opd.metric to one of them "
                              "(eval/reward needs train.eval_reward: true)")
        return float(row[self.metric])


def check(cfg: Config) -> None:
    """Every problem of the `opd` section at once, before anything loads."""
    o, problems = cfg.opd, []
    if not o.teacher:
        problems.append("opd.teacher is required: a local model dir with the policy's tokenizer")
    elif not (Path(o.teacher) / "config.json").is_file():
        problems.append(f"opd.teacher {o.teacher!r} is not a model dir (no config.json)")
    if not cfg.data.eval:
        problems.append("data.eval is required: the OPD-to-GRPO switch reads the held-out score")
    for key, low in (("steps", 1), ("eval_every", 1), ("patience", 1), ("max_rows", 1),
                     ("group_size", 2)):
        if getattr(o, key) < low:
            problems.append(f"opd.{key} must be >= {low}, got {getattr(o, key)!r}")
    if o.min_delta < 0:
        problems.append(f"opd.min_delta must be >= 0, got {o.min_delta!r}")
    if o.estimator not in ESTIMATORS:
        problems.append(f"opd.estimator must be one of {ESTIMATORS}, got {o.estimator!r}")
    if not o.temperature > 0:
        problems.append(f"opd.temperature must be > 0, got {o.temperature!r}")
    if o.lr < 0:
        problems.append(f"opd.lr must be >= 0 (0: optim.lr), got {o.lr!r}")
    if Path(o.out_dir).resolve() == Path(cfg.train.out_dir).resolve():
        problems.append(f"opd.out_dir and train.out_dir are both {o.out_dir!r}: each stage is a "
                        "run of its own; give them different dirs")
    if problems:
        raise ConfigError("the opd section has problems:\n  " + "\n  ".join(problems))


def opd_config(cfg: Config) -> Config:
    """The trainer config of the OPD stage (module docstring)."""
    o = cfg.opd
    out = copy.deepcopy(cfg)
    out.rewards = [{**spec, "weight": 0.0} for spec in cfg.rewards]      # logged, no gradient
    out.eval_rewards = cfg.eval_rewards or cfg.rewards                   # eval keeps the weights
    out.objectives = [{"name": "opd", "weight": 1.0, "teacher": o.teacher,
                       "estimator": o.estimator, "max_rows": o.max_rows, "seed": cfg.train.seed}]
    out.algo.shaping, out.algo.beta = [], 0.0
    out.rollout.branching = {"kind": "none"}
    out.rollout.group_size, out.rollout.temperature = o.group_size, o.temperature
    out.optim.lr = o.lr or cfg.optim.lr
    t = out.train
    t.steps, t.eval_every, t.save_every = o.steps, o.eval_every, o.eval_every
    t.keep_checkpoints = o.patience + 1          # the best eval's checkpoint is always among them
    t.batch_prompts = o.batch_prompts or cfg.train.batch_prompts
    t.dynamic_sampling, t.async_rollouts = False, "none"
    t.out_dir = o.out_dir
    return out


def rule_of(cfg: Config) -> SwitchRule:
    o = cfg.opd
    return SwitchRule(o.metric, o.patience, o.min_delta, o.threshold, Path(o.out_dir))


def replay(cfg: Config) -> SwitchRule:
    """The switch decided again from the OPD run's metrics.jsonl (its eval rows in step order):
    what rank 0's rule decided, on every rank, with nothing sent between them."""
    rule = rule_of(cfg)
    rule.run_dir = None
    for row in read_metrics(Path(cfg.opd.out_dir) / "metrics.jsonl"):
        if row.get(rule.metric) is not None and not rule.reason:
            rule.observe(int(row["step"]), float(row[rule.metric]))
    if rule.best is None:
        raise ConfigError(f"the OPD run {cfg.opd.out_dir} logged no {rule.metric!r}: no eval to "
                          "switch on")
    if not rule.reason:
        rule.reason = f"opd.steps ({cfg.opd.steps}) done"
    return rule


def run_opd(cfg: Config, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """The OPD stage; returns (on every rank) the switch that switch.json records, and (on rank
    0) the run's summary."""
    from mmrlvr.train.trainer import train

    check(cfg)
    o = cfg.opd
    summary = train(opd_config(cfg), progress=progress, overwrite=overwrite, until=rule_of(cfg))
    rule = replay(cfg)
    best_step, best_score = rule.best
    start = Path(cfg.model.path) if best_step == 0 else \
        Path(o.out_dir) / "checkpoints" / f"step-{best_step}"
    if not (start / "config.json").is_file():
        raise FileNotFoundError(f"the best OPD eval was at step {best_step}, but {start} holds no "
                                "model (was the OPD run dir changed while it ran?)")
    switch = {"metric": o.metric, "evals": rule.evals, "best_step": best_step,
              "best_score": best_score, "ended_at": rule.evals[-1][0], "reason": rule.reason,
              "grpo_from": str(start)}
    if summary:                                  # rank 0
        (Path(o.out_dir) / "switch.json").write_text(json.dumps(switch, indent=2) + "\n")
        summary["steps"] = max(r["step"] for r in read_metrics(Path(o.out_dir) / "metrics.jsonl"))
    return {"summary": summary, "switch": switch}


def opd_then_grpo(cfg: Config, overwrite: bool = False, progress: bool = True,
                  opd_only: bool = False) -> dict[str, Any]:
    """Both stages (or only OPD); returns `{"opd": ..., "switch": ..., "grpo": ...}` on rank 0
    ({} elsewhere)."""
    from mmrlvr.train.trainer import train

    opd = run_opd(cfg, overwrite, progress)
    out = {"opd": opd["summary"], "switch": opd["switch"]}
    if not opd_only:
        grpo_cfg = copy.deepcopy(cfg)
        grpo_cfg.model.path = opd["switch"]["grpo_from"]
        out["grpo"] = train(grpo_cfg, progress=progress, overwrite=overwrite)
    return out if opd["summary"] else {}
