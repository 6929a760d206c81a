"""The GRPO loop end to end on a tiny Qwen2.5-VL: run dir contents, determinism, kill -9 + resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mmrlvr.train.checkpoint import MARKER, latest_checkpoint
from mmrlvr.config import load_config, resolve_model_defaults
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.trainer import train

# Wall-clock figures differ between runs by nature; everything else must match exactly.
VOLATILE = ("time/", "perf/")

SLOW_REWARD = '''
import time
from pathlib import Path
SLOW = Path(__file__).with_name("slow.flag")
def slow_len(example, completion):
    if SLOW.exists():      # keeps each step long enough for the test to kill the run mid-way
        time.sleep(0.15)
    return min(len(completion), 40) / 40.0
'''


def write_config(tmp_path: Path, tiny_vl: Path, shapes_dir: Path, name: str, **sections) -> Path:
    cfg = {
        "model": {"path": str(tiny_vl)},
        "data": {"train": str(shapes_dir / "train.jsonl"), "eval": str(shapes_dir / "test.jsonl"),
                 "eval_limit": 8},
        "rollout": {"group_size": 4, "max_new_tokens": 12, "temperature": 1.0},
        "optim": {"lr": 1e-3},
        "train": {"steps": 4, "batch_prompts": 4, "micro_batch": 8, "save_every": 2,
                  "out_dir": str(tmp_path / name), "seed": 3},
        # a length-shaped reward gives non-zero spread even for random weights
        "rewards": [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1},
                    {"name": str(tmp_path / "shaped.py") + ":length", "weight": 0.5}],
    }
    (tmp_path / "shaped.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 40) / 40.0\n")
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def test_train_writes_a_complete_run_dir(tmp_path, tiny_vl, shapes_dir):
    cfg = load_config(write_config(tmp_path, tiny_vl, shapes_dir, "run"))
    summary = train(cfg, progress=False)
    run = Path(cfg.train.out_dir)
    assert (run / "config.yaml").is_file()
    assert load_config(run / "config.yaml") == resolve_model_defaults(cfg)   # what it ran with
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    required = ["reward/mean", "reward/std", "reward/accuracy", "reward/format", "reward/zero_spread_frac",
                "loss/clip_frac", "policy/entropy", "response/length_mean", "rollout/logprob_gap",
                "time/rollout_s", "time/reward_s", "time/update_s", "perf/rollout_tokens_per_s"]
    for key in required:
        assert all(key in r for r in rows[1:]), key
    assert rows[2]["rollout/logprob_gap"] < 1e-3     # same weights sample and recompute
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[-1]
    for step, row in ((0, rows[0]), (4, rows[-1])):    # each question's outcome, for `compare`
        records = [json.loads(ln) for ln in (run / "eval" / f"step-{step}.jsonl").read_text().splitlines()]
        assert len(records) == 8 and len({r["id"] for r in records}) == 8
        assert sum(r["correct"] for r in records) / 8 == row["eval/accuracy"]
    assert list(run.glob("tb/events.out.tfevents.*"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert (run / "checkpoints" / "step-4" / MARKER).is_file()
    assert (run / "report.md").read_text().count("plots/") >= 3
    assert (run / "plots" / "reward.png").stat().st_size > 1000
    saved = json.loads((run / "summary.json").read_text())
    assert saved["accuracy_start"] == rows[0]["eval/accuracy"]
    assert saved["accuracy_end"] == rows[-1]["eval/accuracy"] == summary["accuracy_end"]

    from transformers import AutoModelForImageTextToText, AutoProcessor
    model = AutoModelForImageTextToText.from_pretrained(run / "checkpoints" / "step-4")
    AutoProcessor.from_pretrained(run / "final")
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"


def test_same_seed_same_metrics(tmp_path, tiny_vl, shapes_dir):
    runs = []
    for name in ("a", "b"):
        cfg = load_config(write_config(tmp_path, tiny_vl, shapes_dir, name,
                                       train={"steps": 3, "save_every": 0}))
        train(cfg, progress=False)
        runs.append(stable(read_metrics(Path(cfg.train.out_dir) / "metrics.jsonl")))
    assert runs[0] == runs[1]
    assert runs[0][1]["reward/mean"] != runs[0][2]["reward/mean"] or \
        runs[0][1]["loss/policy"] != runs[0][2]["loss/policy"]


def test_lora_run_saves_merged_hf_model(tmp_path, tiny_vl, shapes_dir):
    cfg = load_config(write_config(tmp_path, tiny_vl, shapes_dir, "lora",
                                   model={"lora": {"r": 4, "alpha": 8}},
                                   train={"steps": 2, "save_every": 0},
                                   algo={"beta": 0.04}))
    train(cfg, progress=False)
    run = Path(cfg.train.out_dir)
    rows = read_metrics(run / "metrics.jsonl")
    assert all("loss/kl" in r for r in rows[1:])
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_pretrained(run / "final")
    assert not any("lora" in k for k in model.state_dict())
    assert (run / "final" / "adapter" / "adapter_config.json").is_file()


def _cli(*args, cwd=None):
    return [sys.executable, "-m", "mmrlvr.cli", *args]


def test_kill_9_then_resume_continues_identically(tmp_path, tiny_vl, shapes_dir):
    (tmp_path / "slow.py").write_text(SLOW_REWARD)
    common = dict(train={"steps": 6, "save_every": 2},
                  rewards=[{"name": "accuracy", "weight": 1.0},
                           {"name": str(tmp_path / "slow.py") + ":slow_len", "weight": 0.5}])
    ref_cfg = write_config(tmp_path, tiny_vl, shapes_dir, "uninterrupted", **common)
    subprocess.run(_cli("train", str(ref_cfg)), check=True, capture_output=True)
    reference = stable(read_metrics(tmp_path / "uninterrupted" / "metrics.jsonl"))

    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "killed", **common)
    run = tmp_path / "killed"
    (tmp_path / "slow.flag").touch()          # only the run to be killed is slowed down
    proc = subprocess.Popen(_cli("train", str(cfg)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
        if steps and max(steps) >= 3:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (tmp_path / "slow.flag").unlink()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert latest_checkpoint(run).name in ("step-2", "step-4")
    # a save cut short by the kill must never be picked up
    (run / "checkpoints" / ".tmp-step-5").mkdir()
    (run / "checkpoints" / "step-5").mkdir()

    out = subprocess.run(_cli("train", "--resume", str(run)), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    resumed = stable(read_metrics(run / "metrics.jsonl"))
    assert [r["step"] for r in resumed] == list(range(7))
    assert resumed == reference
    assert not (run / "checkpoints" / ".tmp-step-5").exists()


@pytest.mark.parametrize("override, message", [
    ("train.stepz=3", "train.steps"),
    ("algo.loss_agg=mean", "algo.loss_agg"),
])
def test_bad_config_is_a_clear_error(tmp_path, tiny_vl, shapes_dir, override, message):
    cfg = write_config(tmp_path, tiny_vl, shapes_dir, "bad")
    out = subprocess.run(_cli("train", str(cfg), override), capture_output=True, text=True)
    assert out.returncode == 2
    assert message in out.stderr


def test_model_dir_without_processor_is_a_clear_error(tmp_path, tiny_vl, shapes_dir):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        (bare / f).write_bytes((Path(tiny_vl) / f).read_bytes())
    cfg = write_config(tmp_path, bare, shapes_dir, "noproc")
    out = subprocess.run(_cli("train", str(cfg)), capture_output=True, text=True)
    assert out.returncode == 2
    assert "has no processor" in out.stderr and str(bare) in out.stderr


def test_data_on_error_skip_counts_bad_rows(tmp_path, tiny_vl, shapes_dir):
    rows = (shapes_dir / "train.jsonl").read_text().splitlines()[:12]
    rows.insert(3, json.dumps({"id": "no-answer", "prompt": "q", "images": []}))
    rows.insert(5, json.dumps({"id": "lost", "prompt": "q", "answer": "1", "images": ["missing.png"]}))
    bad = shapes_dir / "with_bad_rows.jsonl"
    bad.write_text("\n".join(rows) + "\n")
    cfg_path = write_config(tmp_path, tiny_vl, shapes_dir, "skip", train={"steps": 1, "save_every": 0},
                            data={"train": str(bad), "eval": ""})
    out = subprocess.run(_cli("train", str(cfg_path)), capture_output=True, text=True)
    assert out.returncode == 2 and "row 4" in out.stderr and "answer" in out.stderr
    cfg = load_config(cfg_path, ["data.on_error=skip"])
    train(cfg, progress=False)
    metrics = read_metrics(tmp_path / "skip" / "metrics.jsonl")
    assert metrics[-1]["data/skipped_rows"] == 2
