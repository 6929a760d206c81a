"""`rollout.decode`: a static KV cache (and its compiled decode step) samples what the dynamic
cache samples, one prefill per prompt included, on a tiny real Qwen2.5-VL."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

import modalities
from mmrlvr.config import ModelConfig
from mmrlvr.data import Example
from mmrlvr.rollout import SamplingParams
from mmrlvr.rollout.hf import CACHE_BUCKET, HFRolloutEngine
from mmrlvr.train.policy import Policy


@pytest.fixture()
def examples(tmp_path):
    Image.new("RGB", (56, 56), (220, 20, 20)).save(tmp_path / "a.png")
    return [Example(id="none", prompt="What is 2 + 3?", answer="5"),
            Example(id="one", prompt="What colour is the shape?", answer="red",
                    images=[str(tmp_path / "a.png")])]


def _run(policy, batch, decode, params, seed=3):
    torch.manual_seed(seed)
    return HFRolloutEngine(policy, decode=decode).generate(batch, params)


@pytest.mark.parametrize("greedy", [False, True])
def test_static_cache_samples_what_the_dynamic_cache_samples(tiny_vl, examples, greedy):
    policy = Policy.load(ModelConfig(path=str(tiny_vl)), modalities.get("vision"), torch.device("cpu"))
    batch = policy.adapter.encode(examples, policy.processor)
    params = SamplingParams(n=4, max_new_tokens=10, temperature=1.0, greedy=greedy)
    eager, static = (_run(policy, batch, d, params) for d in ("eager", "static"))
    assert torch.equal(eager.completion_ids, static.completion_ids)
    assert eager.texts == static.texts
    if not greedy:
        torch.testing.assert_close(static.sample_logprobs * static.completion_mask,
                                   eager.sample_logprobs * eager.completion_mask, atol=1e-5, rtol=1e-4)
        # still one prefill per prompt: the shared prompt cache was copied, not recomputed
        assert static.stats["rollout/prefill_tokens"] == eager.stats["rollout/prefill_tokens"] \
            == int(batch.inputs["attention_mask"].sum())
    want = batch.inputs["input_ids"].shape[1] + params.max_new_tokens
    assert static.stats["rollout/cache_len"] == -(-want // CACHE_BUCKET) * CACHE_BUCKET
    assert "rollout/cache_len" not in eager.stats


def test_compiled_decoding_gives_the_eager_tokens(tiny_vl, examples):
    """torch.compile of the decode step (inductor on CPU here; CUDA graphs on a GPU)."""
    policy = Policy.load(ModelConfig(path=str(tiny_vl)), modalities.get("vision"), torch.device("cpu"))
    batch = policy.adapter.encode(examples, policy.processor)
    params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0)
    eager = _run(policy, batch, "eager", params)
    assert not hasattr(policy.model, "_compiled_call")
    compiled = _run(policy, batch, "compiled", params)
    assert hasattr(policy.model, "_compiled_call")          # generate really took the compiled step
    assert torch.equal(eager.completion_ids, compiled.completion_ids)
    torch.testing.assert_close(compiled.sample_logprobs * compiled.completion_mask,
                               eager.sample_logprobs * eager.completion_mask, atol=1e-4, rtol=1e-3)


def test_compiled_decoding_refuses_branching(tiny_vl):
    policy = Policy.load(ModelConfig(path=str(tiny_vl)), modalities.get("vision"), torch.device("cpu"))
    with pytest.raises(ValueError, match="hooks"):
        HFRolloutEngine(policy, {"kind": "latent_noise"}, decode="compiled")
    with pytest.raises(ValueError, match="rollout.decode"):
        HFRolloutEngine(policy, decode="fast")
