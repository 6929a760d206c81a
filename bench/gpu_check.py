"""The first check to run on one GPU: a few real GRPO steps of a 1.87 B-parameter Qwen2.5-VL.

Workload (defaults; every size is a flag): a random-weight Qwen2.5-VL built with the tiny builder
(`mmrlvr.tiny.build_tiny`: the real transformers class, a ~600-token locally trained tokenizer)
at text hidden 1536 x 28 layers (12 heads, 2 KV heads, MLP 8960) and a vision tower of 32 blocks
x 1280 — 1,871,592,704 parameters; the synthetic shapes task at 448 px (256 image tokens and
1,024 vision patches per prompt); 8 prompts x 8 rollouts x <= 128 new tokens per step,
micro-batch 16, lr 1e-6 (constant), 2 warm-up + 4 timed steps; bf16 compute with fp32 master
weights and AdamW state (`model.dtype` bf16 on CUDA, `model.param_dtype` float32, the
defaults). Every step goes through the real trainer (`mmrlvr.train.trainer.build_run` + `grpo_step`).
`--tiny` uses the tiny builder's own sizes (0.9 M parameters) for a CPU smoke run; on CPU the
compute dtype is float32.

Rewards: accuracy 0.9 + format 0.1 + `length_reward` (len(text) / 1000). A random model
scores 0 on the first two everywhere; the dense length term gives every group spread, so the
update trains (nearly) every row, as a real run with spread would.

What it prints, per configuration:
  * the step split, median over the timed steps: the trainer's `time/rollout_s`,
    `time/reward_s`, `time/update_s` (and `time/step_s`);
  * generated tokens/s = sum of generated tokens / sum of seconds over the timed steps, once
    over the trainer's rollout phase (prompt encoding, engine wake-up and weight sync, generate)
    and once over the engine's `generate` call alone;
  * MFU = FLOPs / seconds / peak, counting weight matmuls only (attention scores are not
    counted, so it is a slight underestimate), with N_text the trainable weights outside the
    vision tower, N_vis those inside, P the mean prompt tokens (image tokens included), V the
    vision patches per prompt, C the mean completion tokens, R the rows the update trained:
        update:  6 * (N_text * R * (P + C) + N_vis * (R / G) * V)
                 (one forward + backward per row; each prompt's image encoded once per update)
        rollout: 2 * (N_text * (B * G * P + generated tokens) + N_vis * B * V)
                 (prefill of every row, one forward per generated token, images encoded once)
    The peak is `--peak-tflops`, default 989 TFLOP/s (dense bf16 of an H100 SXM or H200) when
    the GPU's name says H100 (not PCIe / NVL) or H200; on any other device MFU is printed only
    with the flag;
  * peak GPU memory, `torch.cuda.max_memory_allocated` (peak RSS on CPU);
  * the fraction of trainable weights changed by all the steps (warm-up included): an fp32
    snapshot before the first step, compared element by element after the last. With fp32
    masters this must be >= 99 % (PASS/FAIL). `--contrast` repeats the run with
    `model.param_dtype=bfloat16` (pure bf16: AdamW writes lr-sized updates into bf16 weights,
    which round most of them away; measured: 98 % unchanged, docs/scale.md).

When `trl` is installed: the same workload through TRL's GRPOTrainer (bf16 autocast over fp32
weights, the same rewards, one optimizer step of 4 micro-batches per 64 rollouts), and the
ratio of median step times. On CUDA: the same run with `rollout.decode=compiled` (static KV
cache, decode step compiled with CUDA graphs; `--no-compile` skips it), its tokens/s beside the
eager path's. On CUDA: the same run with `train.packing` (`--no-packing` skips it), its
update time and MFU beside the padded update's. When `vllm` is installed (and on CUDA): `rollout.backend=vllm`
without and with NC-GRPO noise (`rollout.branching={kind: latent_noise, fraction: 0.5,
alpha: 0.1}`), tokens/s of each, and the vLLM noise check (does vLLM's noisy last-layer input
match the HF path's displacement?). Each of these, and `--contrast`, runs in its own subprocess
(its own GPU memory peak; a failure there is reported, not fatal).

Files: this one holds the arguments, the mmrlvr measurement and the report;
gpu_check_workload.py the model, data, config and rewards, and the figures computed from a run
(counts, medians, tokens/s, MFU); gpu_check_compare.py the runs in subprocesses, TRL's run, and
the vLLM noise check, whose docstring says what it compares and what not.

Usage (one GPU; the box needs torch, torchvision, pillow, transformers, accelerate, peft and
pyyaml, numpy, tqdm, which transformers brings; not yet timed on a GPU: a few minutes expected):
    python bench/gpu_check.py --contrast --json gpu_check.json
    python bench/gpu_check.py --tiny --device cpu  # CPU smoke run (~90 s on 2 cores)
Pure-Python wheels travel to an offline GPU box as files: here
    pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl qwen-vl-utils
(add `requests urllib3 idna certifi charset-normalizer` where the box lacks requests, which
qwen-vl-utils imports), then there `pip install --no-index --no-deps --target /tmp/site
.whl/*.whl` and run `PYTHONPATH=/tmp/site:. python bench/gpu_check.py` from the repository
root. Nothing on the training path imports gradio, librosa, diffusers, vllm, datasets,
math-verify, soundfile, opencv or sacrebleu (tests/test_gpu_check.py runs this script with
them hidden).

A benchmark prints figures; the one verdict is the weights-changed line (and the vLLM noise
check where it runs): exit status 1 when one fails or an mmrlvr configuration errors.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:          # its helpers beside it, however it is started or loaded
    sys.path.append(HERE)
from gpu_check_compare import (  # noqa: E402
    RESULT_TAG, guarded, noise_check, print_noise_check, print_trl, run_trl, spawn_others)
from gpu_check_workload import (  # noqa: E402
    NOISE, PHASES, REFERENCE, TINY, changed_fraction, make_config, model_dims, package_version,
    param_counts, peak_rss_mib, prepare, prompt_shape, snapshot, step_figures, summarize)

ROOT = Path(__file__).resolve().parents[1]
H100_SXM_BF16_TFLOPS = 989.0
CHANGED_MIN = 0.99


def default_peak_tflops(gpu_name: str) -> float | None:
    """Dense bf16 TFLOP/s of an H100 SXM or H200 (989); None for any other GPU (PCIe and NVL
    H100s are slower parts)."""
    name = gpu_name.upper()
    if "H200" in name or ("H100" in name and "PCIE" not in name and "NVL" not in name):
        return H100_SXM_BF16_TFLOPS
    return None


# ------------------------------------------------------------------------------ measurements

def run_grpo(args, cfg, after=None) -> dict:
    """Warm-up + timed GRPO steps through the real trainer; the figures of the timed steps.

    `after(run)` runs once the steps are done (the vLLM noise check) and its dict is added."""
    import torch

    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    cuda = torch.cuda.is_available() and args.device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t_load = time.perf_counter()
    run, _ = build_run(cfg, overwrite=True)          # the check owns its scratch run dir
    load_s = time.perf_counter() - t_load
    params = run.policy.trainable_parameters()
    counts, shape = param_counts(run.policy), prompt_shape(run)
    engine_stats = []                     # each generate call's own stats (time, weight sync)
    generate = run.engine.generate

    def recorded_generate(batch, sampling):
        rollouts = generate(batch, sampling)
        engine_stats.append(rollouts.stats)
        return rollouts

    run.engine.generate = recorded_generate
    before = snapshot(params)
    steps = []
    for step in range(1, args.warmup + args.steps + 1):
        metrics = grpo_step(run, step)
        if step > args.warmup:
            stats = engine_stats[-1]
            steps.append({**metrics, "engine/generate_s": stats["rollout/time_s"],
                          "engine/weight_sync_s": stats.get("rollout/weight_sync_s", 0.0)})
        print(f"  step {step}{' (warm-up)' if step <= args.warmup else ''}: "
              f"{metrics['time/step_s']:.2f} s", file=sys.stderr, flush=True)
    if cuda:
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    changed, total = changed_fraction(params, before)
    del before
    result = {"load_s": load_s, "params": counts, **shape,
              "compute_dtype": str(run.policy.compute_dtype).removeprefix("torch."),
              "param_dtype": cfg.model.param_dtype, "backend": cfg.rollout.backend,
              "branching": cfg.rollout.branching, "steps": [step_figures(m, args) for m in steps],
              "peak_gpu_gib": peak, "peak_rss_mib": peak_rss_mib(),
              "weights_changed": changed, "weights_total": total,
              "changed_fraction": changed / max(total, 1)}
    if after is not None:
        result.update(after(run))
    return summarize(result, args)


# ------------------------------------------------------------------------------------ phases

def run_phase(phase: str, args) -> dict:
    model_dir, train_file = prepare(args)
    out_dir = Path(tempfile.mkdtemp(prefix=f"run-{phase}-", dir=args.workdir))
    if phase == "trl":
        return run_trl(args, model_dir, train_file, out_dir)
    kwargs = {"mmrlvr": {}, "mmrlvr-bf16": {"param_dtype": "bfloat16"},
              "vllm": {"backend": "vllm"},
              "vllm-noise": {"backend": "vllm", "branching": NOISE},
              "mmrlvr-compiled": {"decode": "compiled"},
              "mmrlvr-packed": {"packing": True}}[phase]
    cfg = make_config(args, model_dir, train_file, out_dir, **kwargs)
    return run_grpo(args, cfg, after=noise_check if phase == "vllm-noise" else None)


# ------------------------------------------------------------------------------------ report

def _mfu(r: dict, key: str) -> str:
    return f"{100 * r[key]:.1f} %" if key in r else "n/a (give --peak-tflops)"


def print_grpo(name: str, r: dict, args) -> None:
    print(f"\n[{PHASES[name]}]")
    if "error" in r:
        print(f"  FAILED: {r['error']}")
        return
    n = len(r["steps"])
    noise = " + latent noise" if r["branching"].get("kind") == "latent_noise" else ""
    print(f"  compute {r['compute_dtype']}, trainable weights {r['param_dtype']}, rollouts "
          f"{r['backend']}{noise}; model loaded in {r['load_s']:.1f} s")
    print(f"  step split (median of {n} timed steps): rollout {r['median_rollout_s']:.3f} s | "
          f"reward {r['median_reward_s']:.3f} s | update {r['median_update_s']:.3f} s | "
          f"step {r['median_step_s']:.3f} s")
    mean_len = statistics.fmean(s["completion_tokens_mean"] for s in r["steps"])
    rows = statistics.fmean(s["trained_rows"] for s in r["steps"])
    print(f"  generated tokens/s: {r['tokens_per_s']:,.0f} over the rollout phase, "
          f"{r['generate_tokens_per_s']:,.0f} over the engine's generate call alone"
          + (f" (weight sync {r['median_weight_sync_s']:.2f} s per step)"
             if r["backend"] == "vllm" else ""))
    padded = statistics.fmean(s["padded_frac"] for s in r["steps"])
    print(f"  mean completion {mean_len:.1f} tokens; the update trained {rows:.0f} of "
          f"{args.prompts * args.group} rows; padded fraction {padded:.2f}")
    print(f"  update MFU: {_mfu(r, 'update_mfu')}   rollout MFU: {_mfu(r, 'rollout_mfu')}")
    if r["peak_gpu_gib"] is not None:
        outside = "; memory vLLM allocates outside torch is not counted" \
            if r["backend"] == "vllm" else ""
        print(f"  peak GPU memory: {r['peak_gpu_gib']:.2f} GiB "
              f"(torch.cuda.max_memory_allocated{outside})")
    else:
        print(f"  peak memory: {r['peak_rss_mib']:,.0f} MiB RSS (CPU)")
    print(f"  weights changed: {100 * r['changed_fraction']:.2f} % of "
          f"{r['weights_total']:,} trainable weights ({r['weights_changed']:,} changed)")
    if "noise_check_pass" in r:
        print_noise_check(r)


def print_header(args, model: dict, main_shape: dict) -> None:
    import torch

    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = torch.cuda.get_device_name() if cuda else "CPU"
    dims = model_dims(args)
    print(f"mmrlvr GPU check: random-weight Qwen2.5-VL, {model.get('total', 0):,} parameters (text "
          f"{dims['hidden_size']} x {dims['num_layers']}, vision {dims['vision_depth']} x "
          f"{dims['vision_width']}), {args.image_size} px images; {args.prompts} prompts x "
          f"{args.group} rollouts x <= {args.max_new_tokens} new tokens, micro-batch "
          f"{args.micro_batch}, lr {args.lr:g}; {args.warmup} warm-up + {args.steps} timed steps")
    print(f"device {device}; torch {torch.__version__}, "
          f"transformers {package_version('transformers')}")
    n_text, n_vis = model.get("trainable_text", 0), model.get("trainable_vision", 0)
    P, V = main_shape.get("prompt_tokens", 0), main_shape.get("patches", 0)
    print(f"MFU = FLOPs / s / peak, weight matmuls only: update 6*(N_text*R*(P+C) + "
          f"N_vis*(R/G)*V), rollout 2*(N_text*(B*G*P + generated) + N_vis*B*V); N_text "
          f"{n_text:,}, N_vis {n_vis:,} trainable, B {args.prompts}, G {args.group}, P {P:.0f} "
          f"prompt tokens, V {V:.0f} patches per prompt, R trained rows, C mean completion tokens")
    print(f"peak: {args.peak_tflops:g} TFLOP/s ({args.peak_source})" if args.peak_tflops else
          "peak: unknown for this device: give --peak-tflops (dense bf16 TFLOP/s) for MFU")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="python bench/gpu_check.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="A few real GRPO steps of a 1.87 B random-weight Qwen2.5-VL on one GPU: step "
                    "split, tokens/s, MFU, peak memory, and whether fp32 master weights move "
                    "at lr 1e-6; TRL and vLLM comparisons where installed. Details: the module "
                    "docstring.")
    for key, default in REFERENCE.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=default,
                       help=f"model size (--tiny: {TINY[key]})")
    p.add_argument("--tiny", action="store_true", help="the tiny builder's sizes: a CPU smoke run")
    p.add_argument("--image-size", type=int, default=448, help="shapes images, px per side")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (B)")
    p.add_argument("--group", type=int, default=8, help="rollouts per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--steps", type=int, default=4, help="timed GRPO steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense bf16 peak for MFU (default: 989 on H100 SXM / H200)")
    p.add_argument("--contrast", action="store_true",
                   help="also run pure bf16 (model.param_dtype=bfloat16): how many weights stay")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL comparison")
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM runs")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the run with rollout.decode compiled (static cache + CUDA graphs)")
    p.add_argument("--no-packing", action="store_true",
                   help="skip the run with train.packing (the update without padding)")
    p.add_argument("--workdir", default=None,
                   help="where the model, data and runs go (reused when present); default: a "
                        "temporary dir, deleted afterwards")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the figures as JSON")
    p.add_argument("--phase", choices=list(PHASES), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            if getattr(args, key) == REFERENCE[key]:
                setattr(args, key, value)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if (args.prompts * args.group) % args.micro_batch:
        p.error("--micro-batch must divide --prompts x --group")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))

    if args.phase:                                   # a child of spawn()
        result = guarded(run_phase, args.phase, args)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0

    import torch

    cuda = torch.cuda.is_available() and args.device != "cpu"
    args.peak_source = "--peak-tflops"
    if args.peak_tflops is None and cuda:
        args.peak_tflops = default_peak_tflops(torch.cuda.get_device_name())
        args.peak_source = "dense bf16 of an H100 SXM / H200, from the GPU's name"
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpu-check-")
        args.workdir = tmp.name
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    try:
        prepare(args)
        results: dict[str, dict] = {"mmrlvr": guarded(run_phase, "mmrlvr", args)}
        import gc

        gc.collect()                 # the run's model, optimizer and engine: free for the others
        if cuda:
            torch.cuda.empty_cache()
        others, skipped = spawn_others(argv, args, cuda)
        results.update(others)
        ok = report(args, results, skipped, time.perf_counter() - t_start)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0 if ok else 1


def report(args, results: dict[str, dict], skipped: dict[str, str], wall_s: float) -> bool:
    """Print every figure and the verdicts; write --json; True when nothing failed."""
    main_run = results["mmrlvr"]
    print()
    print_header(args, main_run.get("params", {}), main_run)
    for name, r in results.items():
        if name != "trl":
            print_grpo(name, r, args)
    if "trl" in results:
        print_trl(results["trl"])
    print()
    for name, why in skipped.items():
        label = {"trl": "TRL comparison", "mmrlvr-compiled": "compiled decoding",
                 "mmrlvr-packed": "packed update"}.get(
            name, "vLLM runs and the noise check")
        print(f"skipped: {label}: {why}")
    failed = [name for name, r in results.items() if name != "trl" and "error" in r]
    for name in failed:
        print(f"FAIL: {PHASES[name]}: {results[name]['error']}")
    ok = not failed
    if "error" in main_run:
        return finish(args, results, skipped, wall_s, ok)
    trl = results.get("trl", {})
    if "median_step_s" in trl:
        trl["step_time_ratio_trl_over_mmrlvr"] = trl["median_step_s"] / main_run["median_step_s"]
        print(f"TRL / mmrlvr median step time: x{trl['step_time_ratio_trl_over_mmrlvr']:.2f}")
    packed = results.get("mmrlvr-packed", {})
    if "median_update_s" in packed:
        print(f"update s, {PHASES['mmrlvr-packed']}: {packed['median_update_s']:.3f} (padded: "
              f"{main_run['median_update_s']:.3f}); update MFU {_mfu(packed, 'update_mfu')} "
              f"(padded: {_mfu(main_run, 'update_mfu')})")
    for name in ("mmrlvr-compiled", "vllm", "vllm-noise"):
        if "tokens_per_s" in results.get(name, {}):
            print(f"generated tokens/s, {PHASES[name]}: {results[name]['tokens_per_s']:,.0f} "
                  f"(HF generate: {main_run['tokens_per_s']:,.0f})")
    frac = main_run["changed_fraction"]
    ok = ok and frac >= CHANGED_MIN
    print(f"{'PASS' if frac >= CHANGED_MIN else 'FAIL'}: {100 * frac:.2f} % of trainable weights "
          f"changed with fp32 master weights (>= {100 * CHANGED_MIN:.0f} % required)")
    bf16 = results.get("mmrlvr-bf16", {})
    if "changed_fraction" in bf16:
        print(f"contrast: pure bf16 left {100 * (1 - bf16['changed_fraction']):.2f} % of trainable "
              f"weights unchanged ({100 * bf16['changed_fraction']:.2f} % changed)")
    noisy = results.get("vllm-noise", {})
    if "noise_check_pass" in noisy:
        ok = ok and noisy["noise_check_pass"]
        print(f"{'PASS' if noisy['noise_check_pass'] else 'FAIL'}: vLLM's noisy last-layer input "
              "matches the HF path's displacement"
              + (f" ({noisy['noise_check_error']})" if "noise_check_error" in noisy else ""))
    return finish(args, results, skipped, wall_s, ok)


def finish(args, results: dict[str, dict], skipped: dict[str, str], wall_s: float,
           ok: bool) -> bool:
    """The last line, and the --json file."""
    print(f"wall time {wall_s:.0f} s")
    if args.json:
        out = {"workload": {k: getattr(args, k) for k in (
                   "image_size", "prompts", "group", "max_new_tokens", "micro_batch", "lr",
                   "warmup", "steps", "device", "peak_tflops", "peak_source")},
               "model": model_dims(args), "results": results, "skipped": skipped, "pass": ok,
               "wall_s": wall_s}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return ok


if __name__ == "__main__":
    sys.exit(main())
