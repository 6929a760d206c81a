"""The Python API (`from mmrlvr import GRPOTrainer, load_config`): a script's in-memory dataset
and plain Python reward functions train, evaluate and resume a tiny real Qwen2.5-VL; a reward
callable that raises is scored 0 and counted, as a file reward's failure is; a config built in
Python is refused exactly as the CLI refuses it; datasets of every kind reach the run dir as a
file the loader reads, media included."""
from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from mmrlvr import GRPOTrainer, SFTTrainer, load_config
from mmrlvr.config import Config, ConfigError
from mmrlvr.data import load_dataset
from mmrlvr.train.logger import read_metrics

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::mmrlvr.data.DataWarning")


def accuracy(completions, solution, **kwargs):          # TRL's convention, importable by path
    return [float(s in c) for c, s in zip(completions, solution)]


def brief(completions, **kwargs):                    # varies within a group: an update
    return [1.0 - min(len(c), 30) / 30 for c in completions]


def _image(i: int) -> Image.Image:
    return Image.new("RGB", (56, 56), (30 * i % 255, 100, 200 - 10 * i))


def _dataset(n: int = 6) -> datasets.Dataset:
    return datasets.Dataset.from_dict({
        "prompt": [f"<image>How many squares? ({i})" for i in range(n)],
        "image": [_image(i) for i in range(n)],
        "solution": [str(i % 3 + 1) for i in range(n)]})


def _args(out: Path, steps: int = 2, **extra: str) -> Config:
    keys = {"model.min_pixels": 3136, "model.max_pixels": 4096, "rollout.group_size": 4,
            "rollout.max_new_tokens": 6, "train.steps": steps, "train.batch_prompts": 2,
            "train.micro_batch": 8, "train.save_every": 1, "train.eval_batch": 2,
            "train.out_dir": out, "train.report_to": "[]", **extra}
    return load_config(None, [f"{k}={v}" for k, v in keys.items()])


def test_import_mmrlvr_stays_light_and_the_api_loads_on_first_use():
    code = ("import sys, mmrlvr; light = 'mmrlvr.api' not in sys.modules and 'torch' not in "
            "sys.modules; from mmrlvr import GRPOTrainer, load_config; print(light, "
            "GRPOTrainer.__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["True", "mmrlvr.api"], out.stderr


def test_a_config_built_in_python_is_refused_with_the_clis_message(tmp_path, tiny_vl):
    with pytest.raises(ConfigError) as cli:
        load_config(None, ["optim.lr=-1"])
    cfg = Config()
    cfg.optim.lr = -1.0
    with pytest.raises(ConfigError) as api:
        GRPOTrainer(model=str(tiny_vl), reward_funcs=[accuracy], train_dataset=_dataset(), args=cfg)
    assert str(api.value) == str(cli.value) and "optim.lr" in str(api.value)
    cfg.optim.lr = "fast"                                    # a wrong type: the CLI's words too
    with pytest.raises(ConfigError, match="optim.lr"):
        GRPOTrainer(model=str(tiny_vl), reward_funcs=[accuracy], train_dataset=_dataset(), args=cfg)
    assert not (tmp_path / "run").exists()


def test_a_script_trains_evaluates_and_resumes_through_the_api(tmp_path, tiny_vl, capsys):
    def brevity(completions, **kwargs):                  # a closure: no import path
        return [1.0 - min(len(c), 30) / 30 for c in completions]

    run = tmp_path / "run"
    ds = _dataset()
    logged, ended = [], []

    class Ended:
        def on_log(self, step, metrics):
            logged.append((step, metrics.get("reward/mean")))

        def on_train_end(self, summary):
            ended.append(summary)

    trainer = GRPOTrainer(model=str(tiny_vl), reward_funcs=[accuracy, (brevity, 0.5)],
                          train_dataset=ds, eval_dataset=ds.select(range(2)), args=_args(run),
                          callbacks=[Ended()])
    summary = trainer.train()
    assert summary == json.loads((run / "summary.json").read_text())      # what the CLI writes
    assert summary["steps"] == 2 and summary["train_rows"] == 6 and summary["eval_rows"] == 2
    assert [s for s, _ in logged] == [0, 1, 2] and ended == [summary]
    rows = read_metrics(run / "metrics.jsonl")
    assert {"reward/accuracy", "reward/brevity"} <= set(rows[-1])
    saved = load_config(run / "config.yaml")                # recorded by import path where it has one
    assert [(r["name"].rpartition(":")[2], r["weight"]) for r in saved.rewards] == \
        [("accuracy", 1.0), ("brevity", 0.5)]
    assert saved.rewards[0]["name"].endswith("test_api:accuracy")
    assert saved.rewards[1]["name"] == "python:brevity"
    examples = load_dataset(saved.data.train)               # the run's own copy of the data
    assert [e.answer for e in examples] == ds["solution"]
    assert np.array_equal(np.asarray(Image.open(examples[3].images[0]).convert("RGB")),
                          np.asarray(_image(3)))

    figures = trainer.evaluate()
    assert figures["eval/n"] == 2 and 0.0 <= figures["eval/accuracy"] <= 1.0

    from mmrlvr.cli import main                              # the CLI cannot load the closure
    assert main(["train", "--resume", str(run), "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert "python:brevity" in err and "GRPOTrainer.resume" in err and "Traceback" not in err

    with pytest.raises(ConfigError, match="brevity"):        # asked for, by name
        GRPOTrainer.resume(run, reward_funcs=[accuracy], overrides=["train.steps=3"])
    resumed = GRPOTrainer.resume(run, reward_funcs=[accuracy, brevity], overrides=["train.steps=3"])
    assert resumed.train()["steps"] == 3
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
    assert [r["name"] for r in load_config(run / "config.yaml").rewards] == \
        [r["name"] for r in saved.rewards]                   # still the same rewards, weights


def test_a_raising_callable_reward_is_scored_zero_and_counted(tmp_path, tiny_vl):
    calls = itertools.count()

    def flaky(completions, **kwargs):                    # raises on every other group
        if next(calls) % 2:
            raise RuntimeError("my reward bug")
        return [0.5] * len(completions)

    run = tmp_path / "run"
    summary = GRPOTrainer(model=str(tiny_vl), reward_funcs=[accuracy, flaky], train_dataset=_dataset(),
                          args=_args(run, steps=2, **{"train.save_every": 0})).train()
    assert summary["steps"] == 2                             # the run went on
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["reward/flaky/failed_error"] for r in rows] == [0.5, 0.5]
    errors = (run / "reward_errors.jsonl").read_text()
    assert "my reward bug" in errors and "flaky" in errors


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    _image(i).save(buf, format="PNG")
    return buf.getvalue()


def test_every_kind_of_dataset_reaches_the_run_dir_with_its_media(tmp_path, monkeypatch):
    import pandas as pd

    from mmrlvr.api_data import write_dataset, write_eval

    monkeypatch.chdir(tmp_path)                              # relative paths: the script's dir
    _image(2).save(tmp_path / "two.png")
    rows = [{"prompt": "<image>Count (0)", "image": _image(0), "solution": "1"},
            {"prompt": "<image>Count (1)", "image": _png(1), "solution": "2"},
            {"prompt": "<image>Count (2)", "image": "two.png", "solution": "3"},
            {"prompt": "<image>Count (3)", "image": {"bytes": _png(3), "path": None}, "solution": "4"}]
    pil = [{**r, "image": _image(i)} for i, r in enumerate(rows)]
    kinds = {"list": rows, "dataframe": pd.DataFrame(rows),
             "columns": {k: [r[k] for r in rows] for k in rows[0]},
             "datasetdict": datasets.DatasetDict({"train": datasets.Dataset.from_list(pil)}),
             "iterable": datasets.Dataset.from_list(pil).to_iterable_dataset()}
    for kind, data in kinds.items():
        path = write_dataset(data, tmp_path / kind / "train.jsonl", kind, limit=4)
        examples = load_dataset(path)
        assert [e.answer for e in examples] == ["1", "2", "3", "4"], kind
        for i, ex in enumerate(examples):
            assert np.array_equal(np.asarray(Image.open(ex.images[0]).convert("RGB")),
                                  np.asarray(_image(i))), (kind, i)
    pil = [{**r, "image": _image(i)} for i, r in enumerate(rows)]
    sets = write_eval(datasets.DatasetDict({"a": datasets.Dataset.from_list(pil[:2]),
                                            "b": datasets.Dataset.from_list(pil[2:])}), tmp_path / "ev")
    assert sorted(sets) == ["a", "b"] and len(load_dataset(sets["b"])) == 2
    clip = {"prompt": "<audio>Which tone is higher?", "answer": "A",
            "audios": [{"array": np.sin(np.arange(1600) / 3.0).astype(np.float32),
                        "sampling_rate": 16000}]}
    audio = load_dataset(write_dataset([clip], tmp_path / "audio" / "train.jsonl", "audio"))
    assert audio[0].audios[0].endswith(".wav")
    with pytest.raises(Exception, match="row 0.*sample rate"):
        write_dataset([{**clip, "audios": [np.zeros(10)]}], tmp_path / "bad.jsonl", "bad")


def test_objects_in_a_config_are_taken_as_the_trainers_arguments(tmp_path, tiny_vl):
    """The issue's first try: Config() with a Dataset in data.train and a function in rewards
    (a RepresenterError before); a loaded model is saved into the run dir."""
    from mmrlvr.train.policy import load_processor

    from transformers import AutoModelForImageTextToText

    cfg = _args(tmp_path / "run")
    cfg.data.train = _dataset(4)
    cfg.rewards = [{"name": accuracy, "weight": 2.0}]
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl)
    trainer = GRPOTrainer(model=model, processing_class=load_processor(str(tiny_vl)), args=cfg)
    trainer._prepare()
    assert trainer.args.rewards[0]["weight"] == 2.0
    assert trainer.args.rewards[0]["name"].endswith(":accuracy")
    assert len(load_dataset(trainer.args.data.train)) == 4
    assert (Path(trainer.args.model.path) / "config.json").is_file()
    assert Path(trainer.args.model.path).parent == tmp_path / "run"


def test_the_warm_start_runs_through_sft_trainer_with_callbacks(tmp_path, tiny_vl):
    ds = _dataset(4).add_column("reasoning", ["I count the squares."] * 4)
    losses, ended = [], []

    class Ended:                                     # GRPOTrainer's protocol, the same hooks
        def on_log(self, step, metrics):
            losses.append((step, metrics["sft/loss"]))

        def on_train_end(self, summary):
            ended.append(summary)

    sft = SFTTrainer(model=str(tiny_vl), train_dataset=ds,
                     args=_args(tmp_path / "run", **{"sft.steps": 2, "sft.batch_size": 2,
                                                     "sft.out_dir": tmp_path / "sft"}),
                     callbacks=[Ended()])
    summary = sft.train()
    assert summary["steps"] == 2 and summary["train_rows"] == 4
    assert (sft.model_dir / "config.json").is_file()
    rows = read_metrics(tmp_path / "sft" / "metrics.jsonl")
    assert losses == [(r["step"], r["sft/loss"]) for r in rows] and [s for s, _ in losses] == [1, 2]
    assert ended == [summary]


def test_a_peft_lora_config_trains_the_adapters_alone_as_model_lora_does(tmp_path, tiny_vl):
    """TRL's peft_config=LoraConfig(...) is read into model.lora: the run is bit for bit the one
    the same model.lora in the config makes, and only the adapters train (the merged final
    model differs from the start in the targeted projections alone)."""
    import peft
    import torch
    from transformers import AutoModelForImageTextToText

    keys = {"optim.lr": 1e-3, "train.save_every": 0}
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    runs = {"peft": tmp_path / "peft", "keys": tmp_path / "keys"}
    GRPOTrainer(model=str(tiny_vl), reward_funcs=[accuracy, brief], train_dataset=_dataset(4),
                args=_args(runs["peft"], **keys), peft_config=lora).train()
    GRPOTrainer(model=str(tiny_vl), reward_funcs=[accuracy, brief], train_dataset=_dataset(4),
                args=_args(runs["keys"], **keys, **{"model.lora.r": 4, "model.lora.alpha": 8,
                                                   "model.lora.target_modules": "[q_proj,v_proj]"})
                ).train()
    rows = {k: [{m: v for m, v in r.items() if not m.startswith(("time/", "perf/"))}
                for r in read_metrics(run / "metrics.jsonl")] for k, run in runs.items()}
    assert rows["peft"] == rows["keys"] and "loss/policy" in rows["peft"][-1]
    assert load_config(runs["peft"] / "config.yaml").model.lora == \
        load_config(runs["keys"] / "config.yaml").model.lora
    start = AutoModelForImageTextToText.from_pretrained(tiny_vl).state_dict()
    final = AutoModelForImageTextToText.from_pretrained(runs["peft"] / "final").state_dict()
    moved = {k for k in start if not torch.equal(start[k], final[k])}
    assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved), moved
    assert (runs["peft"] / "final" / "adapter" / "adapter_config.json").is_file()


def test_a_peft_config_mmrlvr_cannot_build_is_one_error(tiny_vl):
    import peft

    def trainer(config):
        return GRPOTrainer(model=str(tiny_vl), reward_funcs=[accuracy], train_dataset=_dataset(2),
                           peft_config=config)

    with pytest.raises(ConfigError, match=r"use_dora=True .*; bias='all'|bias='all' .*use_dora=True"):
        trainer(peft.LoraConfig(r=4, use_dora=True, bias="all"))
    with pytest.raises(ConfigError, match="peft_config is IA3Config .*mmrlvr trains LoRA only"):
        trainer(peft.IA3Config())
    with pytest.raises(ConfigError, match="target_modules='all-linear': give a list"):
        SFTTrainer(model=str(tiny_vl), train_dataset=_dataset(2),
                   peft_config=peft.LoraConfig(target_modules="all-linear"))
    cfg = trainer(peft.LoraConfig(r=2, task_type="CAUSAL_LM")).args.model.lora
    assert (cfg.r, cfg.alpha, cfg.target_modules) == (2, 8, ["auto"])   # peft's alpha; None: auto
