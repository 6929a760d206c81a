"""TRL's `peft_config=`: a `peft.LoraConfig` as mmrlvr's `model.lora` keys.

mmrlvr builds its LoRA itself from `model.lora` (`Policy.load`: peft's `get_peft_model` with r,
lora_alpha, lora_dropout and target_modules), so a LoraConfig given to a trainer is read into
those four keys, with peft's values (its lora_alpha default is 8, mmrlvr's 16), and the run is
the one a config with the same `model.lora` makes. Whatever else the LoraConfig sets away from
peft's defaults (DoRA, rsLoRA, biases, modules_to_save, patterns, another init), and any other
peft method, is one ConfigError naming it: mmrlvr would not build it, and nothing is ignored.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from mmrlvr.config import ConfigError, load_config

__all__ = ["lora_overrides"]

TAKEN = ("r", "lora_alpha", "lora_dropout", "target_modules")
"""The LoraConfig fields that become model.lora.{r, alpha, dropout, target_modules}."""
BOOKKEEPING = ("task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path",
               "revision", "runtime_config", "megatron_core")
"""Fields that describe the config, not the adapter (task_type is checked on its own)."""


def lora_overrides(peft_config: Any) -> list[str]:
    """`peft_config` (None or a peft.LoraConfig) as dotted model.lora overrides, checked."""
    if peft_config is None:
        return []
    from peft import LoraConfig, PeftConfig

    if not isinstance(peft_config, LoraConfig):
        kind = type(peft_config).__name__
        what = "another peft method" if isinstance(peft_config, PeftConfig) else "not a peft config"
        raise ConfigError(f"peft_config is {kind} ({what}): mmrlvr trains LoRA only; give "
                          "peft.LoraConfig(r=..., lora_alpha=..., target_modules=[...]) or "
                          "overrides=['model.lora.r=16']")
    problems = _unsupported(peft_config, LoraConfig())
    targets = peft_config.target_modules
    if isinstance(targets, str):
        problems.append(f"target_modules={targets!r}: give a list of module names "
                        "(model.lora.target_modules), or None for the model family's own")
    if problems:
        raise ConfigError("peft_config: mmrlvr's LoRA cannot honour " + "; ".join(problems))
    keys = {"model.lora.r": peft_config.r, "model.lora.alpha": peft_config.lora_alpha,
            "model.lora.dropout": peft_config.lora_dropout,
            "model.lora.target_modules": ["auto"] if targets is None else sorted(targets)}
    overrides = [f"{k}={json.dumps(v)}" for k, v in keys.items()]
    try:
        load_config(None, overrides)
    except ConfigError as err:
        raise ConfigError(f"peft_config (mmrlvr's model.lora): {err}") from None
    return overrides


def _unsupported(given: Any, default: Any) -> list[str]:
    """Each field `given` sets away from peft's default that mmrlvr's LoRA does not build."""
    out = []
    task = given.task_type
    if task is not None and str(getattr(task, "value", task)) != "CAUSAL_LM":
        out.append(f"task_type={str(getattr(task, 'value', task))!r} (mmrlvr trains causal LMs: "
                   "CAUSAL_LM or None)")
    for field in dataclasses.fields(given):
        name = field.name
        if name in TAKEN or name in BOOKKEEPING:
            continue
        value = getattr(given, name)
        if value != getattr(default, name):
            out.append(f"{name}={value!r} (peft's default: {getattr(default, name)!r})")
    return out
