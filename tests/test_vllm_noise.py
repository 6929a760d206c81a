"""NC-GRPO on the vLLM backend, without vLLM: the flattened-batch displacement, the request list
and row order, and the runner hooks on a toy model shaped like vLLM's Qwen2 (split residual)."""
from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.testing import assert_close

from mmrlvr.methods.ncgrpo.branching import Branching, RowNoise, make_plan
from mmrlvr.methods.ncgrpo.plugin import LatentNoise
from mmrlvr.rollout.vllm import RequestSpec, request_specs, rows_in_plan_order
from mmrlvr.methods.ncgrpo.vllm_noise import (
    NoiseWorkerExtension,
    Segment,
    noise_extra_args,
    noise_from_extra_args,
    prefill_displacement,
)

D = 16


def plan_for(noise="independent", alpha=0.3, n_prompts=1, group=4, seed=0, site="last_layer_input"):
    torch.manual_seed(seed)
    branching = Branching(kind="latent_noise", fraction=0.5, alpha=alpha, noise=noise, site=site)
    return make_plan(branching, n_prompts, group)


def by_hand(h: torch.Tensor, spec: RowNoise, L: int, first: int) -> torch.Tensor:
    """σ_t·ε_t for rows h [n, d] at positions first … first+n-1, from the contract's formula."""
    eps = spec.epsilon(L, h.shape[1])[first:first + h.shape[0]]                # [n, d]
    return spec.alpha * h.norm(dim=-1, keepdim=True) / math.sqrt(h.shape[1]) * eps


def test_mixed_batch_noises_only_the_noisy_prompt_rows():
    plan = plan_for()
    noisy, other = plan.row(2), plan.row(3)
    segments = [
        Segment(query_len=5, computed=0, prompt_len=5, noise=None),    # clean prefill
        Segment(query_len=4, computed=0, prompt_len=7, noise=noisy),   # first chunk of a prefill
        Segment(query_len=1, computed=9, prompt_len=6, noise=other),   # noisy request decoding
        Segment(query_len=1, computed=6, prompt_len=6, noise=noisy),   # its first decode step
        Segment(query_len=8, computed=0, prompt_len=6, noise=other),   # recompute after preemption
    ]
    base = torch.randn(5 + 4 + 1 + 1 + 8 + 3, D)                       # 3 padding rows at the end
    disp = prefill_displacement(base, segments)                        # [22, d]
    assert disp.shape == base.shape and disp.dtype == torch.float32
    touched = disp.abs().sum(dim=1) > 0
    expect = torch.zeros(22, dtype=torch.bool)
    expect[5:9] = True                                                 # the chunk's 4 prompt rows
    expect[11:17] = True                                               # 6 prompt rows, not the 2 generated
    assert touched.tolist() == expect.tolist()
    assert_close(disp[5:9], by_hand(base[5:9], noisy, 7, 0))
    assert_close(disp[11:17], by_hand(base[11:17], other, 6, 0))
    assert prefill_displacement(base[:5], segments[:1]) is None        # a clean batch: nothing at all
    assert prefill_displacement(base[9:11], segments[2:4]) is None     # decode steps: nothing at all


def test_chunked_prefill_adds_exactly_what_one_pass_and_the_hf_path_add():
    plan = plan_for()
    spec = plan.row(3)
    L = 9
    hidden = torch.randn(L, D)                                         # the row's real prompt tokens
    one = prefill_displacement(hidden, [Segment(L, 0, L, spec)])       # unchunked
    pieces, done = [], 0
    for q in (4, 3, 2):                                                # three engine steps
        clean = torch.randn(2, D)
        base = torch.cat([clean, hidden[done:done + q], torch.randn(1, D)])
        disp = prefill_displacement(base, [Segment(2, 0, 30, None), Segment(q, done, L, spec)])
        assert disp[:2].abs().sum() == 0 and disp[-1].abs().sum() == 0
        pieces.append(disp[2:2 + q])
        done += q
    assert_close(torch.cat(pieces), one)
    # The HF engine: rows [N, P] left padded, the same row displaced by NoisePlan.displace.
    padded = torch.zeros(4, 12, D)
    padded[:, 3:] = hidden
    mask = torch.zeros(4, 12)
    mask[:, 3:] = 1
    hf = plan.displace(padded, mask)[3, 3:]                            # [L, d]
    assert_close(hidden + one, hf)
    assert_close(one, by_hand(hidden, spec, L, 0))
    assert not torch.allclose(hidden + one, hidden)


def test_antithetic_pairs_get_plus_and_minus_epsilon():
    plan = plan_for(noise="antithetic")
    plus, minus = plan.row(2), plan.row(3)
    assert plus.seed == minus.seed and (plus.sign, minus.sign) == (1.0, -1.0)
    hidden = torch.randn(6, D)
    disp = prefill_displacement(torch.cat([hidden, hidden]),
                                [Segment(6, 0, 6, plus), Segment(6, 0, 6, minus)])
    assert disp[:6].abs().sum() > 0
    assert torch.equal(disp[6:], -disp[:6])
    independent = plan_for(noise="independent")
    a = prefill_displacement(hidden, [Segment(6, 0, 6, independent.row(2))])
    b = prefill_displacement(hidden, [Segment(6, 0, 6, independent.row(3))])
    assert not torch.allclose(a, -b) and not torch.allclose(a, b)


def test_layout_longer_than_the_hidden_states_fails_loudly():
    plan = plan_for()
    with pytest.raises(RuntimeError, match="schedules 9 tokens"):
        prefill_displacement(torch.randn(8, D), [Segment(9, 0, 9, plan.row(2))])


def test_noise_travels_in_extra_args_and_back():
    spec = plan_for().row(3)
    args = noise_extra_args(spec)
    assert args == {"mmrlvr_noise": {"seed": spec.seed, "sign": spec.sign, "alpha": spec.alpha,
                                     "site": spec.site}}
    assert noise_from_extra_args(args) == spec
    assert noise_from_extra_args(None) is None
    assert noise_from_extra_args({"someone_else": 1}) is None


def test_noisy_members_are_separate_requests_with_their_own_salts_and_rows_come_back_in_order():
    B, G = 2, 4
    plan = plan_for(n_prompts=B, group=G)
    specs = request_specs(B, G, plan, salt="call1")
    assert [(s.prompt, s.rows) for s in specs] == [
        (0, (0, 1)), (0, (2,)), (0, (3,)), (1, (4, 5)), (1, (6,)), (1, (7,))]
    clean = [s for s in specs if len(s.rows) > 1]
    noisy = [s for s in specs if len(s.rows) == 1]
    assert all(s.payload is None and s.cache_salt is None for s in clean)
    assert [s.payload for s in noisy] == [plan.row(r) for r in (2, 3, 6, 7)]
    salts = [s.cache_salt for s in noisy]
    assert len(set(salts)) == len(salts) and all(s.startswith("call1") for s in salts)
    again = request_specs(B, G, plan, salt="call2")
    assert not {s.cache_salt for s in again} & set(salts)
    # vLLM answers in request order, n completions per request; rows follow the plan.
    completions = [[f"p{s.prompt}-r{r}" for r in s.rows] for s in specs]
    rows = rows_in_plan_order(specs, completions)
    assert rows == [f"p{r // G}-r{r}" for r in range(B * G)]
    tags = plan.tags()
    assert [tags[r] for s in noisy for r in s.rows] == ["noisy"] * 4


def test_rows_are_reassembled_whatever_the_request_order():
    specs = [RequestSpec(1, (3,)), RequestSpec(0, (0, 1)), RequestSpec(1, (2,))]
    assert rows_in_plan_order(specs, [["d"], ["a", "b"], ["c"]]) == ["a", "b", "c", "d"]
    with pytest.raises(RuntimeError, match="expected 2"):
        rows_in_plan_order(specs, [["d"], ["a"], ["c"]])
    with pytest.raises(RuntimeError, match="do not tile"):
        rows_in_plan_order(specs[:2], [["d"], ["a", "b"]])
    with pytest.raises(RuntimeError, match="do not tile"):
        rows_in_plan_order([*specs, RequestSpec(0, (1,))], [["d"], ["a", "b"], ["c"], ["e"]])


def test_without_active_noise_each_prompt_is_one_request_of_n():
    for plan in (None, plan_for(alpha=0.0)):
        specs = request_specs(2, 4, plan, salt="x")
        assert [(s.prompt, s.rows, s.payload, s.cache_salt) for s in specs] == [
            (0, (0, 1, 2, 3), None, None), (1, (4, 5, 6, 7), None, None)]


# A toy of what the hooks touch in vLLM: a decoder whose layers take (positions, hidden_states,
# residual) with the residual stream split in two, a norm returning (out, residual), and a runner
# with input_batch / requests / execute_model(scheduler_output).

class SplitResidualLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.inputs: list[torch.Tensor] = []

    def forward(self, positions, hidden_states, residual):
        stream = hidden_states if residual is None else hidden_states + residual
        self.inputs.append(stream.clone())                  # the layer's true input
        return self.proj(stream), stream


class AddNorm(nn.Module):
    def forward(self, x, residual=None):
        if residual is None:
            return 2 * x
        stream = x + residual
        return 2 * stream, stream


class ToyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(50, D)
        self.layers = nn.ModuleList([SplitResidualLayer() for _ in range(3)])
        self.norm = AddNorm()

    def forward(self, input_ids, positions):
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        out, _ = self.norm(hidden, residual)
        return out


class ToyRunner:
    def __init__(self):
        torch.manual_seed(1)
        self.model = nn.Module()
        self.model.language_model = ToyDecoder()
        self.requests: dict[str, SimpleNamespace] = {}
        self.input_batch = None
        self.prompts: dict[str, torch.Tensor] = {}

    def schedule(self, reqs):
        """reqs: (req_id, prompt_len, computed, query_len, RowNoise | None), in batch order."""
        for rid, L, _, _, noise in reqs:
            self.prompts.setdefault(rid, torch.randint(0, 50, (L + 4,)))
            extra = noise_extra_args(noise) if noise else None
            self.requests[rid] = SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra))
        self.input_batch = SimpleNamespace(
            req_ids=[r[0] for r in reqs], num_reqs=len(reqs),
            num_computed_tokens_cpu=np.array([r[2] for r in reqs], dtype=np.int32),
            num_prompt_tokens=np.array([r[1] for r in reqs], dtype=np.int32))
        return SimpleNamespace(num_scheduled_tokens={r[0]: r[3] for r in reqs})

    def flat_inputs(self, reqs):
        ids = torch.cat([self.prompts[rid][c:c + q] for rid, _, c, q, _ in reqs])
        return ids, torch.cat([torch.arange(c, c + q) for _, _, c, q, _ in reqs])

    def execute_model(self, scheduler_output):
        reqs = [(rid, int(L), int(c), scheduler_output.num_scheduled_tokens[rid], None)
                for rid, L, c in zip(self.input_batch.req_ids, self.input_batch.num_prompt_tokens,
                                     self.input_batch.num_computed_tokens_cpu)]
        return self.model.language_model(*self.flat_inputs(reqs))


@pytest.mark.parametrize("site", ["last_layer_input", "final_hidden"])
def test_runner_hooks_displace_the_true_layer_input_of_noisy_prompt_rows_only(site):
    plan = plan_for(site=site)
    noisy = plan.row(2)
    batch = [("clean", 5, 0, 5, None), ("noisy", 7, 0, 7, noisy), ("decoding", 4, 6, 1, plan.row(3))]
    reference = ToyRunner()
    clean_out = reference.execute_model(reference.schedule([(*r[:4], None) for r in batch]))
    last = reference.model.language_model.layers[-1]
    clean_in = last.inputs[-1]

    runner = ToyRunner()
    worker = SimpleNamespace(model_runner=runner)
    info = NoiseWorkerExtension.mmrlvr_install_noise(worker, site)
    assert info == {"decoder": "ToyDecoder", "site": site}
    runner.prompts = reference.prompts
    out = runner.execute_model(runner.schedule(batch))
    hooked_in = runner.model.language_model.layers[-1].inputs[-1]
    rows = slice(5, 12)                                                # the noisy prompt's rows
    if site == "last_layer_input":
        want = clean_in.clone()
        want[rows] += by_hand(clean_in[rows], noisy, 7, 0)             # σ from hidden + residual
        assert_close(hooked_in, want)
        assert torch.equal(hooked_in[:5], clean_in[:5]) and torch.equal(hooked_in[12:], clean_in[12:])
        assert not torch.allclose(out[rows], clean_out[rows])
    else:
        assert torch.equal(hooked_in, clean_in)                        # the decoder ran clean
        want = clean_out.clone()
        want[rows] += by_hand(clean_out[rows], noisy, 7, 0)
        assert_close(out, want)
        assert torch.equal(out[:5], clean_out[:5]) and torch.equal(out[12:], clean_out[12:])
    assert NoiseWorkerExtension.mmrlvr_noise_counts(worker) == {
        "requests": 1, "noised": 7, "expected": 7}
    # Forwards outside execute_model (vLLM's warm-up) and decode steps pass through untouched.
    runner.model.language_model(*runner.flat_inputs(batch))
    assert torch.equal(runner.model.language_model.layers[-1].inputs[-1], clean_in)
    decode = [("noisy", 7, 7, 1, noisy), ("clean", 5, 5, 1, None)]
    runner.execute_model(runner.schedule(decode))
    reference.execute_model(reference.schedule([(*r[:4], None) for r in decode]))
    assert torch.equal(runner.model.language_model.layers[-1].inputs[-1], last.inputs[-1])
    assert NoiseWorkerExtension.mmrlvr_noise_counts(worker) == {
        "requests": 0, "noised": 0, "expected": 0}


def test_runner_hooks_count_prompt_rows_so_a_cache_hit_shows():
    plan = plan_for()
    runner = ToyRunner()
    worker = SimpleNamespace(model_runner=runner)
    NoiseWorkerExtension.mmrlvr_install_noise(worker, "last_layer_input")
    runner.execute_model(runner.schedule([("recomputed", 5, 0, 7, plan.row(3))]))  # 5 prompt + 2
    assert NoiseWorkerExtension.mmrlvr_noise_counts(worker) == {
        "requests": 1, "noised": 5, "expected": 5}
    runner.execute_model(runner.schedule([("noisy", 8, 4, 4, plan.row(2))]))   # 4 tokens cached
    counts = NoiseWorkerExtension.mmrlvr_noise_counts(worker)
    assert counts == {"requests": 1, "noised": 4, "expected": 8}             # the engine raises on this
    with pytest.raises(RuntimeError, match="already"):
        NoiseWorkerExtension.mmrlvr_install_noise(worker, "last_layer_input")


def test_the_plug_in_sets_vllm_up_only_when_noise_is_on():
    """alpha > 0: the worker extension, eager mode, the V1 runner, the install RPC and the check
    after each call; alpha 0 (the placebo): the engine is built and run as for plain GRPO."""
    calls = []

    class LLM:
        counts = {"requests": 2, "noised": 10, "expected": 10}

        def collective_rpc(self, method, args=()):
            calls.append((method, args))
            return [dict(self.counts)] if method == "mmrlvr_noise_counts" else [{}]

    on = LatentNoise({"kind": "latent_noise", "alpha": 0.1, "site": "final_hidden"})
    assert on.vllm_llm_kwargs() == {
        "enforce_eager": True,
        "worker_extension_cls": "mmrlvr.methods.ncgrpo.vllm_noise.NoiseWorkerExtension"}
    assert on.vllm_env() == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    llm = LLM()
    on.vllm_setup(llm)
    assert calls == [("mmrlvr_install_noise", ("final_hidden",))]
    assert on.vllm_check(llm, 2) == {"branch/noised_prompt_tokens": 10}
    with pytest.raises(RuntimeError, match="3 noisy requests were sent but the hook displaced 2"):
        on.vllm_check(llm, 3)
    llm.counts = {"requests": 2, "noised": 6, "expected": 10}          # a prefix-cache hit
    with pytest.raises(RuntimeError, match="6 of their 10 prompt tokens"):
        on.vllm_check(llm, 2)
    spec = plan_for().row(2)
    assert on.vllm_extra_args(spec) == noise_extra_args(spec)
    calls.clear()
    off = LatentNoise({"kind": "latent_noise", "alpha": 0.0})
    assert off.vllm_llm_kwargs() == {} and off.vllm_env() == {}
    off.vllm_setup(llm)
    assert off.vllm_check(llm, 0) == {} and calls == []


def test_nothing_here_imports_vllm():
    assert "vllm" not in sys.modules
