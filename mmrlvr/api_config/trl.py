"""What TRL's `GRPOConfig` and `SFTConfig` share (`TRLConfig`): the names of transformers'
`TrainingArguments` both inherit, and the check that turns a script's names into mmrlvr's
config keys. A subclass declares its tables (`MAPPED`, `CONVERTED`, `TRAINER`, `FIXED`,
`INSTEAD`) and its run's keys (`STEPS`, `BATCH`, `WARMUP`); every given name is checked when it
is given, and a name or value mmrlvr cannot honour is one ConfigError naming each with what to
use instead. Nothing is ignored.
"""
from __future__ import annotations

import difflib
import functools
import json
import math
import os
from typing import Any, ClassVar, Sequence

from mmrlvr.config import Config, ConfigError, load_config
from mmrlvr.config.synonyms import SYNONYMS

COMMON: dict[str, str] = {
    # TrainingArguments name: the mmrlvr key it sets as it is
    "learning_rate": "optim.lr", "max_grad_norm": "optim.max_grad_norm",
    "weight_decay": "optim.weight_decay", "seed": "train.seed",
    "per_device_eval_batch_size": "train.eval_batch",
    "gradient_checkpointing": "model.gradient_checkpointing",
}
"""Names both configs set one mmrlvr key with (the SFT one remaps learning_rate)."""

COMMON_FIXED: dict[str, tuple[tuple[Any, ...], str]] = {
    "remove_unused_columns": ((False,), "mmrlvr passes every dataset column to the rewards"),
    "logging_strategy": (("steps",), "mmrlvr logs every step; logging_steps sets the callbacks'"),
    "eval_on_start": ((True,), "mmrlvr evaluates at step 0 wherever eval data is given; pass no "
                               "eval_dataset to skip eval"),
    "optim": (("adamw_torch", "adamw_torch_fused"), "mmrlvr trains with torch's AdamW"),
    "fp16": ((False,), "mmrlvr has no fp16: bf16=True computes in bfloat16 (model.dtype)"),
}
"""Names accepted only at the value that is mmrlvr's behaviour, in both configs."""

HUB = "mmrlvr does not upload: push RUN/final with huggingface_hub's upload_folder"
NOT_HERE = "not implemented in mmrlvr (docs/api.md lists the TRL names it takes)"
COMMON_INSTEAD: dict[str, str] = {
    "push_to_hub": HUB, "hub_model_id": HUB, "hub_strategy": HUB, "hub_token": HUB,
    "hub_private_repo": HUB,
    "logging_dir": "TensorBoard events and metrics.jsonl go to the run dir (output_dir)",
    "run_name": "the run dir names the run: set output_dir",
    "model_init_kwargs": "overrides=['model.dtype=...', 'model.attn_implementation=...'], or "
                         "pass a loaded model as model=",
    "deepspeed": "launch with torchrun and set train.strategy (ddp or fsdp2) in overrides",
    "fsdp": "launch with torchrun and overrides=['train.strategy=fsdp2']",
    "dataloader_num_workers": "mmrlvr encodes each step's prompts itself (no DataLoader)",
    "use_liger_kernel": NOT_HERE, "pad_to_multiple_of": NOT_HERE,
}
"""Names neither config takes, and what to do instead."""


LENGTH = ("max_steps", "num_train_epochs", "warmup_steps", "warmup_ratio")
"""The run-length names both configs convert the same way, into their own STEPS and WARMUP."""


def world() -> int:
    """The launch's process count (torchrun's WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def whole(**values: Any) -> None:
    """Refuse batch sizes that are not whole numbers >= 1, naming each."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values.values()):
        named = [f"{k} ({v!r})" for k, v in values.items()]
        raise ConfigError(f"{', '.join(named[:-1])} and {named[-1]} must be whole numbers >= 1")


def choice(name: str, value: Any, table: dict[Any, Any]) -> Any:
    key = value.lower() if isinstance(value, str) else value
    if not isinstance(value, (bool, str)) or key not in table:
        raise ConfigError(f"{name}={value!r} has no mmrlvr form; it takes "
                          f"{', '.join(repr(k) for k in table)}")
    return table[key]


def common(name: str, value: Any) -> dict[str, Any]:
    """The keys of the converted names both configs take (bf16, use_cpu, report_to)."""
    if name in ("bf16", "use_cpu"):
        flag = choice(name, value, {True: True, False: False})
        key, on, off = {"bf16": ("model.dtype", "bfloat16", "float32"),
                        "use_cpu": ("train.device", "cpu", "auto")}[name]
        return {key: on if flag else off}
    if name == "report_to":
        names = [value] if isinstance(value, str) else list(value or [])
        return {"train.report_to": [] if names in (["none"], []) else names}
    if name == "eval_strategy":
        choice(name, value, {"steps": 1, "no": 1})       # "no": the trainer refuses eval data
    return {}


def dotted(keys: dict[str, Any]) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in keys.items()]


def _get(cfg: Config, key: str) -> Any:
    return functools.reduce(getattr, key.split("."), cfg)


class TRLConfig:
    """A TRL config (`GRPOConfig`, `SFTConfig`) with the names mmrlvr honours: a refused or
    unknown name, or a value the config check refuses, is one ConfigError that lists them all;
    each given name is readable and settable as an attribute, as in TRL."""

    MAPPED: ClassVar[dict[str, str]] = {}
    CONVERTED: ClassVar[tuple[str, ...]] = ()
    TRAINER: ClassVar[tuple[str, ...]] = ("logging_steps",)
    FIXED: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {}
    INSTEAD: ClassVar[dict[str, str]] = {}
    STEPS, BATCH, WARMUP = "train.steps", "train.batch_prompts", "optim.warmup_steps"
    """The run's length, its rows a step (num_train_epochs) and its warm-up (warmup_ratio)."""

    @classmethod
    def accepted(cls) -> tuple[str, ...]:
        return (*cls.MAPPED, *cls.CONVERTED, *cls.TRAINER, *cls.FIXED)

    @classmethod
    def converted(cls, name: str, value: Any, given: dict[str, Any]) -> dict[str, Any]:
        """The mmrlvr keys of one CONVERTED name other than the run's length (the subclass's)."""
        raise NotImplementedError

    @classmethod
    def length(cls, name: str, value: Any) -> dict[str, Any]:
        """The keys of a run-length name (LENGTH) that need no training-set length: max_steps
        > 0 and whole warmup_steps; epochs and warm-up ratios are `to_config`'s (`_derived`)."""
        if name == "max_steps":
            return {cls.STEPS: value} if not (isinstance(value, int) and value <= 0) else {}
        if name == "warmup_steps" and not (isinstance(value, float) and 0 < value < 1):
            return {cls.WARMUP: value}
        return {}

    def __init__(self, **kwargs: Any):
        object.__setattr__(self, "_given", {})
        self._check(dict(kwargs))
        self._given.update(kwargs)

    @classmethod
    def keys(cls, name: str, value: Any, given: dict[str, Any]) -> dict[str, Any]:
        """The mmrlvr keys of one given name (raises ConfigError for a name or value it refuses)."""
        if name in cls.MAPPED:
            return {cls.MAPPED[name]: value}
        if name in cls.CONVERTED:
            return cls.length(name, value) if name in LENGTH else cls.converted(name, value, given)
        if name in cls.FIXED:
            values, instead = cls.FIXED[name]
            if not any(value == v and type(value) is type(v) for v in values):
                raise ConfigError(f"{name}={value!r}: {instead}")
            return {}
        if name in cls.TRAINER:
            return {}
        raise ConfigError(cls.unknown(name))

    @classmethod
    def unknown(cls, name: str) -> str:
        """What to say of a name this config does not have."""
        me = cls.__name__
        if name in cls.INSTEAD:
            return f"{name}: {cls.INSTEAD[name]}"
        if name in SYNONYMS:
            key, note = SYNONYMS[name]
            return (f"{name} is not a {me} field; mmrlvr's key is {key}: pass "
                    f"overrides=['{key}=...'] to the trainer{' (' + note + ')' if note else ''}")
        near = difflib.get_close_matches(name, cls.accepted(), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        return (f"{name}: mmrlvr's {me} does not take it; {hint}the TRL names it takes are "
                "listed in docs/api.md, and other settings go in the trainer's "
                "overrides=['key=value'] as mmrlvr keys (`mmrlvr train --help-config`)")

    def _check(self, given: dict[str, Any]) -> None:
        problems, keys, good = [], {}, {}
        for name, value in given.items():
            try:
                keys.update(self.keys(name, value, given))
                good[name] = value
            except ConfigError as err:
                problems.append(str(err))
        problems += self._value_problems(good, keys)
        me = type(self).__name__
        if problems:
            raise ConfigError(f"{me}: " + problems[0] if len(problems) == 1 else
                              f"{me}: {len(problems)} problems (fix them all, then rerun):\n"
                              + "\n".join(f"  - {p}" for p in problems))

    @classmethod
    def _value_problems(cls, given: dict[str, Any], keys: dict[str, Any]) -> list[str]:
        """The config check's word on the keys, each problem named by the TRL name behind it."""
        try:
            load_config(None, dotted(keys))
            return []
        except ConfigError as err:
            whole_error = str(err)
        problems = []
        for name, value in given.items():     # each alone: which name the refusal is of
            try:
                load_config(None, dotted(cls.keys(name, value, given)))
            except ConfigError as err:
                problems.append(f"{name}={value!r} (mmrlvr's "
                                f"{', '.join(cls.keys(name, value, given))}): {err}")
        return problems or [f"{whole_error} (the mmrlvr keys of {sorted(given)} together)"]

    def __getattr__(self, name: str) -> Any:
        given = object.__getattribute__(self, "_given")
        if name in given:
            return given[name]
        if name in type(self).accepted():
            raise AttributeError(f"{type(self).__name__}: {name} was not given, so mmrlvr's "
                                 "default applies (trainer.args holds the resolved config)")
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._check({**self._given, name: value})
        self._given[name] = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._given.items())})"

    def to_dict(self) -> dict[str, Any]:
        """The names given, with their values."""
        return dict(self._given)

    def overrides(self) -> list[str]:
        """The given names as mmrlvr's dotted overrides (those that need no run length)."""
        keys: dict[str, Any] = {}
        for name, value in self._given.items():
            keys.update(self.keys(name, value, self._given))
        return dotted(keys)

    def to_config(self, overrides: Sequence[str] = (), reward_specs: list[dict] | None = None,
                  rows: int | None = None) -> Config:
        """The checked mmrlvr Config: mmrlvr's defaults, these names, then `overrides` (dotted
        keys, which win) and `reward_specs` as `rewards`; `rows` (the training set's length)
        turns num_train_epochs into the run's steps."""
        extra = [f"rewards={json.dumps(reward_specs)}"] if reward_specs is not None else []
        mine = self.overrides()
        cfg = load_config(None, [*mine, *overrides, *extra])
        derived = self._derived(cfg, rows)
        return load_config(None, [*mine, *dotted(derived), *overrides, *extra]) if derived else cfg

    def _derived(self, cfg: Config, rows: int | None) -> dict[str, Any]:
        """The run's steps from num_train_epochs, its warm-up steps from a warm-up ratio."""
        given, out = self._given, {}
        steps = _get(cfg, self.STEPS)
        if "num_train_epochs" in given and not (given.get("max_steps") or 0) > 0:
            epochs = given["num_train_epochs"]
            if rows is None:
                raise ConfigError(f"{type(self).__name__}: num_train_epochs={epochs!r} needs the "
                                  "training set's length; pass a train_dataset with one (a "
                                  "Dataset, a list, a DataFrame) or give max_steps")
            steps = out[self.STEPS] = max(1, math.ceil(epochs * rows / _get(cfg, self.BATCH)))
        ratio = given.get("warmup_ratio")
        if ratio is None and isinstance(given.get("warmup_steps"), float) \
                and 0 < given["warmup_steps"] < 1:
            ratio = given["warmup_steps"]        # transformers 5: a float below 1 is a ratio
        if ratio is not None:
            out[self.WARMUP] = math.ceil(ratio * steps)
        return out

    def every(self, cfg: Config) -> int:
        """The callbacks' logging interval: logging_steps (a fraction of the run's steps below 1)."""
        n = self._given.get("logging_steps", 1)
        steps = _get(cfg, self.STEPS)
        return max(1, math.ceil(n * steps) if isinstance(n, float) and n < 1 else int(n))

    def refuses_eval(self) -> bool:
        """eval_strategy 'no': TRL would not evaluate (the trainer refuses eval data then)."""
        return str(self._given.get("eval_strategy", "")).lower() == "no"
