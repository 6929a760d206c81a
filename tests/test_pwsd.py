"""PWSD: weights and loss against a hand computation, on tiny tensors and on a tiny real policy."""
from __future__ import annotations

import math

import pytest
import torch

import modalities
from mmrlvr.config import ModelConfig
from mmrlvr.objectives import StepContext, build
from mmrlvr.methods.transanytext.pwsd import PWSD, pwsd_loss
from mmrlvr.core.types import select


def test_weights_and_loss_match_a_hand_computation():
    student = torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]).log().requires_grad_(True)
    teacher = torch.tensor([[[0.8, 0.2], [0.5, 0.5], [0.1, 0.9]]]).log()
    ids = torch.tensor([[0, 1, 0]])
    mask = torch.tensor([[1, 1, 0]])                               # the third token is padding
    loss, st = pwsd_loss(student, teacher, ids, mask, alpha=1.0)
    w0, w1 = 1.6 / 2.6, (2 / 3) / (1 + 2 / 3)                      # σ(log .8/.5), σ(log .5/.75)
    kl0 = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    kl1 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert st["weights"][0, :2].tolist() == pytest.approx([w0, w1], rel=1e-6)
    assert st["gap"][0, :2].tolist() == pytest.approx([math.log(1.6), math.log(2 / 3)], rel=1e-6)
    assert float(loss.detach()) == pytest.approx((w0 * kl0 + w1 * kl1) / 2, rel=1e-6)
    assert not st["weights"].requires_grad                        # stop-gradient on w
    loss.backward()
    assert student.grad[0, 2].abs().sum() == 0                     # padding gets no gradient
    sharp, _ = pwsd_loss(student.detach(), teacher, ids, mask, alpha=2.0)
    w0a, w1a = 1.6 ** 2 / (1 + 1.6 ** 2), (2 / 3) ** 2 / (1 + (2 / 3) ** 2)
    assert float(sharp) == pytest.approx((w0a * kl0 + w1a * kl1) / 2, rel=1e-6)
    same, st = pwsd_loss(teacher, teacher, ids, mask)
    assert float(same) == 0.0 and st["weights"][0, :2].tolist() == [0.5, 0.5]


@pytest.fixture(scope="module")
def translation_policy(tiny_vl):
    from mmrlvr.train.policy import Policy

    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(tiny_vl), modality="image_translation"),
                       modalities.get("image_translation"), torch.device("cpu"))


@pytest.fixture(scope="module")
def banner_examples(tmp_path_factory):
    from mmrlvr.data import load_jsonl
    from mmrlvr.tasks.banners import make_banners

    out = tmp_path_factory.mktemp("banners-pwsd")
    make_banners(out, n_train=4, n_test=0, width=112, height=56, seed=1)
    return out, load_jsonl(out / "train.jsonl")


def test_objective_on_a_tiny_policy_matches_the_hand_computation(translation_policy, banner_examples):
    from mmrlvr.rollout import make_engine
    from mmrlvr.rollout.base import SamplingParams

    policy, examples = translation_policy, banner_examples[1][:2]
    adapter = policy.adapter
    student_batch = adapter.encode(examples, policy.processor)
    teacher_batch = adapter.encode_privileged(examples, policy.processor)
    assert teacher_batch.inputs["input_ids"].shape[1] > student_batch.inputs["input_ids"].shape[1] + 50
    assert "Source-language patch" in teacher_batch.prompt_texts[0]
    assert examples[0].meta["source_patch"] in teacher_batch.prompt_texts[0]
    torch.manual_seed(1)
    rollouts = make_engine("hf", policy).generate(student_batch, SamplingParams(n=2, max_new_tokens=6))
    ctx = StepContext(policy, rollouts, scores=[], advantages=torch.zeros(4), step=1, total_steps=1)
    ((weight, objective),) = build([{"name": "pwsd", "weight": 0.5, "alpha": 1.0}])
    assert weight == 0.5 and isinstance(objective, PWSD)
    loss, stats = objective.loss(ctx)

    # by hand: per-token logprobs of the sampled tokens under both prompts (the trainer's code path)
    rows = [0, 0, 1, 1]
    mask = rollouts.completion_mask
    width = int(mask.sum(dim=1).max())
    ids, mask = rollouts.completion_ids[:, :width], mask[:, :width]
    with torch.no_grad():
        s_in, _ = select(student_batch, rows)
        t_in, _ = select(teacher_batch, rows)
        ls, _ = policy.completion_logprobs(s_in, ids, mask)
        lt, _ = policy.completion_logprobs(t_in, ids, mask)
        s_all = policy.vocab_logprobs(policy.training_inputs(s_in, ids, mask), ids.shape[1])
        t_all = policy.vocab_logprobs(policy.training_inputs(t_in, ids, mask), ids.shape[1])
    m = mask.float()
    assert s_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)[m.bool()] == pytest.approx(ls[m.bool()], abs=1e-5)
    w = torch.sigmoid(lt - ls)                                               # [4, C]
    kl = (s_all.exp() * (s_all - t_all)).sum(-1)                             # [4, C]
    expected = float((w * kl * m).sum() / m.sum())
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert stats["weight_mean"] == pytest.approx(float((w * m).sum() / m.sum()), rel=1e-4)
    assert stats["rows"] == 4 and float(loss.detach()) > 0
    policy.model.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in policy.trainable_parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    policy.model.zero_grad(set_to_none=True)


def test_pwsd_needs_the_image_translation_modality(policy, shapes_dir):
    from mmrlvr.data import load_jsonl
    from mmrlvr.rollout import make_engine
    from mmrlvr.rollout.base import SamplingParams

    batch = policy.adapter.encode(load_jsonl(shapes_dir / "test.jsonl")[:1], policy.processor)
    rollouts = make_engine("hf", policy).generate(batch, SamplingParams(n=2, max_new_tokens=3))
    ctx = StepContext(policy, rollouts, [], torch.zeros(2), 1, 1)
    with pytest.raises(ValueError, match="image_translation"):
        PWSD().loss(ctx)


def one_pwsd_step(tmp_path, tiny_vl, data_dir, reward_weight: float, pwsd: dict) -> dict:
    """One GRPO-trainer step on banners with the translation reward and a pwsd objective;
    returns its metrics row (the config is left at tmp_path/c.yaml)."""
    import yaml

    from mmrlvr.config import load_config
    from mmrlvr.train.logger import read_metrics
    from mmrlvr.train.trainer import train

    cfg = {"model": {"path": str(tiny_vl), "modality": "image_translation"},
           "data": {"train": str(data_dir / "train.jsonl")},
           "rollout": {"group_size": 2, "max_new_tokens": 6},
           "rewards": [{"name": "translation", "weight": reward_weight}],
           "objectives": [{"name": "pwsd", "weight": 1.0, **pwsd}],
           "train": {"steps": 1, "batch_prompts": 2, "out_dir": str(tmp_path / "run")}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    train(load_config(tmp_path / "c.yaml"), progress=False)
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    return row


def test_a_grpo_step_runs_with_the_translation_reward_and_pwsd(tmp_path, tiny_vl, banner_examples):
    row = one_pwsd_step(tmp_path, tiny_vl, banner_examples[0], 1.0, {})
    assert row["reward/translation/parse_fail"] == 1.0             # random weights write no patch
    assert "objective/pwsd" in row and row["objective/pwsd/rows"] == 4


def test_privileged_rows_switch_the_drawn_share_to_the_teacher_prompt(banner_examples):
    import random

    from mmrlvr.train.sft import privileged_rows

    _, examples = banner_examples
    adapter = modalities.get("image_translation")
    out = privileged_rows(adapter, examples, 0.5, random.Random(0))
    switched = [b for a, b in zip(examples, out) if b.prompt != a.prompt]
    assert len(switched) == 2
    assert all(b.prompt.endswith(b.meta["source_patch"]) for b in switched)
    assert privileged_rows(adapter, examples, 0.0, random.Random(0)) == examples


def test_mmrlvr_sft_runs_sft_then_pwsd_and_evaluates_the_reward(tmp_path, tiny_vl, banner_examples):
    import yaml

    from mmrlvr.config import load_config
    from mmrlvr.train.logger import read_metrics
    from mmrlvr.train.sft import sft

    data_dir, _ = banner_examples
    (tmp_path / "half.py").write_text("def half(example, completion):\n    return 0.5\n")
    cfg = {"model": {"path": str(tiny_vl), "modality": "image_translation"},
           "data": {"train": str(data_dir / "train.jsonl"), "eval": str(data_dir / "train.jsonl"),
                    "eval_limit": 2},
           "rollout": {"group_size": 2, "max_new_tokens": 6},
           "rewards": [{"name": "translation", "weight": 1.0},     # 0 for a random model's text
                       {"name": f"{tmp_path / 'half.py'}:half", "weight": 0.4}],
           "train": {"eval_reward": True, "eval_batch": 2},
           "sft": {"steps": 2, "batch_size": 4, "out_dir": str(tmp_path / "sft"),
                   "privileged_fraction": 0.5,
                   "pwsd": {"steps": 2, "batch_prompts": 2, "max_rows": 3,
                            "out_dir": str(tmp_path / "pwsd")}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    summary = sft(load_config(tmp_path / "c.yaml"), progress=False)
    assert summary["reward_start"] == summary["reward_end"] == pytest.approx(0.2)
    assert (tmp_path / "sft" / "final" / "config.json").is_file()
    assert (tmp_path / "pwsd" / "final" / "config.json").is_file()
    rows = read_metrics(tmp_path / "pwsd" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["eval/reward"] == pytest.approx(0.2)          # eval keeps the reward weights
    assert "eval/reward/translation/position" in rows[0]
    for row in rows[1:]:
        assert row["objective/pwsd/rows"] == 3 and row["reward/mean"] == 0.0   # no PG term
        assert row["update/trained_rows"] == 0 and row["optim/grad_norm"] > 0
    assert summary["pwsd"]["reward_start"] == summary["pwsd"]["reward_end"] == pytest.approx(0.2)
    run_cfg = yaml.safe_load((tmp_path / "pwsd" / "config.yaml").read_text())
    assert run_cfg["model"]["path"] == str(tmp_path / "sft" / "final")
    assert run_cfg["rewards"][0]["weight"] == 0.0
    # each stage writes its report and plots; every key either logs is in docs/metrics.md
    from test_metrics_doc import undocumented

    for stage, title, plots in [("sft", "# SFT run sft", ("sft_loss", "reward")),
                                ("pwsd", "# PWSD stage pwsd", ("objective_pwsd", "reward"))]:
        report = (tmp_path / stage / "report.md").read_text()
        assert report.startswith(title)
        for name in plots:
            assert (tmp_path / stage / "plots" / f"{name}.png").is_file()
            assert f"](plots/{name}.png)" in report
        logged = {k for r in read_metrics(tmp_path / stage / "metrics.jsonl") for k in r}
        assert undocumented(logged) == [], stage


def test_sft_options_for_pwsd_need_the_image_translation_modality(tmp_path, tiny_vl):
    from mmrlvr.config import ConfigError, load_config
    from mmrlvr.train.sft import sft

    with pytest.raises(ConfigError, match="privileged_fraction"):
        load_config(None, ["sft.privileged_fraction=1.5"])
    cfg = load_config(None, [f"model.path={tiny_vl}", "sft.privileged_fraction=0.5"])
    with pytest.raises(ValueError, match="image_translation"):
        sft(cfg, progress=False)


def test_pwsd_only_needs_an_sft_model_and_accepts_overrides_after_the_flag(tmp_path, capsys):
    from mmrlvr.cli import main

    missing = tmp_path / "no-sft"
    assert main(["sft", "configs/banners_cpu.yaml", "--pwsd-only", f"sft.out_dir={missing}"]) == 2
    assert f"{missing}/final, which does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sft", "configs/banners_cpu.yaml", "--bogus"])


def test_a_frozen_teacher_scores_with_the_frozen_weights(translation_policy, banner_examples):
    import copy

    from mmrlvr.rollout import make_engine
    from mmrlvr.rollout.base import SamplingParams

    policy, examples = translation_policy, banner_examples[1][:2]
    batch = policy.adapter.encode(examples, policy.processor)
    torch.manual_seed(2)
    rollouts = make_engine("hf", policy).generate(batch, SamplingParams(n=2, max_new_tokens=6))
    live = PWSD()
    frozen = PWSD(teacher="frozen")
    assert frozen.needs_ref_model and not live.needs_ref_model
    with pytest.raises(ValueError, match="ref_model"):
        frozen.loss(StepContext(policy, rollouts, [], torch.zeros(4), 1, 1))
    same = copy.deepcopy(policy.base_model()).eval()                  # frozen copy = live weights
    moved = copy.deepcopy(same)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with torch.no_grad():
        l_live, _ = live.loss(StepContext(policy, rollouts, [], torch.zeros(4), 1, 1))
        l_same, _ = frozen.loss(StepContext(policy, rollouts, [], torch.zeros(4), 1, 1, ref_model=same))
        l_moved, _ = frozen.loss(StepContext(policy, rollouts, [], torch.zeros(4), 1, 1, ref_model=moved))
    assert float(l_same) == pytest.approx(float(l_live), rel=1e-5)
    assert abs(float(l_moved) - float(l_live)) > 1e-4
    with pytest.raises(ValueError, match="live.*frozen"):
        PWSD(teacher="student")


def test_the_trainer_loads_the_frozen_teacher_for_pwsd(tmp_path, tiny_vl, banner_examples):
    from mmrlvr.config import ConfigError, load_config

    # beta 0: the frozen copy is loaded for the teacher alone
    row = one_pwsd_step(tmp_path, tiny_vl, banner_examples[0], 0.0, {"teacher": "frozen"})
    assert row["objective/pwsd/rows"] == 4 and row["objective/pwsd"] > 0
    with pytest.raises(ConfigError, match="sft.pwsd.teacher"):
        load_config(tmp_path / "c.yaml", ["sft.pwsd.teacher=student"])


def test_the_pwsd_stage_config_takes_its_own_settings(tmp_path):
    from mmrlvr.config import load_config
    from mmrlvr.train.sft import pwsd_config

    cfg = load_config(None, ["model.modality=image_translation", "rollout.temperature=0.7",
                             "algo.beta=0.04", "sft.pwsd.steps=5", "sft.pwsd.temperature=1.0",
                             "sft.pwsd.teacher=frozen", "sft.pwsd.lr=3e-5",
                             "rewards=[{name: translation, weight: 1.0}]"])
    out = pwsd_config(cfg, tmp_path / "sft")
    assert out.rollout.temperature == 1.0 and cfg.rollout.temperature == 0.7   # GRPO keeps its own
    assert out.algo.beta == 0.0 and out.optim.lr == 3e-5 and out.train.steps == 5
    assert out.objectives[0]["teacher"] == "frozen" and out.rewards[0]["weight"] == 0.0
    assert out.model.path == str(tmp_path / "sft")
