"""NC-GRPO α sweep on the tiny shapes task, and the latent-noise hook's rollout overhead.

Builds everything it needs under --out: a tiny random-weight Qwen2.5-VL (`mmrlvr.tiny`), a
shapes dataset (`mmrlvr.tasks.shapes`), optionally a short SFT warm start (`mmrlvr.train.sft`). Then,
from that one start model and with equal budgets (same steps, prompts, group size, seed, data
order), one GRPO run per α with `rollout.branching: {kind: latent_noise, fraction: 0.5, alpha}`.
α = 0 tags half of each group "noisy" but displaces nothing: it is plain GRPO, token for token.

Per α it prints held-out greedy accuracy and pass@k (sampled from the clean model: evaluation
never branches), training-time group diversity (distinct extracted answers per group), the
zero-spread group fraction, and the clean and noisy halves' training accuracy. Then the hook's
cost: the same prompts rolled out with and without the hook at equal token counts (EOS held off
until max_new_tokens, so both sides do the same decode work), interleaved; the overhead is
given on the fastest repetition of each side (least disturbed by other load) and on the median.

    python bench/ncgrpo_sweep.py --steps 3                  # smoke run, a few minutes on 2 cores
    python bench/ncgrpo_sweep.py --steps 150 --sft-steps 100 --image-size 112 --out runs/ncgrpo_sweep

What it leaves out: several seeds per α (the spread between seeds on this task is a few points,
so short sweeps rank α only roughly), and the GPU recipe (configs/geo3k_ncgrpo_qwen25vl7b.yaml).
"""
from __future__ import annotations

import argparse
import json
import statistics
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
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.methods.ncgrpo.branching import Branching, find_decoder, make_plan
from mmrlvr.train.sft import sft
from mmrlvr.tiny import build_tiny
from mmrlvr.train.trainer import train
from mmrlvr.tasks.shapes import make_shapes

OVERHEAD_TARGET = 5.0                       # percent (the target)
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112  # as configs/quickstart.yaml


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="work dir (default: a fresh temp dir)")
    p.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2, 0.4])
    p.add_argument("--steps", type=int, default=40, help="GRPO steps per α (equal budget)")
    p.add_argument("--sft-steps", type=int, default=40, help="warm-start SFT steps (0: none)")
    p.add_argument("--n-train", type=int, default=400)
    p.add_argument("--n-test", type=int, default=64)
    p.add_argument("--image-size", type=int, default=56)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--k", type=int, default=4, help="samples per held-out prompt for pass@k")
    p.add_argument("--site", default="last_layer_input", choices=["last_layer_input", "final_hidden"])
    p.add_argument("--noise", default="independent", choices=["independent", "shared", "antithetic"])
    p.add_argument("--reps", type=int, default=15, help="interleaved timing repetitions")
    p.add_argument("--timing-alpha", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 keeps timings steady on a shared machine)")
    return p.parse_args(argv)


def prepare(args, out: Path) -> tuple[Path, Path]:
    """Tiny model, shapes data and (optionally) the SFT warm start; returns (start model, data dir)."""
    tiny, data = out / "tiny-qwen25vl", out / "shapes"
    if not (tiny / "config.json").exists():
        build_tiny("qwen2.5-vl", tiny, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    if not (data / "train.jsonl").exists():
        make_shapes(data, n_train=args.n_train, n_test=args.n_test, seed=args.seed,
                    image_size=args.image_size)
    if args.sft_steps <= 0:
        return tiny, data
    sft_dir = out / "sft"
    if not (sft_dir / "final" / "config.json").exists():
        cfg = base_config(args, tiny, data, out / "unused")
        cfg.sft.init, cfg.sft.steps, cfg.sft.out_dir = str(tiny), args.sft_steps, str(sft_dir)
        cfg.sft.batch_size, cfg.sft.lr, cfg.data.eval = 32, 3e-3, ""
        print(f"SFT warm start: {args.sft_steps} steps ...", flush=True)
        sft(cfg, progress=False, overwrite=True)
    return sft_dir / "final", data


def base_config(args, model: Path, data: Path, out_dir: Path, branching: dict | None = None):
    cfg = load_config(None, [
        f"model.path={model}", f"model.min_pixels={MIN_PIXELS}", f"model.max_pixels={MAX_PIXELS}",
        f"data.train={data / 'train.jsonl'}", f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=1.0",
        f"optim.lr={args.lr}", "optim.warmup_steps=0", f"train.steps={args.steps}",
        f"train.batch_prompts={args.batch_prompts}", "train.micro_batch=64",
        f"train.seed={args.seed}", f"train.threads={args.threads}", f"train.out_dir={out_dir}"])
    if branching is not None:
        cfg.rollout.branching = branching
    return cfg


def branching_for(args, alpha: float) -> dict:
    return {"kind": "latent_noise", "fraction": 0.5, "alpha": alpha, "site": args.site,
            "noise": args.noise}


def held_out(args, model: Path, test) -> dict:
    """Greedy accuracy and pass@k of `model`, sampled from the clean model (no branching)."""
    policy = Policy.load(load_config(None, [f"model.path={model}"]).model,
                         modalities.get("vision", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
                         torch.device("cpu"))
    torch.manual_seed(args.seed)
    res = evaluate(policy, make_engine("hf", policy), test, max_new_tokens=args.max_new_tokens,
                   batch_size=32, samples=args.k)
    return {"accuracy": res["accuracy"], f"pass@{args.k}": res[f"pass@{args.k}"]}


def sweep(args, start: Path, data: Path, out: Path, test) -> list[dict]:
    rows = []
    for alpha in args.alphas:
        run_dir = out / f"alpha-{alpha:g}"
        cfg = base_config(args, start, data, run_dir, branching_for(args, alpha))
        t0 = time.perf_counter()
        train(cfg, progress=False, overwrite=True)
        seconds = time.perf_counter() - t0
        steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]

        def mean(key, steps=steps):
            vals = [r[key] for r in steps if r.get(key) is not None]
            return float(np.mean(vals)) if vals else float("nan")

        row = {"alpha": alpha, **held_out(args, run_dir / "final", test),
               "distinct_answers": mean("rollout/distinct_answers"),
               "zero_spread_frac": mean("reward/zero_spread_frac"),
               "clean_acc": mean("branch/clean_accuracy"), "noisy_acc": mean("branch/noisy_accuracy"),
               "first_tok_entropy": mean("rollout/first_token_entropy"),
               "rollout_s": mean("time/rollout_s"), "run_s": seconds}
        rows.append(row)
        print(f"  α={alpha:g}: done in {seconds:.0f} s", flush=True)
    return rows


def overhead(args, start: Path, data: Path) -> dict:
    """Median rollout seconds with and without the hook, same prompts, same token counts."""
    adapter = modalities.get("vision", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    policy = Policy.load(load_config(None, [f"model.path={start}"]).model, adapter, torch.device("cpu"))
    examples = load_dataset(str(data / "train.jsonl"))[:args.batch_prompts]
    batch = adapter.encode(examples, policy.processor)
    real_generate = policy.model.generate

    def full_length(**kwargs):                    # hold EOS off: both sides decode every step
        return real_generate(**kwargs, min_new_tokens=kwargs["max_new_tokens"])

    policy.model.generate = full_length
    params = SamplingParams(n=args.group_size, max_new_tokens=args.max_new_tokens)
    engines = {"plain": make_engine("hf", policy),
               "hook": make_engine("hf", policy, branching_for(args, args.timing_alpha))}
    times: dict[str, list[float]] = {k: [] for k in engines}
    for rep in range(args.reps + 1):              # rep 0 warms up
        for name in (("plain", "hook") if rep % 2 else ("hook", "plain")):
            torch.manual_seed(rep)
            t0 = time.perf_counter()
            roll = engines[name].generate(batch, params)
            if rep:
                times[name].append(time.perf_counter() - t0)
            assert int(roll.completion_mask.sum()) == roll.completion_mask.numel()
    q1, _, q3 = statistics.quantiles(times["plain"], n=4)
    out = {"rows": len(batch) * args.group_size, "tokens": args.max_new_tokens,
           "plain_spread_pct": 100 * (q3 - q1) / statistics.median(times["plain"])}
    # the hook's own work per generate call (plan + prefill displacement), timed alone
    mask = batch.inputs["attention_mask"].repeat_interleave(args.group_size, dim=0)   # [N, P]
    hidden = torch.randn(*mask.shape, find_decoder(policy.model).norm.weight.numel())  # [N, P, d]
    branching = Branching.from_config(branching_for(args, args.timing_alpha))
    t0 = time.perf_counter()
    for _ in range(args.reps):
        make_plan(branching, len(batch), args.group_size).displace(hidden, mask)
    out["hook_work_s"] = (time.perf_counter() - t0) / args.reps
    for stat, fn in (("min", min), ("median", statistics.median)):
        plain, hook = fn(times["plain"]), fn(times["hook"])
        out.update({f"plain_{stat}_s": plain, f"hook_{stat}_s": hook,
                    f"overhead_{stat}_pct": 100 * (hook - plain) / plain})
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ncgrpo_sweep-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {out}", flush=True)
    start, data = prepare(args, out)
    test = load_dataset(str(data / "test.jsonl"))
    print("held-out, start model ...", flush=True)
    start_eval = held_out(args, start, test)
    print(f"start model: accuracy {start_eval['accuracy']:.3f}, "
          f"pass@{args.k} {start_eval[f'pass@{args.k}']:.3f}", flush=True)
    print(f"sweep: {len(args.alphas)} runs × {args.steps} steps × {args.batch_prompts} prompts × "
          f"G {args.group_size} (half noisy), site {args.site}, noise {args.noise}", flush=True)
    rows = sweep(args, start, data, out, test)
    cost = overhead(args, start, data)

    k = args.k
    head = (f"{'alpha':>6} {'acc':>6} {f'pass@{k}':>7} {'distinct':>8} {'zero_sp':>7} "
            f"{'clean_acc':>9} {'noisy_acc':>9} {'ent_1st':>7} {'roll_s':>7}")
    print("\n" + head)
    for r in rows:
        print(f"{r['alpha']:>6g} {r['accuracy']:>6.3f} {r[f'pass@{k}']:>7.3f} "
              f"{r['distinct_answers']:>8.2f} {r['zero_spread_frac']:>7.3f} {r['clean_acc']:>9.3f} "
              f"{r['noisy_acc']:>9.3f} {r['first_tok_entropy']:>7.3f} {r['rollout_s']:>7.3f}")
    print(f"\n(start model: acc {start_eval['accuracy']:.3f}, pass@{k} {start_eval[f'pass@{k}']:.3f};"
          f" acc/pass@{k} on {len(test)} held-out prompts, clean model; other columns are means over"
          f" training steps)")
    print(f"\nrollout time, {cost['rows']} rows × {cost['tokens']} tokens each, {args.reps} interleaved "
          f"repetitions, hook at α {args.timing_alpha:g}:")
    print(f"  plain      min {cost['plain_min_s']:.3f} s   median {cost['plain_median_s']:.3f} s   "
          f"(rep-to-rep spread, IQR/median: {cost['plain_spread_pct']:.0f}%)")
    print(f"  with hook  min {cost['hook_min_s']:.3f} s   median {cost['hook_median_s']:.3f} s")
    print(f"  overhead   min {cost['overhead_min_pct']:+.1f}%   median {cost['overhead_median_pct']:+.1f}%"
          f"   (end to end; differences below the spread are machine noise)")
    work_pct = 100 * cost["hook_work_s"] / cost["plain_median_s"]
    verdict = "within" if work_pct <= OVERHEAD_TARGET else "OVER"
    print(f"  hook work alone (plan + prefill displacement): {1000 * cost['hook_work_s']:.2f} ms per call"
          f" = {work_pct:.1f}% of the plain median ({verdict} the {OVERHEAD_TARGET:g}% target)")
    (out / "sweep.json").write_text(json.dumps(
        {"args": vars(args), "start": start_eval, "rows": rows, "overhead": cost}, indent=2) + "\n")
    print(f"figures: {out / 'sweep.json'}")


if __name__ == "__main__":
    main()
