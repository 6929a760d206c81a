"""OPDVR (mmrlvr.methods.opdvr.shaper): the ReLU gate by correctness and the advantage change by hand, the
teacher's checks, and GRPO steps on the tiny model with a same-weights and a different teacher."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import modalities
from mmrlvr.core.types import Scores
from mmrlvr.methods.opdvr.shaper import OPDVR, gated_gap
from mmrlvr.algo.shaping import SHAPERS, ShapeContext, build, token_credit

TEACHER = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -3.0, -1.0], [-1.0, -1.0, -1.0]])   # [3, 3]
STUDENT = torch.tensor([[-1.5, -0.1, -2.0], [-1.2, -1.0, -4.0], [-0.5, -2.0, -7.0]])
# d = T − S:             [[ 0.5, -0.4, 0.0], [ 1.0, -2.0, 3.0], [-0.5,  1.0,  6.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]])


class FakeTeacher(OPDVR):
    """OPDVR with fixed log-probabilities in place of the two forwards."""

    def token_logprobs(self, ctx):
        return TEACHER, STUDENT, {"teacher_s": 0.0}


def test_the_gate_keeps_approval_on_correct_and_disapproval_on_incorrect_rollouts():
    correct = torch.tensor([True, False, True])
    gated, d = gated_gap(TEACHER, STUDENT, correct, MASK)
    torch.testing.assert_close(d, torch.tensor([[0.5, -0.4, 0.0], [1.0, -2.0, 0.0], [-0.5, 1.0, 0.0]]))
    torch.testing.assert_close(gated, torch.tensor([[0.5, 0.0, 0.0],      # correct: max(d, 0)
                                                    [0.0, -2.0, 0.0],     # incorrect: min(d, 0)
                                                    [0.0, 1.0, 0.0]]))    # padding: 0


def test_correctness_reads_accuracy_else_overall():
    scores = [[{"overall": 0.95, "accuracy": 0.0}, {"overall": 0.1, "accuracy": 1.0}],
              [{"overall": 0.6}, {"overall": 0.4}]]
    assert Scores(scores).correct("accuracy", 0.5).flatten().tolist() == [False, True, True, False]


def test_opdvr_adds_coef_times_the_gated_gap_to_the_token_advantages():
    scores = [[{"overall": 1.0, "accuracy": 1.0}, {"overall": 0.1, "accuracy": 0.0},
               {"overall": 0.9, "accuracy": 1.0}]]          # one group of 3: rows 0, 1, 2
    adv = torch.tensor([0.7, -0.7, 0.0])
    (shaper,) = [FakeTeacher(teacher="unused", coef=0.5)]
    roll = SimpleNamespace(group_size=3)
    ctx = ShapeContext(roll, scores, MASK, policy=object())
    credit, stats = token_credit(adv, MASK, 0.2, 0.28, [shaper], ctx)
    want = torch.tensor([[0.7 + 0.25, 0.7, 0.7],            # correct: + 0.5·max(d, 0)
                         [-0.7, -0.7 - 1.0, -0.7],          # incorrect: + 0.5·min(d, 0); pad kept
                         [0.0, 0.5, 0.0]])                  # zero-spread row still learns
    torch.testing.assert_close(credit.advantages, want)
    assert stats["shaping/opdvr/d_correct_mean"] == pytest.approx((0.5 + 0 + 0 + 0 + 1.0) / 5)
    assert stats["shaping/opdvr/d_incorrect_mean"] == pytest.approx(-2.0 / 2)
    assert stats["shaping/opdvr/changed_frac"] == pytest.approx(3 / 7)
    assert stats["shaping/opdvr/d_mean"] == pytest.approx((0.5 - 0.4 + 1.0 - 2.0 - 0.5 + 1.0) / 7)
    assert stats["shaping/opdvr/correct_frac"] == pytest.approx(2 / 3)
    zero = FakeTeacher(teacher="unused", coef=0.0)
    credit, stats = token_credit(adv, MASK, 0.2, 0.28, [zero], ctx)
    assert torch.equal(credit.advantages, adv.unsqueeze(1).expand(3, 3))
    assert stats["shaping/opdvr/changed_frac"] == 0.0


def test_the_default_is_the_papers_coefficient_free_form_and_coef_scales_it():
    scores = [[{"overall": 1.0, "accuracy": 1.0}, {"overall": 0.1, "accuracy": 0.0},
               {"overall": 0.9, "accuracy": 1.0}]]
    adv = torch.tensor([0.7, -0.7, 0.0])
    ctx = ShapeContext(SimpleNamespace(group_size=3), scores, MASK, policy=object())
    (free,) = [FakeTeacher(teacher="unused")]                # no coef: A_t + g_t
    credit, _ = token_credit(adv, MASK, 0.2, 0.28, [free], ctx)
    torch.testing.assert_close(credit.advantages, torch.tensor([[0.7 + 0.5, 0.7, 0.7],
                                                                [-0.7, -0.7 - 2.0, -0.7],
                                                                [0.0, 1.0, 0.0]]))
    old = FakeTeacher(teacher="unused", coef=0.1)          # the earlier default, by config value
    credit, _ = token_credit(adv, MASK, 0.2, 0.28, [old], ctx)
    torch.testing.assert_close(credit.advantages, torch.tensor([[0.7 + 0.05, 0.7, 0.7],
                                                                [-0.7, -0.7 - 0.2, -0.7],
                                                                [0.0, 0.1, 0.0]]))


def test_options_are_checked_and_the_method_is_registered():
    assert "opdvr" in SHAPERS.names()
    with pytest.raises(ValueError, match="teacher"):
        build([{"name": "opdvr"}])
    with pytest.raises(ValueError, match="coef"):
        build([{"name": "opdvr", "teacher": "x", "coef": -1}])
    (s,) = build([{"name": "opdvr", "teacher": "privileged"}])
    assert (s.stage, s.coef, s.threshold, s.sample_temperature) == ("advantage", None, 0.5, None)


def test_a_privileged_teacher_needs_an_adapter_that_has_one():
    examples = [SimpleNamespace(id="a")]
    roll = SimpleNamespace(prompts=SimpleNamespace(examples=examples, prompt_options={}))
    pol = SimpleNamespace(adapter=modalities.get("vision"), processor=None)
    with pytest.raises(ValueError, match="adapter 'vision' has none"):
        OPDVR(teacher="privileged")._privileged_prompts(pol, roll)


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("qwen2.5-vl", tmp_path_factory.mktemp("tiny-vocab"), vocab_target=500,
                      hidden_size=32, num_layers=1)


def test_a_teacher_with_another_tokenizer_is_refused(policy, other_tokenizer):
    with pytest.raises(ValueError, match="tokenizer differs from the policy's"):
        OPDVR(teacher=str(other_tokenizer))._teacher_model(policy)


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("qwen2.5-vl", tmp_path_factory.mktemp("tiny-seed1"), seed=1)


def test_grpo_steps_with_a_same_weights_and_a_different_teacher(tmp_path, tiny_vl, shapes_dir,
                                                               other_seed):
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    # correctness by a coin the completion flips (a random model answers nothing right): both
    # correct and incorrect rollouts in each step
    (tmp_path / "parity.py").write_text(
        "def parity(example, completion):\n    return float(len(completion) % 2 == 0)\n")
    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "rollout.max_new_tokens=8",
                             "train.batch_prompts=2", "train.steps=2", "optim.lr=1e-3",
                             f"train.out_dir={tmp_path / 'run'}"])
    cfg.rewards = [{"name": f"{tmp_path / 'parity.py'}:parity", "weight": 1.0}]
    cfg.algo.shaping = [{"name": "opdvr", "teacher": str(tiny_vl), "coef": 0.5}]
    run, _ = build_run(cfg)
    same = grpo_step(run, 1)           # the student still holds tiny_vl's weights here
    assert 0 < same["shaping/opdvr/correct_frac"] < 1
    assert abs(same["shaping/opdvr/d_mean"]) < 1e-4
    assert abs(same["shaping/opdvr/d_correct_mean"]) < 1e-4
    assert abs(same["shaping/opdvr/d_incorrect_mean"]) < 1e-4
    assert same["shaping/opdvr/mean_abs_delta_adv"] < 1e-4
    assert same["shaping/opdvr/student_recomputed"] == 1.0
    assert run.shapers[0].model is not None and not run.shapers[0].model.training
    assert not any(p.requires_grad for p in run.shapers[0].model.parameters())

    run.shapers = build([{"name": "opdvr", "teacher": str(other_seed), "coef": 0.5}])
    other = grpo_step(run, 2)
    assert 0 < other["shaping/opdvr/correct_frac"] < 1
    assert other["shaping/opdvr/d_correct_mean"] > 0.01          # approval only
    assert other["shaping/opdvr/d_incorrect_mean"] < -0.01       # disapproval only
    assert 0 < other["shaping/opdvr/changed_frac"] < 1
    assert other["shaping/opdvr/mean_abs_delta_adv"] > 0.005
    assert other["update/skipped"] == 0.0 and other["optim/grad_norm"] > 0


def test_a_privileged_teacher_scores_the_teacher_prompt(tiny_vl, tmp_path_factory):
    from mmrlvr.config import ModelConfig
    from mmrlvr.core.types import select
    from mmrlvr.data import load_jsonl
    from mmrlvr.rollout import make_engine
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.tasks.banners import make_banners
    from mmrlvr.train.policy import Policy

    out = tmp_path_factory.mktemp("banners-opdvr")
    make_banners(out, n_train=2, n_test=0, width=112, height=56, seed=1)
    examples = load_jsonl(out / "train.jsonl")
    torch.manual_seed(0)
    policy = Policy.load(ModelConfig(path=str(tiny_vl), modality="image_translation"),
                         modalities.get("image_translation"), torch.device("cpu"))
    batch = policy.adapter.encode(examples, policy.processor)
    rollouts = make_engine("hf", policy).generate(batch, SamplingParams(n=2, max_new_tokens=6))
    mask = rollouts.completion_mask
    scores = [[{"overall": 1.0}, {"overall": 0.0}], [{"overall": 0.0}, {"overall": 1.0}]]
    ctx = ShapeContext(rollouts, scores, mask, examples, batch, policy)
    teacher, student, _ = OPDVR(teacher="privileged", micro_batch=3).token_logprobs(ctx)
    # by hand: whole rows through completion_logprobs under each prompt, temperature 1
    rows, width = [0, 0, 1, 1], int(mask.sum(dim=1).max())
    ids, m = rollouts.completion_ids[:, :width], mask[:, :width]
    with torch.no_grad():
        t_in, _ = select(policy.adapter.encode_privileged(examples, policy.processor), rows)
        s_in, _ = select(batch, rows)
        lt, _ = policy.completion_logprobs(t_in, ids, m)
        ls, _ = policy.completion_logprobs(s_in, ids, m)
    keep = m.bool()
    torch.testing.assert_close(teacher[:, :width][keep], lt[keep], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(student[:, :width][keep], ls[keep], atol=1e-4, rtol=1e-4)
    assert float((lt - ls)[keep].abs().max()) > 1e-3     # the privileged prompt moves the teacher
