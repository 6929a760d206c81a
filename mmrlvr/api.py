"""The Python API, shaped like TRL's, so a TRL script ports by changing its imports:

    from mmrlvr import GRPOTrainer, load_config
    cfg = load_config("configs/quickstart.yaml", ["train.steps=2", "train.out_dir=runs/x"])
    trainer = GRPOTrainer(model="runs/tiny", reward_funcs=[accuracy, fmt], train_dataset=ds, args=cfg)
    summary = trainer.train()          # the summary dict `mmrlvr train` prints and writes
    trainer.evaluate()                 # held-out figures of the trained model, as the run logs them
    GRPOTrainer.resume("runs/x", reward_funcs=[accuracy, fmt]).train()   # after train.steps=...

A thin layer over `mmrlvr train` (`mmrlvr.train.trainer.train`): the config is checked exactly as
the CLI checks it (the same YAML load, types and ranges); datasets in memory become data files
in the run dir (`mmrlvr.api_data`); reward callables become config specs recorded by import path
where they have one and run isolated like file rewards (`mmrlvr.api_rewards`); a loaded model is
saved into the run dir. What the run writes is what the CLI's run writes. `SFTTrainer` does the
same for the supervised warm start (`mmrlvr sft`). `args` may also be TRL's `GRPOConfig(...)`
(`SFTConfig(...)` for SFTTrainer: `mmrlvr.api_config`). A script started by `torchrun --nproc_per_node N` trains as `torchrun ...
mmrlvr train` does: rank 0 writes the data files, every rank trains its share of each step, and
callbacks and the summary are rank 0's. docs/api.md has the whole surface.
"""
from __future__ import annotations

import atexit
import copy
import dataclasses
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

import rewards
from mmrlvr import api_data
from mmrlvr.api_config import GRPOConfig, SFTConfig, TRLConfig, lora_overrides
from mmrlvr.train.launch import refuse_lone_launch
from mmrlvr.api_rewards import rebind, reward_specs
from mmrlvr.config import Config, ConfigError, load_config, to_dict

__all__ = ["Callback", "GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer", "checked_config",
           "load_config"]


class Callback:
    """Hooks a trainer calls; subclass and override any of them (a plain function given as a
    callback is its `on_log`)."""

    def on_log(self, step: int, metrics: dict[str, Any]) -> None:
        """Each metrics row as it is written to metrics.jsonl (step 0: the first eval)."""

    def on_evaluate(self, metrics: dict[str, Any]) -> None:
        """The figures of each `evaluate()` call."""

    def on_train_end(self, summary: dict[str, Any]) -> None:
        """The run's summary, once `train()` has written it."""


class _OnLog(Callback):
    def __init__(self, fn: Callable[[int, dict[str, Any]], Any]):
        self.fn = fn

    def on_log(self, step: int, metrics: dict[str, Any]) -> None:
        self.fn(step, metrics)


def _callbacks(callbacks: Any) -> list[Callback]:
    items = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) \
        else [callbacks]
    out = []
    for i, cb in enumerate(items):
        if isinstance(cb, type):
            cb = cb()
        if isinstance(cb, Callback) or callable(getattr(cb, "on_log", None)):
            out.append(cb)                    # another class with on_log: its other hooks optional
        elif callable(cb):
            out.append(_OnLog(cb))
        else:
            raise ConfigError(f"callbacks[{i}] is {type(cb).__name__}: give a Callback (with "
                              "on_log(step, metrics)) or a function f(step, metrics)")
    return out


class _Every(Callback):
    """`inner`'s on_log every `n` steps (TRL's logging_steps); a row between them that holds
    eval figures passes those alone, as TRL logs each evaluation."""

    def __init__(self, inner: Any, n: int):
        self.inner, self.n = inner, n

    def on_log(self, step: int, metrics: dict[str, Any]) -> None:
        if step % self.n == 0:
            self.inner.on_log(step, metrics)
        elif evals := {k: v for k, v in metrics.items() if k.startswith("eval/")}:
            self.inner.on_log(step, evals)

    def on_evaluate(self, metrics: dict[str, Any]) -> None:
        _call([self.inner], "on_evaluate", metrics)

    def on_train_end(self, summary: dict[str, Any]) -> None:
        _call([self.inner], "on_train_end", summary)


def _call(callbacks: list[Any], hook: str, *args: Any) -> None:
    if not _is_main():                  # on_log is rank 0's (RunLogger): the other hooks too
        return
    for cb in callbacks:
        fn = getattr(cb, hook, None)
        if callable(fn):
            fn(*args)


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _join(device: str) -> Any:
    """This process's `Dist`: under several processes it joins the group the run itself uses
    (once) and leaves it at exit, as the CLI leaves it when its command ends."""
    from mmrlvr.train.parallel import init

    d = init(device)
    if d.world > 1:
        atexit.register(_leave_group)
    return d


def _on_main(fn: Callable[[], Any], device: str) -> Any:
    """`fn()` run by rank 0 alone, its result on every rank: under several processes (a script
    started by torchrun) one process writes the run's files and the others wait for their
    paths; an error there is raised on every rank, so none waits for ever."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return fn()
    d = _join(device)
    result, error = None, None
    if d.main:
        try:
            result = fn()
        except Exception as err:             # noqa: BLE001 - raised below, on every rank
            error = err
    kind = type(error) if error is not None and _picklable(type(error)) else RuntimeError
    result, failure = d.gather((result, None if error is None else (kind, str(error))))[0]
    if error is not None:
        raise error
    if failure is not None:
        raise failure[0](f"{failure[1]} (rank 0)")
    return result


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
        return True
    except Exception:                        # noqa: BLE001 - a class defined in a function
        return False


def _length(dataset: Any) -> int | None:
    """A training set's row count where it has one (num_train_epochs needs it), else None."""
    if dataset is None or api_data.is_path(dataset):
        return None
    data = api_data.train_split(dataset, "train_dataset")
    if isinstance(data, dict):                               # columns: {name: [values]}
        return len(next(iter(data.values()), []))
    return len(data) if hasattr(data, "__len__") else None


def checked_config(args: Any = None, overrides: Sequence[str] = (),
                   reward_specs: list[dict[str, Any]] | None = None) -> Config:
    """`args` (a Config, a YAML path, a nested dict or None for the defaults) with `overrides`
    (and `reward_specs` as its `rewards`), checked as `mmrlvr train` checks a config file:
    written as YAML and loaded back through `load_config`, so a wrong type, an unknown key or a
    value out of range (optim.lr -1) is the CLI's ConfigError before anything loads."""
    if args is None or isinstance(args, (str, Path)):
        extra = [f"rewards={json.dumps(reward_specs)}"] if reward_specs is not None else []
        return load_config(args, [*overrides, *extra])
    raw = to_dict(args) if isinstance(args, Config) else args
    if not isinstance(raw, dict):
        raise ConfigError(f"args is {type(args).__name__}: give a Config (load_config(...)), a "
                          "YAML path or a nested dict of config keys")
    if reward_specs is not None:
        raw = {**raw, "rewards": reward_specs}
    try:
        text = yaml.safe_dump(raw, sort_keys=False)
    except yaml.YAMLError as err:
        raise ConfigError(f"the config holds a Python object a config file cannot ({err}); pass "
                          "datasets as train_dataset=/eval_dataset=, reward functions as "
                          "reward_funcs= and a loaded model as model=") from None
    with tempfile.TemporaryDirectory(prefix="mmrlvr-config-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(text)
        try:
            return load_config(path, list(overrides))
        except ConfigError as err:
            raise ConfigError(str(err).replace(str(path), "the config")) from None


def _lift_objects(args: Any) -> tuple[Any, dict[str, Any]]:
    """A Config whose fields hold objects a config file cannot (a model in model.path, a
    dataset in data.train/data.eval, callables in rewards) as the Config without them and
    those objects, taken as if given to the trainer (model=, train_dataset=, ...)."""
    if not isinstance(args, Config):
        return args, {}
    found: dict[str, Any] = {}
    model, data = args.model, args.data
    if not isinstance(model.path, str):
        found["model"], model = model.path, dataclasses.replace(model, path="")
    if not isinstance(data.train, str):
        found["train_dataset"], data = data.train, dataclasses.replace(data, train="")
    if not isinstance(data.eval, (str, dict)) or (isinstance(data.eval, dict) and not all(
            isinstance(v, str) for v in data.eval.values())):
        found["eval_dataset"], data = data.eval, dataclasses.replace(data, eval="")
    specs = list(args.rewards)
    if any(not (isinstance(s, dict) and isinstance(s.get("name"), str)) for s in specs):
        found["reward_funcs"], specs = specs, []
    return dataclasses.replace(args, model=model, data=data, rewards=specs), found


def _claim_check(run_dir: Path, overwrite: bool) -> None:
    """Refuse (as the run would) to write data into a dir that holds another run, before a
    byte is written; with `overwrite` the old run's files go, as `--overwrite` removes them."""
    from mmrlvr.train.rundir import claim

    claim(run_dir, resume=False, overwrite=overwrite).release()
    if overwrite:
        shutil.rmtree(run_dir / "data", ignore_errors=True)


def _save_model(model: Any, processing_class: Any, out: Path) -> str:
    """A loaded transformers model (and its processor) saved as a model dir the run loads."""
    if not hasattr(model, "save_pretrained"):
        raise ConfigError(f"model is {type(model).__name__}: give a model dir, a hub id in the "
                          "local cache, or a loaded transformers model")
    processor = processing_class
    if processor is None:
        source = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        if not Path(source).is_dir():
            raise ConfigError("model is a loaded model whose processor cannot be found (its "
                              f"config names {source!r}, not a local dir): pass "
                              "processing_class=processor")
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(source)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return str(out)


def _trl_config(args: Any, overrides: Sequence[str], specs: list[dict[str, Any]] | None,
                train_dataset: Any, eval_dataset: Any, kind: type) -> tuple[Config, int]:
    """The checked Config of `args` and the callbacks' logging interval (TRL's logging_steps of
    a GRPOConfig or SFTConfig, whichever `kind` the trainer takes; 1: every row)."""
    if not isinstance(args, TRLConfig):
        return checked_config(args, overrides, specs), 1
    trainer = "GRPOTrainer" if kind is GRPOConfig else "SFTTrainer"
    if not isinstance(args, kind):
        raise ConfigError(f"{trainer} takes args={kind.__name__}(...), not "
                          f"{type(args).__name__} (TRL's names of the {trainer[:-7]} stage)")
    cfg = args.to_config(overrides, specs, rows=_length(train_dataset))
    if args.refuses_eval() and (eval_dataset is not None or cfg.data.eval):
        raise ConfigError(f"{kind.__name__}: eval_strategy='no' with eval data: mmrlvr evaluates "
                          "wherever eval data is given; pass no eval_dataset to skip eval")
    return cfg, args.every(cfg)


class GRPOTrainer:
    """`mmrlvr train` from Python. `model`: a model dir, a cached hub id or a loaded transformers
    model (saved to RUN/model; give `processing_class` unless its config names a local dir);
    `reward_funcs`: callables in any convention of `rewards/conventions.py` (TRL, EasyR1,
    ms-swift, mmrlvr), ORM classes, registered names, `file.py:function`, `(reward, weight)`
    pairs or spec dicts; `args`: a Config, YAML path, dict or TRL's `GRPOConfig(...)` (its
    names mapped onto mmrlvr's keys, `overrides` applied after); `train_dataset`/`eval_dataset`:
    see `mmrlvr.api_data`; `callbacks`: `Callback`s or functions f(step, metrics);
    `overrides`: dotted keys as on the command line; `overwrite`: replace an earlier run in
    train.out_dir; `max_rows`: rows read from an iterable dataset (default: the rows the run
    draws, train.steps x train.batch_prompts); `peft_config`: TRL's, a peft.LoraConfig read
    into model.lora (`mmrlvr.api_config.peft`)."""

    def __init__(self, model: Any = None, reward_funcs: Any = None, args: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None, callbacks: Any = None,
                 processing_class: Any = None, reward_weights: Sequence[float] | None = None,
                 overrides: Sequence[str] = (), overwrite: bool = False,
                 max_rows: int | None = None, peft_config: Any = None):
        refuse_lone_launch()                 # accelerate's one process for N: torchrun
        overrides = [*lora_overrides(peft_config), *overrides]     # model.lora; overrides win
        args, lifted = _lift_objects(args)
        model = lifted.get("model", model) if model is None else model
        reward_funcs = lifted.get("reward_funcs", reward_funcs) if reward_funcs is None else reward_funcs
        train_dataset = lifted.get("train_dataset") if train_dataset is None else train_dataset
        eval_dataset = lifted.get("eval_dataset") if eval_dataset is None else eval_dataset
        if isinstance(args, GRPOConfig) and reward_weights is None:
            reward_weights = args.to_dict().get("reward_weights")
        specs, self._objects = (None, {}) if reward_funcs is None else \
            reward_specs(reward_funcs, reward_weights)
        cfg, every = _trl_config(args, overrides, specs, train_dataset, eval_dataset,
                                 GRPOConfig)
        if isinstance(model, (str, Path)):
            cfg.model.path = str(model)
        self.args = cfg
        self.run_dir = Path(cfg.train.out_dir)
        self.callbacks = [cb if every == 1 else _Every(cb, every) for cb in _callbacks(callbacks)]
        self.summary: dict[str, Any] | None = None
        self._model, self._processing_class = (None if isinstance(model, (str, Path)) else model,
                                               processing_class)
        self._train_dataset, self._eval_dataset = train_dataset, eval_dataset
        self._max_rows = max_rows
        self._overwrite, self._resume, self._force, self._trust = overwrite, False, False, False
        self._prepared = False
        if model is None and not cfg.model.path:
            raise ConfigError("no model: pass model= (a model dir or a loaded model) or set "
                              "model.path in args")
        if train_dataset is None and not cfg.data.train:
            raise ConfigError("no training data: pass train_dataset= (a datasets.Dataset, a list "
                              "of dicts, ...) or set data.train in args")

    @classmethod
    def resume(cls, run_dir: str | Path, reward_funcs: Any = None, callbacks: Any = None,
               overrides: Sequence[str] = (), force: bool = False,
               trust_checkpoint: bool = False) -> "GRPOTrainer":
        """Continue the run in `run_dir` from its last complete checkpoint, as `mmrlvr train
        --resume RUN_DIR [overrides]` does (e.g. overrides=["train.steps=400"]). Rewards that
        were Python callables are given again as `reward_funcs` (matched to the run's by name;
        weights and options stay the run's); rewards recorded by import path load by themselves."""
        refuse_lone_launch()
        run_dir = Path(run_dir)
        if not (run_dir / "config.yaml").is_file():
            raise FileNotFoundError(f"{run_dir}: no config.yaml, so not a run dir to resume")
        cfg = load_config(run_dir / "config.yaml", [*overrides, f"train.out_dir={run_dir}"])
        self = cls.__new__(cls)
        cfg.rewards, self._objects = rebind(cfg.rewards, reward_funcs, run_dir)
        self.args, self.run_dir, self.callbacks, self.summary = cfg, run_dir, _callbacks(callbacks), None
        self._model = self._processing_class = self._train_dataset = self._eval_dataset = None
        self._max_rows = None
        self._overwrite, self._resume, self._force, self._trust = False, True, force, trust_checkpoint
        self._prepared = True
        return self

    def _prepare(self) -> None:
        """Write what the run reads into the run dir (rank 0 alone): the datasets and a loaded
        model; every rank's config then names those files."""
        if self._prepared:
            return
        cfg = self.args
        cfg.model.path, cfg.data.train, cfg.data.eval = _on_main(self._write, cfg.train.device)
        self._prepared = True

    def _write(self) -> tuple[str, Any, Any]:
        cfg, data_dir = self.args, self.run_dir / "data"
        _claim_check(self.run_dir, self._overwrite)
        model, train, evals = cfg.model.path, cfg.data.train, cfg.data.eval
        if self._model is not None:
            model = _save_model(self._model, self._processing_class, self.run_dir / "model")
        columns = dict(cfg.data.columns or {})
        if self._train_dataset is not None:
            limit = self._max_rows or cfg.train.steps * cfg.train.batch_prompts
            train = api_data.write_dataset(self._train_dataset, data_dir / "train.jsonl",
                                           "train_dataset", columns, limit)
        if self._eval_dataset is not None:
            evals = api_data.write_eval(self._eval_dataset, data_dir, columns,
                                        self._max_rows or cfg.data.eval_limit or None)
        return model, train, evals

    def train(self, resume_from_checkpoint: bool = False) -> dict[str, Any]:
        """Run GRPO (or continue it: `resume_from_checkpoint=True` continues this run dir's run,
        on the data it was started with); returns the run's summary (under several processes
        rank 0's; {} on the others, as `mmrlvr train` returns)."""
        from mmrlvr.train.trainer import train

        if resume_from_checkpoint and not self._resume:
            saved = load_config(self.run_dir / "config.yaml", [f"train.out_dir={self.run_dir}"])
            self.args.data, self.args.model.path = saved.data, saved.model.path
            self._resume = self._prepared = True
        self._prepare()
        with rewards.supplied(self._objects):
            summary = train(copy.deepcopy(self.args), resume=self._resume,
                            overwrite=self._overwrite, force=self._force,
                            trust_checkpoint=self._trust, callbacks=self.callbacks)
        self.summary = summary
        _call(self.callbacks, "on_train_end", summary)
        return summary

    @property
    def model_dir(self) -> Path:
        """The model `evaluate` and the demo use: RUN/final once trained, else the newest
        complete checkpoint, else the starting model."""
        from mmrlvr.train.checkpoint import latest_checkpoint

        final = self.run_dir / "final"
        if (final / "config.json").is_file():
            return final
        ckpt = latest_checkpoint(self.run_dir) if (self.run_dir / "checkpoints").is_dir() else None
        if ckpt is not None and not (self.args.model.lora.r > 0):
            return ckpt
        return Path(self.args.model.path)

    def evaluate(self, eval_dataset: Any = None) -> dict[str, Any]:
        """Held-out figures of `model_dir` on `eval_dataset` (else the run's data.eval sets),
        keyed as the run logs them (`eval/accuracy`, `eval/<name>/accuracy`, ...). Under several
        processes every rank takes part as in the run's own eval (each scores its share of the
        rows; the figures are of them all, on every rank) and rank 0 alone writes the rows."""
        from mmrlvr.api_eval import evaluate_model

        self._prepare()
        device, columns = self.args.train.device, dict(self.args.data.columns or {})
        sets = None if eval_dataset is None else _on_main(lambda: api_data.write_eval(
            eval_dataset, self.run_dir / "data" / "evaluate", columns), device)
        with rewards.supplied(self._objects):
            metrics = evaluate_model(self.args, self.model_dir, sets, _join(device))
        _call(self.callbacks, "on_evaluate", metrics)
        return metrics


class SFTTrainer:
    """`mmrlvr sft` from Python: the supervised warm start on rows with a reference `reasoning`
    (`<think>` part) and answer. `model` a model dir (the start: sft.init), `args` as
    GRPOTrainer's or TRL's `SFTConfig(...)`; the data go to sft.out_dir/data; `callbacks` and
    `peft_config` as GRPOTrainer's (`on_log` for each SFT metrics row, `on_train_end` with the
    summary). `train()` returns the SFT summary and `model_dir` is the warm-started model to
    give GRPOTrainer as `model`."""

    def __init__(self, model: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 args: Any = None, overrides: Sequence[str] = (), overwrite: bool = False,
                 callbacks: Any = None, peft_config: Any = None):
        refuse_lone_launch()                 # accelerate's one process for N: torchrun
        overrides = [*lora_overrides(peft_config), *overrides]     # model.lora; overrides win
        args, lifted = _lift_objects(args)
        self._train = lifted.get("train_dataset") if train_dataset is None else train_dataset
        self._eval = lifted.get("eval_dataset") if eval_dataset is None else eval_dataset
        cfg, every = _trl_config(args, overrides, None, self._train, self._eval, SFTConfig)
        if isinstance(model, (str, Path)):
            cfg.sft.init = str(model)
        elif model is not None:
            raise ConfigError("SFTTrainer takes the model as a model dir (save a loaded model with "
                              "save_pretrained first)")
        self.args, self.out_dir, self._overwrite = cfg, Path(cfg.sft.out_dir), overwrite
        self.callbacks = [cb if every == 1 else _Every(cb, every) for cb in _callbacks(callbacks)]
        self.summary: dict[str, Any] | None = None

    @property
    def model_dir(self) -> Path:
        return self.out_dir / "final"

    def train(self) -> dict[str, Any]:
        from mmrlvr.train.sft import sft

        cfg = self.args
        cfg.data.train, cfg.data.eval = _on_main(self._write, cfg.train.device)
        self.summary = sft(copy.deepcopy(cfg), overwrite=self._overwrite, callbacks=self.callbacks)
        _call(self.callbacks, "on_train_end", self.summary)
        return self.summary

    def _write(self) -> tuple[Any, Any]:
        cfg, data_dir = self.args, self.out_dir / "data"
        columns, train, evals = dict(cfg.data.columns or {}), cfg.data.train, cfg.data.eval
        if self._train is not None or self._eval is not None:
            _claim_check(self.out_dir, self._overwrite)
        if self._train is not None:
            train = api_data.write_dataset(self._train, data_dir / "train.jsonl", "train_dataset",
                                           columns, cfg.sft.steps * cfg.sft.batch_size)
        if self._eval is not None:
            evals = api_data.write_eval(self._eval, data_dir, columns, cfg.data.eval_limit or None)
        return train, evals
