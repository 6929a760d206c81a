"""The runs bench/gpu_check.py makes after its own, each in a fresh interpreter (`spawn`: its own
GPU memory peak; a failure there is reported, not fatal): the pure-bf16 contrast, TRL's
GRPOTrainer on the same workload, and mmrlvr with vLLM rollouts without and with NC-GRPO noise,
the last followed by the vLLM noise check.

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
"""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpu_check_workload import FORMAT_PROMPT, PHASES, package_version, peak_rss_mib, reward_specs

SCRIPT = Path(__file__).resolve().with_name("gpu_check.py")
ROOT = SCRIPT.parents[1]
RESULT_TAG = "GPU_CHECK_RESULT "


def available(module: str) -> bool:
    """Whether `module` can be imported (an import hook that refuses it counts as absent)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ------------------------------------------------------------------------------ subprocesses

def spawn_others(argv: list[str], args, cuda: bool) -> tuple[dict[str, dict], dict[str, str]]:
    """Every configuration after the first that this box can run, each in its own subprocess:
    (results by phase, in report order; why each of the others was skipped)."""
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    if args.contrast:
        results["mmrlvr-bf16"] = spawn("mmrlvr-bf16", argv, args)
    cuda_only = (("mmrlvr-compiled", "--no-compile", args.no_compile,
                  "compiled decoding is measured on CUDA (CUDA graphs)"),
                 ("mmrlvr-packed", "--no-packing", args.no_packing,
                  "the packed update is measured on CUDA (on CPU: bench/packing.py)"))
    for phase, flag, off, why in cuda_only:
        if not cuda or off:
            skipped[phase] = why if not cuda else flag
        else:
            results[phase] = spawn(phase, argv, args)
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
    return results, skipped


def spawn(phase: str, argv: list[str], args) -> dict:
    """`phase` in a fresh interpreter (its own GPU memory and peak); its stderr streams through."""
    cmd = [sys.executable, str(SCRIPT), *argv, "--phase", phase, "--workdir", str(args.workdir)]
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


# --------------------------------------------------------------------------------------- TRL

def run_trl(args, model_dir: Path, train_file: Path, out_dir: Path) -> dict:
    """The same workload through TRL's GRPOTrainer; median step time of the timed steps."""
    import dataclasses

    import torch
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
            "config_keys_unknown_to_this_trl": dropped, "trl_version": package_version("trl"),
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "peak_rss_mib": peak_rss_mib()}


def print_trl(r: dict) -> None:
    """TRL's figures, after the mmrlvr configurations'."""
    print(f"\n[{PHASES['trl']}]")
    if "error" in r:
        print(f"  FAILED: {r['error']}")
    else:
        print(f"  trl {r['trl_version']}: median step {r['median_step_s']:.3f} s"
              + (f"; peak GPU memory {r['peak_gpu_gib']:.2f} GiB" if r["peak_gpu_gib"] else ""))
        if r["config_keys_unknown_to_this_trl"]:
            print(f"  (GRPOConfig of this trl lacks {r['config_keys_unknown_to_this_trl']}: "
                  "left at its defaults)")


# ------------------------------------------------------------------------- vLLM noise check

def _capture_install(worker) -> bool:
    """(runs in vLLM's worker) Record the last decoder layer's input before and after mmrlvr's
    noise hook, at every prompt row of every request, for the next forwards."""
    from dataclasses import asdict

    from mmrlvr.methods.ncgrpo.vllm_noise import batch_segments

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
    import torch

    from mmrlvr.methods.ncgrpo.branching import find_decoder
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
    import torch

    from mmrlvr.methods.ncgrpo.branching import NoisePlan, RowNoise

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
    batch = run.prompting.plain().encode(policy, run.train_data[:1])
    engine.wake_up()                      # syncs the last update's weights first
    engine.llm.collective_rpc(_capture_install)
    try:
        engine.generate(batch, SamplingParams(n=2, max_new_tokens=1, temperature=1.0))
    finally:
        rows = engine.llm.collective_rpc(_capture_take)[0]
    engine.sleep()
    hidden, mask = hf_last_layer_input(policy, batch)
    return compare_noise(rows, hidden, mask)


def print_noise_check(r: dict) -> None:
    """The noise check's figures, under the noisy vLLM run's."""
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
