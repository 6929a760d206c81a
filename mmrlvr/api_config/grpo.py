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

from typing import Any

from mmrlvr.api_config.trl import (COMMON, COMMON_FIXED, COMMON_INSTEAD, NOT_HERE, TRLConfig,
                                   choice, common, whole, world)
from mmrlvr.config import ConfigError
from mmrlvr.config.synonyms import VALUE_SYNONYMS

__all__ = ["GRPOConfig"]

MAPPED: dict[str, str] = {
    # TRL / transformers name: the mmrlvr key it sets as it is
    "output_dir": "train.out_dir",
    **COMMON,
    "num_generations": "rollout.group_size",
    "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "beta": "algo.beta",
    "epsilon_high": "algo.clip_high",
    "num_iterations": "algo.ppo_epochs",
    "mask_truncated_completions": "algo.mask_truncated",
    "save_steps": "train.save_every",
    "save_total_limit": "train.keep_checkpoints",
    "eval_steps": "train.eval_every",
    "vllm_gpu_memory_utilization": "rollout.vllm_gpu_memory_utilization",
    "router_aux_loss_coef": "algo.router_aux_coef",
}
"""TRL names that set one mmrlvr key to the same value."""

CONVERTED = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
             "num_train_epochs", "epsilon", "warmup_steps", "warmup_ratio", "lr_scheduler_type",
             "top_k", "loss_type", "scale_rewards", "importance_sampling_level", "bf16",
             "use_vllm", "use_cpu", "report_to", "adam_beta1", "adam_beta2", "eval_strategy")
"""TRL names whose value is translated (`_converted`)."""

FIXED: dict[str, tuple[tuple[Any, ...], str]] = {
    # name: (the values that describe what mmrlvr does anyway, what to do for another)
    **COMMON_FIXED,
    "shuffle_dataset": ((True,), "mmrlvr draws prompts in seeded permutations (train.sampler)"),
    "save_strategy": (("steps",), "mmrlvr checkpoints every save_steps and at the end (what a "
                                  "resume needs); leave it out or set save_steps"),
    "vllm_mode": (("colocate",), "mmrlvr runs vLLM inside the training processes "
                                 "(use_vllm=True, i.e. rollout.backend vllm)"),
    "multi_objective_aggregation": (("sum_then_normalize",), "mmrlvr sums the weighted rewards, "
                                                             "then normalises the sum per group"),
    "min_p": ((None, 0, 0.0), "mmrlvr samples with temperature, top_p and top_k only"),
    "repetition_penalty": ((1, 1.0), "mmrlvr samples with temperature, top_p and top_k only"),
}
"""TRL names accepted only at the value that is mmrlvr's behaviour."""

_ONE_UPDATE = ("mmrlvr makes one update per step over all of its rollouts; set "
               "per_device_train_batch_size and gradient_accumulation_steps")
INSTEAD: dict[str, str] = {
    **COMMON_INSTEAD,
    "generation_batch_size": _ONE_UPDATE,
    "steps_per_generation": _ONE_UPDATE,
    "max_prompt_length": "overrides=['data.max_prompt_tokens=N'] (longer rows are bad rows, not "
                         "truncated)",
    "num_generations_eval": "mmrlvr evaluates greedily; overrides=['train.eval_samples=K'] adds "
                            "K sampled completions per prompt for pass@k",
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
    "torch_compile": "overrides=['rollout.decode=compiled'] (the hf engine's generate)",
    "resume_from_checkpoint": "trainer.train(resume_from_checkpoint=True) or "
                              "GRPOTrainer.resume(output_dir)",
    **{name: NOT_HERE for name in (
        "delta", "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos",
        "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "top_entropy_quantile",
        "entropy_coef", "use_liger_loss", "cache_implementation",
        "generation_kwargs", "chat_template_kwargs", "use_transformers_paged",
        "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
        "vllm_group_port", "vllm_enable_sleep_mode", "vllm_model_impl", "vllm_max_model_length",
        "vllm_tensor_parallel_size", "vllm_structured_outputs_regex",
        "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "off_policy_mask_threshold",
        "use_bias_correction_kl", "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max",
        "entropy_coef_delta", "entropy_target", "log_multimodal", "log_unique_prompts",
        "log_completions_hub_repo", "cast_lm_head_to_fp32", "ds3_gather_for_generation",
        "trust_remote_code", "use_transformers_continuous_batching",
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


def _batch(given: dict[str, Any]) -> dict[str, Any]:
    """per_device_train_batch_size x processes x gradient_accumulation_steps completions a step."""
    if "per_device_train_batch_size" not in given and "gradient_accumulation_steps" not in given:
        return {}
    per, acc = given.get("per_device_train_batch_size", PER_DEVICE), \
        given.get("gradient_accumulation_steps", 1)
    group, n = given.get("num_generations", GENERATIONS), world()
    whole(per_device_train_batch_size=per, gradient_accumulation_steps=acc, num_generations=group)
    if per * n * acc % group:
        raise ConfigError(f"per_device_train_batch_size x processes x gradient_accumulation_steps "
                          f"({per} x {n} x {acc} = {per * n * acc} completions a step) "
                          f"must be a multiple of num_generations ({group}), as TRL requires")
    return {"train.micro_batch": per, "train.batch_prompts": per * n * acc // group}


class GRPOConfig(TRLConfig):
    """TRL's `GRPOConfig(...)` with the TRL names mmrlvr honours (module docstring, docs/api.md).
    A refused or unknown name, or a value the config check refuses, is one ConfigError that
    lists them all; each given name is readable and settable as an attribute, as in TRL."""

    MAPPED, CONVERTED, FIXED, INSTEAD = MAPPED, CONVERTED, FIXED, INSTEAD
    TRAINER = ("logging_steps", "reward_weights")

    @classmethod
    def converted(cls, name: str, value: Any, given: dict[str, Any]) -> dict[str, Any]:
        """The mmrlvr keys of one CONVERTED name (the run-length names are TRLConfig.length's)."""
        if name == "epsilon":          # TRL: epsilon_high is epsilon unless given
            return {"algo.clip_low": value, **({} if "epsilon_high" in given else
                                               {"algo.clip_high": value})}
        if name == "lr_scheduler_type":
            schedule, floor = choice(name, value, SCHEDULES)
            return {"optim.schedule": schedule, **({"optim.min_lr_ratio": floor}
                                                   if floor is not None else {})}
        if name == "top_k":
            return {"rollout.top_k": 0 if value is None else value}
        if name == "loss_type":
            ours = VALUE_SYNONYMS["algo.loss_agg"]
            return {"algo.loss_agg": choice(name, value, {k: v[0] for k, v in ours.items()})}
        if name == "scale_rewards":
            return {"algo.advantage": choice(name, value, SCALE_REWARDS)}
        if name == "importance_sampling_level":
            return {"algo.ratio": choice(name, value, {"token": "token", "sequence": "sequence"})}
        if name == "use_vllm":
            return {"rollout.backend": "vllm" if choice(name, value, {True: 1, False: 0}) else "hf"}
        if name in ("adam_beta1", "adam_beta2"):
            return {"optim.betas": [given.get("adam_beta1", 0.9), given.get("adam_beta2", 0.999)]}
        if name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            return _batch(given)
        return common(name, value)     # bf16, use_cpu, report_to, eval_strategy
