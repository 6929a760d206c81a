"""A TRL or EasyR1 user's key names get the mmrlvr key meant: "did you mean" names it exactly,
at the top level or in any section, from the loader and from `mmrlvr train` (exit 2)."""
from __future__ import annotations

import textwrap

import pytest

from mmrlvr.config import SYNONYMS, ConfigError, describe, load_config

# (their name, our key): the names the issue and the brief list, checked against TRL's
# GRPOConfig / TrainingArguments and EasyR1's config dataclasses
LISTED = [
    ("num_generations", "rollout.group_size"), ("learning_rate", "optim.lr"), ("lr", "optim.lr"),
    ("max_completion_length", "rollout.max_new_tokens"),
    ("max_new_tokens", "rollout.max_new_tokens"), ("response_length", "rollout.max_new_tokens"),
    ("per_device_train_batch_size", "train.batch_prompts"),
    ("rollout_batch_size", "train.batch_prompts"), ("max_steps", "train.steps"),
    ("total_training_steps", "train.steps"), ("beta", "algo.beta"), ("kl_coef", "algo.beta"),
    ("epsilon", "algo.clip_low"), ("clip_ratio_low", "algo.clip_low"),
    ("epsilon_high", "algo.clip_high"), ("clip_ratio_high", "algo.clip_high"),
    ("temperature", "rollout.temperature"), ("output_dir", "train.out_dir"),
    ("model_name_or_path", "model.path"), ("loss_type", "algo.loss_agg"),
    ("num_iterations", "algo.ppo_epochs"), ("ppo_epochs", "algo.ppo_epochs"),
    ("warmup_steps", "optim.warmup_steps"), ("max_grad_norm", "optim.max_grad_norm"),
    ("seed", "train.seed"), ("save_steps", "train.save_every"),
    ("eval_steps", "train.eval_every"), ("gradient_accumulation_steps", "train.micro_batch"),
]
KEYS = {key for key, _, _ in describe()}


def _message(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    return str(err.value)


def _elsewhere(theirs: str, ours: str) -> str:
    """The section to misplace `theirs` in: our key's own, unless `theirs` is a key there."""
    section = ours.split(".")[0]
    return "model" if f"{section}.{theirs}" in KEYS else section


@pytest.mark.parametrize("theirs, ours", LISTED, ids=[t for t, _ in LISTED])
def test_their_name_at_the_top_level_says_exactly_which_key(theirs, ours):
    assert _message([f"{theirs}=1"]).startswith(
        f"unknown config key '{theirs}' (did you mean '{ours}'?")


@pytest.mark.parametrize("theirs, ours", LISTED, ids=[t for t, _ in LISTED])
def test_their_name_in_a_section_says_exactly_which_key(theirs, ours):
    section = _elsewhere(theirs, ours)
    msg = _message([f"{section}.{theirs}=1"])
    assert msg.startswith(f"unknown config key '{section}.{theirs}' (did you mean '{ours}'?")
    assert "known:" not in msg                     # one key meant: no list to search


def test_every_synonym_points_at_a_real_key_and_is_not_one_of_ours():
    sections = {key.split(".")[0] for key in KEYS}
    for theirs, (ours, _) in SYNONYMS.items():
        assert ours in KEYS or ours in sections, (theirs, ours)
        assert theirs not in sections, theirs


def test_what_differs_is_said_beside_the_key():
    msg = _message(["train.gradient_accumulation_steps=4"])
    assert "did you mean 'train.micro_batch'?" in msg and "micro-batches" in msg
    assert "completions per device" in _message(["per_device_train_batch_size=16"])
    assert "dr_grpo is seq-sum-norm" in _message(["loss_type=dr_grpo"])


def test_a_key_of_another_section_and_near_misspellings_are_found():
    assert "(did you mean 'rollout.top_p'?)" in _message(["top_p=0.9"])
    assert "(did you mean 'optim.weight_decay'?)" in _message(["train.weight_decay=0.01"])
    assert "(did you mean 'rollout.group_size'?" in _message(["num_generation=8"])
    msg = _message(["optim.lrr=1"])                # a typo keeps the section's known keys
    assert "(did you mean 'optim.lr'?); known: [" in msg


def test_a_trl_style_flat_config_gets_every_key_translated(tmp_path):
    path = tmp_path / "trl.yaml"
    path.write_text(textwrap.dedent("""\
        model_name_or_path: Qwen/Qwen2.5-VL-3B-Instruct
        learning_rate: 1.0e-6
        num_generations: 8
        max_completion_length: 512
        beta: 0.04
    """))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith("5 problems in the config")
    for theirs, ours in [("model_name_or_path", "model.path"), ("learning_rate", "optim.lr"),
                         ("num_generations", "rollout.group_size"),
                         ("max_completion_length", "rollout.max_new_tokens"),
                         ("beta", "algo.beta")]:
        assert f"unknown config key '{theirs}' (did you mean '{ours}'?" in msg


@pytest.mark.parametrize("override, ours", [
    ("num_generations=8", "rollout.group_size"), ("optim.learning_rate=1e-5", "optim.lr"),
    ("rollout.max_completion_length=256", "rollout.max_new_tokens")])
def test_cli_exits_2_with_the_key_meant(tmp_path, capsys, monkeypatch, override, ours):
    import mmrlvr.train.trainer
    from mmrlvr.cli import main

    def no_training(*args, **kwargs):
        raise AssertionError("train() must not run for a bad config")

    monkeypatch.setattr(mmrlvr.train.trainer, "train", no_training)
    path = tmp_path / "run.yaml"
    path.write_text("model: {path: /nonexistent/model}\n")
    assert main(["train", str(path), override]) == 2
    err = capsys.readouterr().err
    key = override.split("=")[0]
    assert err.startswith(f"mmrlvr train: error: unknown config key '{key}' "
                          f"(did you mean '{ours}'?")
