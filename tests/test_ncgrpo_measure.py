"""NC-GRPO you can see working: what the noise did is measured every call (ncgrpo/*), `alpha: auto`
steers α to a target KL, and the pixel-space baseline (`kind: image_noise`) touches only the
noisy members' images. Tiny real Qwen2.5-VL, a few one-token rollouts each."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmrlvr.config import load_config
from mmrlvr.data import Example
from mmrlvr.methods.ncgrpo.auto import AlphaController
from mmrlvr.methods.ncgrpo.branching import find_decoder
from mmrlvr.methods.ncgrpo.probe import answers_differ, first_step_figures
from mmrlvr.rollout import SamplingParams, make_engine

G = 4                        # 2 clean + 2 noisy per group


@pytest.fixture(scope="module")
def prompts(policy, tmp_path_factory):
    """A text prompt and an image prompt (rows 0-3 and 4-7)."""
    path = tmp_path_factory.mktemp("ncm") / "red.png"
    Image.new("RGB", (56, 56), (220, 20, 20)).save(path)
    examples = [Example(id="text", prompt="What is 2 + 3?", answer="5"),
                Example(id="img", prompt="How many red shapes are in the picture?", answer="1",
                        images=[str(path)])]
    return policy.adapter.encode(examples, policy.processor)


def sample(engine, batch, seed=0, tokens=1):
    torch.manual_seed(seed)
    return engine.generate(batch, SamplingParams(n=G, max_new_tokens=tokens, temperature=0.7))


def test_first_step_kl_is_zero_at_alpha0_and_positive_with_noise(policy, prompts):
    off = sample(make_engine("hf", policy, {"kind": "latent_noise", "alpha": 0.0}), prompts).stats
    assert off["ncgrpo/first_step_kl"] == 0.0 and off["ncgrpo/first_step_kl_max"] == 0.0
    assert off["ncgrpo/first_token_changed_frac"] == 0.0 and off["ncgrpo/alpha"] == 0.0
    on = sample(make_engine("hf", policy, {"kind": "latent_noise", "alpha": 1.0}), prompts).stats
    assert on["ncgrpo/first_step_kl"] > 1e-4
    assert on["ncgrpo/clean_entropy"] == pytest.approx(off["ncgrpo/clean_entropy"], rel=1e-5)
    assert on["ncgrpo/kl_over_entropy"] == pytest.approx(
        on["ncgrpo/first_step_kl"] / on["ncgrpo/clean_entropy"])
    plain = sample(make_engine("hf", policy, {"kind": "none"}), prompts).stats
    assert not [k for k in plain if k.startswith("ncgrpo/")]


def test_first_step_figures_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.5, 0.5], [0.2, 0.8]]))  # [4, 2]
    out = first_step_figures(logits, [False, True, False, True], group_size=2, temperature=1.0)
    kl1 = 0.9 * torch.log(torch.tensor(0.9 / 0.5)) + 0.1 * torch.log(torch.tensor(0.1 / 0.5))
    kl2 = 0.2 * torch.log(torch.tensor(0.2 / 0.5)) + 0.8 * torch.log(torch.tensor(0.8 / 0.5))
    assert out["ncgrpo/first_step_kl"] == pytest.approx(float(kl1 + kl2) / 2, rel=1e-5)
    assert out["ncgrpo/first_step_kl_max"] == pytest.approx(float(kl1), rel=1e-5)
    assert out["ncgrpo/clean_entropy"] == pytest.approx(float(torch.log(torch.tensor(2.0))), rel=1e-5)
    # argmax of [0.5, 0.5] is token 0: row 1 keeps it, row 3 moves to token 1
    assert out["ncgrpo/first_token_changed_frac"] == 0.5
    assert first_step_figures(logits, [True] * 4, 2, 1.0) == {}       # no clean member: no figure


def test_answers_differ_by_hand():
    answers = ["1", "2", "1", "2",    "3", "3", "3", "4",    None, "5", "5", None]
    branch = ["clean", "clean", "noisy", "noisy"] * 3
    out = answers_differ(answers, branch, 4)
    # group 0: {1,2} vs {1,2} same; group 1: {3} vs {3,4} differ, 4 new; group 2: {5} vs {5} same
    assert out == {"ncgrpo/answers_differ_frac": 1 / 3, "ncgrpo/noisy_new_answer_frac": 1 / 3}


def test_alpha_auto_reaches_its_target_kl(policy, prompts):
    target = 0.002                   # reachable on this tiny model: KL 0.028 nat at α 1, H 6.3
    engine = make_engine("hf", policy, {"kind": "latent_noise", "alpha": "auto", "target": target,
                                        "alpha_init": 0.1})
    ratios = []
    for call in range(12):
        stats = sample(engine, prompts, seed=call).stats
        ratios.append(stats["ncgrpo/kl_over_entropy"] / target)
    assert ratios[0] < 0.2                          # α_init 0.1 starts far below the target
    assert all(abs(r - 1) < 0.3 for r in ratios[-3:]), ratios
    state = engine.branching.state_dict()
    assert state["calls"] == 12 and 0.1 < state["alpha"] < 10
    again = make_engine("hf", policy, {"kind": "latent_noise", "alpha": "auto", "target": target})
    again.branching.load_state_dict(state)         # a resumed run steers on from there
    assert sample(again, prompts).stats["ncgrpo/alpha"] == state["alpha"]


def test_controller_steps_are_bounded_and_skip_a_zero_entropy():
    c = AlphaController(target=0.1, alpha_init=1.0)
    c.observe(kl=1e-12, entropy=1.0)                # far too little: one step up, at most x2
    assert c.alpha == pytest.approx(2.0)
    c.observe(kl=0.0, entropy=1.0)                  # below resolution: up by the largest step
    assert c.alpha == pytest.approx(4.0)
    c.observe(kl=0.4, entropy=1.0)                  # 4x the goal: α²-law step ½·½·log(1/4)
    assert c.alpha == pytest.approx(4.0 * 0.25 ** 0.25)
    before = c.alpha
    c.observe(kl=0.3, entropy=0.0)                  # a deterministic first token: α kept
    assert c.alpha == before and c.calls == 4


def test_alpha_auto_config_and_vllm_refusal():
    from mmrlvr.methods.ncgrpo.plugin import ImageNoise, LatentNoise

    with pytest.raises(ValueError, match="target > 0"):
        LatentNoise({"kind": "latent_noise", "alpha": "auto", "target": 0})
    with pytest.raises(ValueError, match="HF engine"):
        LatentNoise({"kind": "latent_noise", "alpha": "auto"}).vllm_llm_kwargs()
    with pytest.raises(ValueError, match="HF engine only"):
        ImageNoise({"kind": "image_noise"}).vllm_llm_kwargs()
    with pytest.raises(ValueError, match="unknown key"):
        ImageNoise({"kind": "image_noise", "alpha": 0.1})


def test_image_noise_changes_only_the_noisy_members_images(policy, prompts):
    visual, decoder = policy.base_model().model.visual, find_decoder(policy.model)
    pixels, embeds = [], []
    h1 = visual.register_forward_pre_hook(lambda m, a, k: pixels.append(a[0].clone()), with_kwargs=True)
    h2 = decoder.register_forward_pre_hook(
        lambda m, a, k: embeds.append(k["inputs_embeds"].clone()) if not embeds else None,
        with_kwargs=True)
    try:
        stats = sample(make_engine("hf", policy, {"kind": "image_noise", "sigma": 0.5}), prompts).stats
    finally:
        h1.remove(), h2.remove()
    clean = prompts.inputs["pixel_values"]
    assert len(pixels) == 3                        # the prompts' images once, then 2 noisy rows
    assert torch.equal(pixels[0], clean)
    for noisy in pixels[1:]:
        diff = noisy - clean
        assert diff.abs().max() > 0 and 0.4 < float(diff.std()) < 0.6   # σ 0.5 on every value
    assert not torch.equal(pixels[1], pixels[2])                       # independent per row
    e = embeds[0]                                                      # [8, P, d] prefill
    image = (prompts.inputs["input_ids"][1] == policy.base_model().config.image_token_id)   # [P]
    assert all(torch.equal(e[r], e[0]) for r in range(1, 4))        # the text prompt: untouched
    assert torch.equal(e[5], e[4])                                  # clean members alike
    for r in (6, 7):
        assert torch.equal(e[r][~image], e[4][~image])               # text positions untouched
        assert not torch.equal(e[r][image], e[4][image])             # image features moved
    assert stats["ncgrpo/first_step_kl_max"] > 0 and stats["ncgrpo/sigma"] == 0.5
    assert "get_image_features" not in vars(policy.base_model().model)   # the class's method again


@pytest.mark.parametrize("branching", [{"kind": "image_noise", "sigma": 0.0},
                                       {"kind": "latent_noise", "alpha": 0.0}], ids=["sigma0", "alpha0"])
def test_zero_noise_samples_exactly_plain_grpo(policy, prompts, branching):
    plain = sample(make_engine("hf", policy, None), prompts, tokens=6)
    rng = torch.get_rng_state()
    other = sample(make_engine("hf", policy, branching), prompts, tokens=6)
    assert torch.equal(other.completion_ids, plain.completion_ids)
    assert torch.equal(other.sample_logprobs, plain.sample_logprobs)
    assert torch.equal(torch.get_rng_state(), rng)


def test_grpo_step_logs_ncgrpo_figures_and_a_checkpoint_keeps_alpha(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import _save, grpo_step

    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "rollout.max_new_tokens=4",
                             "train.batch_prompts=2", "train.steps=2", f"train.out_dir={tmp_path}"])
    cfg.rollout.branching = {"kind": "latent_noise", "alpha": "auto", "target": 0.002,
                             "alpha_init": 0.3}
    run, _ = build_run(cfg)
    metrics = grpo_step(run, 1)
    assert metrics["ncgrpo/alpha"] == 0.3 and metrics["ncgrpo/first_step_kl"] > 0
    assert {"ncgrpo/answers_differ_frac", "ncgrpo/clean_entropy", "branch/noisy_reward"} <= set(metrics)
    moved = run.engine.branching.controller.alpha
    assert moved != 0.3
    _save(run, 1)
    run.lock.release()
    resumed, start = build_run(cfg, resume=True)
    assert start == 1 and resumed.engine.branching.controller.alpha == moved
    resumed.lock.release()


def test_shipped_ncgrpo_configs_steer_alpha():
    from pathlib import Path

    from mmrlvr.methods.ncgrpo.branching import Branching

    for name in ("shapes_ncgrpo_cpu.yaml", "geo3k_ncgrpo_qwen25vl7b.yaml"):
        cfg = load_config(Path(__file__).parent.parent / "configs" / name)
        branching = Branching.from_config(cfg.rollout.branching)
        assert branching.auto and branching.target == 0.1 and cfg.rollout.backend == "hf", name
