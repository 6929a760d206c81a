"""The clip task's calls (docs/tools.md, "The clip task"): greedy held-out trajectories of a
model trained with `clip`, and how many of their calls name the segment the question asks about
(eval records keep only the final turn, so the calls are counted here).

    python bench/clip_calls.py runs/ccmp/tools-s0/final runs/clip/test.jsonl
"""
from __future__ import annotations

import argparse
import collections
import json
import warnings


def main() -> None:
    import torch

    import modalities
    from mmrlvr.config import load_config
    from mmrlvr.data.loading import load_jsonl
    from mmrlvr.rollout import SamplingParams, make_engine
    from mmrlvr.rollout.multiturn import MultiTurnEngine
    from mmrlvr.tools import build_runner
    from mmrlvr.train.policy import Policy

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--config", default="configs/clip_tools_cpu.yaml")
    args = ap.parse_args()
    warnings.simplefilter("ignore")          # every prompt's recording is cut: that is the task
    torch.set_num_threads(1)
    cfg = load_config(args.config, [f"model.path={args.model}"])
    policy = Policy.load(cfg.model, modalities.get("audio"), torch.device("cpu"))
    engine = MultiTurnEngine(make_engine("hf", policy), policy, build_runner(cfg.rollout.tools),
                             cfg.rollout.max_turns, cfg.rollout.max_trajectory_tokens)
    rows = load_jsonl(args.data)
    counts = collections.Counter()
    for i in range(0, len(rows), 50):
        batch = rows[i:i + 50]
        out = engine.generate(policy.adapter.encode(batch, policy.processor,
                                                    system_prompt=cfg.data.system_prompt),
                              SamplingParams(n=1, max_new_tokens=cfg.rollout.max_new_tokens,
                                             greedy=True))
        for ex, completion in zip(batch, out.texts):
            calls = completion.trajectory.calls
            counts["rows"] += 1
            counts["called"] += bool(calls)
            counts["named_the_asked_segment"] += bool(calls) and \
                calls[0].arguments == ex.meta["segment"]
    print(json.dumps(dict(counts)))


if __name__ == "__main__":
    main()
