"""TRL's `GRPOConfig`, so a TRL script's config ports with its own names:

    args = GRPOConfig(output_dir="runs/x", learning_rate=1e-5, per_device_train_batch_size=8,
                      num_generations=8, max_completion_length=256, max_steps=200, beta=0.0)
    GRPOTrainer(model=..., reward_funcs=[...], args=args, train_dataset=ds).train()

Each TRL name given becomes mmrlvr config keys (`MAPPED`), and the result is checked exactly as
`mmrlvr train` checks a config file (a value out of range is refused naming both names). A name
mmrlvr cannot honour is an error that says what to use instead (`INSTEAD`, `FIXED`); an unknown
name is an error too. Nothing is ignored. Names not given keep mmrlvr's defaults, not TRL's
(docs/api.md lists where they differ). Three differ in kind:

  * `per_device_train_batch_size` (P) counts completions per forward on each process, as in TRL:
    it is `train.micro_batch`, and a step trains P x processes x gradient_accumulation_steps
    completions, i.e. that / num_generations prompts (`train.batch_prompts`), in one update;
  * `num_train_epochs` becomes `train.steps` = ceil(epochs x rows / batch_prompts), from the
    training set's length (`max_steps` > 0 wins, as in TRL);
  * `logging_steps` and `reward_weights` are the trainer's (callbacks' `on_log` every N steps;
    the rewards' weights): metrics.jsonl and the trackers still get every step.
"""
from __future__ import annotations

import difflib
import json
import math
import os
from typing import Any, Sequence

from mmrlvr.config import Config, ConfigError, load_config
from mmrlvr.config.synonyms import SYNONYMS, VALUE_SYNONYMS

__all__ = ["GRPOConfig"]

MAPPED: dict[str, str] = {
    # TRL / transformers name: the mmrlvr key it sets as it is
    "output_dir": "train.out_dir",
    "learning_rate": "optim.lr",
    "num_generations": "rollout.group_size",
    "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "beta": "algo.beta",
    "epsilon_high": "algo.clip_high",
    "num_iterations": "algo.ppo_epochs",
    "mask_truncated_completions": "algo.mask_truncated",
    "max_grad_norm": "optim.max_grad_norm",
    "weight_decay": "optim.weight_decay",
    "seed": "train.seed",
    "save_steps": "train.save_every",
    "save_total_limit": "train.keep_checkpoints",
    "eval_steps": "train.eval_every",
    "per_device_eval_batch_size": "train.eval_batch",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "vllm_gpu_memory_utilization": "rollout.vllm_gpu_memory_utilization",
    "router_aux_loss_coef": "algo.router_aux_coef",
}
"""TRL names that set one mmrlvr key to the same value."""

CONVERTED = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
             "num_train_epochs", "epsilon", "warmup_steps", "warmup_ratio", "lr_scheduler_type", "top_k",
             "loss_type", "scale_rewards", "importance_sampling_level", "bf16", "use_vllm", "use_cpu", "report_to", "adam_beta1", "adam_beta2", "eval_strategy")
"""TRL names whose value is translated (`_converted`)."""

TRAINER = ("logging_steps", "reward_weights")
"""TRL names the trainer applies (not config keys)."""

FIXED: dict[str, tuple[tuple[Any, ...], str]] = {
    # name: (the values that describe what mmrlvr does anyway, what to do for another)
    "remove_unused_columns": ((False,), "mmrlvr passes every dataset column to the rewards"),
    "shuffle_dataset": ((True,), "mmrlvr draws prompts in seeded permutations (train.sampler)"),
    "save_strategy": (("steps",), "mmrlvr checkpoints every save_steps and at the end (what a "
                                  "resume needs); leave it out or set save_steps"),
    "logging_strategy": (("steps",), "mmrlvr logs every step; logging_steps sets the callbacks'"),
    "eval_on_start": ((True,), "mmrlvr evaluates at step 0 wherever eval data is given; pass no "
                               "eval_dataset to skip eval"),
    "vllm_mode": (("colocate",), "mmrlvr runs vLLM inside the training processes "
                                 "(use_vllm=True, i.e. rollout.backend vllm)"),
    "multi_objective_aggregation": (("sum_then_normalize",), "mmrlvr sums the weighted rewards, "
                                                             "then normalises the sum per group"),
    "optim": (("adamw_torch", "adamw_torch_fused"), "mmrlvr trains with torch's AdamW"),
    "min_p": ((None, 0, 0.0), "mmrlvr samples with temperature, top_p and top_k only"),
    "repetition_penalty": ((1, 1.0), "mmrlvr samples with temperature, top_p and top_k only"),
    "fp16": ((False,), "mmrlvr has no fp16: bf16=True computes in bfloat16 (model.dtype)"),
}
"""TRL names accepted only at the value that is mmrlvr's behaviour."""

_ONE_UPDATE = ("mmrlvr makes one update per step over all of its rollouts; set "
               "per_device_train_batch_size and gradient_accumulation_steps")
_HUB = "mmrlvr does not upload: push RUN/final with huggingface_hub's upload_folder"
_NOT_HERE = "not implemented in mmrlvr (docs/api.md lists the TRL names it takes)"
INSTEAD: dict[str, str] = {
    "generation_batch_size": _ONE_UPDATE,
    "steps_per_generation": _ONE_UPDATE,
    "push_to_hub": _HUB, "hub_model_id": _HUB, "hub_strategy": _HUB, "hub_token": _HUB,
    "hub_private_repo": _HUB,
    "logging_dir": "TensorBoard events and metrics.jsonl go to the run dir (output_dir)",
    "run_name": "the run dir names the run: set output_dir",
    "max_prompt_length": "overrides=['data.max_prompt_tokens=N'] (longer rows are bad rows, not "
                         "truncated)",
    "num_generations_eval": "mmrlvr evaluates greedily; overrides=['train.eval_samples=K'] adds "
                            "K sampled completions per prompt for pass@k",
    "model_init_kwargs": "overrides=['model.dtype=...', 'model.attn_implementation=...'], or "
                         "pass a loaded model as model=",
    "disable_dropout": "mmrlvr trains with the dropout of the model's config.json; set it there",
    "lr_scheduler_kwargs": "overrides=['optim.min_lr_ratio=R'] (the cosine floor)",
    "log_completions": "each eval's completions are in RUN/eval/step-N.jsonl (mmrlvr demo --run)",
    "num_completions_to_print": "each eval's completions are in RUN/eval/step-N.jsonl",
    "sync_ref_model": "mmrlvr's reference is the frozen starting model (beta > 0)",
    "ref_model_sync_steps": "mmrlvr's reference is the frozen starting model (beta > 0)",
    "ref_model_mixup_alpha": "mmrlvr's reference is the frozen starting model (beta > 0)",
    "vllm_importance_sampling_correction": "overrides=['algo.rollout_correction=tis'] (or mis) "
                                           "with algo.rollout_correction_cap",
    "vllm_importance_sampling_cap": "overrides=['algo.rollout_correction_cap=C']",
    "max_tool_calling_iterations": "overrides=['rollout.max_turns=N'] with rollout.tools",
    "deepspeed": "launch with torchrun and set train.strategy (ddp or fsdp2) in overrides",
    "fsdp": "launch with torchrun and overrides=['train.strategy=fsdp2']",
    "torch_compile": "overrides=['rollout.decode=compiled'] (the hf engine's generate)",
    "resume_from_checkpoint": "trainer.train(resume_from_checkpoint=True) or "
                              "GRPOTrainer.resume(output_dir)",
    "dataloader_num_workers": "mmrlvr encodes each step's prompts itself (no DataLoader)",
    **{name: _NOT_HERE for name in (
        "delta", "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos",
        "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "top_entropy_quantile",
        "entropy_coef", "use_liger_kernel", "use_liger_loss", "cache_implementation",
        "generation_kwargs", "chat_template_kwargs", "use_transformers_paged",
        "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
        "vllm_group_port", "vllm_enable_sleep_mode", "vllm_model_impl", "vllm_max_model_length",
        "vllm_tensor_parallel_size", "vllm_structured_outputs_regex",
        "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "off_policy_mask_threshold",
        "use_bias_correction_kl", "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max",
        "entropy_coef_delta", "entropy_target", "log_multimodal", "log_unique_prompts",
        "log_completions_hub_repo", "cast_lm_head_to_fp32", "ds3_gather_for_generation",
        "pad_to_multiple_of", "trust_remote_code", "use_transformers_continuous_batching",
        "transformers_continuous_batching_config")},
}
"""TRL names mmrlvr does not take, and what to do instead."""

SCHEDULES = {"cosine": ("cosine", 0.0), "constant": ("constant", None),
             "constant_with_warmup": ("constant", None)}
"""TRL's lr_scheduler_type -> (optim.schedule, optim.min_lr_ratio: TRL's cosine decays to 0)."""
SCALE_REWARDS = {True: "grpo", "group": "grpo", False: "drgrpo", "none": "drgrpo",
                 "batch": "reinforce_pp"}
"""TRL's scale_rewards -> algo.advantage (each subtracts the group mean)."""
PER_DEVICE, GENERATIONS = 8, 8
"""TRL's defaults, used where per_device_train_batch_size or num_generations is not given."""


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _batch(given: dict[str, Any]) -> dict[str, Any]:
    """per_device_train_batch_size x processes x gradient_accumulation_steps completions a step."""
    if "per_device_train_batch_size" not in given and "gradient_accumulation_steps" not in given:
        return {}
    per, acc = given.get("per_device_train_batch_size", PER_DEVICE), \
        given.get("gradient_accumulation_steps", 1)
    group, world = given.get("num_generations", GENERATIONS), _world()
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (per, acc, group)):
        raise ConfigError(f"per_device_train_batch_size ({per!r}), gradient_accumulation_steps "
                          f"({acc!r}) and num_generations ({group!r}) must be whole numbers >= 1")
    if per * world * acc % group:
        raise ConfigError(f"per_device_train_batch_size x processes x gradient_accumulation_steps "
                          f"({per} x {world} x {acc} = {per * world * acc} completions a step) "
                          f"must be a multiple of num_generations ({group}), as TRL requires")
    return {"train.micro_batch": per, "train.batch_prompts": per * world * acc // group}


def _choice(name: str, value: Any, table: dict[Any, Any]) -> Any:
    key = value.lower() if isinstance(value, str) else value
    if not isinstance(value, (bool, str)) or key not in table:
        raise ConfigError(f"{name}={value!r} has no mmrlvr form; it takes "
                          f"{', '.join(repr(k) for k in table)}")
    return table[key]


def _converted(name: str, value: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The mmrlvr keys of one CONVERTED name (steps and ratios that need the run's length are
    the trainer's: `GRPOConfig.to_config`)."""
    if name == "max_steps":
        return {"train.steps": value} if not (isinstance(value, int) and value <= 0) else {}
    if name in ("num_train_epochs", "warmup_ratio", "eval_strategy"):
        if name == "eval_strategy":
            _choice(name, value, {"steps": 1, "no": 1})
        return {}
    if name == "epsilon":          # TRL: epsilon_high is epsilon unless given
        return {"algo.clip_low": value, **({} if "epsilon_high" in given else
                                           {"algo.clip_high": value})}
    if name == "warmup_steps":
        return {} if isinstance(value, float) and 0 < value < 1 else {"optim.warmup_steps": value}
    if name == "lr_scheduler_type":
        schedule, floor = _choice(name, value, SCHEDULES)
        return {"optim.schedule": schedule, **({"optim.min_lr_ratio": floor} if floor is not None
                                               else {})}
    if name == "top_k":
        return {"rollout.top_k": 0 if value is None else value}
    if name == "loss_type":
        ours = VALUE_SYNONYMS["algo.loss_agg"]
        return {"algo.loss_agg": _choice(name, value, {k: v[0] for k, v in ours.items()})}
    if name == "scale_rewards":
        return {"algo.advantage": _choice(name, value, SCALE_REWARDS)}
    if name == "importance_sampling_level":
        return {"algo.ratio": _choice(name, value, {"token": "token", "sequence": "sequence"})}
    if name in ("bf16", "use_vllm", "use_cpu"):
        flag = _choice(name, value, {True: True, False: False})
        key, on, off = {"bf16": ("model.dtype", "bfloat16", "float32"),
                        "use_vllm": ("rollout.backend", "vllm", "hf"),
                        "use_cpu": ("train.device", "cpu", "auto")}[name]
        return {key: on if flag else off}
    if name == "report_to":
        names = [value] if isinstance(value, str) else list(value or [])
        return {"train.report_to": [] if names in (["none"], []) else names}
    if name in ("adam_beta1", "adam_beta2"):
        return {"optim.betas": [given.get("adam_beta1", 0.9), given.get("adam_beta2", 0.999)]}
    return _batch(given)        # per_device_train_batch_size, gradient_accumulation_steps


def _unknown(name: str) -> str:
    """What to say of a name GRPOConfig does not have."""
    if name in INSTEAD:
        return f"{name}: {INSTEAD[name]}"
    if name in SYNONYMS:
        key, note = SYNONYMS[name]
        return (f"{name} is not a GRPOConfig field; mmrlvr's key is {key}: pass "
                f"overrides=['{key}=...'] to the trainer{' (' + note + ')' if note else ''}")
    near = difflib.get_close_matches(name, ACCEPTED, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return (f"{name}: mmrlvr's GRPOConfig does not take it; {hint}the TRL names it takes are "
            "listed in docs/api.md, and other settings go in the trainer's "
            "overrides=['key=value'] as mmrlvr keys (`mmrlvr train --help-config`)")


ACCEPTED: tuple[str, ...] = (*MAPPED, *CONVERTED, *TRAINER, *FIXED)
"""Every name GRPOConfig takes."""


def _keys(name: str, value: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The mmrlvr keys of one given name (raises ConfigError for a name or value it refuses)."""
    if name in MAPPED:
        return {MAPPED[name]: value}
    if name in CONVERTED:
        return _converted(name, value, given)
    if name in FIXED:
        values, instead = FIXED[name]
        if not any(value == v and type(value) is type(v) for v in values):
            raise ConfigError(f"{name}={value!r}: {instead}")
        return {}
    if name in TRAINER:
        return {}
    raise ConfigError(_unknown(name))


def _dotted(keys: dict[str, Any]) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in keys.items()]


class GRPOConfig:
    """TRL's `GRPOConfig(...)` with the TRL names mmrlvr honours (module docstring, docs/api.md).
    A refused or unknown name, or a value the config check refuses, is one ConfigError that
    lists them all; each given name is readable and settable as an attribute, as in TRL."""

    def __init__(self, **kwargs: Any):
        object.__setattr__(self, "_given", {})
        self._check(dict(kwargs))
        self._given.update(kwargs)

    def _check(self, given: dict[str, Any]) -> None:
        problems, keys, good = [], {}, {}
        for name, value in given.items():
            try:
                keys.update(_keys(name, value, given))
                good[name] = value
            except ConfigError as err:
                problems.append(str(err))
        problems += self._value_problems(good, keys)
        if problems:
            raise ConfigError("GRPOConfig: " + problems[0] if len(problems) == 1 else
                              f"GRPOConfig: {len(problems)} problems (fix them all, then rerun):\n"
                              + "\n".join(f"  - {p}" for p in problems))

    @staticmethod
    def _value_problems(given: dict[str, Any], keys: dict[str, Any]) -> list[str]:
        """The config check's word on the keys, each problem named by the TRL name behind it."""
        try:
            load_config(None, _dotted(keys))
            return []
        except ConfigError as err:
            whole = str(err)
        problems = []
        for name, value in given.items():     # each alone: which name the refusal is of
            try:
                load_config(None, _dotted(_keys(name, value, given)))
            except ConfigError as err:
                problems.append(f"{name}={value!r} (mmrlvr's {', '.join(_keys(name, value, given))}):"
                                f" {err}")
        return problems or [f"{whole} (the mmrlvr keys of {sorted(given)} together)"]

    def __getattr__(self, name: str) -> Any:
        given = object.__getattribute__(self, "_given")
        if name in given:
            return given[name]
        if name in ACCEPTED:
            raise AttributeError(f"GRPOConfig: {name} was not given, so mmrlvr's default applies "
                                 "(trainer.args holds the resolved config)")
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._check({**self._given, name: value})
        self._given[name] = value

    def __repr__(self) -> str:
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in self._given.items())})"

    def to_dict(self) -> dict[str, Any]:
        """The names given, with their values."""
        return dict(self._given)

    def overrides(self) -> list[str]:
        """The given names as mmrlvr's dotted overrides (those that need no run length)."""
        keys: dict[str, Any] = {}
        for name, value in self._given.items():
            keys.update(_keys(name, value, self._given))
        return _dotted(keys)

    def to_config(self, overrides: Sequence[str] = (), reward_specs: list[dict] | None = None,
                  rows: int | None = None) -> Config:
        """The checked mmrlvr Config: mmrlvr's defaults, these names, then `overrides` (dotted
        keys, which win) and `reward_specs` as `rewards`; `rows` (the training set's length)
        turns num_train_epochs into train.steps."""
        extra = [f"rewards={json.dumps(reward_specs)}"] if reward_specs is not None else []
        mine = self.overrides()
        cfg = load_config(None, [*mine, *overrides, *extra])
        derived = self._derived(cfg, rows)
        return load_config(None, [*mine, *_dotted(derived), *overrides, *extra]) if derived else cfg

    def _derived(self, cfg: Config, rows: int | None) -> dict[str, Any]:
        """train.steps from num_train_epochs, optim.warmup_steps from a warm-up ratio."""
        given, out = self._given, {}
        steps = cfg.train.steps
        if "num_train_epochs" in given and not (given.get("max_steps") or 0) > 0:
            epochs = given["num_train_epochs"]
            if rows is None:
                raise ConfigError(f"GRPOConfig: num_train_epochs={epochs!r} needs the training "
                                  "set's length; pass a train_dataset with one (a Dataset, a "
                                  "list, a DataFrame) or give max_steps")
            steps = out["train.steps"] = max(1, math.ceil(epochs * rows / cfg.train.batch_prompts))
        ratio = given.get("warmup_ratio")
        if ratio is None and isinstance(given.get("warmup_steps"), float) \
                and 0 < given["warmup_steps"] < 1:
            ratio = given["warmup_steps"]        # transformers 5: a float below 1 is a ratio
        if ratio is not None:
            out["optim.warmup_steps"] = math.ceil(ratio * steps)
        return out

    def every(self, steps: int) -> int:
        """The callbacks' logging interval: logging_steps (a fraction of `steps` below 1)."""
        n = self._given.get("logging_steps", 1)
        return max(1, math.ceil(n * steps) if isinstance(n, float) and n < 1 else int(n))

    def refuses_eval(self) -> bool:
        """eval_strategy 'no': TRL would not evaluate (the trainer refuses eval data then)."""
        return str(self._given.get("eval_strategy", "")).lower() == "no"

