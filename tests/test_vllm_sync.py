"""The vLLM backend beside a (multi-process) training run, without vLLM or a GPU: weight names,
LoRA merge, unit-by-unit gathering (counted fake shards and real FSDP2 over 2 gloo processes),
per-rank seeds, LLM arguments, request building, and the engine against a stand-in `LLM`."""
from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.rollout import vllm as vllm_engine
from mmrlvr.rollout.base import SamplingParams
from mmrlvr.rollout.vllm import RequestSpec, build_requests, llm_kwargs, request_specs
from mmrlvr.rollout.vllm_sync import (
    checkpoint_name,
    engine_seed,
    load_units,
    merge_lora,
    plain_name,
    sync_units,
    unit_key,
)

KINDS = {"qwen2-vl": "qwen2_vl", "qwen2.5-vl": "qwen2_5_vl", "qwen2-audio": "qwen2_audio"}

# vLLM 0.33.0's Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration
# hf_to_vllm_mapper prefixes (applied in turn); Qwen2AudioForConditionalGeneration has no mapper.
VLLM_VL_PREFIXES = {"model.language_model.": "language_model.model.", "model.visual.": "visual.",
                    "lm_head.": "language_model.lm_head.", "model.": "language_model.model."}
VLLM_MODULE_ROOTS = {"qwen2_vl": ("language_model.model.", "language_model.lm_head.", "visual."),
                     "qwen2_audio": ("language_model.model.", "language_model.lm_head.",
                                     "audio_tower.", "multi_modal_projector.")}
VLLM_MODULE_ROOTS["qwen2_5_vl"] = VLLM_MODULE_ROOTS["qwen2_vl"]


def vllm_internal_name(name: str, model_type: str) -> str:
    if model_type == "qwen2_audio":
        return name
    for prefix, new in VLLM_VL_PREFIXES.items():
        if name.startswith(prefix):
            name = name.replace(prefix, new, 1)
    return name


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    root = tmp_path_factory.mktemp("vllm-sync")
    return {kind: Path(build_tiny(kind, root / kind)) for kind in KINDS}


def load(path, dtype=torch.float32):
    from mmrlvr.train.policy import load_model

    torch.manual_seed(0)
    return load_model(str(path), dtype)


def checkpoint_keys(path: Path) -> set[str]:
    from safetensors import safe_open

    keys = set()
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            keys |= set(f.keys())
    return keys


def synced(model, model_type, dtype=torch.float32, **kw) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for unit in sync_units(model, model_type, dtype, **kw):
        for name, tensor in unit:
            assert name not in out, f"{name} sent twice"
            out[name] = tensor
    return out


def with_lora(model, seed=1, targets=("q_proj", "k_proj", "v_proj", "o_proj", "qkv")):
    """peft LoRA (scaling alpha/r = 4) with random B, so the merge is not a no-op."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=list(targets)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return peft_model


# ------------------------------------------------------------------------------- names

@pytest.mark.parametrize("kind", list(KINDS))
def test_every_parameter_maps_to_the_checkpoint_transformers_writes(tiny_dirs, kind):
    model_type = KINDS[kind]
    model = load(tiny_dirs[kind])
    assert model.config.model_type == model_type
    names = [n for n, _ in model.named_parameters()]
    mapped = [checkpoint_name(plain_name(n), model_type) for n in names]
    assert len(set(mapped)) == len(mapped) == len(names)              # no collisions
    assert set(mapped) == checkpoint_keys(tiny_dirs[kind])            # what vLLM loads from disk
    # ... and vLLM's own mapper puts each of them under one of its model's modules
    roots = VLLM_MODULE_ROOTS[model_type]
    assert all(vllm_internal_name(m, model_type).startswith(roots) for m in mapped)
    assert synced(model, model_type).keys() == set(mapped)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_known_vision_language_names_map_exactly(model_type):
    cases = {
        "model.language_model.layers.3.self_attn.q_proj.weight":
            "model.layers.3.self_attn.q_proj.weight",
        "model.language_model.embed_tokens.weight": "model.embed_tokens.weight",
        "model.language_model.norm.weight": "model.norm.weight",
        "model.visual.blocks.1.attn.qkv.bias": "visual.blocks.1.attn.qkv.bias",
        "model.visual.merger.mlp.0.weight": "visual.merger.mlp.0.weight",
        "model.visual.patch_embed.proj.weight": "visual.patch_embed.proj.weight",
        "lm_head.weight": "lm_head.weight",
        "model.layers.0.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight",  # already so
        "visual.blocks.0.norm1.weight": "visual.blocks.0.norm1.weight",
    }
    for name, want in cases.items():
        assert checkpoint_name(name, model_type) == want
    assert vllm_internal_name("model.layers.3.self_attn.q_proj.weight", model_type) == \
        "language_model.model.layers.3.self_attn.q_proj.weight"


def test_known_audio_names_map_exactly():
    cases = {
        "model.language_model.layers.2.mlp.down_proj.weight":
            "language_model.model.layers.2.mlp.down_proj.weight",
        "model.audio_tower.layers.0.self_attn.k_proj.weight":
            "audio_tower.layers.0.self_attn.k_proj.weight",
        "model.audio_tower.embed_positions.weight": "audio_tower.embed_positions.weight",
        "model.multi_modal_projector.linear.bias": "multi_modal_projector.linear.bias",
        "lm_head.weight": "language_model.lm_head.weight",
        "language_model.lm_head.weight": "language_model.lm_head.weight",     # transformers 4
        "audio_tower.conv1.weight": "audio_tower.conv1.weight",
    }
    for name, want in cases.items():
        assert checkpoint_name(name, "qwen2_audio") == want


def test_unknown_names_and_families_fail_loudly():
    with pytest.raises(ValueError, match="no checkpoint name"):
        checkpoint_name("vision_tower.blocks.0.weight", "qwen2_vl")
    with pytest.raises(ValueError, match="no checkpoint name"):
        checkpoint_name("model.visual.blocks.0.norm1.weight", "qwen2_audio")
    with pytest.raises(ValueError, match="no weight-name mapping for model type 'llava'"):
        checkpoint_name("model.layers.0.weight", "llava")


def test_wrappers_and_peft_names_are_stripped():
    assert plain_name("base_model.model.model.language_model.layers.0.self_attn.q_proj"
                      ".base_layer.weight") == \
        "model.language_model.layers.0.self_attn.q_proj.weight"
    assert plain_name("base_model.model.model.language_model.layers.0.self_attn.q_proj"
                      ".lora_A.default.weight") is None
    assert plain_name("model.language_model.layers._checkpoint_wrapped_module.mlp.up_proj.weight") \
        == "model.language_model.layers.mlp.up_proj.weight"
    assert plain_name("_orig_mod.lm_head.weight") == "lm_head.weight"
    assert plain_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert plain_name("base_model.model.lm_head.original_module.weight") is None
    assert unit_key("base_model.model.model.visual.blocks.1.attn.qkv.lora_B.default.weight") \
        == "base_model.model.model.visual.blocks.1"
    assert unit_key("base_model.model.lm_head.base_layer.weight") == \
        unit_key("base_model.model.lm_head.lora_A.default.weight") == "base_model.model.lm_head"
    assert unit_key("model.language_model.norm.weight") == "model.language_model.norm"


# ------------------------------------------------------------------------------- LoRA

def test_lora_merge_equals_peft_merge_and_unload(tiny_dirs):
    peft_model = with_lora(load(tiny_dirs["qwen2.5-vl"]))
    reference = copy.deepcopy(peft_model).merge_and_unload()
    want = {checkpoint_name(n, "qwen2_5_vl"): p.detach() for n, p in reference.named_parameters()}
    got = synced(peft_model, "qwen2_5_vl")
    assert got.keys() == want.keys()
    for name in want:
        assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=name)
    adapted = "model.layers.1.self_attn.v_proj.weight"
    base = peft_model.base_model.model.model.language_model.layers[1].self_attn.v_proj
    assert not torch.allclose(got[adapted], base.base_layer.weight)      # the delta is in
    # merge_lora is W + scaling·B@A (fan_in_fan_out transposes the delta)
    w, a, b = torch.randn(6, 5), torch.randn(2, 5), torch.randn(6, 2)
    assert_close(merge_lora(w, [(a, b, 0.5)]), w + 0.5 * b @ a)
    assert_close(merge_lora(w.T, [(a, b, 0.5)], fan_in_fan_out=True), w.T + 0.5 * (b @ a).T)
    # an adapter peft already merged into its base is not added twice
    peft_model.merge_adapter()
    again = synced(peft_model, "qwen2_5_vl")
    for name in want:
        assert_close(again[name], want[name], rtol=0, atol=1e-6, msg=name)


def test_later_syncs_send_only_what_training_changes(tiny_dirs):
    model = load(tiny_dirs["qwen2-vl"])
    for name, p in model.named_parameters():
        if ".visual." in f".{name}":
            p.requires_grad_(False)
    sent = synced(model, "qwen2_vl", only_trainable=True)
    assert sent and not any(n.startswith("visual.") for n in sent)
    assert len(sent) == sum(p.requires_grad for p in model.parameters())
    peft_model = with_lora(load(tiny_dirs["qwen2-vl"]), targets=("q_proj", "v_proj"))
    sent = synced(peft_model, "qwen2_vl", only_trainable=True)
    assert sorted(sent) == sorted(f"model.layers.{i}.self_attn.{m}_proj.weight"
                                  for i in range(4) for m in ("q", "v"))


# ------------------------------------------------------------------------------- unit by unit

class GatherLog:
    """Counts `full_tensor()` calls and checks that no tensor of an earlier unit is still alive."""

    def __init__(self):
        self.order: list[str] = []
        self.unit = -1
        self.unit_name = None
        self.alive: list[tuple[weakref.ref, int]] = []
        self.most_alive = 0

    def gathering(self, name: str) -> None:
        key = unit_key(name)
        if key != self.unit_name:
            self.unit, self.unit_name = self.unit + 1, key
        live = [(ref, u) for ref, u in self.alive if ref() is not None]
        stale = [u for _, u in live if u != self.unit]
        assert not stale, f"gathering {name} (unit {self.unit}) while tensors of units {stale} live"
        self.order.append(name)

    def track(self, tensor: torch.Tensor) -> None:
        self.alive.append((weakref.ref(tensor), self.unit))
        self.most_alive = max(self.most_alive, sum(r() is not None for r, _ in self.alive))


class FakeShard:
    """A DTensor stand-in: `full_tensor()` hands out a fresh whole tensor and is logged."""

    def __init__(self, name, value, requires_grad, log):
        self.name, self.value, self.requires_grad, self.log = name, value, requires_grad, log

    def full_tensor(self) -> torch.Tensor:
        self.log.gathering(self.name)
        whole = self.value.clone()
        self.log.track(whole)
        return whole


class ShardedModel:
    """What sync_units reads of a model, with every parameter a FakeShard."""

    def __init__(self, model, log):
        self._params = [(n, FakeShard(n, p.detach(), p.requires_grad, log))
                        for n, p in model.named_parameters()]
        self._model = model

    def named_parameters(self):
        return iter(self._params)

    def named_modules(self):
        return self._model.named_modules()


def test_units_are_gathered_one_at_a_time_in_a_fixed_order(tiny_dirs):
    peft_model = with_lora(load(tiny_dirs["qwen2-vl"]))
    want = synced(peft_model, "qwen2_vl", torch.bfloat16)
    logs, results = [], []
    for _ in range(2):                                   # two "ranks"
        log = GatherLog()
        received: dict[str, torch.Tensor] = {}

        def load_fn(unit, log=log, received=received):
            for name, tensor in unit:
                log.track(tensor)
                received[name] = tensor.clone()          # a copy: vLLM copies into its own

        count, size = load_units(sync_units(ShardedModel(peft_model, log), "qwen2_vl",
                                            torch.bfloat16), load_fn)
        assert count == len(received) and size == 2 * sum(t.numel() for t in received.values())
        logs.append(log)
        results.append(received)
    params = [n for n, _ in peft_model.named_parameters()]
    active_lora = [n for n in params if "lora_" in n]
    assert logs[0].order == logs[1].order == params      # every shard, model order, once
    assert active_lora and set(active_lora) <= set(logs[0].order)
    layer_size = sum(1 for n in params if ".language_model.layers.0." in n)
    assert logs[0].most_alive <= 2 * layer_size          # one layer: whole + cast copies
    for got in results:
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]) and got[name].dtype == torch.bfloat16


FSDP_SCRIPT_MARK = "--fsdp2-worker"


def fsdp2_worker(path: str, out: str) -> None:
    """One rank: sync units of a tiny Qwen2-VL (plain, then with LoRA) before and after
    fully_shard, and write whether they match."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    result = {}
    for variant in ("plain", "lora"):
        model = load(path)
        if variant == "lora":
            model = with_lora(model)
        want = synced(model, "qwen2_vl", torch.bfloat16)
        for module in model.modules():
            if type(module).__name__.endswith(("DecoderLayer", "VisionBlock")):
                fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sharded = all(isinstance(p, DTensor) for p in model.parameters())
        got = synced(model, "qwen2_vl", torch.bfloat16)
        result[variant] = {"sharded": sharded, "names": list(got),
                           "equal": got.keys() == want.keys()
                           and all(torch.equal(got[k], want[k]) for k in want)}
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_shards_sync_exactly_like_the_whole_model_on_two_processes(tiny_dirs, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
               "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                              os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen(
            [sys.executable, __file__, FSDP_SCRIPT_MARK, str(tiny_dirs["qwen2-vl"]),
             str(tmp_path / f"rank{rank}.json")], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, output[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for variant in ("plain", "lora"):
        assert all(r[variant]["sharded"] and r[variant]["equal"] for r in ranks), variant
        assert ranks[0][variant]["names"] == ranks[1][variant]["names"]


# ------------------------------------------------------------------------------- engine set-up

def test_every_rank_gets_its_own_seed():
    assert [engine_seed(7, r) for r in range(4)] == [7, 8, 9, 10]
    assert engine_seed(0, 0) != engine_seed(1, 0)


def test_llm_arguments_single_and_multi_process():
    one = llm_kwargs("/m", dtype=torch.bfloat16, media="image", gpu_memory_utilization=0.4,
                     max_model_len=None, seed=5, rank=0, world=1, noise=False)
    assert one == dict(model="/m", dtype="bfloat16", seed=5, gpu_memory_utilization=0.4,
                       max_model_len=None, enable_prefix_caching=True, enable_sleep_mode=True,
                       logprobs_mode="processed_logprobs",
                       limit_mm_per_prompt={"image": 8, "video": 0})
    many = llm_kwargs("/m", dtype=torch.bfloat16, media="audio", gpu_memory_utilization=0.4,
                      max_model_len=4096, seed=5, rank=3, world=4, noise=True)
    assert many["distributed_executor_backend"] == "external_launcher"
    assert many["tensor_parallel_size"] == 1 and many["seed"] == 8
    assert many["limit_mm_per_prompt"] == {"audio": 8}
    assert many["enforce_eager"] is True
    assert many["worker_extension_cls"] == "mmrlvr.rollout.vllm_noise.NoiseWorkerExtension"


def test_requests_carry_sampling_media_noise_and_salts():
    from mmrlvr.rollout.branching import Branching, make_plan

    torch.manual_seed(0)
    plan = make_plan(Branching(kind="latent_noise", fraction=0.5, alpha=0.2), 2, 4)
    specs = request_specs(2, 4, plan, salt="s")
    prompts = [{"prompt": "p0", "multi_modal_data": {"image": ["img"]}}, {"prompt": "p1"}]
    params = SamplingParams(n=4, max_new_tokens=12, temperature=0.7, top_p=0.9)
    requests, samplings = build_requests(prompts, specs, params, eos_ids=[5, 6],
                                         placeholder_ids=[9])
    assert [r["prompt"] for r in requests] == ["p0", "p0", "p0", "p1", "p1", "p1"]
    assert requests[0] == prompts[0] and requests[1]["multi_modal_data"] == {"image": ["img"]}
    assert "cache_salt" not in requests[0] and requests[1]["cache_salt"] == "s:2"
    assert [s["n"] for s in samplings] == [2, 1, 1, 2, 1, 1]
    assert samplings[0] == dict(n=2, max_tokens=12, logprobs=0, stop_token_ids=[5, 6],
                                temperature=0.7, top_p=0.9, top_k=-1, logit_bias={9: -100.0},
                                extra_args=None)
    assert samplings[1]["extra_args"] == {"mmrlvr_noise": {
        "seed": plan.row(2).seed, "sign": 1.0, "alpha": 0.2, "site": "last_layer_input"}}
    greedy = SamplingParams(max_new_tokens=3, greedy=True)
    _, [g] = build_requests(prompts[:1], [RequestSpec(0, (0,))], greedy, [5], [])
    assert (g["n"], g["temperature"], g["top_p"], g["logit_bias"]) == (1, 0.0, 1.0, None)


# ------------------------------------------------------------------------------- the engine

class FakeVLLMModel:
    def __init__(self):
        self.weights: dict[str, torch.Tensor] = {}
        self.loads: list[list[str]] = []

    def load_weights(self, weights):
        names = []
        for name, tensor in weights:
            self.weights[name] = tensor.clone()
            names.append(name)
        self.loads.append(names)
        return set(names)


class FakeLLM:
    """The slice of `vllm.LLM` the engine uses. `answer(request, sampling) -> str`."""

    def __init__(self, tokenizer, answer, **kwargs):
        self.kwargs, self.tokenizer, self.answer = kwargs, tokenizer, answer
        self.model = FakeVLLMModel()
        self.log: list = []
        self.requests: list[tuple[dict, SimpleNamespace]] = []
        self.llm_engine = SimpleNamespace(reset_encoder_cache=lambda: self.log.append("encoder"))

    def apply_model(self, fn):
        self.log.append("load")
        return [fn(self.model)]

    def sleep(self, level):
        self.log.append(("sleep", level))

    def wake_up(self, tags=None):
        self.log.append(("wake", tuple(tags)))

    def reset_prefix_cache(self):
        self.log.append("prefix")

    def collective_rpc(self, method, args=()):
        if method == "mmrlvr_install_noise":
            return [{}]
        noisy = sum(bool(s.extra_args) for _, s in self.requests[self._call_start:])
        return [{"requests": noisy, "noised": noisy, "expected": noisy}]

    def generate(self, requests, samplings, use_tqdm=False):
        self._call_start = len(self.requests)
        outputs = []
        for request, sampling in zip(requests, samplings, strict=True):
            self.requests.append((request, sampling))
            comps = []
            for _ in range(sampling.n):
                text = self.answer(request, sampling)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] \
                    + sampling.stop_token_ids[:1]
                comps.append(SimpleNamespace(
                    token_ids=ids, logprobs=[{t: SimpleNamespace(logprob=-0.25)} for t in ids]))
            outputs.append(SimpleNamespace(outputs=comps))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    """The engine's vLLM entry points replaced; yields a setter for the answer function."""
    made = []
    state = {"answer": lambda request, sampling: "<answer>1</answer>"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(vllm_engine, "vllm_sampling_params", lambda **kw: SimpleNamespace(**kw))

    def build(**kwargs):
        llm = FakeLLM(state["tokenizer"], lambda p, s: state["answer"](p, s), **kwargs)
        made.append(llm)
        return llm

    monkeypatch.setattr(vllm_engine, "build_llm", build)
    return SimpleNamespace(made=made, state=state)


@pytest.fixture(scope="module")
def vl_policy(tiny_dirs):
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.train.policy import Policy

    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(tiny_dirs["qwen2.5-vl"])), modalities.get("vision"),
                       torch.device("cpu"))


def prompts_for(policy, shapes_dir, n=3):
    from mmrlvr.data import load_dataset

    examples = load_dataset(str(shapes_dir / "test.jsonl"))[:n]
    return examples, policy.adapter.encode(examples, policy.processor)


def test_engine_syncs_once_per_change_and_wakes_around_the_sync(fake_vllm, vl_policy, shapes_dir):
    fake_vllm.state["tokenizer"] = vl_policy.tokenizer
    engine = vllm_engine.VLLMRolloutEngine(vl_policy, seed=3)
    llm = fake_vllm.made[0]
    assert llm.kwargs["model"] == str(vl_policy.base_model().config._name_or_path)
    assert llm.kwargs["seed"] == 3 and "distributed_executor_backend" not in llm.kwargs
    assert llm.kwargs["dtype"] == "float32"                   # the policy's compute dtype on CPU
    _, batch = prompts_for(vl_policy, shapes_dir)
    params = SamplingParams(n=4, max_new_tokens=8)

    first = engine.generate(batch, params)                    # the first call sends everything
    want = {checkpoint_name(n, "qwen2_5_vl"): p.detach()
            for n, p in vl_policy.model.named_parameters()}
    assert llm.model.weights.keys() == want.keys()
    assert all(torch.equal(llm.model.weights[k], want[k]) for k in want)
    assert first.stats["rollout/weight_sync_s"] > 0
    assert llm.log[-2:] == ["prefix", "encoder"]
    loads = len(llm.model.loads)
    assert loads == len([u for u in sync_units(vl_policy.model, "qwen2_5_vl", torch.float32)])

    again = engine.generate(batch, params)                    # unchanged: nothing sent
    assert len(llm.model.loads) == loads and again.stats["rollout/weight_sync_s"] == 0.0

    layer = vl_policy.model.model.language_model.layers[2].mlp.up_proj
    saved = layer.weight.detach().clone()
    try:
        with torch.no_grad():
            layer.weight.add_(1.0)
        engine.sleep()
        engine.sleep()                                        # idempotent
        with pytest.raises(RuntimeError, match="asleep"):
            engine.sync_weights()
        engine.mark_weights_changed()
        llm.log.clear()
        engine.wake_up()
        assert llm.log[0] == ("wake", ("weights",)) and llm.log[-1] == ("wake", ("kv_cache",))
        assert "load" in llm.log and llm.log.index("encoder") < len(llm.log) - 1
        assert torch.equal(llm.model.weights["model.layers.2.mlp.up_proj.weight"], saved + 1.0)
        assert engine.generate(batch, params).stats["rollout/weight_sync_s"] > 0   # reported once
        assert engine.generate(batch, params).stats["rollout/weight_sync_s"] == 0.0
    finally:
        with torch.no_grad():
            layer.weight.copy_(saved)


def test_engine_rollouts_have_the_hf_engines_shape(fake_vllm, vl_policy, shapes_dir):
    fake_vllm.state["tokenizer"] = vl_policy.tokenizer
    fake_vllm.state["answer"] = \
        lambda r, s: "<answer>2</answer>" if s.temperature else "<answer>3</answer>"
    engine = vllm_engine.VLLMRolloutEngine(vl_policy)
    _, batch = prompts_for(vl_policy, shapes_dir)
    out = engine.generate(batch, SamplingParams(n=4, max_new_tokens=16, temperature=0.9))
    assert out.group_size == 4 and out.completion_ids.shape[0] == 12
    assert out.texts == ["<answer>2</answer>"] * 12 and out.branch == ["clean"] * 12
    lengths = out.completion_mask.sum(dim=1)
    assert (lengths == lengths[0]).all()
    assert torch.equal(out.sample_logprobs[out.completion_mask.bool()],
                       torch.full((int(lengths.sum()),), -0.25))
    requests = fake_vllm.made[0].requests
    assert all(r["multi_modal_data"]["image"] for r, _ in requests)   # the image, for vLLM
    greedy = engine.generate(batch, SamplingParams(max_new_tokens=16, greedy=True))
    assert greedy.sample_logprobs is None and greedy.texts == ["<answer>3</answer>"] * 3
    assert [s.temperature for _, s in requests[-3:]] == [0.0] * 3


def test_eval_through_vllm_greedy_and_clean_pass_at_k(fake_vllm, vl_policy, shapes_dir):
    from mmrlvr.train.evaluate import evaluate

    from mmrlvr.data import load_dataset

    def key(text, media):
        return text, media["image"][0].tobytes()

    examples, gold = [], {}
    for ex in load_dataset(str(shapes_dir / "test.jsonl")):
        k = key(vl_policy.adapter.encode([ex], vl_policy.processor).prompt_texts[0],
                vl_policy.adapter.vllm_media(ex))
        if k not in gold and len(examples) < 4:
            examples.append(ex)
            gold[k] = ex.answer
    seen = []

    def answer(request, sampling):
        seen.append(sampling)
        k = key(request["prompt"], request["multi_modal_data"])
        if sampling.temperature == 0.0:                      # greedy: right on even examples
            ok = list(gold).index(k) % 2 == 0
            return f"<answer>{gold[k] if ok else 'nothing'}</answer>"
        return f"<answer>{gold[k]}</answer>"                   # some sample is always right

    fake_vllm.state.update(tokenizer=vl_policy.tokenizer, answer=answer)
    branching = {"kind": "latent_noise", "fraction": 0.5, "alpha": 0.3}
    engine = vllm_engine.VLLMRolloutEngine(vl_policy, branching)
    assert fake_vllm.made[0].kwargs["enforce_eager"] is True
    result = evaluate(vl_policy, engine.without_branching(), examples, max_new_tokens=16,
                      batch_size=2, samples=4, temperature=1.0)
    assert result["n"] == 4 and result["accuracy"] == 0.5 and result["pass@4"] == 1.0
    sampled = [s for s in seen if s.temperature]
    assert sampled and all(s.extra_args is None and s.n == 4 for s in sampled)   # never noisy
    assert all("cache_salt" not in r for r, _ in fake_vllm.made[0].requests)
    train = engine.generate(vl_policy.adapter.encode(examples[:1], vl_policy.processor),
                            SamplingParams(n=4, max_new_tokens=8))
    assert train.branch == ["clean", "clean", "noisy", "noisy"]                 # training is


def test_multi_process_engine_uses_the_external_launcher(fake_vllm, vl_policy, monkeypatch):
    import torch.distributed as dist

    fake_vllm.state["tokenizer"] = vl_policy.tokenizer
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 2)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    for key in vllm_engine.LAUNCH_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="torchrun's environment"):
        vllm_engine.VLLMRolloutEngine(vl_policy, seed=10)
    for key, value in zip(vllm_engine.LAUNCH_ENV, ("2", "2", "4", "127.0.0.1", "29500")):
        monkeypatch.setenv(key, value)
    vllm_engine.VLLMRolloutEngine(vl_policy, seed=10)
    kwargs = fake_vllm.made[-1].kwargs
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["seed"] == 12 and kwargs["enable_sleep_mode"] is True


def test_nothing_here_imports_vllm():
    assert "vllm" not in sys.modules


if __name__ == "__main__" and sys.argv[1:2] == [FSDP_SCRIPT_MARK]:
    fsdp2_worker(sys.argv[2], sys.argv[3])
