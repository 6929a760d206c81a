"""StructReward (+ rollout recycling) against plain GRPO on the CPU shapes task, side by side.

Unless --sft-model is given, builds under --out: a shapes dataset (`mmrlvr.tasks.shapes`, rows
with reference `steps`), a tiny Qwen2.5-VL whose tokenizer learnt the data's words
(`mmrlvr.tiny`) and a short SFT warm start (`mmrlvr.train.sft`). Then two GRPO runs from that one
model with equal budgets (same steps, prompts, group size, seed, data order):

    plain         configs/shapes_structreward_cpu.yaml with the quickstart's rewards
                  (accuracy 0.9 + format 0.1) and no objectives, plus struct_steps at weight 0
                  so r_proc is logged: a weight-0 reward adds exactly 0.0, the update is plain
                  GRPO's value for value;
    structreward  the config as shipped: struct_steps (hard gate, λ 0.5) + recycling.

It prints the training accuracy and r_proc of both runs step by step (trailing mean over
--smooth steps), held-out accuracy where the runs evaluated, then held-out greedy accuracy,
format rate and r_proc of the start model and of both final models; everything also goes to
OUT/compare.json.

    python bench/structreward_compare.py --steps 2 --sft-steps 2 --n-train 64 --n-test 16 \\
        --image-size 56                                                 # smoke run
    python bench/structreward_compare.py --steps 150 --sft-steps 100 --out runs/structreward_compare

What it leaves out: several seeds (short runs on this task differ by a few points between
seeds), and the GPU recipe (configs/structreward_qwen25vl7b.yaml).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

import modalities
from mmrlvr.config import load_config
from mmrlvr.data import load_dataset
from mmrlvr.train.evaluate import evaluate
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.policy import Policy
from mmrlvr.rollout import make_engine
from mmrlvr.train.sft import sft
from mmrlvr.tiny import build_tiny
from mmrlvr.train.trainer import train
from mmrlvr.tasks.shapes import make_shapes
from mmrlvr.methods.structreward.steps import StructStepsReward

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "shapes_structreward_cpu.yaml"
PLAIN_REWARDS = [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1},
                 {"name": "struct_steps", "weight": 0.0}]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="work dir (default: a fresh temp dir)")
    p.add_argument("--config", default=str(CONFIG), help="the StructReward run config")
    p.add_argument("--sft-model", default=None, help="start from this model (skips the build)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per run [config's]")
    p.add_argument("--batch-prompts", type=int, default=None, help="prompts per step [config's]")
    p.add_argument("--eval-every", type=int, default=None, help="held-out eval interval [config's]")
    p.add_argument("--eval-limit", type=int, default=0, help="held-out rows used (0 = all)")
    p.add_argument("--sft-steps", type=int, default=100, help="warm-start SFT steps")
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-test", type=int, default=200)
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--smooth", type=int, default=10, help="trailing mean window for the curves")
    p.add_argument("--rows", type=int, default=15, help="about how many curve rows to print")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def prepare(args, out: Path) -> tuple[Path, Path]:
    """Shapes data and, unless --sft-model, tiny model + SFT; returns (start model, data dir)."""
    data = out / "shapes"
    if not (data / "train.jsonl").exists():
        make_shapes(data, n_train=args.n_train, n_test=args.n_test, seed=args.seed,
                    image_size=args.image_size)
    if args.sft_model:
        return Path(args.sft_model), data
    tiny, sft_dir = out / "tiny-qwen25vl", out / "sft"
    if not (tiny / "config.json").exists():
        corpus = [f"{ex.prompt} <think>{ex.reasoning or ''}</think><answer>{ex.answer}</answer>"
                  for ex in load_dataset(str(data / "train.jsonl"))]
        build_tiny("qwen2.5-vl", tiny, extra_corpus=corpus)
    if not (sft_dir / "final" / "config.json").exists():
        cfg = load_config(args.config, [f"data.train={data / 'train.jsonl'}", "data.eval=",
                                        f"sft.init={tiny}", f"sft.steps={args.sft_steps}",
                                        f"sft.out_dir={sft_dir}", f"train.seed={args.seed}"])
        print(f"SFT warm start: {args.sft_steps} steps ...", flush=True)
        sft(cfg, progress=False, overwrite=True)
    return sft_dir / "final", data


def run_config(args, arm: str, start: Path, data: Path, out: Path):
    overrides = [f"model.path={start}", f"data.train={data / 'train.jsonl'}",
                 f"data.eval={data / 'test.jsonl'}", f"data.eval_limit={args.eval_limit}",
                 f"train.out_dir={out / arm}", "train.save_every=0", f"train.seed={args.seed}",
                 f"train.threads={args.threads}"]
    for key, value in (("train.steps", args.steps), ("train.batch_prompts", args.batch_prompts),
                       ("train.eval_every", args.eval_every)):
        if value is not None:
            overrides.append(f"{key}={value}")
    cfg = load_config(args.config, overrides)
    if arm == "plain":
        cfg.rewards, cfg.objectives = [dict(r) for r in PLAIN_REWARDS], []
    return cfg


def held_out(cfg, model: Path, test) -> dict[str, float]:
    """Greedy accuracy, format rate and r_proc (StructReward's matcher) of `model`."""
    adapter = modalities.get("vision", min_pixels=cfg.model.min_pixels,
                             max_pixels=cfg.model.max_pixels)
    policy = Policy.load(cfg.model, adapter, torch.device("cpu"), path=str(model))
    res = evaluate(policy, make_engine("hf", policy), test,
                   max_new_tokens=cfg.rollout.max_new_tokens, batch_size=cfg.train.eval_batch,
                   keep_predictions=True)
    by_id = {ex.id: ex for ex in test}
    reward = StructStepsReward()
    r_proc = [reward.score(by_id[p["id"]], [p["completion"]])[0]["r_proc"]
              for p in res["predictions"]]
    return {"accuracy": res["accuracy"], "format_rate": res["format_rate"],
            "r_proc": float(np.mean(r_proc))}


def curve(rows: list[dict], key: str, window: int) -> dict[int, float]:
    out, seen = {}, []
    for r in rows:
        if r.get(key) is not None:
            seen.append(r[key])
            out[r["step"]] = float(np.mean(seen[-window:]))
    return out


def fmt(value) -> str:
    return f"{value:.3f}" if value is not None else "  -  "


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="structreward_compare-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {out}", flush=True)
    start, data = prepare(args, out)
    runs: dict[str, dict] = {}
    for arm in ("plain", "structreward"):
        cfg = run_config(args, arm, start, data, out)
        print(f"{arm}: {cfg.train.steps} steps x {cfg.train.batch_prompts} prompts x "
              f"G {cfg.rollout.group_size} ...", flush=True)
        t0 = time.perf_counter()
        train(cfg, progress=False, overwrite=True)
        rows = read_metrics(out / arm / "metrics.jsonl")
        runs[arm] = {"cfg": cfg, "rows": rows, "seconds": time.perf_counter() - t0}

    test = load_dataset(str(data / "test.jsonl"))
    if args.eval_limit:
        test = test[:args.eval_limit]
    cfg = runs["structreward"]["cfg"]
    print("held-out (greedy) ...", flush=True)
    final = {"start": held_out(cfg, start, test),
             **{arm: held_out(cfg, out / arm / "final", test) for arm in runs}}

    keys = {"acc": "reward/accuracy", "r_proc": "reward/struct_steps/r_proc",
            "eval": "eval/accuracy"}
    curves = {arm: {name: curve(r["rows"], key, 1 if name == "eval" else args.smooth)
                    for name, key in keys.items()} for arm, r in runs.items()}
    steps = sorted({s for arm in curves.values() for c in arm.values() for s in c})
    every = max(1, len(steps) // max(args.rows, 1))
    shown = [s for i, s in enumerate(steps) if i % every == 0 or s == steps[-1]
             or any(s in curves[a]["eval"] for a in curves)]
    print(f"\ntraining curves (trailing mean over {args.smooth} steps; eval = held-out greedy)")
    print(f"{'step':>5} | {'acc plain':>9} {'acc SR':>7} | {'r_proc plain':>12} {'r_proc SR':>9}"
          f" | {'eval plain':>10} {'eval SR':>7}")
    for s in shown:
        p, q = curves["plain"], curves["structreward"]
        print(f"{s:>5} | {fmt(p['acc'].get(s)):>9} {fmt(q['acc'].get(s)):>7} | "
              f"{fmt(p['r_proc'].get(s)):>12} {fmt(q['r_proc'].get(s)):>9} | "
              f"{fmt(p['eval'].get(s)):>10} {fmt(q['eval'].get(s)):>7}")

    recycled = out / "structreward" / "recycled.jsonl"
    n_recycled = sum(1 for _ in recycled.open()) if recycled.exists() else 0
    print(f"\nheld-out, {len(test)} questions    accuracy  format  r_proc   run s")
    for name, res in final.items():
        secs = f"{runs[name]['seconds']:7.0f}" if name in runs else "      -"
        print(f"  {name:<28} {res['accuracy']:8.3f} {res['format_rate']:7.3f} "
              f"{res['r_proc']:7.3f} {secs}")
    print(f"recycled instances trained: {n_recycled} ({recycled})")
    summary = {"held_out": final, "curves": {a: {k: {str(s): v for s, v in c.items()}
                                                 for k, c in cs.items()}
                                             for a, cs in curves.items()},
               "seconds": {a: r["seconds"] for a, r in runs.items()},
               "recycled_instances": n_recycled, "start_model": str(start)}
    (out / "compare.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'compare.json'}")


if __name__ == "__main__":
    main()
