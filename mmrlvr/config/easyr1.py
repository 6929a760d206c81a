"""EasyR1's config keys, answered one by one with mmrlvr's.

EasyR1's config nests (`worker: rollout: n: 5`, `algorithm:`, `trainer:`, and `data:` keys mmrlvr's
`data` lacks). `easyr1_keys` takes each such key out of a raw config before it is read and answers
it by its full dotted name from `EASYR1` (read from EasyR1's config dataclasses, `data`,
`algorithm`, `trainer` and `worker.{actor,ref,critic,rollout,reward}`, and its
`examples/config.yaml`): mmrlvr's key for it or, where mmrlvr has none, what mmrlvr does
instead. A last line gives the settings that carry over unchanged in mmrlvr's keys, to paste.
"""
from __future__ import annotations

import yaml

from mmrlvr.config.synonyms import _ONE_UPDATE, _STEPS, VALUE_SYNONYMS, _normal

_NO_CRITIC = "GRPO has no critic (no value model, no GAE)"
_NO_OFFLOAD = ("mmrlvr does not offload to CPU; `mmrlvr plan CONFIG` says whether a run fits, and "
               "train.strategy: fsdp2 shards it over the processes")
_FIXED_KL = "mmrlvr's KL coefficient algo.beta is fixed (no adaptive KL controller)"
_PROCESSES = "processes come from the launcher: torchrun / accelerate launch --num_processes N"
_RESUME = "`mmrlvr train --resume RUN_DIR` continues from the run dir's last complete checkpoint"

EASYR1_SECTIONS = ("worker", "algorithm", "trainer")
"""EasyR1's top-level sections that mmrlvr has not (its `data` section is mmrlvr's too)."""

EASYR1: dict[str, tuple[str | None, str]] = {
    # EasyR1's dotted key: (mmrlvr key, or None where mmrlvr has none; what differs, or what to
    # do instead). An empty note: same meaning, same value. A key ending in `.*` covers a section.
    "data.train_files": ("data.train", ""),
    "data.val_files": ("data.eval", ""),
    "data.prompt_key": ("data.columns", "data.columns: {prompt: <your column>}"),
    "data.answer_key": ("data.columns", "data.columns: {answer: <your column>}"),
    "data.image_key": ("data.columns", "data.columns: {images: <your column>}"),
    "data.video_key": ("data.columns", "data.columns: {videos: <your column>}"),
    "data.image_dir": (None, "media paths are read relative to the data file's dir; "
                             "data.allow_outside lets them be absolute or lead outside it"),
    "data.max_prompt_length": ("data.max_prompt_tokens", "longer rows are bad rows (data.on_error)"),
    "data.max_response_length": ("rollout.max_new_tokens", ""),
    "data.rollout_batch_size": ("train.batch_prompts", ""),
    "data.mini_rollout_batch_size": ("train.dynamic_max_draws", "mmrlvr generates each step's "
                                     "prompts at once; dynamic sampling draws train.batch_prompts "
                                     "more at a time"),
    "data.val_batch_size": ("train.eval_batch", ""),
    "data.override_chat_template": (None, "the chat template is the model dir's; edit its "
                                          "chat_template.jinja (or tokenizer_config.json)"),
    "data.shuffle": ("train.sampler", "prompts are always drawn in seeded permutations "
                                      "(train.sampler: uniform)"),
    "data.seed": ("train.seed", ""),
    "data.min_pixels": ("model.min_pixels", ""),
    "data.max_pixels": ("model.max_pixels", ""),
    "data.filter_overlong_prompts": ("data.on_error", "data.on_error: skip drops rows over "
                                     "data.max_prompt_tokens and counts them; raise stops on one"),
    "data.filter_overlong_prompts_workers": (None, "rows are checked in the loading process"),
    "algorithm.gamma": (None, _NO_CRITIC),
    "algorithm.lam": (None, _NO_CRITIC),
    "algorithm.adv_estimator": ("algo.advantage", "grpo, drgrpo, rloo or reinforce_pp"),
    "algorithm.disable_kl": ("algo.beta", "algo.beta: 0 loads no reference model"),
    "algorithm.use_kl_loss": ("algo.beta", "mmrlvr's KL is always a loss term, algo.beta x KL, "
                                           "never a reward penalty"),
    "algorithm.kl_penalty": ("algo.kl_estimator", "EasyR1's low_var_kl is k3, kl is k1"),
    "algorithm.kl_coef": ("algo.beta", ""),
    "algorithm.kl_type": (None, _FIXED_KL),
    "algorithm.kl_horizon": (None, _FIXED_KL),
    "algorithm.kl_target": (None, _FIXED_KL),
    "algorithm.online_filtering": ("train.dynamic_sampling", ""),
    "algorithm.filter_key": ("train.dynamic_sampling", "dynamic sampling keeps the groups whose "
                                                       "total reward has any spread"),
    "algorithm.filter_low": ("train.dynamic_sampling", "dynamic sampling keeps the groups whose "
                                                       "total reward has any spread"),
    "algorithm.filter_high": ("train.dynamic_sampling", "dynamic sampling keeps the groups whose "
                                                        "total reward has any spread"),
    "worker.hybrid_engine": ("rollout.backend", "rollouts and training share each process "
                                                "(vLLM colocated) whatever the backend"),
    "worker.actor.strategy": ("train.strategy", "auto, ddp or fsdp2 (EasyR1's fsdp)"),
    "worker.actor.global_batch_size": ("train.batch_prompts", _ONE_UPDATE),
    "worker.actor.micro_batch_size_per_device_for_update": (
        "train.micro_batch", "counted in sequences, for the update and the logprob passes alike"),
    "worker.actor.micro_batch_size_per_device_for_experience": (
        "train.micro_batch", "counted in sequences, for the update and the logprob passes alike"),
    "worker.actor.max_grad_norm": ("optim.max_grad_norm", ""),
    "worker.actor.clip_ratio_low": ("algo.clip_low", ""),
    "worker.actor.clip_ratio_high": ("algo.clip_high", ""),
    "worker.actor.clip_ratio_dual": (None, "mmrlvr has no dual-clip bound"),
    "worker.actor.loss_avg_mode": ("algo.loss_agg", "token or seq, as in EasyR1"),
    "worker.actor.loss_type": ("algo.ratio", "EasyR1's gspo is algo.ratio: sequence; cispo has "
                                             "no mmrlvr counterpart"),
    "worker.actor.ppo_epochs": ("algo.ppo_epochs", ""),
    "worker.actor.padding_free": ("train.packing", "packs each group's completions after one "
                                                   "copy of its prompt"),
    "worker.actor.dynamic_batching": ("train.length_buckets", "micro-batches of completions of "
                                                              "similar length"),
    "worker.actor.ulysses_size": (None, "mmrlvr has no sequence parallelism; long sequences fit "
                                        "by train.micro_batch and model.gradient_checkpointing"),
    "worker.actor.use_torch_compile": (None, "the training forward is not compiled; "
                                             "rollout.decode: compiled compiles hf decoding"),
    "worker.actor.tau_positive": (None, "mmrlvr has no SAPO soft gate"),
    "worker.actor.tau_negative": (None, "mmrlvr has no SAPO soft gate"),
    "worker.actor.disable_kl": ("algo.beta", "algo.beta: 0 loads no reference model"),
    "worker.actor.use_kl_loss": ("algo.beta", "mmrlvr's KL is always a loss term"),
    "worker.actor.kl_penalty": ("algo.kl_estimator", "EasyR1's low_var_kl is k3, kl is k1"),
    "worker.actor.kl_coef": ("algo.beta", ""),
    "worker.actor.global_batch_size_per_device": ("train.batch_prompts", _ONE_UPDATE),
    "worker.actor.model.model_path": ("model.path", ""),
    "worker.actor.model.tokenizer_path": (None, "the tokenizer and processor load from model.path"),
    "worker.actor.model.override_config": (None, "edit the model dir's config.json"),
    "worker.actor.model.enable_gradient_checkpointing": ("model.gradient_checkpointing", ""),
    "worker.actor.model.trust_remote_code": (None, "mmrlvr loads transformers' own model classes "
                                                   "only, never a model dir's code"),
    "worker.actor.model.freeze_vision_tower": ("model.freeze_vision", ""),
    "worker.actor.model.lora.rank": ("model.lora.r", "a rank above 0 turns LoRA on"),
    "worker.actor.model.lora.alpha": ("model.lora.alpha", ""),
    "worker.actor.model.lora.target_modules": ("model.lora.target_modules", "a list of module "
                                               "names, or [auto] for the model family's"),
    "worker.actor.model.lora.exclude_modules": (None, "LoRA goes on language-model modules only "
                                                      "(model.lora.target_modules)"),
    "worker.actor.optim.lr": ("optim.lr", ""),
    "worker.actor.optim.betas": ("optim.betas", ""),
    "worker.actor.optim.weight_decay": ("optim.weight_decay", ""),
    "worker.actor.optim.strategy": ("model.param_dtype", "EasyR1's adamw_bf16 is "
                                    "model.param_dtype: bfloat16; adamw keeps float32"),
    "worker.actor.optim.lr_warmup_ratio": ("optim.warmup_steps", "a number of steps: "
                                           "lr_warmup_ratio x train.steps"),
    "worker.actor.optim.lr_warmup_steps": ("optim.warmup_steps", ""),
    "worker.actor.optim.min_lr_ratio": ("optim.min_lr_ratio", "the floor of optim.schedule: cosine"),
    "worker.actor.optim.lr_scheduler_type": ("optim.schedule", "cosine or constant"),
    "worker.actor.optim.training_steps": ("train.steps", ""),
    "worker.actor.fsdp.enable_full_shard": ("train.strategy", "train.strategy: fsdp2 shards "
                                                              "parameters, gradients and optimiser"),
    "worker.actor.fsdp.enable_cpu_offload": (None, _NO_OFFLOAD),
    "worker.actor.fsdp.enable_rank0_init": (None, "every process loads the model, then FSDP2 "
                                                  "shards it (train.strategy)"),
    "worker.actor.fsdp.use_orig_params": (None, "FSDP2 (fully_shard) always keeps the original "
                                                "parameters"),
    "worker.actor.fsdp.torch_dtype": ("model.param_dtype", "weights and optimiser state; float32 "
                                                           "by default"),
    "worker.actor.fsdp.fsdp_size": (None, "train.strategy: fsdp2 shards over every process"),
    "worker.actor.fsdp.mp_param_dtype": ("model.dtype", "the compute dtype (bf16 on CUDA by "
                                                        "default)"),
    "worker.actor.fsdp.mp_reduce_dtype": (None, "gradients are reduced in float32"),
    "worker.actor.fsdp.mp_buffer_dtype": (None, "buffers follow model.dtype"),
    "worker.actor.offload.*": (None, _NO_OFFLOAD),
    "worker.ref.*": (None, "the reference model is loaded when algo.beta > 0 and placed like the "
                           "policy (train.strategy)"),
    "worker.critic.*": (None, _NO_CRITIC),
    "worker.reward.reward_function": ("rewards", "rewards: [{name: path/file.py:function, "
                                                 "weight: 1.0}], EasyR1's functions as they are"),
    "worker.reward.reward_function_kwargs": ("rewards", "options go beside `name` in the reward's "
                                                        "rewards entry"),
    "worker.reward.skip_special_tokens": (None, "rewards get the completion text decoded without "
                                                "special tokens"),
    "worker.reward.num_cpus": (None, "user rewards run isolated, each call with a timeout"),
    "worker.reward.reward_function_name": ("rewards", "the name after `:` in the reward's `name`"),
    "worker.rollout.name": ("rollout.backend", "hf or vllm (auto: vLLM on a GPU where installed)"),
    "worker.rollout.n": ("rollout.group_size", ""),
    "worker.rollout.temperature": ("rollout.temperature", ""),
    "worker.rollout.top_p": ("rollout.top_p", ""),
    "worker.rollout.top_k": ("rollout.top_k", "0 is off here (EasyR1's -1)"),
    "worker.rollout.seed": ("train.seed", ""),
    "worker.rollout.limit_images": (None, "vLLM is sized for the data's most media per prompt"),
    "worker.rollout.dtype": ("model.dtype", "bfloat16 (auto on CUDA) or float32"),
    "worker.rollout.gpu_memory_utilization": ("rollout.vllm_gpu_memory_utilization", ""),
    "worker.rollout.ignore_eos": (None, "completions end at EOS or rollout.max_new_tokens"),
    "worker.rollout.enforce_eager": (None, "vLLM runs as mmrlvr's engine sets it up "
                                           "(rollout.decode is the hf backend's choice)"),
    "worker.rollout.enable_chunked_prefill": (None, "vLLM runs as mmrlvr's engine sets it up"),
    "worker.rollout.tensor_parallel_size": (None, "each process runs its own vLLM engine "
                                                  "(tensor parallel 1) beside its trainer"),
    "worker.rollout.max_model_len": (None, "set from data.max_prompt_tokens and "
                                           "rollout.max_new_tokens"),
    "worker.rollout.max_num_batched_tokens": (None, "vLLM runs as mmrlvr's engine sets it up"),
    "worker.rollout.disable_log_stats": (None, "rollout figures are logged as rollout/* "
                                               "(docs/metrics.md)"),
    "worker.rollout.disable_tqdm": (None, "one progress bar per run, on the main process"),
    "worker.rollout.val_override_config": ("train.eval_samples", "held-out eval decodes greedily; "
                                           "train.eval_samples adds sampled completions for pass@k"),
    "worker.rollout.prompt_length": ("data.max_prompt_tokens", ""),
    "worker.rollout.response_length": ("rollout.max_new_tokens", ""),
    "worker.rollout.trust_remote_code": (None, "mmrlvr loads transformers' own model classes only"),
    "trainer.total_epochs": ("train.steps", _STEPS),
    "trainer.max_steps": ("train.steps", ""),
    "trainer.project_name": ("train.out_dir", "the run dir names the run; WANDB_PROJECT names a "
                                              "wandb project"),
    "trainer.experiment_name": ("train.out_dir", "the run dir names the run"),
    "trainer.logger": ("train.report_to", "any of tensorboard, wandb, mlflow, trackio; EasyR1's "
                                          "file is metrics.jsonl, always written"),
    "trainer.nnodes": (None, _PROCESSES),
    "trainer.n_gpus_per_node": (None, _PROCESSES),
    "trainer.max_try_make_batch": ("train.dynamic_max_draws", ""),
    "trainer.critic_warmup": (None, _NO_CRITIC),
    "trainer.val_freq": ("train.eval_every", "0 evaluates at the start and the end only"),
    "trainer.val_before_train": ("train.eval_every", "held-out eval runs at the start and the end "
                                                     "whenever data.eval is set"),
    "trainer.val_only": (None, "`mmrlvr eval --model DIR --data FILE`"),
    "trainer.val_generations_to_log": (None, "every held-out completion is written to "
                                             "RUN/eval/step-N.jsonl"),
    "trainer.save_freq": ("train.save_every", "0 saves at the end only (EasyR1's -1 never saves)"),
    "trainer.save_limit": ("train.keep_checkpoints", "at least 1 (EasyR1's -1 keeps every one)"),
    "trainer.save_model_only": (None, "a checkpoint always holds the trainer state, so a resume "
                                      "is exact; RUN/final is the model alone"),
    "trainer.save_checkpoint_path": ("train.out_dir", "checkpoints go to RUN/checkpoints/step-N"),
    "trainer.load_checkpoint_path": (None, _RESUME),
    "trainer.find_last_checkpoint": (None, _RESUME),
    "trainer.ray_timeline": (None, "mmrlvr has no Ray; each step's phases are logged as time/*"),
}
"""EasyR1's dotted key -> (mmrlvr key or None, what differs or what to do instead)."""


def easyr1_entry(dotted: str) -> tuple[str | None, str] | None:
    """EASYR1's answer for `dotted` (its own or its section's `.*`), else None."""
    if dotted in EASYR1:
        return EASYR1[dotted]
    parts = dotted.split(".")
    for k in range(len(parts) - 1, 0, -1):
        section = ".".join(parts[:k]) + ".*"
        if section in EASYR1:
            return EASYR1[section]
    return None


def easyr1_problem(dotted: str) -> str:
    """The one line that answers EasyR1's key `dotted`."""
    entry = easyr1_entry(dotted)
    if entry is None:
        return (f"unknown config key '{dotted}': EasyR1's {dotted.split('.')[0]} section, but "
                "no key EasyR1 or mmrlvr has; `mmrlvr train --help-config` lists mmrlvr's")
    ours, note = entry
    if ours is None:
        return f"unknown config key '{dotted}': EasyR1's {dotted} has no mmrlvr key; {note}"
    return (f"unknown config key '{dotted}': EasyR1's {dotted} is mmrlvr's '{ours}'"
            f"{'; ' + note if note else ''}")


def _easyr1_leaves(node: dict, prefix: str) -> list[tuple[str, object]]:
    out = []
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and dotted not in EASYR1 and value:
            out += _easyr1_leaves(value, dotted + ".")
        else:
            out.append((dotted, value))
    return out


def easyr1_keys(raw: dict, leaves: list[str]) -> tuple[dict, list[str]]:
    """(`raw` without EasyR1's keys, one problem line per EasyR1 key and, when any carry over
    unchanged, a last line with them in mmrlvr's keys). `leaves`: every mmrlvr dotted key.

    EasyR1's keys are those under its own sections (`EASYR1_SECTIONS`) and the keys of `data`
    that EASYR1 names and mmrlvr's `data` has not."""
    found: list[tuple[str, object]] = []                   # in the config's own order
    rest = dict(raw)
    for section, node in raw.items():
        if section in EASYR1_SECTIONS and isinstance(node, dict):
            found += _easyr1_leaves(rest.pop(section), f"{section}.")
        elif section == "data" and isinstance(node, dict):
            rest["data"] = {k: v for k, v in node.items()
                            if f"data.{k}" not in EASYR1 or f"data.{k}" in leaves}
            found += [(f"data.{k}", v) for k, v in node.items() if k not in rest["data"]]
    problems = [easyr1_problem(dotted) for dotted, _ in found]
    carried = _carry_over(found)
    if carried:
        block = yaml.safe_dump(carried, sort_keys=False, default_flow_style=False)
        problems.append("the EasyR1 settings above that carry over unchanged, in mmrlvr's keys "
                        "(paste them in; the others say what to do):\n"
                        + "\n".join("      " + line for line in block.splitlines()))
    return rest, problems


def _carry_over(found: list[tuple[str, object]]) -> dict:
    """{section: {key: value}} for EasyR1 keys with the same meaning here (an empty note, or a
    value `VALUE_SYNONYMS` renames); a key two EasyR1 keys set differently is left out."""
    flat: dict[str, object] = {}
    clashes: set[str] = set()
    for dotted, value in found:
        entry = easyr1_entry(dotted)
        if entry is None or entry[0] is None or value is None:
            continue
        ours, note = entry
        known = VALUE_SYNONYMS.get(ours, {})
        if isinstance(value, str) and _normal(value) in known:
            value = known[_normal(value)][0]
        elif note and ours not in VALUE_SYNONYMS:
            continue
        if ours in flat and flat[ours] != value:
            clashes.add(ours)
        flat.setdefault(ours, value)
    nested: dict = {}
    for ours, value in flat.items():
        if ours in clashes or "." not in ours:
            continue
        node = nested
        *sections, last = ours.split(".")
        for part in sections:
            node = node.setdefault(part, {})
        node[last] = value
    return nested
