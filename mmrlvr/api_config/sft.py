"""TRL's `SFTConfig`, for the warm start (`SFTTrainer`) with a TRL script's names:

    args = SFTConfig(output_dir="runs/sft", learning_rate=1e-4, per_device_train_batch_size=8,
                     max_steps=200, warmup_steps=10, seed=42, report_to="none")
    SFTTrainer(model=..., train_dataset=ds_with_reasoning, args=args).train()

As `GRPOConfig` (`mmrlvr.api_config.grpo`): each name becomes mmrlvr keys (here the `sft`
section's: `sft.lr`, `sft.steps`, `sft.batch_size`, `sft.warmup_steps`, `sft.out_dir`) checked
as `mmrlvr sft` checks a config file, and a name mmrlvr cannot honour, or does not know, is one
error naming what to use instead. TRL's meanings: `per_device_train_batch_size` (P) rows per
forward on each process (`train.micro_batch`), P x processes x gradient_accumulation_steps rows
a step (`sft.batch_size`, one update); `num_train_epochs` is `sft.steps` = ceil(epochs x rows /
sft.batch_size). A GRPO name (num_generations, beta, ...) is refused as the GRPO stage's.
"""
from __future__ import annotations

from typing import Any

from mmrlvr.api_config.grpo import GRPOConfig
from mmrlvr.api_config.trl import (COMMON, COMMON_FIXED, COMMON_INSTEAD, NOT_HERE, TRLConfig,
                                   choice, common, whole, world)
from mmrlvr.config import ConfigError

__all__ = ["SFTConfig"]

MAPPED: dict[str, str] = {
    **COMMON,
    "output_dir": "sft.out_dir",
    "learning_rate": "sft.lr",
}
"""TRL names that set one mmrlvr key to the same value."""

CONVERTED = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
             "num_train_epochs", "warmup_steps", "warmup_ratio", "lr_scheduler_type", "bf16",
             "use_cpu", "report_to", "eval_strategy")
"""TRL names whose value is translated (`SFTConfig.converted`)."""

_FINAL = "mmrlvr sft writes its final model only (output_dir/final), the start of the GRPO run"
FIXED: dict[str, tuple[tuple[Any, ...], str]] = {
    **COMMON_FIXED,
    "max_length": ((None,), "mmrlvr sft trains on whole rows, never truncated (a prompt over "
                            "data.max_prompt_tokens is a bad row, skipped); pass max_length=None"),
    "packing": ((False,), "mmrlvr sft pads each batch (no packing)"),
    "completion_only_loss": ((None, True), "mmrlvr's SFT loss covers the completion (the "
                                           "reference reasoning and answer) only"),
    "assistant_only_loss": ((True,), "mmrlvr's SFT loss covers the model's own turns only "
                                     "(never the prompt or a tool's reply); leave it out"),
    "loss_type": (("nll",), "mmrlvr's SFT loss is the token-mean NLL of the completion"),
    "adam_beta1": ((0.9,), "mmrlvr sft trains with AdamW's betas (0.9, 0.999)"),
    "adam_beta2": ((0.999,), "mmrlvr sft trains with AdamW's betas (0.9, 0.999)"),
    "save_strategy": (("no",), _FINAL),
}
"""TRL names accepted only at the value that is mmrlvr's behaviour."""

_ROWS = ("rows need a reference `reasoning` and the answer (docs/api.md, SFTTrainer); other "
         "column names: overrides=['data.columns={...}']")
INSTEAD: dict[str, str] = {
    **{name: "a GRPOConfig name (the GRPO stage's): SFT trains on reference "
             "completions, it does not sample" for name in GRPOConfig.accepted()
       if name not in (*MAPPED, *CONVERTED, *FIXED, "logging_steps")},
    **COMMON_INSTEAD,
    "save_steps": _FINAL, "save_total_limit": _FINAL,
    "eval_steps": "mmrlvr sft evaluates at step 0 and at its last step",
    "resume_from_checkpoint": "mmrlvr sft has no checkpoints to resume: rerun it",
    "dataset_text_field": _ROWS, "dataset_kwargs": _ROWS, "dataset_num_proc": _ROWS,
    "max_seq_length": "mmrlvr sft trains on whole rows, never truncated",
    "lr_scheduler_kwargs": "overrides=['optim.min_lr_ratio=R'] (the cosine floor)",
    "eos_token": "the model's own EOS ends each target", "pad_token": "the processor's pad token",
    **{name: NOT_HERE for name in (
        "padding_free", "chat_template_path", "activation_offloading", "neftune_noise_alpha",
        "dataset_batch_size", "padding_side", "torch_compile")},
}
"""TRL names mmrlvr's SFT does not take, and what to do instead."""

SCHEDULES = {"cosine": 0.0, "constant": 1.0, "constant_with_warmup": 1.0}
"""TRL's lr_scheduler_type -> optim.min_lr_ratio (mmrlvr sft warms up, then decays cosine to
that floor: 0 is TRL's cosine, 1 holds the lr)."""
PER_DEVICE = 8
"""TRL's default, used where only gradient_accumulation_steps is given."""


def _batch(given: dict[str, Any]) -> dict[str, Any]:
    """per_device_train_batch_size x processes x gradient_accumulation_steps rows a step."""
    if "per_device_train_batch_size" not in given and "gradient_accumulation_steps" not in given:
        return {}
    per, acc = given.get("per_device_train_batch_size", PER_DEVICE), \
        given.get("gradient_accumulation_steps", 1)
    whole(per_device_train_batch_size=per, gradient_accumulation_steps=acc)
    return {"train.micro_batch": per, "sft.batch_size": per * world() * acc}


class SFTConfig(TRLConfig):
    """TRL's `SFTConfig(...)` with the TRL names mmrlvr's warm start honours (module docstring,
    docs/api.md); checked as GRPOConfig is."""

    MAPPED, CONVERTED, FIXED, INSTEAD = MAPPED, CONVERTED, FIXED, INSTEAD
    STEPS, BATCH, WARMUP = "sft.steps", "sft.batch_size", "sft.warmup_steps"

    @classmethod
    def converted(cls, name: str, value: Any, given: dict[str, Any]) -> dict[str, Any]:
        """The mmrlvr keys of one CONVERTED name (the run-length names are TRLConfig.length's)."""
        if name == "lr_scheduler_type":
            floor = choice(name, value, SCHEDULES)
            no_warmup = str(value).lower() == "constant"      # TRL's constant does not warm up
            if no_warmup and ("warmup_steps" in given or "warmup_ratio" in given):
                raise ConfigError("lr_scheduler_type='constant' does not warm up: use "
                                  "'constant_with_warmup' with warmup_steps")
            return {"optim.min_lr_ratio": floor, **({"sft.warmup_steps": 0} if no_warmup else {})}
        if name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            return _batch(given)
        return common(name, value)     # bf16, use_cpu, report_to, eval_strategy
