"""PIRL: the trinary reward, the consistency regulariser, the template pool, and PIRL-off = GRPO."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import rewards
from mmrlvr.config import ConfigError, load_config, to_dict
from mmrlvr.data import Example
from mmrlvr.objectives import StepContext, build
from mmrlvr.methods.pirl.consistency import PirlConsistency, instruction_mask, token_kl
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.core.templates import HELDOUT_TEMPLATES, TRAIN_TEMPLATES, apply_templates
from rewards.base import build_combined

CONFIGS = Path(__file__).parent.parent / "configs"
FMT = "Put the final answer in <answer> </answer>."
YES = Example(id="q1", prompt="Is there a nodule in the left lung?", answer="yes")
MC = Example(id="q2", prompt="Which side?\nA. left\nB. right", answer="B", choices=["left", "right"])


@pytest.mark.parametrize("example, completion, expected", [
    (YES, "<think>a bright spot on the image right</think><answer>yes</answer>", 1.0),
    (YES, "<think>no spot</think><answer>no</answer>", 0.0),
    (YES, "<answer>yes</answer>", 0.5),                       # no think block
    (YES, "yes", 0.5),                                        # bare answer
    (YES, "<think>a spot</think> Yes.", 0.5),                 # answer outside the tags
    (YES, "<think>a spot</think><answer>yes", 0.5),           # unclosed answer tag
    (YES, "<think>a spot</think><answer>yes</answer> and more", 0.5),   # text after the answer
    (YES, "<think>it is yes", 0.0),                           # all thinking, never answered
    (YES, "yes or no", 0.0),                                  # ambiguous: fails closed
    (YES, "", 0.0),
    (MC, "<think>right lung</think><answer>right</answer>", 1.0),   # option text for letter gold
    (MC, "<think>right lung</think><answer>A</answer>", 0.0),
    (MC, "Answer: B", 0.5),
])
def test_trinary_reward_on_hand_cases(example, completion, expected):
    [score] = rewards.get("pirl").score(example, [completion])
    assert score["overall"] == expected
    assert score["correct"] == float(expected > 0)


def test_r_mid_anneals_from_half_to_zero_through_the_combined_reward():
    combined = build_combined([{"name": "pirl", "weight": 1.0}, {"name": "format", "weight": 0.0}])
    sloppy = ["<answer>yes</answer>"]
    seen = []
    for progress in (0.0, 0.25, 0.5, 1.0, 1.5):
        seen.append(combined.score(YES, sloppy, progress=progress)[0]["overall"])
    assert seen == [0.5, 0.375, 0.25, 0.0, 0.0]
    custom = rewards.get("pirl", r_mid_start=0.8, r_mid_end=0.2)
    assert custom.r_mid(0.5) == pytest.approx(0.5)
    assert custom.score(YES, ["<think>x</think><answer>yes</answer>"], progress=0.5)[0]["overall"] == 1.0


FOUR = {"formatted_correct": "<think>a spot</think><answer>yes</answer>",
        "formatted_wrong": "<think>no spot</think><answer>no</answer>",
        "misformatted_correct": "yes",
        "misformatted_wrong": "no"}


@pytest.mark.parametrize("levels, want", [
    ("content_first", {"formatted_correct": 1.0, "formatted_wrong": 0.0,
                       "misformatted_correct": 0.25, "misformatted_wrong": 0.0}),
    ("format_first", {"formatted_correct": 1.0, "formatted_wrong": 0.25,
                      "misformatted_correct": 0.0, "misformatted_wrong": 0.0}),
    ({"formatted_correct": 1.0, "formatted_wrong": 0.3, "misformatted_correct": "r_mid",
      "misformatted_wrong": 0.1},
     {"formatted_correct": 1.0, "formatted_wrong": 0.3, "misformatted_correct": 0.25,
      "misformatted_wrong": 0.1}),
])
def test_trinary_levels_give_each_cell_its_configured_value(levels, want):
    reward = rewards.get("pirl", levels=levels)
    got = {cell: reward.score(YES, [text], progress=0.5)[0]["overall"] for cell, text in FOUR.items()}
    assert got == want                                  # r_mid at half-way: 0.25
    default = rewards.get("pirl")
    assert [default.score(YES, [t], progress=0.5)[0]["overall"] for t in FOUR.values()] == \
        [1.0, 0.0, 0.25, 0.0]                           # the default is content_first


def test_format_first_ranks_formatted_wrong_above_every_misformatted_answer():
    reward = rewards.get("pirl", levels="format_first")
    for progress in (0.0, 0.5, 0.9):
        v = {c: reward.score(YES, [t], progress=progress)[0]["overall"] for c, t in FOUR.items()}
        assert v["formatted_correct"] > v["formatted_wrong"] > v["misformatted_correct"] >= \
            v["misformatted_wrong"]


def test_bad_levels_are_refused_by_name():
    with pytest.raises(ValueError, match="not one of"):
        rewards.get("pirl", levels="format_last")
    with pytest.raises(ValueError, match="missing or unknown keys"):
        rewards.get("pirl", levels={"formatted_correct": 1.0})
    with pytest.raises(ValueError, match="bad values"):
        rewards.get("pirl", levels={**dict.fromkeys(
            ["formatted_correct", "formatted_wrong", "misformatted_correct"], 1.0),
            "misformatted_wrong": 2.0})


def test_template_pool_off_is_identity_and_draws_nothing():
    rng = random.Random(0)
    state = rng.getstate()
    examples = [YES, MC]
    assert apply_templates(examples, [], rng) is examples and rng.getstate() == state
    wrapped = apply_templates(examples, ["Question: {question}"], rng)
    assert [e.prompt for e in wrapped] == ["Question: " + YES.prompt, "Question: " + MC.prompt]
    assert wrapped[1].answer == "B" and YES.prompt == "Is there a nodule in the left lung?"
    with pytest.raises(ConfigError, match="data.templates"):
        load_config(None, ["data.templates=['no slot here']"])


def test_shipped_configs_train_on_the_pool_and_never_on_held_out_templates():
    for name in ("medvqa_multitemplate_cpu", "medvqa_pirl_cpu", "vqarad_pirl_qwen25vl7b"):
        cfg = load_config(CONFIGS / f"{name}.yaml")
        assert cfg.data.templates == list(TRAIN_TEMPLATES)
        assert not set(cfg.data.templates) & set(HELDOUT_TEMPLATES)
    # the three CPU configs differ only in the PIRL keys: equal budgets
    plain = to_dict(load_config(CONFIGS / "medvqa_grpo_cpu.yaml", ["train.out_dir=x"]))
    for name in ("medvqa_multitemplate_cpu", "medvqa_pirl_cpu"):
        other = to_dict(load_config(CONFIGS / f"{name}.yaml", ["train.out_dir=x"]))
        other["data"]["templates"], other["objectives"] = [], []
        other["rewards"] = plain["rewards"]
        assert other == plain


# -- the regulariser on a tiny Qwen2.5-VL ---------------------------------------------------------
@pytest.fixture(scope="module")
def med_examples(tmp_path_factory):
    from mmrlvr.data import load_jsonl
    from mmrlvr.tasks.medvqa import make_medvqa

    out = tmp_path_factory.mktemp("med")
    make_medvqa(out, n_train=6, n_test=0, image_size=56)
    return load_jsonl(out / "train.jsonl")


@pytest.fixture(scope="module")
def rollouts(policy, med_examples):
    torch.manual_seed(0)
    prompts = policy.adapter.encode(med_examples[:2], policy.processor, system_prompt="Be brief.",
                                    format_prompt=FMT)
    return make_engine("hf", policy).generate(prompts, SamplingParams(n=2, max_new_tokens=6))


def test_instruction_mask_is_exactly_the_user_question(policy, rollouts, med_examples):
    obj = PirlConsistency()
    batch = obj.prepare(policy, rollouts, [0, 2])
    ids, instr = batch["full"]["input_ids"], batch["instr"]
    image_pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for i, ex in enumerate(med_examples[:2]):
        assert policy.tokenizer.decode(ids[i][instr[i]]) == f"{ex.prompt} {FMT}"
        assert not instr[i][ids[i] == image_pad].any()               # never the image
    P = rollouts.prompts.inputs["input_ids"].shape[1]
    assert not instr[:, P:].any()                                    # never the response
    direct = instruction_mask(rollouts.prompts.inputs["input_ids"], policy.tokenizer,
                              policy.placeholder_ids, rollouts.prompts.inputs["mm_token_type_ids"])
    assert torch.equal(direct[0], instr[0, :P])


def test_regulariser_is_zero_at_zero_delta_and_positive_otherwise(policy, rollouts):
    obj = PirlConsistency(epsilon=0.05)
    batch = obj.prepare(policy, rollouts, [0, 1, 2, 3])
    mask = batch["completion_mask"]
    with torch.no_grad():
        clean = obj.logprobs(policy, batch, None)
        zero = obj.logprobs(policy, batch, torch.zeros_like(batch["embeds"]))
        assert token_kl(clean, zero, mask) == 0.0
        noise = torch.randn(batch["embeds"].shape, generator=torch.Generator().manual_seed(1))
        bounded = noise / noise.norm(dim=-1, keepdim=True) * obj.radius(batch)
        assert token_kl(clean, obj.logprobs(policy, batch, bounded), mask) > 0
    delta = obj.attack(policy, batch, clean, torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert token_kl(clean, obj.logprobs(policy, batch, delta), mask) > 0


def test_attack_respects_the_bound_and_moves_only_instruction_embeddings(policy, rollouts):
    obj = PirlConsistency(epsilon=0.05, steps=3)
    batch = obj.prepare(policy, rollouts, [0, 3])
    with torch.no_grad():
        clean = obj.logprobs(policy, batch, None)
    delta = obj.attack(policy, batch, clean, torch.Generator().manual_seed(0))
    norms = delta.norm(dim=-1)                                             # [n, T]
    bound = 0.05 * batch["embeds"].norm(dim=-1)
    instr = batch["instr"]
    assert (norms <= bound * (1 + 1e-5)).all()
    assert (norms[instr] > 0.5 * bound[instr]).all()                    # the attack used its budget
    assert (delta[~instr] == 0).all()
    # what the language model receives: image features scattered in, only instruction rows moved
    seen = []
    lm = policy.base_model().model.language_model
    hook = lm.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["inputs_embeds"].detach()),
                                        with_kwargs=True)
    try:
        with torch.no_grad():
            obj.logprobs(policy, batch, None)
            obj.logprobs(policy, batch, delta)
    finally:
        hook.remove()
    moved = (seen[0] - seen[1]).abs().sum(-1) > 0                       # [n, T]
    assert torch.equal(moved, instr)


def test_objective_loss_backpropagates_and_zero_epsilon_gives_zero(policy, rollouts):
    ctx = StepContext(policy, rollouts, [], torch.zeros(4), step=1, total_steps=2)
    [(weight, obj)] = build([{"name": "pirl_consistency", "weight": 0.1, "max_rows": 3}])
    assert weight == 0.1 and obj.name == "pirl_consistency"
    policy.model.zero_grad(set_to_none=True)
    loss, stats = obj.loss(ctx)
    loss.backward()
    emb = policy.base_model().get_input_embeddings().weight
    assert loss > 0 and emb.grad is not None and emb.grad.abs().sum() > 0
    assert stats["rows"] == 3 and 0.04 < stats["delta_rel_norm"] <= 0.05 + 1e-6
    policy.model.zero_grad(set_to_none=True)
    again, _ = obj.loss(ctx)
    assert again.item() == loss.item()                                 # seeded by the step
    off, _ = PirlConsistency(epsilon=0.0).loss(ctx)
    assert off.item() == 0.0
    policy.model.zero_grad(set_to_none=True)


# -- end to end: PIRL on, and PIRL off = the plain GRPO step ------------------------------------
def _run(tmp_path, tiny_vl, data, name, config, overrides=()):
    from mmrlvr.train.setup import build_run

    cfg = load_config(CONFIGS / config, [
        f"model.path={tiny_vl}", f"data.train={data}", "data.eval=", "rollout.group_size=2",
        "rollout.max_new_tokens=6", "train.batch_prompts=2", "train.steps=2", "train.seed=5",
        f"train.out_dir={tmp_path / name}", "optim.lr=1e-3", *overrides])
    torch.manual_seed(0)
    run, _ = build_run(cfg)
    return run


def _step(run):
    from mmrlvr.train.trainer import grpo_step

    metrics = grpo_step(run, 1)
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "perf/"))}


def test_pirl_off_is_the_plain_grpo_step_and_on_adds_its_terms(tmp_path, tiny_vl, med_examples):
    data = Path(med_examples[0].images[0]).parent.parent / "train.jsonl"
    plain = _run(tmp_path, tiny_vl, data, "plain", "medvqa_grpo_cpu.yaml")
    off = _run(tmp_path, tiny_vl, data, "off", "medvqa_pirl_cpu.yaml", [
        "objectives=[]", "data.templates=[]",
        "rewards=[{name: accuracy, weight: 0.9}, {name: format, weight: 0.1}]"])
    assert _step(plain) == _step(off)
    on = _run(tmp_path, tiny_vl, data, "on", "medvqa_pirl_cpu.yaml",
              ["objectives=[{name: pirl_consistency, weight: 0.1, max_rows: 2}]"])
    metrics = _step(on)
    assert metrics["reward/pirl/r_mid"] == 0.25                        # progress 1/2 of 0.5 -> 0
    assert metrics["objective/pirl_consistency/rows"] == 2.0
    assert metrics["objective/pirl_consistency"] >= 0.0
    assert "reward/accuracy" in metrics
