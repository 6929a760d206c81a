"""NC-GRPO latent-noise branching on tiny real models: off is plain GRPO, noise lands where it should."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import LogitsProcessor, LogitsProcessorList

import mmrlvr.methods.ncgrpo.branching as branching_module
from mmrlvr.config import load_config
from mmrlvr.core.types import Rollouts
from mmrlvr.data import Example
from mmrlvr.methods.ncgrpo.branching import (
    Branching,
    BranchSiteError,
    NoisePlan,
    find_decoder,
    latent_noise,
    make_plan,
)
from mmrlvr.methods.ncgrpo.plugin import LatentNoise
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.rollout.base import BRANCHINGS, make_branching
from mmrlvr.core.types import Scores
from mmrlvr.rollout.diversity import normalised_edit, rollout_metrics


def branch_metrics(roll, scores):
    """What the trainer logs for an NC-GRPO run: the core's rollout/* figures, then branch/*."""
    return rollout_metrics(roll, Scores(scores), LatentNoise({"kind": "latent_noise"}))

CONFIGS = Path(__file__).parent.parent / "configs"
G = 4                       # 2 clean + 2 noisy per group at fraction 0.5
FORCED = [101, 57, 230, 88, 175, 64]   # ordinary tokens (no EOS, no placeholder) fed every row


@pytest.fixture(scope="module")
def prompts(policy, tmp_path_factory):
    """Two prompts of different lengths (one left padded), one with an image."""
    path = tmp_path_factory.mktemp("nc") / "red.png"
    Image.new("RGB", (56, 56), (220, 20, 20)).save(path)
    examples = [Example(id="text", prompt="What is 2 + 3?", answer="5"),
                Example(id="img", prompt="How many red shapes are in the picture?", answer="1",
                        images=[str(path)])]
    batch = policy.adapter.encode(examples, policy.processor)
    mask = batch.inputs["attention_mask"]
    assert (mask == 0).any(), "the fixture needs a left-padded prompt"
    return batch


def sample(policy, batch, branching, seed=0, n=G, tokens=8):
    torch.manual_seed(seed)
    return make_engine("hf", policy, branching).generate(batch, SamplingParams(n=n, max_new_tokens=tokens))


@pytest.fixture()
def forced(policy, monkeypatch):
    """Make generate feed FORCED tokens to every row; collect each call's output (logits, cache).

    Noisy members are prefilled whole (they must not share a prompt cache), so the clean runs
    compared with them here take the same whole-prefill path (not one prefill per prompt)."""
    import mmrlvr.rollout.hf as hf

    monkeypatch.setattr(hf, "prefill_once", lambda model, inputs, kwargs, n: (inputs, kwargs))
    outputs = []
    real = policy.model.generate

    class Force(LogitsProcessor):
        def __init__(self, prompt_len):
            self.prompt_len = prompt_len

        def __call__(self, input_ids, scores):
            out = torch.full_like(scores, float("-inf"))
            out[:, FORCED[input_ids.shape[1] - self.prompt_len]] = 0.0
            return out

    def generate(**kwargs):
        proc = LogitsProcessorList([Force(kwargs["input_ids"].shape[1])])
        out = real(**kwargs, logits_processor=proc)
        outputs.append(out)
        return out

    monkeypatch.setattr(policy.model, "generate", generate)
    return outputs


@pytest.fixture()
def hooks(monkeypatch):
    """The PrefillNoise hook objects the engine installed, for their call counts."""
    seen = []
    real = branching_module.latent_noise

    @contextmanager
    def spy(*args, **kwargs):
        with real(*args, **kwargs) as hook:
            seen.append(hook)
            yield hook

    monkeypatch.setattr(branching_module, "latent_noise", spy)
    return seen


def noisy_rows(n_prompts):
    return [b * G + g for b in range(n_prompts) for g in range(G) if g >= G // 2]


def clean_rows(n_prompts):
    return [b * G + g for b in range(n_prompts) for g in range(G) if g < G // 2]


@pytest.fixture(scope="module")
def plain(policy, prompts):
    """Plain GRPO rollouts under seed 0 and torch's RNG state right after them."""
    roll = sample(policy, prompts, None)
    return roll, torch.get_rng_state()


@pytest.mark.parametrize("branching", [{"kind": "none"}, {"kind": "latent_noise", "alpha": 0.0}],
                         ids=["none", "alpha0"])
def test_off_or_alpha0_samples_exactly_plain_grpo(policy, prompts, plain, branching, hooks):
    plain_roll, rng_after_plain = plain
    other = sample(policy, prompts, branching)
    assert torch.equal(other.completion_ids, plain_roll.completion_ids)
    assert torch.equal(other.sample_logprobs, plain_roll.sample_logprobs)
    assert torch.equal(torch.get_rng_state(), rng_after_plain)   # no random number consumed
    assert hooks == ([] if branching["kind"] == "none" else [None])   # no hook installed at all
    expected = ["clean"] * (2 * G) if branching["kind"] == "none" \
        else ["clean", "clean", "noisy", "noisy"] * 2
    assert other.branch == expected
    assert plain_roll.branch == ["clean"] * (2 * G)


def test_noise_reaches_only_flagged_rows_at_prompt_positions_in_prefill(
        policy, prompts, forced, hooks):
    layer = find_decoder(policy.model).layers[-1]
    seen = []
    handle = layer.input_layernorm.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    try:
        sample(policy, prompts, None, tokens=len(FORCED))
        plain, seen[:] = list(seen), []
        alpha = 0.2
        sample(policy, prompts, {"kind": "latent_noise", "alpha": alpha}, tokens=len(FORCED))
        noisy = list(seen)
    finally:
        handle.remove()
    hook = hooks[-1]
    assert (hook.calls, hook.applied) == (len(FORCED), 1)         # prefill + 5 decode steps, 1 noised
    assert len(noisy) == len(plain) == len(FORCED)
    mask = prompts.inputs["attention_mask"].repeat_interleave(G, dim=0).bool()   # [N, P]
    delta = noisy[0] - plain[0]                                   # [N, P, d] prefill
    moved = delta.norm(dim=-1) > 0                                # [N, P]
    flags = torch.tensor([g >= G // 2 for _ in range(2) for g in range(G)])
    assert torch.equal(moved, mask & flags[:, None])              # flagged rows, real tokens only
    # scale: |δ_t| = α·|h_t|·|ε_t|/√d with |ε_t|/√d ≈ 1 for d = 128
    ratio = delta.norm(dim=-1)[moved] / (alpha * plain[0].norm(dim=-1)[moved])
    assert 0.85 < float(ratio.mean()) < 1.15 and float(ratio.std()) < 0.2
    for step in range(1, len(FORCED)):                            # decoding untouched
        assert torch.equal(noisy[step], plain[step])


def _kv(cache, layer):
    return cache.layers[layer].keys, cache.layers[layer].values


def test_last_layer_input_displaces_last_layer_prompt_kv_and_persists(policy, prompts, forced):
    sample(policy, prompts, None, tokens=len(FORCED))
    sample(policy, prompts, {"kind": "latent_noise", "alpha": 0.1}, tokens=len(FORCED))
    plain, noisy = forced
    P = prompts.inputs["input_ids"].shape[1]
    noisy_r, clean_r = noisy_rows(2), clean_rows(2)
    n_layers = len(find_decoder(policy.model).layers)
    for layer in range(n_layers - 1):                             # lower layers: same cache
        for a, b in zip(_kv(plain.cache, layer), _kv(noisy.cache, layer)):
            assert torch.equal(a, b)
    for a, b in zip(_kv(plain.cache, n_layers - 1), _kv(noisy.cache, n_layers - 1)):  # [N, h, P+T-1, hd]
        assert torch.equal(a[clean_r], b[clean_r])
        assert (a[noisy_r, :, P - 1] - b[noisy_r, :, P - 1]).abs().amax(dim=(1, 2)).min() > 1e-4
        torch.testing.assert_close(a[:, :, P:], b[:, :, P:])      # decoded positions: clean layers below
    for step in range(len(FORCED)):
        lp, ln = plain.logits[step], noisy.logits[step]          # [N, V]
        torch.testing.assert_close(lp[clean_r], ln[clean_r], atol=1e-6, rtol=0)
        assert (lp[noisy_r] - ln[noisy_r]).abs().amax(dim=1).min() > 1e-4   # persists while decoding


def test_final_hidden_moves_only_the_first_sampled_logits(policy, prompts, forced):
    sample(policy, prompts, None, tokens=len(FORCED))
    sample(policy, prompts, {"kind": "latent_noise", "alpha": 0.1, "site": "final_hidden"},
           tokens=len(FORCED))
    plain, noisy = forced
    for layer in range(len(find_decoder(policy.model).layers)):  # no cache is touched
        for a, b in zip(_kv(plain.cache, layer), _kv(noisy.cache, layer)):
            assert torch.equal(a, b)
    noisy_r, clean_r = noisy_rows(2), clean_rows(2)
    first_p, first_n = plain.logits[0], noisy.logits[0]
    assert torch.equal(first_p[clean_r], first_n[clean_r])
    assert (first_p[noisy_r] - first_n[noisy_r]).abs().amax(dim=1).min() > 1e-4
    for step in range(1, len(FORCED)):
        assert torch.equal(plain.logits[step], noisy.logits[step])


def test_noise_modes_independent_shared_antithetic():
    torch.manual_seed(0)
    B, Gs, P, d = 2, 5, 3, 16                          # fraction 0.5 of 5 -> last 3 members noisy
    hidden = torch.randn(B, P, d).repeat_interleave(Gs, dim=0)   # members of a group share a prompt
    mask = torch.ones(B * Gs, P, dtype=torch.long)
    deltas = {}
    for mode in ("independent", "shared", "antithetic"):
        plan = make_plan(Branching(kind="latent_noise", alpha=0.1, noise=mode), B, Gs)
        assert plan.flags == [False, False, True, True, True] * B
        assert plan.tags()[:Gs] == ["clean", "clean", "noisy", "noisy", "noisy"]
        deltas[mode] = (plan.displace(hidden, mask) - hidden).reshape(B, Gs, P, d)
    for mode, delta in deltas.items():
        assert not delta[:, :2].any(), mode                       # clean members untouched
    ind, sh, anti = deltas["independent"], deltas["shared"], deltas["antithetic"]
    for b in range(B):
        assert not torch.allclose(ind[b, 2], ind[b, 3]) and not torch.allclose(ind[b, 3], ind[b, 4])
        assert torch.equal(sh[b, 2], sh[b, 3]) and torch.equal(sh[b, 3], sh[b, 4])
        torch.testing.assert_close(anti[b, 2], -anti[b, 3])      # a ±ε pair
        assert not torch.allclose(anti[b, 4].abs(), anti[b, 2].abs())   # odd member: its own ε
    assert not torch.allclose(sh[0, 2], sh[1, 2])                 # groups draw their own ε


def test_noise_is_reproducible_and_padding_invariant():
    plan_args = (Branching(kind="latent_noise", alpha=0.3), 1, 2)
    torch.manual_seed(7)
    a = make_plan(*plan_args)
    torch.manual_seed(7)
    b = make_plan(*plan_args)
    assert a == b and a.seeds[1] != 0
    h = torch.randn(2, 4, 8)
    padded = torch.cat([torch.zeros(2, 3, 8), h], dim=1)          # 3 positions of left padding
    pmask = torch.tensor([[0, 0, 0, 1, 1, 1, 1]] * 2)
    torch.testing.assert_close(a.displace(padded, pmask)[:, 3:], a.displace(h, torch.ones(2, 4)))
    assert a.row(0) is None and a.row(1).epsilon(4, 8).shape == (4, 8)


def test_training_logprobs_come_from_the_clean_model(policy, prompts):
    """The hook is gone after generate (also after an error); recompute is the clean model's."""
    roll = sample(policy, prompts, {"kind": "latent_noise", "alpha": 0.4, "site": "final_hidden"})
    decoder = find_decoder(policy.model)
    assert not decoder.norm._forward_hooks and not decoder.layers[-1]._forward_pre_hooks
    from mmrlvr.core.types import select

    rows = list(range(2 * G))
    inputs, _ = select(prompts, [r // G for r in rows])
    with torch.no_grad():
        logp, _ = policy.completion_logprobs(inputs, roll.completion_ids, roll.completion_mask)
    gap = (logp[:, 0] - roll.sample_logprobs[:, 0]).abs()        # first token: the noised position
    assert gap[clean_rows(2)].max() < 1e-4 and gap[noisy_rows(2)].min() > 1e-5

    plan = make_plan(Branching(kind="latent_noise"), 1, 2)
    with pytest.raises(ValueError, match="boom"), latent_noise(policy.model, plan, torch.ones(2, 3)):
        assert decoder.layers[-1]._forward_pre_hooks
        raise ValueError("boom")
    assert not decoder.layers[-1]._forward_pre_hooks


def test_branch_metrics_by_hand(policy, prompts):
    texts = ["<answer>5</answer>", "<answer>5</answer>", "<answer>6</answer>", "no answer",
             "<answer>1</answer>", "<answer>2</answer>", "<answer>3</answer>", "<answer>1</answer>"]
    roll = Rollouts(prompts=prompts, group_size=G, completion_ids=torch.zeros(8, 1, dtype=torch.long),
                    completion_mask=torch.ones(8, 1, dtype=torch.long), sample_logprobs=None,
                    texts=texts, branch=["clean", "clean", "noisy", "noisy"] * 2,
                    stats={"first_token_entropy": torch.tensor([1.0, 1, 3, 3, 1, 1, 3, 3])})
    acc = [1, 1, 0, 0, 1, 0, 0, 1]
    scores = [[{"overall": 0.9 * a + 0.1, "accuracy": float(a)} for a in acc[b * G:(b + 1) * G]]
              for b in range(2)]
    m = branch_metrics(roll, scores)
    assert m["rollout/distinct_answers"] == pytest.approx((2 + 3) / 2)
    assert m["rollout/first_token_entropy"] == pytest.approx(2.0)
    assert m["branch/clean_accuracy"] == pytest.approx(3 / 4)
    assert m["branch/noisy_accuracy"] == pytest.approx(1 / 4)
    assert m["branch/clean_reward"] == pytest.approx(0.9 * 3 / 4 + 0.1)
    assert m["branch/noisy_first_token_entropy"] == pytest.approx(3.0)
    assert m["branch/noisy_frac"] == 0.5
    roll.branch = ["clean"] * 8                                   # plain GRPO: no branch/* keys
    assert not [k for k in branch_metrics(roll, scores) if k.startswith("branch/")]


def test_decoder_locator_for_audio_peft_and_unknown_models(policy):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    wrapped = get_peft_model(copy.deepcopy(policy.model),
                             LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert find_decoder(wrapped).layers[-1] is not None
    assert type(find_decoder(wrapped)).__name__ == "Qwen2_5_VLTextModel"

    cfg = Qwen2AudioConfig(
        audio_config={"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2,
                      "encoder_ffn_dim": 64, "num_mel_bins": 16, "max_source_positions": 50},
        text_config={"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2,
                     "vocab_size": 100, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "intermediate_size": 64},
        audio_token_index=99)
    torch.manual_seed(0)
    audio = Qwen2AudioForConditionalGeneration(cfg).eval()
    assert find_decoder(audio) is audio.model.language_model     # not the audio encoder's layers

    class OldLayout(torch.nn.Module):                             # transformers 4.x Qwen2-Audio
        def __init__(self):
            super().__init__()
            self.audio_tower = audio.model.audio_tower
            self.language_model = torch.nn.Module()
            self.language_model.model = audio.model.language_model
    assert find_decoder(OldLayout()) is audio.model.language_model
    with pytest.raises(BranchSiteError, match="text decoder of Linear"):
        find_decoder(torch.nn.Linear(2, 2))

    # the same hook displaces an audio-LM's prefill: noisy row's first logits move, clean row's don't
    ids = torch.randint(0, 90, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    kw = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 3, "do_sample": False,
          "return_dict_in_generate": True, "output_logits": True, "pad_token_id": 0}
    with torch.no_grad():
        base = audio.generate(**kw).logits[0]
        plan = NoisePlan("last_layer_input", 0.3, 2, [False, True], [0, 123], [0.0, 1.0])
        with latent_noise(audio, plan, mask) as hook:
            moved = audio.generate(**kw).logits[0]
    assert hook.applied == 1
    assert torch.equal(base[0], moved[0]) and not torch.allclose(base[1], moved[1])


def test_branching_config_errors_and_shipped_configs():
    with pytest.raises(ValueError, match="unknown key"):
        Branching.from_config({"kind": "latent_noise", "alpah": 0.1})
    with pytest.raises(ValueError, match="site"):
        Branching.from_config({"kind": "latent_noise", "site": "embeddings"})
    assert Branching.from_config({"kind": "latent_noise", "alpha": "1e-1"}).alpha == 0.1
    gpu = load_config(CONFIGS / "geo3k_ncgrpo_qwen25vl7b.yaml")
    assert (gpu.optim.lr, gpu.rollout.group_size, gpu.rollout.temperature) == (1e-6, 12, 1.0)
    branching = Branching.from_config(gpu.rollout.branching)
    assert branching.kind == "latent_noise" and branching.noisy_members(12) == 6   # 6 clean + 6 noisy
    cpu = load_config(CONFIGS / "shapes_ncgrpo_cpu.yaml")
    assert Branching.from_config(cpu.rollout.branching).kind == "latent_noise"
    assert cpu.train.out_dir == "runs/shapes_ncgrpo"


def test_grpo_step_with_alpha0_is_plain_grpo_and_logs_branch_metrics(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    (tmp_path / "shaped.py").write_text(   # length-shaped: spread (so an update) on random weights
        "def length(example, completion):\n    return min(len(completion), 40) / 40.0\n")

    def step(name, branching):
        cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                                 "rollout.group_size=4", "rollout.max_new_tokens=8",
                                 "train.batch_prompts=2", "train.steps=2", "optim.lr=1e-2",
                                 f"train.out_dir={tmp_path / name}"])
        cfg.rewards.append({"name": f"{tmp_path / 'shaped.py'}:length", "weight": 0.5})
        if branching is not None:
            cfg.rollout.branching = branching
        run, _ = build_run(cfg)
        metrics = grpo_step(run, 1)
        return metrics, run.policy.model.state_dict()

    plain_m, plain_w = step("plain", None)
    off_m, off_w = step("alpha0", {"kind": "latent_noise", "alpha": 0.0})
    assert plain_m["optim/grad_norm"] > 0                         # a real update happened
    for k in plain_w:
        assert torch.equal(plain_w[k], off_w[k]), k
    same = [k for k in plain_m if not k.startswith(("time/", "perf/"))]
    assert {k: plain_m[k] for k in same} == {k: off_m[k] for k in same}
    assert not [k for k in plain_m if k.startswith("branch/")]
    assert {"branch/clean_reward", "branch/noisy_reward", "branch/clean_accuracy",
            "rollout/distinct_answers", "rollout/first_token_entropy",
            "reward/zero_spread_frac"} <= set(off_m)


def test_group_diversity_metrics_by_hand():
    ids = torch.tensor([[1, 2, 3, 0], [1, 2, 3, 0], [1, 2, 4, 0], [5, 0, 0, 0],
                        [7, 8, 0, 0], [8, 7, 0, 0], [7, 8, 0, 0], [9, 9, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0],
                         [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    texts = ["<answer>5</answer>", "<answer>5</answer>", "<answer>6</answer>", "no answer",
             "<answer>1</answer>", "<answer>2</answer>", "<answer>3</answer>", "<answer>3</answer>"]
    roll = Rollouts(prompts=None, group_size=G, completion_ids=ids, completion_mask=mask,
                    sample_logprobs=None, texts=texts, branch=["clean", "clean", "noisy", "noisy"] * 2)
    acc = [0, 0, 0, 0, 0, 1, 0, 0]
    scores = [[{"overall": float(a), "accuracy": float(a)} for a in acc[b * G:(b + 1) * G]]
              for b in range(2)]
    m = branch_metrics(roll, scores)
    # group 0 pairs: 0, 1/3, 3/3, 1/3, 3/3, 3/3; group 1: 2/2 (swap), 0, 4/4, 1, 1, 1
    assert m["rollout/pairwise_edit"] == pytest.approx((0 + 1 / 3 + 1 + 1 / 3 + 1 + 1 + 5) / 12)
    assert m["rollout/pass_at_group"] == pytest.approx(1 / 2)     # only group 1 has a hit
    assert m["rollout/distinct_answers"] == pytest.approx((2 + 3) / 2)
    assert m["branch/clean_pairwise_edit"] == pytest.approx((0 + 1) / 2)
    assert m["branch/noisy_pairwise_edit"] == pytest.approx((1 + 1) / 2)
    assert m["branch/clean_distinct_answers"] == pytest.approx((1 + 2) / 2)   # {5}, {1, 2}
    assert m["branch/noisy_distinct_answers"] == pytest.approx((1 + 1) / 2)   # {6}, {3}
    roll.branch = ["clean"] * 8
    plain = branch_metrics(roll, scores)
    assert not [k for k in plain if k.startswith("branch/")]
    assert plain == rollout_metrics(roll, Scores(scores))        # as a run without the plug-in
    assert plain["rollout/pairwise_edit"] == m["rollout/pairwise_edit"]
    assert "rollout/pass_at_group" not in branch_metrics(roll, [[{"overall": 1.0}] * G] * 2)

    assert normalised_edit([list(b"kitten"), list(b"sitting"), []], [(0, 1), (1, 0), (2, 2), (2, 0)]) \
        == pytest.approx([3 / 7, 3 / 7, 0.0, 1.0])

    def reference(a, b):                  # the textbook table, one cell at a time
        prev = list(range(len(b) + 1))
        for i, x in enumerate(a, 1):
            cur = [i]
            for j, y in enumerate(b, 1):
                cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
            prev = cur
        return prev[-1] / max(len(a), len(b), 1)

    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 3, (int(torch.randint(0, 7, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(12)]
    pairs = [(i, j) for i in range(12) for j in range(12)]
    assert normalised_edit(seqs, pairs) == pytest.approx([reference(seqs[i], seqs[j]) for i, j in pairs])


def test_the_hook_finds_latent_noise_by_name_and_none_is_plain_grpo():
    """`kind: none` (or no mapping) builds no plug-in, whatever else the mapping holds (the
    shipped NC-GRPO config with `rollout.branching.kind=none` is the plain arm)."""
    assert make_branching(None) is None and make_branching({"kind": "none"}) is None
    assert make_branching({"kind": "none", "fraction": 0.5, "alpha": 0.1}) is None
    assert BRANCHINGS.get("latent_noise") is LatentNoise
    nc = make_branching({"kind": "latent_noise", "alpha": 0.2, "noise": "shared"})
    assert isinstance(nc, LatentNoise) and nc.config.alpha == 0.2 and not nc.supports_compiled
    with pytest.raises(ValueError, match=r"kind is 'latent'; choose one of \['none', 'image_noise', 'latent_noise'"):
        make_branching({"kind": "latent", "alpha": 0.1})
    with pytest.raises(ValueError, match="rollout.branching: unknown key"):
        make_branching({"kind": "latent_noise", "alpah": 0.1})
    with pytest.raises(ValueError, match="must be a mapping"):
        make_branching("latent_noise")
    assert make_engine("hf", None, {"kind": "none", "alpha": 0.1}).branching is None
    engine = make_engine("hf", None, {"kind": "latent_noise"})
    assert isinstance(engine.branching, LatentNoise) and engine.without_branching().branching is None
