"""Multi-turn tool rollouts under 2 real DDP processes (gloo, CPU; issue "multi-turn tools", item
4): after a one-process SFT on the zoom rows' gold trajectories, GRPO on two ranks calls the zoom
tool itself, each rank on its own prompts and with its own number of turns, and the ranks' weights
end equal."""
from __future__ import annotations

import json

import yaml

from mmrlvr.tasks.zoom import make_zoom
from tests.test_multiprocess import cli, env, run_ok, torchrun
from tests.test_zoom_task import PIXELS, VIEW
from tests.tool_warm_start import warm_start


def test_tool_rollouts_on_two_ddp_ranks_call_the_tool_and_stay_in_step(tmp_path):
    data = tmp_path / "zoom"
    make_zoom(data, n_train=4, n_test=2, seed=0, view=VIEW, families=["count"])
    common = {"model": {"min_pixels": PIXELS, "max_pixels": PIXELS},
              "data": {"train": str(data / "train.jsonl"), "eval": ""},
              "rollout": {"backend": "hf", "max_turns": 2, "tools": [{"name": "zoom"}],
                          "max_trajectory_tokens": 160, "max_new_tokens": 60},
              "rewards": [{"name": "accuracy", "weight": 0.9}, {"name": "turn_format", "weight": 0.1}]}
    warm = [f"model.min_pixels={PIXELS}", f"model.max_pixels={PIXELS}",
            f"data.train={data / 'train.jsonl'}", "rollout.max_turns=2",
            "rollout.tools=[{name: zoom}]", "rollout.max_trajectory_tokens=160",
            "rollout.max_new_tokens=60", "train.threads=1"]
    model, _ = warm_start(tmp_path, "qwen2.5-vl", data, warm, batch_size=4)
    cfg = {**common,
           "model": {**common["model"], "path": str(model)},
           "rollout": {**common["rollout"], "group_size": 2, "temperature": 0.3},
           "train": {"steps": 2, "batch_prompts": 2, "micro_batch": 4, "save_every": 0,
                     "eval_every": 0, "threads": 1, "seed": 0, "out_dir": str(tmp_path / "grpo")}}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_ok(torchrun(*cli("train", str(path))), env=env())
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp"
    assert summary["ranks_in_sync"] is True
    log = [json.loads(x) for x in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in log if "tools/calls_per_rollout" in r]
    assert len(steps) == 2 and any(r["optim/grad_norm"] > 0 for r in steps)   # a group with spread
    assert sum(r["tools/calls_per_rollout"] for r in steps) > 0       # the policy's own calls
