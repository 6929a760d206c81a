"""The vLLM rollout engine beside a (multi-process) training run, without vLLM or a GPU: per-rank
seeds, the `LLM(...)` arguments, request building, and the engine against a stand-in `LLM`
(weights synced once per change around sleep and wake, rollouts shaped like the HF engine's,
evaluation through it, the external launcher in a multi-process run).
Weight names and the LoRA merge: test_vllm_names.py; the unit-by-unit gathering:
test_vllm_sync.py."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from mmrlvr.rollout import vllm as vllm_engine
from mmrlvr.rollout.base import SamplingParams, make_branching
from mmrlvr.rollout.vllm import RequestSpec, build_requests, llm_kwargs, request_specs
from mmrlvr.rollout.vllm_sync import checkpoint_name, engine_seed, sync_units


# ------------------------------------------------------------------------------- engine set-up

def test_every_rank_gets_its_own_seed():
    assert [engine_seed(7, r) for r in range(4)] == [7, 8, 9, 10]
    assert engine_seed(0, 0) != engine_seed(1, 0)


def test_llm_arguments_single_and_multi_process():
    one = llm_kwargs("/m", dtype=torch.bfloat16, media="image", gpu_memory_utilization=0.4,
                     max_model_len=None, seed=5, rank=0, world=1)
    assert one == dict(model="/m", dtype="bfloat16", seed=5, gpu_memory_utilization=0.4,
                       max_model_len=None, enable_prefix_caching=True, enable_sleep_mode=True,
                       logprobs_mode="processed_logprobs",
                       limit_mm_per_prompt={"image": 8, "video": 0})
    noise = make_branching({"kind": "latent_noise", "alpha": 0.1})   # found by name, as in a run
    many = llm_kwargs("/m", dtype=torch.bfloat16, media="audio", gpu_memory_utilization=0.4,
                      max_model_len=4096, seed=5, rank=3, world=4, extra=noise.vllm_llm_kwargs())
    assert many["distributed_executor_backend"] == "external_launcher"
    assert many["tensor_parallel_size"] == 1 and many["seed"] == 8
    assert many["limit_mm_per_prompt"] == {"audio": 8}
    assert many["enforce_eager"] is True
    assert many["worker_extension_cls"] == "mmrlvr.methods.ncgrpo.vllm_noise.NoiseWorkerExtension"


def test_requests_carry_sampling_media_noise_and_salts():
    branching = make_branching({"kind": "latent_noise", "fraction": 0.5, "alpha": 0.2})
    torch.manual_seed(0)
    plan = branching.plan(2, 4)
    specs = request_specs(2, 4, plan, salt="s")
    prompts = [{"prompt": "p0", "multi_modal_data": {"image": ["img"]}}, {"prompt": "p1"}]
    params = SamplingParams(n=4, max_new_tokens=12, temperature=0.7, top_p=0.9)
    with pytest.raises(ValueError, match="no extra_args function"):
        build_requests(prompts, specs, params, eos_ids=[5, 6], placeholder_ids=[9])
    requests, samplings = build_requests(prompts, specs, params, eos_ids=[5, 6],
                                         placeholder_ids=[9], extra_args=branching.vllm_extra_args)
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
def vl_policy(tiny_vl):
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.train.policy import Policy

    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(tiny_vl)), modalities.get("vision"),
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
