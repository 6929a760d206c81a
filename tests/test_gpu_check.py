"""bench/gpu_check.py: it runs where only the training dependencies are installed, and its vLLM
noise check compares what it claims to (on a stand-in vLLM runner; vLLM itself needs a GPU)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
BLOCKED = ("gradio", "librosa", "diffusers", "vllm", "datasets", "math_verify", "soundfile", "cv2",
           "sacrebleu", "playwright", "trl")
"""What a GPU box with only torch, transformers, accelerate and peft lacks (trl needs datasets)."""

SITECUSTOMIZE = f'''
import os, sys

BLOCKED = {set(BLOCKED)!r}


class HideBlocked:
    """Wraps one import finder: the blocked packages are not there, as on a box without them
    (`importlib.util.find_spec` gives None, which transformers' availability probes expect,
    and `import` raises ModuleNotFoundError)."""

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            log = os.environ.get("GPU_CHECK_BLOCK_LOG")
            if log:
                with open(log, "a") as fh:
                    fh.write(name + "\\n")
            return None
        find = getattr(self.inner, "find_spec", None)
        return None if find is None else find(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [HideBlocked(f) for f in sys.meta_path]
'''
"""Installed by the interpreter at start-up (a `sitecustomize` on PYTHONPATH), in the script's
own process and in every subprocess it starts. Every finder is wrapped, `.pth`-installed ones
(editable installs) included: a finder that only raised ImportError first would break
transformers' `find_spec` probes, which never raise on a box that lacks a package."""


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_helper(name: str):
    """One of the script's helper modules (gpu_check_compare, gpu_check_workload), imported as
    the script imports it: loading the script puts bench/ on the import path."""
    load_gpu_check()
    return importlib.import_module(name)


def blocked_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
            "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "GPU_CHECK_BLOCK_LOG": str(tmp_path / "blocked.log")}


def test_gpu_check_runs_with_only_the_training_dependencies(tmp_path):
    env = blocked_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import gradio"], env=env, capture_output=True,
                           text=True, check=False)
    assert "No module named 'gradio'" in probe.stderr                    # the blocker is live

    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0",
         "--prompts", "2", "--group", "4", "--max-new-tokens", "16", "--micro-batch", "4",
         "--image-size", "112", "--peak-tflops", "1", "--contrast",
         "--workdir", str(tmp_path / "work"), "--json", str(out)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    log = tmp_path / "blocked.log"
    tried = sorted(set(log.read_text().split())) if log.exists() else []
    detail = f"blocked imports tried: {tried}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, detail
    text = proc.stdout
    for line in ("step split (median of 1 timed steps): rollout", "generated tokens/s:",
                 "update MFU:", "peak memory:", "weights changed:",
                 "skipped: TRL comparison: trl is not installed",
                 "skipped: vLLM runs and the noise check: vLLM needs a CUDA device"):
        assert line in text, detail
    verdict = re.search(r"^PASS: ([\d.]+) % of trainable weights changed with fp32 master weights",
                        text, re.M)
    assert verdict and float(verdict.group(1)) > 99.0, detail
    assert "contrast: pure bf16 left" in text, detail

    figures = json.loads(out.read_text())
    main, bf16 = figures["results"]["mmrlvr"], figures["results"]["mmrlvr-bf16"]
    assert figures["pass"] is True
    assert main["compute_dtype"] == "float32" and main["param_dtype"] == "float32"
    assert main["changed_fraction"] > 0.99 and main["weights_total"] == main["params"]["trainable"]
    assert bf16["param_dtype"] == "bfloat16" and bf16["changed_fraction"] < 0.5   # rounded away
    for r in (main, bf16):
        assert r["median_update_s"] > 0 and r["tokens_per_s"] > 0
        assert r["steps"][0]["trained_rows"] > 0                           # groups have spread
        assert 0 < r["update_mfu"] and 0 < r["rollout_mfu"]                # peak 1 TFLOP/s given
    assert main["patches"] == 64 and main["prompt_tokens"] > 16           # 112 px: 8 x 8 patches
    assert set(figures["skipped"]) == {"trl", "vllm", "mmrlvr-compiled", "mmrlvr-packed"}  # CPU


# ------------------------------------------------------------- the vLLM noise check, on a toy

D = 16


class SplitResidualLayer(nn.Module):
    """vLLM's decoder-layer calling convention: (positions, hidden_states, residual)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, positions, hidden_states, residual):
        stream = hidden_states if residual is None else hidden_states + residual
        return torch.tanh(self.proj(stream)), stream


class AddNorm(nn.Module):
    def forward(self, x, residual=None):
        return x if residual is None else x + residual


class ToyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(50, D)
        self.layers = nn.ModuleList([SplitResidualLayer() for _ in range(3)])
        self.norm = AddNorm()

    def forward(self, ids, positions):
        hidden, residual = self.embed_tokens(ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        return self.norm(hidden, residual)


class ToyRunner:
    """What the hooks read of vLLM's V1 GPUModelRunner: input_batch, requests, execute_model."""

    def __init__(self, prompt: torch.Tensor):
        torch.manual_seed(0)
        self.model = nn.Module()
        self.model.language_model = ToyDecoder()
        self.prompt, self.requests, self.input_batch = prompt, {}, None

    def step(self, reqs):
        """reqs: (req_id, computed, query_len, RowNoise | None), in batch order; one forward."""
        from mmrlvr.methods.ncgrpo.vllm_noise import noise_extra_args

        for rid, _, _, noise in reqs:
            extra = noise_extra_args(noise) if noise else None
            self.requests[rid] = SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra))
        L = len(self.prompt) - 4                              # 4 more ids to decode with
        self.input_batch = SimpleNamespace(
            req_ids=[r[0] for r in reqs], num_reqs=len(reqs),
            num_computed_tokens_cpu=np.array([r[1] for r in reqs], dtype=np.int32),
            num_prompt_tokens=np.array([L] * len(reqs), dtype=np.int32))
        return self.execute_model(SimpleNamespace(num_scheduled_tokens={r[0]: r[2] for r in reqs}))

    def execute_model(self, scheduler_output):
        parts = [(int(c), scheduler_output.num_scheduled_tokens[rid]) for rid, c in
                 zip(self.input_batch.req_ids, self.input_batch.num_computed_tokens_cpu)]
        ids = torch.cat([self.prompt[c:c + q] for c, q in parts])
        with torch.no_grad():
            positions = torch.cat([torch.arange(c, c + q) for c, q in parts])
            return self.model.language_model(ids, positions)


def clean_last_layer_input(runner, L: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The HF side's stand-in: the prompt's clean last-layer input, left padded
    ([1, pad + L, D], mask [1, pad + L])."""
    decoder, got = runner.model.language_model, {}
    handle = decoder.layers[-1].register_forward_pre_hook(
        lambda m, args: got.update(h=args[1] + args[2]))
    with torch.no_grad():
        decoder(runner.prompt[:L], torch.arange(L))
    handle.remove()
    hidden = torch.cat([torch.randn(pad, D), got["h"]]).unsqueeze(0)              # [1, P, D]
    mask = torch.cat([torch.zeros(pad, dtype=torch.long), torch.ones(L, dtype=torch.long)])
    return hidden, mask.unsqueeze(0)


def recorded_rows(compare, L: int = 9):
    """One clean and one noisy request of the same prompt through the toy runner with mmrlvr's
    noise hooks and the check's recording hooks; the noisy prefill comes in two chunks."""
    from mmrlvr.methods.ncgrpo.branching import Branching, make_plan
    from mmrlvr.methods.ncgrpo.vllm_noise import NoiseWorkerExtension

    torch.manual_seed(3)
    noise_config = load_helper("gpu_check_workload").NOISE
    noise = make_plan(Branching.from_config(noise_config), 1, 2).row(1)       # member 1 is noisy
    runner = ToyRunner(torch.randint(0, 50, (L + 4,)))
    worker = SimpleNamespace(model_runner=runner)
    NoiseWorkerExtension.mmrlvr_install_noise(worker, "last_layer_input")
    compare._capture_install(worker)
    runner.model.language_model(runner.prompt[:L], torch.arange(L))    # a warm-up: not recorded
    runner.step([("0", 0, L, None), ("1", 0, 4, noise)])
    runner.step([("1", 4, L - 4, noise), ("0", L, 1, None)])
    runner.step([("1", L, 1, noise), ("0", L + 1, 1, None)])           # decoding: not recorded
    rows = compare._capture_take(worker)
    return rows, runner, noise


def test_noise_check_recovers_the_hf_displacement_through_the_runner_hooks():
    compare = load_helper("gpu_check_compare")
    rows, runner, noise = recorded_rows(compare)
    assert [(r["request"], r["computed"], r["base"].shape[0]) for r in rows] == [
        ("0", 0, 9), ("1", 0, 4), ("1", 4, 5)]
    assert len(runner.model.language_model.layers[-1]._forward_pre_hooks) == 1  # only mmrlvr's left
    hidden, mask = clean_last_layer_input(runner, 9, pad=3)
    out = compare.compare_noise(rows, hidden, mask)
    assert out["noise_check_pass"] is True, out
    assert out["noise_prompt_tokens_vllm"] == out["noise_prompt_tokens_hf"] == 9
    assert out["noise_eps_cosine"] > 0.9999 and out["noise_displacement_rel_err"] < 1e-5
    assert out["noise_clean_max_abs_change"] == 0.0 and out["noise_base_rel_err"] < 1e-6
    assert abs(out["noise_sigma_ratio_median"] - 1) < 1e-6
    assert noise.alpha == 0.1 and noise.site == "last_layer_input"


def test_noise_check_fails_on_another_draw_a_moved_clean_row_or_another_prompt_length():
    compare = load_helper("gpu_check_compare")
    rows, runner, _ = recorded_rows(compare)
    hidden, mask = clean_last_layer_input(runner, 9, pad=3)

    other = [dict(r) for r in rows]
    for r in other:
        if r["noise"] is not None:
            r["noise"] = {**r["noise"], "seed": r["noise"]["seed"] + 1}      # HF draws another ε
    out = compare.compare_noise(other, hidden, mask)
    assert out["noise_check_pass"] is False and abs(out["noise_eps_cosine"]) < 0.5

    touched = [dict(r) for r in rows]
    touched[0]["moved"] = touched[0]["moved"] + 1e-3                      # the clean request moved
    out = compare.compare_noise(touched, hidden, mask)
    assert out["noise_check_pass"] is False and out["noise_clean_max_abs_change"] > 0

    short_mask = mask.clone()
    short_mask[0, 3] = 0                                                  # HF's prompt: 8 tokens
    out = compare.compare_noise(rows, hidden, short_mask)
    assert out["noise_check_pass"] is False and "9 prompt tokens" in out["noise_check_error"]


def test_hf_last_layer_input_is_what_the_last_decoder_layer_receives(tmp_path):
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.data import Example
    from mmrlvr.train.policy import Policy
    from mmrlvr.tiny import build_tiny
    from mmrlvr.core.types import to_device
    from PIL import Image

    compare = load_helper("gpu_check_compare")
    model_dir = build_tiny("qwen2.5-vl", tmp_path / "tiny")
    policy = Policy.load(ModelConfig(path=str(model_dir)), modalities.get("vision"),
                         torch.device("cpu"))
    image = tmp_path / "red.png"
    Image.new("RGB", (56, 56), "red").save(image)
    examples = [Example(id="a", prompt="How many shapes are in the image?", answer="1",
                        images=[str(image)]),
                Example(id="b", prompt="What colour is it?", answer="red", images=[str(image)])]
    batch = policy.adapter.encode(examples, policy.processor)
    hidden, mask = compare.hf_last_layer_input(policy, batch)
    with torch.no_grad():
        out = policy.model(**to_device(batch.inputs, policy.device), output_hidden_states=True,
                           use_cache=False)
    assert hidden.shape == out.hidden_states[-2].shape and hidden.dtype == torch.float32
    assert torch.allclose(hidden, out.hidden_states[-2].float(), atol=1e-5)
    assert torch.equal(mask, batch.inputs["attention_mask"]) and int(mask[1].sum()) < mask.shape[1]


@pytest.mark.parametrize("name", ["H100 80GB HBM3", "H200"])
def test_known_gpus_get_the_dense_bf16_peak(name):
    assert load_gpu_check().default_peak_tflops(f"NVIDIA {name}") == 989.0


@pytest.mark.parametrize("name", ["NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"])
def test_other_gpus_need_the_flag(name):
    assert load_gpu_check().default_peak_tflops(name) is None
