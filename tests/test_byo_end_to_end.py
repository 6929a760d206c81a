"""A TRL, an EasyR1 and an ms-swift user each bring their dataset and their reward code as their
trainer has them, name them in a config, and `train` runs GRPO steps on a tiny real Qwen2.5-VL:
the rewards see the dataset's own columns, and their scores are what the run logs."""
from __future__ import annotations

import io
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from mmrlvr.config import load_config
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.trainer import train

pytestmark = pytest.mark.filterwarnings("ignore::mmrlvr.data.DataWarning")

# Each reward also appends what it was given to calls.jsonl, so the test sees what a user's
# function really received inside the run (rewards run isolated, possibly in another thread).
TRL_REWARDS = '''
import json, os

def _log(name, **seen):
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({"fn": name, **seen}) + "\\n")

def accuracy_reward(completions, solution, **kwargs):
    _log("accuracy_reward", n=len(completions), solution=solution,
         difficulty=kwargs.get("difficulty"), conversational=isinstance(completions[0], list))
    texts = [c[0]["content"] for c in completions]
    return [float(s.strip("$") in t) for t, s in zip(texts, solution)]

def length_reward(completions, **kwargs):
    _log("length_reward", n=len(completions))
    return [min(len(c[0]["content"]), 30) / 30.0 for c in completions]
'''

EASYR1_REWARD = '''
import json, os, re
from typing import Any

def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({"fn": "compute_score", "format_weight": format_weight,
                             "keys": sorted(reward_inputs[0]),
                             "truths": sorted({r["ground_truth"] for r in reward_inputs})}) + "\\n")
    scores = []
    for r in reward_inputs:
        fmt = 1.0 if re.search(r"<answer>.*</answer>", r["response"], re.DOTALL) else 0.0
        acc = 1.0 if r["ground_truth"] in r["response"] else 0.0
        length = min(r["response_length"], 20) / 20.0
        scores.append({"overall": (1 - format_weight) * acc + format_weight * fmt + 0.1 * length,
                       "format": fmt, "accuracy": acc})
    return scores
'''

SWIFT_PLUGIN = '''
import json, os

class ORM:      # ms-swift's base class, as a plugin file imports it
    def __call__(self, completions, **kwargs):
        raise NotImplementedError

class CountAccuracy(ORM):
    def __call__(self, completions, solution, **kwargs):
        with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as fh:
            fh.write(json.dumps({"fn": "CountAccuracy", "solution": solution,
                                 "has_messages": "messages" in kwargs}) + "\\n")
        return [float(s in c) + min(len(c), 25) / 100.0 for c, s in zip(completions, solution)]
'''


def _image(i: int) -> Image.Image:
    return Image.new("RGB", (56 + 8 * (i % 3), 56), (40 * i % 255, 120, 200 - 20 * (i % 5)))


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    _image(i).save(buf, format="PNG")
    return buf.getvalue()


def _train(tmp_path: Path, tiny_vl: Path, data: str, rewards: list[dict]) -> tuple[list[dict], list[dict]]:
    cfg = {
        "model": {"path": str(tiny_vl), "min_pixels": 3136, "max_pixels": 4096},
        "data": {"train": data, "eval": ""},
        "rollout": {"group_size": 4, "max_new_tokens": 10, "temperature": 1.0},
        "optim": {"lr": 1e-3},
        "train": {"steps": 2, "batch_prompts": 2, "micro_batch": 8, "save_every": 0,
                  "out_dir": str(tmp_path / "run"), "seed": 1},
        "rewards": rewards,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    train(load_config(tmp_path / "config.yaml"), progress=False)
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return metrics, calls


def _reward_keys(row: dict) -> set[str]:
    return {k for k in row if k.startswith("reward/")}


def test_a_trl_user_trains_on_their_saved_dataset_with_their_reward_functions(tmp_path, tiny_vl):
    n = 6
    datasets.Dataset.from_dict({
        "prompt": [[{"role": "system", "content": [{"type": "text", "text": "Answer in <answer> tags."}]},
                    {"role": "user", "content": [{"type": "image"},
                                                 {"type": "text", "text": f"How many squares? ({i})"}]}]
                   for i in range(n)],
        "image": [_image(i) for i in range(n)],
        "solution": [f"${i % 4 + 1}$" for i in range(n)],
        "difficulty": [i % 2 for i in range(n)],
    }).save_to_disk(str(tmp_path / "trl_ds"))
    (tmp_path / "my_rewards.py").write_text(TRL_REWARDS)

    metrics, calls = _train(tmp_path, tiny_vl, str(tmp_path / "trl_ds"), [
        {"name": f"{tmp_path / 'my_rewards.py'}:accuracy_reward", "weight": 1.0},
        {"name": f"{tmp_path / 'my_rewards.py'}:length_reward", "weight": 0.5}])

    assert [r["step"] for r in metrics if "reward/mean" in r] == [1, 2]
    acc = [c for c in calls if c["fn"] == "accuracy_reward"]
    assert len(acc) == 2 * 2 and {c["n"] for c in acc} == {4}           # a call per group
    assert all(c["conversational"] for c in acc)                        # chat in, chat out, as in TRL
    for c in acc:                                                       # the row's own columns
        assert len(set(c["solution"])) == 1 and c["solution"][0] in {"$1$", "$2$", "$3$", "$4$"}
        assert c["difficulty"][0] in (0, 1)
    assert len([c for c in calls if c["fn"] == "length_reward"]) == 4
    row = metrics[-1]
    assert len(_reward_keys(row) - {"reward/mean", "reward/std"}) >= 2, _reward_keys(row)
    assert 0.0 < row["reward/mean"] <= 1.5                              # the length reward is > 0


def test_an_easyr1_user_trains_on_geometry3k_parquet_with_compute_score(tmp_path, tiny_vl):
    n = 6
    (tmp_path / "geo3k").mkdir()
    pq.write_table(pa.table({
        "images": [[{"bytes": _png(i), "path": None}] for i in range(n)],
        "problem": [f"<image>Find x in figure {i}." for i in range(n)],
        "answer": [str(10 + i) for i in range(n)]}), tmp_path / "geo3k" / "train-00000-of-00001.parquet")
    (tmp_path / "math.py").write_text(EASYR1_REWARD)

    metrics, calls = _train(tmp_path, tiny_vl, f"{tmp_path / 'geo3k'}@train", [
        {"name": f"{tmp_path / 'math.py'}:compute_score", "format_weight": 0.2}])

    assert [r["step"] for r in metrics if "reward/mean" in r] == [1, 2]
    assert calls and all(c["format_weight"] == 0.2 for c in calls)     # the config's argument
    assert {"response", "response_length", "ground_truth"} <= set(calls[0]["keys"])
    truths = {t for c in calls for t in c["truths"]}
    assert truths and truths <= {str(10 + i) for i in range(n)}
    assert metrics[-1]["reward/mean"] > 0.0                             # the length term


def test_an_ms_swift_user_trains_on_their_jsonl_with_their_orm_plugin(tmp_path, tiny_vl):
    rows = []
    for i in range(6):
        _image(i).save(tmp_path / f"img{i}.png")
        rows.append({"messages": [{"role": "user", "content": "<image>How many circles?"},
                                  {"role": "assistant", "content": f"<answer>{i % 3 + 1}</answer>"}],
                     "images": [f"img{i}.png"], "solution": str(i % 3 + 1)})
    (tmp_path / "swift.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "plugin.py").write_text(SWIFT_PLUGIN)

    metrics, calls = _train(tmp_path, tiny_vl, str(tmp_path / "swift.jsonl"), [
        {"name": f"{tmp_path / 'plugin.py'}:CountAccuracy"}])

    assert [r["step"] for r in metrics if "reward/mean" in r] == [1, 2]
    assert calls and all(c["has_messages"] for c in calls)
    assert {s for c in calls for s in c["solution"]} <= {"1", "2", "3"}
    assert metrics[-1]["reward/mean"] > 0.0
