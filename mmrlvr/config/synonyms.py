"""Other trainers' names for mmrlvr's config keys, so that an unknown key says which key to use.

People arrive with a TRL `GRPOConfig` (and the `transformers.TrainingArguments` under it) or an
EasyR1 `config.yaml` in mind. `suggest` turns an unknown key into the one mmrlvr key meant, in
this order: a name of the table below (anywhere in the config), a key mmrlvr has in another
section (`temperature` at the top level), a near spelling in the same section (`optim.lrr`), a
near spelling of a synonym (`num_generation`). Names checked against TRL's `grpo_config.py` and
EasyR1's `verl/trainer/config.py`, `verl/workers/actor/config.py` and `examples/config.yaml`.

EasyR1's nested sections (`worker: rollout: n: 5`) are answered key by key in `easyr1.py`.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing

_PER_DEVICE = ("TRL counts completions per device per step; mmrlvr counts prompts per step, each "
               "sampled rollout.group_size times (batch_prompts = per_device_train_batch_size x "
               "processes x gradient_accumulation_steps / num_generations)")
_ONE_UPDATE = ("mmrlvr makes one optimiser update per step over all of the step's rollouts "
               "(algo.ppo_epochs passes), accumulating gradients over micro-batches of "
               "train.micro_batch sequences, so it has no gradient_accumulation_steps")
_STEPS = "mmrlvr counts steps, not epochs: steps = epochs x rows / train.batch_prompts"

SYNONYMS: dict[str, tuple[str, str]] = {
    # their name: (mmrlvr key, what differs; empty when nothing does)
    # the model
    "model_name_or_path": ("model.path", ""),
    "model_path": ("model.path", ""),
    "model_id": ("model.path", ""),
    "torch_dtype": ("model.dtype", "auto, float32 or bfloat16 (compute only; weights stay fp32)"),
    "bf16": ("model.dtype", "model.dtype: bfloat16 (compute only; weights stay fp32)"),
    "enable_gradient_checkpointing": ("model.gradient_checkpointing", ""),
    "freeze_vision_tower": ("model.freeze_vision", ""),
    "use_peft": ("model.lora.r", "a LoRA rank above 0 turns LoRA on"),
    "lora_r": ("model.lora.r", ""),
    "lora_rank": ("model.lora.r", ""),
    "rank": ("model.lora.r", ""),
    "lora_alpha": ("model.lora.alpha", ""),
    "lora_dropout": ("model.lora.dropout", ""),
    "lora_target_modules": ("model.lora.target_modules", ""),
    # data
    "dataset_name": ("data.train", ""),
    "train_files": ("data.train", ""),
    "train_dataset": ("data.train", ""),
    "val_files": ("data.eval", ""),
    "eval_dataset": ("data.eval", ""),
    "test_files": ("data.eval", ""),
    "prompt_key": ("data.columns", "data.columns: {prompt: <your column>}"),
    "answer_key": ("data.columns", "data.columns: {answer: <your column>}"),
    "image_key": ("data.columns", "data.columns: {images: <your column>}"),
    # sampling
    "num_generations": ("rollout.group_size", ""),
    "n": ("rollout.group_size", ""),
    "max_completion_length": ("rollout.max_new_tokens", ""),
    "max_response_length": ("rollout.max_new_tokens", ""),
    "response_length": ("rollout.max_new_tokens", ""),
    "max_new_tokens": ("rollout.max_new_tokens", ""),
    "max_tokens": ("rollout.max_new_tokens", ""),
    "temperature": ("rollout.temperature", ""),
    "use_vllm": ("rollout.backend", "rollout.backend: vllm"),
    "gpu_memory_utilization": ("rollout.vllm_gpu_memory_utilization", ""),
    # the algorithm
    "beta": ("algo.beta", ""),
    "kl_coef": ("algo.beta", ""),
    "kl_penalty": ("algo.kl_estimator", "EasyR1's low_var_kl is k3, kl is k1"),
    "adv_estimator": ("algo.advantage", ""),
    "scale_rewards": ("algo.advantage", "scale_rewards: false is advantage: drgrpo"),
    "epsilon": ("algo.clip_low", ""),
    "clip_ratio_low": ("algo.clip_low", ""),
    "epsilon_high": ("algo.clip_high", ""),
    "clip_ratio_high": ("algo.clip_high", ""),
    "loss_type": ("algo.loss_agg", "TRL's dapo and bnpo are token, grpo is seq, dr_grpo is "
                                   "seq-sum-norm"),
    "loss_avg_mode": ("algo.loss_agg", ""),
    "num_iterations": ("algo.ppo_epochs", ""),
    "ppo_epochs": ("algo.ppo_epochs", ""),
    # rewards
    "reward_funcs": ("rewards", "a list of {name, weight}; name may be path/file.py:function"),
    "reward_function": ("rewards", "a list of {name, weight}; name may be path/file.py:function"),
    "score_function": ("rewards", "a list of {name, weight}; name may be path/file.py:function"),
    "reward_weights": ("rewards", "each entry of `rewards` carries its own weight"),
    # the optimiser
    "learning_rate": ("optim.lr", ""),
    "lr": ("optim.lr", ""),
    "adam_beta1": ("optim.betas", "optim.betas: [beta1, beta2]"),
    "adam_beta2": ("optim.betas", "optim.betas: [beta1, beta2]"),
    "lr_scheduler_type": ("optim.schedule", "cosine or constant"),
    "lr_warmup_steps": ("optim.warmup_steps", ""),
    "warmup_ratio": ("optim.warmup_steps", "a number of steps: warmup_ratio x train.steps"),
    "lr_warmup_ratio": ("optim.warmup_steps", "a number of steps: lr_warmup_ratio x train.steps"),
    "warmup_steps": ("optim.warmup_steps", ""),
    "max_grad_norm": ("optim.max_grad_norm", ""),
    # the loop
    "max_steps": ("train.steps", ""),
    "total_training_steps": ("train.steps", ""),
    "num_train_epochs": ("train.steps", _STEPS),
    "total_episodes": ("train.steps", _STEPS),
    "per_device_train_batch_size": ("train.batch_prompts", _PER_DEVICE),
    "rollout_batch_size": ("train.batch_prompts", ""),
    "train_batch_size": ("train.batch_prompts", ""),
    "batch_size": ("train.batch_prompts", ""),
    "global_batch_size": ("train.batch_prompts", _ONE_UPDATE),
    "gradient_accumulation_steps": ("train.micro_batch", _ONE_UPDATE),
    "micro_batch_size_per_device_for_update": ("train.micro_batch", ""),
    "micro_batch_size_per_device_for_experience": ("train.micro_batch", ""),
    "output_dir": ("train.out_dir", ""),
    "save_checkpoint_path": ("train.out_dir", ""),
    "run_name": ("train.out_dir", "the run dir names the run"),
    "experiment_name": ("train.out_dir", "the run dir names the run"),
    "seed": ("train.seed", ""),
    "save_steps": ("train.save_every", ""),
    "save_freq": ("train.save_every", ""),
    "save_total_limit": ("train.keep_checkpoints", ""),
    "save_limit": ("train.keep_checkpoints", ""),
    "eval_steps": ("train.eval_every", ""),
    "val_freq": ("train.eval_every", ""),
    "report_to": ("train.report_to", ""),
    "logger": ("train.report_to", "a list of tensorboard, wandb, mlflow, trackio"),
}
"""TRL / transformers / EasyR1 name -> (mmrlvr key, what differs)."""

VALUE_SYNONYMS: dict[str, dict[str, tuple[str, str]]] = {
    "algo.loss_agg": {"dapo": ("token", "TRL's loss_type"), "bnpo": ("token", "TRL's loss_type"),
                      "grpo": ("seq", "TRL's loss_type"),
                      "dr_grpo": ("seq-sum-norm", "TRL's loss_type")},
    "algo.kl_estimator": {"low_var_kl": ("k3", "EasyR1's kl_penalty"),
                          "kl": ("k1", "EasyR1's kl_penalty")},
    "algo.advantage": {"dr_grpo": ("drgrpo", "the Dr. GRPO estimator"),
                       "reinforce_plus_plus": ("reinforce_pp", "EasyR1's adv_estimator")},
}
"""Other trainers' values of a choice key -> (mmrlvr value, whose)."""


def leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of the config class `cls` and of its sections (`model.lora` as well as
    `model.lora.r`), in declaration order."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.append(f"{prefix}{f.name}")
        if dataclasses.is_dataclass(hints[f.name]):
            out += leaf_keys(hints[f.name], f"{prefix}{f.name}.")
    return out


def _normal(key: str) -> str:
    return str(key).strip().lower().replace("-", "_")


def suggest(prefix: str, key: str, names: set[str], leaves: list[str]) -> tuple[str | None, bool]:
    """(the hint to append, whether it names exactly one key) for the unknown `key` of section
    `prefix` (`""` or `"optim."`), whose known names are `names`; `leaves`: every dotted key."""
    name = _normal(key)
    if name in SYNONYMS and name not in names:
        target, note = SYNONYMS[name]
        return f" (did you mean '{target}'?{' ' + note if note else ''})", True
    elsewhere = [leaf for leaf in leaves if leaf.rsplit(".", 1)[-1] == name
                 and leaf != f"{prefix}{name}"]
    if elsewhere:       # the first is the GRPO run's (train.steps before sft.steps)
        return f" (did you mean '{elsewhere[0]}'?)", True
    near = difflib.get_close_matches(str(key), names, n=1)
    if near:
        return f" (did you mean '{prefix}{near[0]}'?)", False
    near = difflib.get_close_matches(name, list(SYNONYMS), n=1, cutoff=0.8)
    if near:
        target, _ = SYNONYMS[near[0]]
        return f" (did you mean '{target}'? {near[0]} is its name elsewhere)", False
    return None, False


def value_hint(key: str, value: object) -> str:
    """For a choice key given another trainer's value: what mmrlvr calls it (else '')."""
    known = VALUE_SYNONYMS.get(key, {})
    if isinstance(value, str) and _normal(value) in known:
        ours, whose = known[_normal(value)]
        return f" ({whose} {value!r} is {ours!r} here)"
    return ""
