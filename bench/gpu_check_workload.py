"""What bench/gpu_check.py runs (its docstring gives the sizes, the rewards and the formulas): the
random-weight Qwen2.5-VL and the shapes data, built into the workdir once; the config of each
mmrlvr configuration; the rewards, which TRL's run shares; and the figures computed from a run
(parameter counts, prompt shape, weights changed, peak RSS, medians, tokens/s, MFU).

Nothing heavy is imported at the top: the length reward's spec names this file, which the run
loads."""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

REFERENCE = dict(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                 intermediate_size=8960, vision_depth=32, vision_width=1280)
"""The measured reference workload's model: 1.87 B parameters (text 1.31 B, vision 0.56 B)."""
TINY = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256,
            vision_depth=2, vision_width=64)
"""`build_tiny`'s own defaults (0.9 M parameters)."""
NOISE = {"kind": "latent_noise", "fraction": 0.5, "alpha": 0.1}
FORMAT_PROMPT = ("Output the thinking process in <think> </think> and the final answer in "
                 "<answer> </answer> tags.")
PHASES = {"mmrlvr": "mmrlvr, fp32 master weights", "mmrlvr-bf16": "mmrlvr, pure bf16 (contrast)",
          "trl": "TRL GRPOTrainer", "vllm": "mmrlvr, vLLM rollouts",
          "vllm-noise": "mmrlvr, vLLM rollouts + NC-GRPO noise",
          "mmrlvr-compiled": "mmrlvr, static KV cache + compiled decode (CUDA graphs)",
          "mmrlvr-packed": "mmrlvr, packed update (train.packing: no padding, block mask)"}


def length_reward(example, completion: str) -> float:
    """Dense shaping reward `len(completion) / 1000` (characters): spread in every group."""
    return len(completion) / 1000


def reward_specs() -> list[dict]:
    return [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1},
            {"name": f"{Path(__file__).resolve()}:length_reward", "weight": 1.0, "label": "length"}]


# ------------------------------------------------------------------------------------- setup

def model_dims(args) -> dict:
    return {k: getattr(args, k) for k in REFERENCE}


def prepare(args) -> tuple[Path, Path]:
    """Build the model and the shapes data into the workdir once (reused when they match)."""
    workdir = Path(args.workdir)
    dims, px = model_dims(args), args.image_size
    model_dir = workdir / ("qwen25vl-{hidden_size}x{num_layers}-h{num_heads}-kv{num_kv_heads}-"
                           "mlp{intermediate_size}-vis{vision_depth}x{vision_width}".format(**dims)
                           + f"-{px}px")
    info = model_dir / "tiny.json"
    built = json.loads(info.read_text()) if info.exists() else {}
    if any(built.get(k) != v for k, v in dims.items()):
        from mmrlvr.tiny import build_tiny

        t0 = time.perf_counter()
        print(f"building the random-weight Qwen2.5-VL in {model_dir} ...", file=sys.stderr,
              flush=True)
        build_tiny("qwen2.5-vl", model_dir, min_pixels=px * px, max_pixels=px * px, **dims)
        print(f"  built in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    n_rows = args.prompts * (args.warmup + args.steps)
    data_dir = workdir / f"shapes-{px}px-{n_rows}"
    if not (data_dir / "info.json").exists():
        from mmrlvr.tasks.shapes import make_shapes

        make_shapes(data_dir, n_train=n_rows, n_test=0, seed=0, image_size=px)
    return model_dir, data_dir / "train.jsonl"


def make_config(args, model_dir: Path, train_file: Path, out_dir: Path, *,
                param_dtype: str = "float32", backend: str = "hf", branching: dict | None = None,
                decode: str = "eager", packing: bool = False):
    from mmrlvr.config import load_config

    px = args.image_size * args.image_size
    compute = "bfloat16" if param_dtype == "bfloat16" else "auto"   # auto: bf16 on CUDA
    cfg = load_config(None, [
        f"model.path={model_dir}", f"model.min_pixels={px}", f"model.max_pixels={px}",
        f"model.dtype={compute}", f"model.param_dtype={param_dtype}", f"data.train={train_file}",
        f"rollout.backend={backend}", f"rollout.decode={decode}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=1.0",
        "algo.beta=0.0", f"optim.lr={args.lr}", "optim.schedule=constant",
        f"train.steps={args.warmup + args.steps}", f"train.batch_prompts={args.prompts}",
        f"train.micro_batch={args.micro_batch}", f"train.out_dir={out_dir}", "train.seed=0",
        f"train.device={args.device}", f"train.packing={str(packing).lower()}"])
    cfg.data.format_prompt = FORMAT_PROMPT
    cfg.rewards = reward_specs()
    if branching:
        cfg.rollout.branching = dict(branching)
    return cfg


# ----------------------------------------------------------------------------------- figures

def is_vision(name: str) -> bool:
    return ".visual." in f".{name}"


def param_counts(policy) -> dict[str, int]:
    text = vis = 0
    for name, p in policy.model.named_parameters():
        if p.requires_grad:
            if is_vision(name):
                vis += p.numel()
            else:
                text += p.numel()
    return {"trainable": text + vis, "trainable_text": text, "trainable_vision": vis,
            "total": sum(p.numel() for p in policy.model.parameters())}


def prompt_shape(run) -> dict[str, float]:
    """Mean prompt tokens (image tokens included) and vision patches per prompt (<= 16 prompts)."""
    examples = run.train_data[:16]
    batch = run.prompting.plain().encode(run.policy, examples)
    grid = batch.inputs.get("image_grid_thw")
    patches = float(grid.prod(dim=1).sum()) / len(examples) if grid is not None else 0.0
    return {"prompt_tokens": float(batch.inputs["attention_mask"].sum(dim=1).float().mean()),
            "patches": patches}


def snapshot(params) -> list:
    import torch

    return [p.detach().to("cpu", dtype=torch.float32, copy=True) for p in params]


def changed_fraction(params, before) -> tuple[int, int]:
    """(elements that differ from the snapshot, elements) over the trainable weights."""
    changed = total = 0
    for p, old in zip(params, before):
        changed += int((p.detach().float() != old.to(p.device)).sum())
        total += old.numel()
    return changed, total


def step_figures(m: dict, args) -> dict:
    rows = args.prompts * args.group
    return {"rollout_s": m["time/rollout_s"], "reward_s": m["time/reward_s"],
            "update_s": m["time/update_s"], "step_s": m["time/step_s"],
            "generate_s": m["engine/generate_s"], "weight_sync_s": m["engine/weight_sync_s"],
            "generated_tokens": m["response/length_mean"] * rows,
            "completion_tokens_mean": m["response/length_mean"],
            "trained_rows": m["update/trained_rows"], "reward_mean": m["reward/mean"],
            "padded_frac": m["update/padded_frac"]}


def summarize(r: dict, args) -> dict:
    """Medians, tokens/s and MFU (formulas in gpu_check.py's docstring) of a run's timed steps."""
    steps = r["steps"]
    for key in ("rollout_s", "reward_s", "update_s", "step_s"):
        r[f"median_{key}"] = statistics.median(s[key] for s in steps)
    tokens = sum(s["generated_tokens"] for s in steps)
    r["tokens_per_s"] = tokens / sum(s["rollout_s"] for s in steps)
    r["generate_tokens_per_s"] = tokens / sum(s["generate_s"] for s in steps)
    r["median_weight_sync_s"] = statistics.median(s["weight_sync_s"] for s in steps)
    B, G = args.prompts, args.group
    n_text, n_vis = r["params"]["trainable_text"], r["params"]["trainable_vision"]
    P, V = r["prompt_tokens"], r["patches"]
    for s in steps:
        R, C = s["trained_rows"], s["completion_tokens_mean"]
        s["update_flops"] = 6 * (n_text * R * (P + C) + n_vis * (R / G) * V)
        s["rollout_flops"] = 2 * (n_text * (B * G * P + s["generated_tokens"]) + n_vis * B * V)
    peak = args.peak_tflops
    r["peak_tflops"] = peak
    if peak:
        r["update_mfu"] = statistics.median(s["update_flops"] / s["update_s"] / (peak * 1e12)
                                            for s in steps)
        r["rollout_mfu"] = statistics.median(s["rollout_flops"] / s["rollout_s"] / (peak * 1e12)
                                             for s in steps)
    return r


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def package_version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"
