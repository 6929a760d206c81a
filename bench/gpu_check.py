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

Rewards: accuracy 0.9 + format 0.1 + `length_reward` below (len(text) / 1000). A random model
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
    which round most of them away; DESIGN.md measured 98 % unchanged).

When `trl` is installed: the same workload through TRL's GRPOTrainer (bf16 autocast over fp32
weights, the same rewards, one optimizer step of 4 micro-batches per 64 rollouts), and the
ratio of median step times. When `vllm` is installed (and on CUDA): `rollout.backend=vllm`
without and with NC-GRPO noise (`rollout.branching={kind: latent_noise, fraction: 0.5,
alpha: 0.1}`), tokens/s of each, and the noise check below. Each of these, and `--contrast`,
runs in its own subprocess (its own GPU memory peak; a failure there is reported, not fatal).

The vLLM noise check. After the timed steps the noisy engine generates one token for one prompt
with G = 2 (one clean request, one noisy). Two extra forward pre-hooks on vLLM's last decoder
layer, one before and one after mmrlvr's noise hook, record that layer's input (hidden_states +
residual) at the prompt rows. The HF path's side is the same prompt through the policy's own
forward (the weights vLLM was just synced from), its last-layer input displaced by
`NoisePlan.displace` (what `HFRolloutEngine` applies) with the noisy request's seed and sign.
Compared: the prompt length L of both paths (the noise is drawn as randn(L, d)); the recovered
noise direction (vLLM's displacement / σ_vLLM against HF's / σ_HF, cosine >= 0.99); the
displacement itself (relative error <= 0.1: bf16 rounding on vLLM's side plus the two paths'
σ, i.e. their hidden-state norms); the clean request's rows (exactly untouched); and, for
information, how far vLLM's clean last-layer input is from HF's. Not compared: the tokens
sampled after the displaced prefill (different samplers), decoding steps (the engine's own
counters check that only prompt tokens were displaced), chunked prefill (one prompt fits one
chunk here), the `final_hidden` site and the shared / antithetic noise modes.

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
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = dict(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                 intermediate_size=8960, vision_depth=32, vision_width=1280)
"""The measured reference workload's model: 1.87 B parameters (text 1.31 B, vision 0.56 B)."""
TINY = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256,
            vision_depth=2, vision_width=64)
"""`build_tiny`'s own defaults (0.9 M parameters)."""
H100_SXM_BF16_TFLOPS = 989.0
CHANGED_MIN = 0.99
NOISE = {"kind": "latent_noise", "fraction": 0.5, "alpha": 0.1}
FORMAT_PROMPT = ("Output the thinking process in <think> </think> and the final answer in "
                 "<answer> </answer> tags.")
RESULT_TAG = "GPU_CHECK_RESULT "
PHASES = {"mmrlvr": "mmrlvr, fp32 master weights", "mmrlvr-bf16": "mmrlvr, pure bf16 (contrast)",
          "trl": "TRL GRPOTrainer", "vllm": "mmrlvr, vLLM rollouts",
          "vllm-noise": "mmrlvr, vLLM rollouts + NC-GRPO noise"}


def length_reward(example, completion: str) -> float:
    """Dense shaping reward `len(completion) / 1000` (characters): spread in every group."""
    return len(completion) / 1000


def reward_specs() -> list[dict]:
    return [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1},
            {"name": f"{Path(__file__).resolve()}:length_reward", "weight": 1.0, "label": "length"}]


def default_peak_tflops(gpu_name: str) -> float | None:
    """Dense bf16 TFLOP/s of an H100 SXM or H200 (989); None for any other GPU (PCIe and NVL
    H100s are slower parts)."""
    name = gpu_name.upper()
    if "H200" in name or ("H100" in name and "PCIE" not in name and "NVL" not in name):
        return H100_SXM_BF16_TFLOPS
    return None


def available(module: str) -> bool:
    """Whether `module` can be imported (an import hook that refuses it counts as absent)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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
                param_dtype: str = "float32", backend: str = "hf", branching: dict | None = None):
    from mmrlvr.config import load_config

    px = args.image_size * args.image_size
    compute = "bfloat16" if param_dtype == "bfloat16" else "auto"   # auto: bf16 on CUDA
    cfg = load_config(None, [
        f"model.path={model_dir}", f"model.min_pixels={px}", f"model.max_pixels={px}",
        f"model.dtype={compute}", f"model.param_dtype={param_dtype}", f"data.train={train_file}",
        f"rollout.backend={backend}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=1.0",
        "algo.beta=0.0", f"optim.lr={args.lr}", "optim.schedule=constant",
        f"train.steps={args.warmup + args.steps}", f"train.batch_prompts={args.prompts}",
        f"train.micro_batch={args.micro_batch}", f"train.out_dir={out_dir}", "train.seed=0",
        f"train.device={args.device}"])
    cfg.data.format_prompt = FORMAT_PROMPT
    cfg.rewards = reward_specs()
    if branching:
        cfg.rollout.branching = dict(branching)
    return cfg


# ------------------------------------------------------------------------------ measurements

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
    batch = run.policy.adapter.encode(examples, run.policy.processor,
                                      system_prompt=run.cfg.data.system_prompt,
                                      format_prompt=run.cfg.data.format_prompt)
    grid = batch.inputs.get("image_grid_thw")
    patches = float(grid.prod(dim=1).sum()) / len(examples) if grid is not None else 0.0
    return {"prompt_tokens": float(batch.inputs["attention_mask"].sum(dim=1).float().mean()),
            "patches": patches}


def snapshot(params) -> list:
    return [p.detach().to("cpu", dtype=_torch().float32, copy=True) for p in params]


def changed_fraction(params, before) -> tuple[int, int]:
    """(elements that differ from the snapshot, elements) over the trainable weights."""
    changed = total = 0
    for p, old in zip(params, before):
        changed += int((p.detach().float() != old.to(p.device)).sum())
        total += old.numel()
    return changed, total


def _torch():
    import torch

    return torch


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def run_grpo(args, cfg, after=None) -> dict:
    """Warm-up + timed GRPO steps through the real trainer; the figures of the timed steps.

    `after(run)` runs once the steps are done (the vLLM noise check) and its dict is added."""
    torch = _torch()
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    cuda = torch.cuda.is_available() and args.device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t_load = time.perf_counter()
    run, _ = build_run(cfg)
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
              "branching": cfg.rollout.branching, "steps": [_step_figures(m, args) for m in steps],
              "peak_gpu_gib": peak, "peak_rss_mib": peak_rss_mib(),
              "weights_changed": changed, "weights_total": total,
              "changed_fraction": changed / max(total, 1)}
    if after is not None:
        result.update(after(run))
    return summarize(result, args)


def _step_figures(m: dict, args) -> dict:
    rows = args.prompts * args.group
    return {"rollout_s": m["time/rollout_s"], "reward_s": m["time/reward_s"],
            "update_s": m["time/update_s"], "step_s": m["time/step_s"],
            "generate_s": m["engine/generate_s"], "weight_sync_s": m["engine/weight_sync_s"],
            "generated_tokens": m["response/length_mean"] * rows,
            "completion_tokens_mean": m["response/length_mean"],
            "trained_rows": m["update/trained_rows"], "reward_mean": m["reward/mean"]}


def summarize(r: dict, args) -> dict:
    """Medians, tokens/s and MFU (formulas in the module docstring) of a run's timed steps."""
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


# ------------------------------------------------------------------------- vLLM noise check

def _capture_install(worker) -> bool:
    """(runs in vLLM's worker) Record the last decoder layer's input before and after mmrlvr's
    noise hook, at every prompt row of every request, for the next forwards."""
    from dataclasses import asdict

    from mmrlvr.rollout.vllm_noise import batch_segments

    runner = worker.model_runner
    hooks = runner._mmrlvr_noise
    layer = hooks.decoder.layers[-1]
    store: dict = {"rows": []}

    def layer_input(args, kwargs):
        bound = hooks.signature.bind(*args, **kwargs)
        hidden, residual = bound.arguments["hidden_states"], bound.arguments.get("residual")
        return hidden.float() if residual is None else hidden.float() + residual.float()

    def before(module, args, kwargs):
        if hooks.num_scheduled is not None:          # a real step, not a warm-up / dummy run
            store["base"] = layer_input(args, kwargs)

    def after(module, args, kwargs):
        base = store.pop("base", None)
        if base is None:
            return
        moved = layer_input(args, kwargs)
        start = 0
        for req_id, seg in zip(runner.input_batch.req_ids,
                               batch_segments(runner, hooks.num_scheduled)):
            n = seg.prompt_rows
            if n:
                store["rows"].append({
                    "request": str(req_id), "computed": seg.computed, "prompt_len": seg.prompt_len,
                    "noise": None if seg.noise is None else asdict(seg.noise),
                    "base": base[start:start + n].cpu(), "moved": moved[start:start + n].cpu()})
            start += seg.query_len

    handles = [layer.register_forward_pre_hook(before, with_kwargs=True, prepend=True),
               layer.register_forward_pre_hook(after, with_kwargs=True)]
    runner._gpu_check_capture = (store, handles)
    return True


def _capture_take(worker) -> list[dict]:
    """(runs in vLLM's worker) The recorded rows; removes the recording hooks."""
    store, handles = worker.model_runner._gpu_check_capture
    for h in handles:
        h.remove()
    del worker.model_runner._gpu_check_capture
    return store["rows"]


def hf_last_layer_input(policy, batch):
    """The HF path's input to the last decoder layer for `batch`'s prompts: ([N, P, d] float32,
    attention mask [N, P]), from the policy's own forward in its generation precision."""
    torch = _torch()
    from mmrlvr.rollout.branching import find_decoder
    from mmrlvr.core.types import to_device

    grabbed = {}

    def grab(module, args, kwargs):
        grabbed["h"] = (args[0] if args else kwargs["hidden_states"]).detach().float().cpu()

    handle = find_decoder(policy.model).layers[-1].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        inputs = to_device(batch.inputs, policy.device, policy.dtype)
        with torch.no_grad(), policy.generation():
            policy.model(**inputs, use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return grabbed["h"], batch.inputs["attention_mask"].cpu()


def compare_noise(rows: list[dict], hf_hidden, hf_mask) -> dict:
    """vLLM's recorded last-layer inputs of one prompt against the HF path's displacement.

    `rows`: `_capture_take`'s records (one clean and one noisy request of the same prompt);
    `hf_hidden` [1, P, d] float32 and `hf_mask` [1, P]: `hf_last_layer_input` of that prompt."""
    torch = _torch()
    from mmrlvr.rollout.branching import NoisePlan, RowNoise

    noisy = sorted({r["request"] for r in rows if r["noise"] is not None})
    if len(noisy) != 1:
        return {"noise_check_pass": False,
                "noise_check_error": f"expected one noisy request's prefill, recorded {len(noisy)}"}
    mine = sorted((r for r in rows if r["request"] == noisy[0]), key=lambda r: r["computed"])
    L, d = mine[0]["prompt_len"], hf_hidden.shape[-1]
    pos = hf_mask[0].bool()
    L_hf = int(pos.sum())
    out = {"noise_prompt_tokens_vllm": L, "noise_prompt_tokens_hf": L_hf}
    covered = sum(r["base"].shape[0] for r in mine)
    if L != L_hf or covered != L:
        out.update(noise_check_pass=False, noise_check_error=(
            f"vLLM's noisy request has {L} prompt tokens ({covered} recorded), the HF prompt "
            f"{L_hf}: the noise, randn(L, d), is not the same draw"))
        return out
    base = torch.cat([r["base"] for r in mine])                                    # [L, d]
    moved = torch.cat([r["moved"] for r in mine])                                  # [L, d]
    noise = RowNoise(**mine[0]["noise"])
    plan = NoisePlan(noise.site, noise.alpha, 1, [True], [noise.seed], [noise.sign])
    h = hf_hidden[0, pos]                                                          # [L, d]
    disp_hf = (plan.displace(hf_hidden, hf_mask) - hf_hidden)[0, pos]              # [L, d]
    disp_vllm = moved - base                                                       # [L, d]
    sigma_vllm = noise.alpha * base.norm(dim=-1, keepdim=True) / math.sqrt(d)      # [L, 1]
    sigma_hf = noise.alpha * h.norm(dim=-1, keepdim=True) / math.sqrt(d)           # [L, 1]
    eps_cos = float(torch.nn.functional.cosine_similarity(
        (disp_vllm / sigma_vllm).flatten(), (disp_hf / sigma_hf).flatten(), dim=0))
    disp_err = float((disp_vllm - disp_hf).norm() / disp_hf.norm())
    clean = [r for r in rows if r["noise"] is None]
    clean_max = max((float((r["moved"] - r["base"]).abs().max()) for r in clean), default=None)
    out.update(noise_eps_cosine=eps_cos, noise_displacement_rel_err=disp_err,
               noise_sigma_ratio_median=float((sigma_vllm / sigma_hf).median()),
               noise_clean_max_abs_change=clean_max,
               noise_base_rel_err=float((base - h).norm() / h.norm()))
    if clean_max is None:
        out.update(noise_check_pass=False, noise_check_error="no clean request was recorded")
    else:
        out["noise_check_pass"] = eps_cos >= 0.99 and disp_err <= 0.1 and clean_max == 0.0
    return out


def noise_check(run) -> dict:
    """One prompt, G = 2 (one clean, one noisy member) through the noisy vLLM engine, compared
    with the HF path (module docstring)."""
    from mmrlvr.rollout import SamplingParams

    policy, engine = run.policy, run.engine
    batch = policy.adapter.encode(run.train_data[:1], policy.processor,
                                  system_prompt=run.cfg.data.system_prompt,
                                  format_prompt=run.cfg.data.format_prompt)
    engine.wake_up()                      # syncs the last update's weights first
    engine.llm.collective_rpc(_capture_install)
    try:
        engine.generate(batch, SamplingParams(n=2, max_new_tokens=1, temperature=1.0))
    finally:
        rows = engine.llm.collective_rpc(_capture_take)[0]
    engine.sleep()
    hidden, mask = hf_last_layer_input(policy, batch)
    return compare_noise(rows, hidden, mask)


# --------------------------------------------------------------------------------------- TRL

def run_trl(args, model_dir: Path, train_file: Path, out_dir: Path) -> dict:
    """The same workload through TRL's GRPOTrainer; median step time of the timed steps."""
    import dataclasses

    torch = _torch()
    from datasets import Dataset
    from datasets import Image as ImageFeature
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmrlvr.data import Example, load_dataset
    from mmrlvr.train.policy import load_processor
    from rewards.base import build_combined

    total = args.warmup + args.steps
    examples = load_dataset(str(train_file))
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"{ex.prompt} {FORMAT_PROMPT}"}]
                   for ex in examples],
        "image": [str(ex.images[0]) for ex in examples],
        "answer": [ex.answer for ex in examples], "id": [ex.id for ex in examples],
    }).cast_column("image", ImageFeature())
    combined = build_combined(reward_specs())

    def mmrlvr_reward(prompts, completions, answer, id, **_):
        """mmrlvr's combined reward, one completion at a time."""
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [combined.score(Example(id=i, prompt="", answer=a), [t])[0]["overall"]
                for t, a, i in zip(texts, answer, id)]

    class Timer(TrainerCallback):
        """Wall time between optimizer steps (generation, rewards and update all inside)."""

        def __init__(self):
            self.last, self.steps = None, []

        def on_step_begin(self, args, state, control, **kw):
            if self.last is None:
                self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            self.steps.append(now - self.last)
            self.last = now

    cuda = torch.cuda.is_available() and args.device != "cpu"
    accum = args.prompts * args.group // args.micro_batch
    wanted = dict(
        output_dir=str(out_dir), num_generations=args.group,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=accum,
        steps_per_generation=accum, num_iterations=1, max_completion_length=args.max_new_tokens,
        max_prompt_length=None, temperature=1.0, top_p=1.0, learning_rate=args.lr,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, beta=0.0,
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, max_steps=total, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=not cuda, bf16=cuda, gradient_checkpointing=False,
        model_init_kwargs={"dtype": "float32"}, seed=0, dataloader_num_workers=0,
        disable_tqdm=True, log_completions=False)
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    dropped = sorted(set(wanted) - known)
    timer = Timer()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=mmrlvr_reward,
                          args=GRPOConfig(**{k: v for k, v in wanted.items() if k in known}),
                          train_dataset=dataset, processing_class=load_processor(str(model_dir)),
                          callbacks=[timer])
    trainer.train()
    if len(timer.steps) != total:
        raise RuntimeError(f"expected {total} TRL optimizer steps, timed {len(timer.steps)}")
    timed = timer.steps[args.warmup:]
    return {"median_step_s": statistics.median(timed), "step_s": timed,
            "config_keys_unknown_to_this_trl": dropped, "trl_version": _version("trl"),
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "peak_rss_mib": peak_rss_mib()}


# ------------------------------------------------------------------------------------ phases

def run_phase(phase: str, args) -> dict:
    model_dir, train_file = prepare(args)
    out_dir = Path(tempfile.mkdtemp(prefix=f"run-{phase}-", dir=args.workdir))
    if phase == "trl":
        return run_trl(args, model_dir, train_file, out_dir)
    kwargs = {"mmrlvr": {}, "mmrlvr-bf16": {"param_dtype": "bfloat16"},
              "vllm": {"backend": "vllm"},
              "vllm-noise": {"backend": "vllm", "branching": NOISE}}[phase]
    cfg = make_config(args, model_dir, train_file, out_dir, **kwargs)
    return run_grpo(args, cfg, after=noise_check if phase == "vllm-noise" else None)


def spawn(phase: str, argv: list[str], args) -> dict:
    """`phase` in a fresh interpreter (its own GPU memory and peak); its stderr streams through."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--phase", phase,
           "--workdir", str(args.workdir)]
    if args.peak_tflops:
        cmd += ["--peak-tflops", str(args.peak_tflops)]
    print(f"\n[{PHASES[phase]}] running in a subprocess ...", file=sys.stderr, flush=True)
    result = None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        for line in proc.stdout:             # its log goes on to stderr; the result line is ours
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
            else:
                sys.stderr.write(line)
    if result is None:
        return {"error": f"the subprocess exited {proc.returncode} without a result "
                         "(its log is above)"}
    return result


def guarded(fn, *a) -> dict:
    try:
        return fn(*a)
    except Exception as err:  # noqa: BLE001 - report the failure, keep the other figures
        import traceback

        traceback.print_exc(file=sys.stderr)
        return {"error": f"{type(err).__name__}: {err}"}


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


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
    print(f"  mean completion {mean_len:.1f} tokens; the update trained {rows:.0f} of "
          f"{args.prompts * args.group} rows")
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
        if "noise_eps_cosine" in r:
            print(f"  noise check: prompt tokens vLLM {r['noise_prompt_tokens_vllm']} / HF "
                  f"{r['noise_prompt_tokens_hf']}; noise direction cosine "
                  f"{r['noise_eps_cosine']:.4f}; displacement rel. error "
                  f"{r['noise_displacement_rel_err']:.4f}; σ ratio "
                  f"{r['noise_sigma_ratio_median']:.4f}; clean rows max |change| "
                  f"{r['noise_clean_max_abs_change']}; clean last-layer input vLLM vs HF "
                  f"rel. error {r['noise_base_rel_err']:.4f}")
        else:
            print(f"  noise check: {r.get('noise_check_error')}")


def print_header(args, model: dict, main_shape: dict) -> None:
    torch = _torch()
    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = torch.cuda.get_device_name() if cuda else "CPU"
    dims = model_dims(args)
    print(f"mmrlvr GPU check: random-weight Qwen2.5-VL, {model.get('total', 0):,} parameters (text "
          f"{dims['hidden_size']} x {dims['num_layers']}, vision {dims['vision_depth']} x "
          f"{dims['vision_width']}), {args.image_size} px images; {args.prompts} prompts x "
          f"{args.group} rollouts x <= {args.max_new_tokens} new tokens, micro-batch "
          f"{args.micro_batch}, lr {args.lr:g}; {args.warmup} warm-up + {args.steps} timed steps")
    print(f"device {device}; torch {torch.__version__}, transformers {_version('transformers')}")
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

    torch = _torch()
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
        skipped: dict[str, str] = {}
        if args.contrast:
            results["mmrlvr-bf16"] = spawn("mmrlvr-bf16", argv, args)
        if args.no_trl:
            skipped["trl"] = "--no-trl"
        elif not available("trl"):
            skipped["trl"] = "trl is not installed (pip install trl, or the [bench] extra)"
        else:
            results["trl"] = spawn("trl", argv, args)
        if args.no_vllm:
            skipped["vllm"] = "--no-vllm"
        elif not cuda:
            skipped["vllm"] = "vLLM needs a CUDA device"
        elif not available("vllm"):
            skipped["vllm"] = "vllm is not installed (the [vllm] extra)"
        else:
            results["vllm"] = spawn("vllm", argv, args)
            results["vllm-noise"] = spawn("vllm-noise", argv, args)
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
        r = results["trl"]
        print(f"\n[{PHASES['trl']}]")
        if "error" in r:
            print(f"  FAILED: {r['error']}")
        else:
            print(f"  trl {r['trl_version']}: median step {r['median_step_s']:.3f} s"
                  + (f"; peak GPU memory {r['peak_gpu_gib']:.2f} GiB" if r["peak_gpu_gib"] else ""))
            if r["config_keys_unknown_to_this_trl"]:
                print(f"  (GRPOConfig of this trl lacks {r['config_keys_unknown_to_this_trl']}: "
                      "left at its defaults)")
    print()
    for name, why in skipped.items():
        label = "TRL comparison" if name == "trl" else "vLLM runs and the noise check"
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
    for name in ("vllm", "vllm-noise"):
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
