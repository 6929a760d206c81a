"""Benchmark one GRPO step: mmrlvr against TRL's GRPOTrainer on the identical workload.

Workload (fixed): a tiny random-weight Qwen2.5-VL (`mmrlvr.tiny.build_tiny`, 0.9 M parameters)
with its processor set to 224x224 px images (64 image tokens per prompt), the synthetic shapes
task at 224 px, 8 prompts x 8 rollouts x up to 64 new tokens per step, temperature 1.0, full
fine-tuning in float32 on CPU (CUDA when present), AdamW, beta 0 (no reference model), one
optimiser step per batch of rollouts, one forward/backward over all 64 sequences (micro-batch 64),
token-level loss (TRL's `dapo`), clip 0.2 / 0.28, no gradient checkpointing.

Rewards, identical on both sides (mmrlvr's own reward objects, called from a TRL reward function
for TRL): 0.9 accuracy + 0.1 format + 1.0 length, where length is `min(len(text), 200) / 200`
(a dense shaping term, loaded as `bench/grpo_step.py:length_reward`). A random-weight model
scores 0 on accuracy and format everywhere; without the dense term every group would have zero
spread and mmrlvr would (rightly) skip the backward, which would not be a like-for-like timing.

The random model can sample an end-of-turn token before 64 tokens, and neither side forces a
minimum length, so the table reports the mean completion length each side actually generated and
rollout throughput from the tokens actually generated.

Figures, per framework, each measured in its own subprocess (so peak RSS is per framework):
  median step s      wall time of one full step (rollout + rewards + update + optimiser step),
                     median over the timed steps (warm-up steps excluded)
  rollout tok/s      completion tokens generated / wall time of the rollout phase (prompt
                     processing + generate + decode), summed over the timed steps
  mean compl len     mean completion length in tokens (including the end token, if any)
  rollout s          median wall time of the rollout phase
  update s           mmrlvr: median `time/update_s` (logprobs, loss, backward, optimiser step)
  padded             mmrlvr: mean `update/padded_frac`, the share of completion positions the
                     update's forwards run that are padding
  peak RSS MB        `ru_maxrss` of that subprocess (model load, data, all steps)

TRL's step is timed from its `on_step_begin` to `on_step_end` callback (its dataloader fetch,
which decodes the PNGs, happens just before and is not counted); its rollout phase is timed by
wrapping `GRPOTrainer._generate`. mmrlvr's step is `mmrlvr.train.trainer.grpo_step`, timed around
the call.

    python bench/grpo_step.py                   # both frameworks, 2 warm-up + 8 timed steps
    python bench/grpo_step.py --only mmrlvr     # one framework, in this process
    python bench/grpo_step.py --workdir /tmp/b  # keep (and reuse) the model and data
    python bench/grpo_step.py --threads 1       # on a busy machine: no thread oversubscription
    python bench/grpo_step.py --variant train.packing=true   # also mmrlvr with these overrides
    python bench/grpo_step.py --family qwen3-vl   # another family's tiny model, same workload

TRL is the `bench` extra (`pip install -e .[bench]`); without it only mmrlvr is measured. A
benchmark prints figures; nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SIZE = 224
PIXELS = IMAGE_SIZE * IMAGE_SIZE
PROMPTS = 8
GROUP = 8
MAX_NEW = 64
LR = 1e-5
FORMAT_PROMPT = ("Output the thinking process in <think> </think> and the final answer in "
                 "<answer> </answer> tags.")
RESULT_TAG = "GRPO_BENCH_RESULT "
LENGTH_CAP = 200


def length_reward(example, completion: str) -> float:
    """Dense shaping reward: `min(len(completion), 200) / 200` (characters)."""
    return min(len(completion), LENGTH_CAP) / LENGTH_CAP


def reward_specs() -> list[dict]:
    return [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1},
            {"name": f"{Path(__file__).resolve()}:length_reward", "weight": 1.0, "label": "length"}]


# ---------------------------------------------------------------------------------------- setup

def prepare(workdir: Path, n_prompts: int, family: str = "qwen2.5-vl") -> tuple[Path, Path]:
    """Build the tiny model (of `family`) and the shapes data once (reused when already there)."""
    name = "tiny-qwen25vl-224" if family == "qwen2.5-vl" else f"tiny-{family}-224"
    model_dir, data_dir = workdir / name, workdir / f"shapes-224-{n_prompts}"
    if not (model_dir / "tiny.json").exists():
        from mmrlvr.tiny import build_tiny

        build_tiny(family, model_dir, min_pixels=PIXELS, max_pixels=PIXELS)
    if not (data_dir / "info.json").exists():
        from mmrlvr.tasks.shapes import make_shapes

        make_shapes(data_dir, n_train=n_prompts, n_test=0, seed=0, image_size=IMAGE_SIZE)
    return model_dir, data_dir / "train.jsonl"


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# --------------------------------------------------------------------------------------- mmrlvr

def bench_mmrlvr(model_dir: Path, train_file: Path, workdir: Path, warmup: int, steps: int,
                 variant: str = "") -> dict:
    import torch

    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    total = warmup + steps
    cfg = load_config(None, [
        f"model.path={model_dir}", f"model.min_pixels={PIXELS}", f"model.max_pixels={PIXELS}",
        "model.dtype=float32", f"data.train={train_file}", f"data.format_prompt={FORMAT_PROMPT}",
        f"rollout.group_size={GROUP}", f"rollout.max_new_tokens={MAX_NEW}", "rollout.temperature=1.0",
        "algo.beta=0.0", "algo.loss_agg=token", "algo.clip_low=0.2", "algo.clip_high=0.28",
        f"optim.lr={LR}", "optim.schedule=constant", f"train.steps={total}",
        f"train.batch_prompts={PROMPTS}", f"train.micro_batch={PROMPTS * GROUP}",
        f"train.out_dir={workdir / 'mmrlvr-run'}", "train.seed=0",
    ] + [kv for kv in variant.split(",") if kv])
    cfg.rewards = reward_specs()
    run, _ = build_run(cfg, overwrite=True)          # the benchmark owns its scratch run dir
    step_s, roll_s, update_s, tokens, lengths, trained, padded = [], [], [], [], [], [], []
    for step in range(1, total + 1):
        t0 = time.perf_counter()
        m = grpo_step(run, step)
        dt = time.perf_counter() - t0
        if step > warmup:
            n = PROMPTS * GROUP
            step_s.append(dt)
            roll_s.append(m["time/rollout_s"])
            update_s.append(m["time/update_s"])
            padded.append(m["update/padded_frac"])
            tokens.append(m["response/length_mean"] * n)
            lengths.append(m["response/length_mean"])
            trained.append(m["update/trained_rows"])
    return {"framework": f"mmrlvr [{variant}]" if variant else "mmrlvr", "step_s": step_s,
            "rollout_s": roll_s, "update_s": update_s, "padded_frac": statistics.fmean(padded),
            "tokens": tokens, "mean_len": statistics.fmean(lengths),
            "trained_rows": statistics.fmean(trained),
            "threads": torch.get_num_threads(), "peak_rss_mb": peak_rss_mb()}


# ------------------------------------------------------------------------------------------ TRL

def bench_trl(model_dir: Path, train_file: Path, workdir: Path, warmup: int, steps: int) -> dict:
    import torch
    from datasets import Dataset
    from datasets import Image as ImageFeature
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmrlvr.data import Example, load_dataset
    from mmrlvr.train.policy import load_processor
    from rewards.base import build_combined

    total = warmup + steps
    examples = load_dataset(str(train_file))
    rows = {"prompt": [[{"role": "user", "content": f"{ex.prompt} {FORMAT_PROMPT}"}] for ex in examples],
            "image": [str(ex.images[0]) for ex in examples],
            "answer": [ex.answer for ex in examples], "id": [ex.id for ex in examples]}
    dataset = Dataset.from_dict(rows).cast_column("image", ImageFeature())

    combined = build_combined(reward_specs())

    def mmrlvr_reward(prompts, completions, answer, id, **_):
        """The same combined reward mmrlvr uses, one call per completion."""
        out = []
        for comp, gold, ex_id in zip(completions, answer, id):
            text = comp[0]["content"] if isinstance(comp, list) else comp
            ex = Example(id=ex_id, prompt="", answer=gold)
            out.append(combined.score(ex, [text])[0]["overall"])
        return out

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0, self.steps = None, []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.steps.append(time.perf_counter() - self.t0)

    timer = Timer()
    args = GRPOConfig(
        output_dir=str(workdir / "trl-out"), num_generations=GROUP,
        per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, max_completion_length=MAX_NEW,
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, loss_type="dapo", epsilon=0.2,
        epsilon_high=0.28, scale_rewards="group", max_steps=total, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=not torch.cuda.is_available(), bf16=False,
        gradient_checkpointing=False, model_init_kwargs={"dtype": "float32"}, seed=0,
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=mmrlvr_reward, args=args,
                          train_dataset=dataset, processing_class=load_processor(str(model_dir)),
                          callbacks=[timer])
    gen_log: list[tuple[float, int]] = []
    original = trainer._generate

    def timed_generate(prompts):
        t0 = time.perf_counter()
        out = original(prompts)
        gen_log.append((time.perf_counter() - t0, sum(len(c) for c in out[1])))
        return out

    trainer._generate = timed_generate
    trainer.train()
    if len(timer.steps) != total or len(gen_log) != total:
        raise RuntimeError(f"expected {total} steps and rollouts, saw {len(timer.steps)} steps "
                           f"and {len(gen_log)} rollouts")
    timed = gen_log[warmup:]
    n = PROMPTS * GROUP
    return {"framework": f"trl {_version('trl')}", "step_s": timer.steps[warmup:],
            "rollout_s": [t for t, _ in timed], "tokens": [k for _, k in timed],
            "mean_len": statistics.fmean(k / n for _, k in timed), "trained_rows": float(n),
            "threads": torch.get_num_threads(), "peak_rss_mb": peak_rss_mb()}


# ---------------------------------------------------------------------------------------- report

def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def run_one(framework: str, args, variant: str = "") -> dict:
    workdir = Path(args.workdir)
    model_dir, train_file = prepare(workdir, PROMPTS * (args.warmup + args.steps), args.family)
    try:
        if framework == "mmrlvr":
            return bench_mmrlvr(model_dir, train_file, workdir, args.warmup, args.steps, variant)
        return bench_trl(model_dir, train_file, workdir, args.warmup, args.steps)
    except Exception as err:  # noqa: BLE001 - report a failure, keep the other figures
        import traceback

        traceback.print_exc(file=sys.stderr)
        return {"framework": framework, "error": f"{type(err).__name__}: {err}",
                "peak_rss_mb": peak_rss_mb()}


def spawn(framework: str, args, variant: str = "") -> dict:
    """Run one framework in a fresh interpreter so its peak RSS is its own."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--only", framework, "--child",
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--workdir", str(args.workdir),
           "--family", args.family]
    if variant:
        cmd += ["--variant", variant]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
            if "error" in result:
                result["log_tail"] = "\n".join(proc.stderr.strip().splitlines()[-15:])
            return result
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    return {"framework": framework, "error": f"subprocess exited {proc.returncode} without a "
            f"result", "log_tail": tail}


def summarize(r: dict) -> dict:
    if "error" in r:
        return r
    r = dict(r)
    r["median_step_s"] = statistics.median(r["step_s"])
    r["median_rollout_s"] = statistics.median(r["rollout_s"])
    r["tok_per_s"] = sum(r["tokens"]) / sum(r["rollout_s"])
    return r


def print_report(results: list[dict], args) -> None:
    import torch

    threads = next((r["threads"] for r in results if "threads" in r), torch.get_num_threads())
    print(f"GRPO step benchmark: tiny {args.family} (random weights), {IMAGE_SIZE} px images, "
          f"{PROMPTS} prompts x {GROUP} rollouts x <= {MAX_NEW} new tokens; "
          f"{args.warmup} warm-up + {args.steps} timed steps")
    print(f"torch {torch.__version__} ({threads} threads, "
          f"{'cuda' if torch.cuda.is_available() else 'cpu'}), transformers {_version('transformers')}, "
          f"trl {_version('trl')}, {os.cpu_count()} CPUs")
    print()
    width = max([14] + [len(r["framework"]) + 2 for r in results])
    head = f"{'framework':<{width}}{'median step s':>15}{'rollout s':>11}{'update s':>10}" \
           f"{'padded':>8}{'rollout tok/s':>15}{'mean compl len':>16}{'peak RSS MB':>13}" \
           f"{'trained rows':>14}"
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['framework']:<{width}}  FAILED: {r['error']}")
            continue
        update = f"{statistics.median(r['update_s']):>10.3f}" if "update_s" in r else f"{'-':>10}"
        padded = f"{r['padded_frac']:>8.2f}" if "padded_frac" in r else f"{'-':>8}"
        print(f"{r['framework']:<{width}}{r['median_step_s']:>15.3f}{r['median_rollout_s']:>11.3f}"
              f"{update}{padded}{r['tok_per_s']:>15.0f}{r['mean_len']:>16.1f}"
              f"{r['peak_rss_mb']:>13.0f}{r['trained_rows']:>14.0f}")
    trl = next((r for r in results if "error" not in r and r["framework"].startswith("trl")), None)
    for a in results:
        if trl is not None and "error" not in a and a["framework"].startswith("mmrlvr"):
            print(f"\nTRL / {a['framework']}: step time x{trl['median_step_s'] / a['median_step_s']:.2f} "
                  f"(mmrlvr at {a['median_step_s'] / trl['median_step_s']:.2f} of TRL's), rollout "
                  f"tok/s x{trl['tok_per_s'] / a['tok_per_s']:.2f}, peak RSS "
                  f"x{trl['peak_rss_mb'] / a['peak_rss_mb']:.2f}")
    for r in results:
        if "error" in r and r.get("log_tail"):
            print(f"\n{r['framework']} log tail:\n{r['log_tail']}")
    print()
    for r in results:
        if "step_s" in r:
            print(f"{r['framework']} step times s: " + " ".join(f"{t:.3f}" for t in r["step_s"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/grpo_step.py",
        description="Median GRPO step time, rollout tokens/s and peak RSS of mmrlvr, and of TRL's "
                    "GRPOTrainer on the identical model, data and settings when trl is installed "
                    f"(tiny Qwen2.5-VL, {IMAGE_SIZE} px images, {PROMPTS} prompts x {GROUP} rollouts "
                    f"x {MAX_NEW} new tokens). Each framework runs in its own subprocess.",
        epilog="Rewards: 0.9 accuracy + 0.1 format + min(len(text), 200)/200, so every group has "
               "spread and both frameworks run the backward. The printed figures are measurements "
               "of this machine at this moment; run on an idle machine for numbers to quote.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=8, help="timed GRPO steps per framework")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps before them")
    p.add_argument("--workdir", default=None,
                   help="where the tiny model, the data and run outputs go (reused if present); "
                        "default: a fresh temporary dir, deleted afterwards")
    p.add_argument("--only", choices=["mmrlvr", "trl"], default=None,
                   help="measure one framework only, in this process")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads in both subprocesses (0: torch's default, one per core); "
                        "on a machine shared with other jobs, 1 avoids thread oversubscription, "
                        "which can slow a step several-fold")
    p.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="also measure mmrlvr with these config overrides (repeatable), e.g. "
                        "train.packing=true or rollout.decode=static")
    p.add_argument("--family", default="qwen2.5-vl",
                   help="the tiny model's family (`mmrlvr tiny --help`: qwen3-vl, gemma3, ...); "
                        "TRL runs the same model where it supports the family")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    if args.child:
        result = run_one(args.only, args, args.variant[0] if args.variant else "")
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0

    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="grpo-bench-")
        args.workdir = tmp.name
    try:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        prepare(Path(args.workdir), PROMPTS * (args.warmup + args.steps), args.family)
        if args.only:
            frameworks = [args.only]
        else:
            frameworks = ["mmrlvr"]
            if _version("trl") != "not installed":
                frameworks.append("trl")
            else:
                print("trl is not installed (pip install -e .[bench]); measuring mmrlvr only\n")
        if args.only:
            variants = [""] + args.variant if args.only == "mmrlvr" else [""]
            results = [summarize(run_one(args.only, args, v)) for v in variants]
        else:
            results = [summarize(spawn("mmrlvr", args, v)) for v in args.variant]
            results = [summarize(spawn(f, args)) for f in frameworks[:1]] + results + \
                [summarize(spawn(f, args)) for f in frameworks[1:]]
        print_report(results, args)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0 if all("error" not in r for r in results if r["framework"] == "mmrlvr") else 1


if __name__ == "__main__":
    sys.exit(main())
