"""Run config: docs/methods.md defaults, YAML onto typed dataclasses, dotted overrides, loud errors."""
from __future__ import annotations

import dataclasses
import textwrap

import pytest

from mmrlvr.config import (AlgoConfig, Config, ConfigError, LoraConfig, ModelConfig, OptimConfig,
                           RolloutConfig, describe, load_config, save_config)

# The public config surface: names the README and docs/grpo-step.md promise users.
FIXED_KEYS = ["model.path", "data.train", "data.eval", "data.on_error", "rollout.backend",
              "rollout.group_size", "rollout.max_new_tokens", "rollout.temperature",
              "rollout.branching", "rewards", "algo.advantage", "algo.loss_agg", "algo.beta",
              "optim.lr", "train.steps", "train.batch_prompts", "train.eval_every",
              "train.save_every", "train.seed", "train.out_dir"]


def _write(tmp_path, text: str, name: str = "run.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _leaf_keys(obj, prefix: str = "") -> list[str]:
    """Every dotted key of a config instance, sections expanded."""
    keys = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            keys += _leaf_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


# --- defaults ---------------------------------------------------------------------------------

def test_defaults_are_the_methods_md_values():
    cfg = Config()
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (0.2, 0.28)      # DAPO clip-higher
    assert cfg.algo.beta == 0.0                                          # no reference by default
    assert cfg.algo.kl_estimator == "k3"
    assert cfg.algo.loss_agg == "token"
    assert cfg.algo.advantage == "grpo"
    assert cfg.rewards == [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1}]
    assert cfg.rollout.branching == {"kind": "none"}                     # plain GRPO
    assert cfg.objectives == []
    assert cfg.data.on_error == "raise"


def test_load_config_without_file_gives_defaults():
    assert load_config(None) == Config()


def test_default_lists_are_not_shared_between_configs():
    a, b = Config(), Config()
    a.rewards.append({"name": "x"})
    a.model.lora.target_modules.append("gate_proj")
    assert len(b.rewards) == 2
    assert b.model.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]


# --- YAML and overrides -----------------------------------------------------------------------

def test_yaml_loads_into_typed_dataclasses(tmp_path):
    path = _write(tmp_path, """
        model:
          path: /models/tiny
          lora: {r: 4, alpha: 8}
        rollout:
          group_size: 4
          temperature: 0.7
        optim:
          lr: 1e-5          # YAML 1.1 reads this as the string '1e-5'
          betas: [0.9, 0.95]
        algo: {loss_agg: seq-sum-norm, norm_len: 32, advantage: drgrpo}
        rewards:
          - {name: accuracy, weight: 1.0}
    """)
    cfg = load_config(path)
    assert isinstance(cfg.model, ModelConfig) and isinstance(cfg.model.lora, LoraConfig)
    assert isinstance(cfg.rollout, RolloutConfig) and isinstance(cfg.optim, OptimConfig)
    assert isinstance(cfg.algo, AlgoConfig)
    assert cfg.model.path == "/models/tiny"
    assert (cfg.model.lora.r, cfg.model.lora.alpha, cfg.model.lora.dropout) == (4, 8, 0.0)
    assert cfg.rollout.group_size == 4 and cfg.rollout.temperature == 0.7
    assert cfg.rollout.max_new_tokens == 0     # untouched keys keep their defaults (0: the model's)
    assert cfg.optim.lr == 1e-5 and type(cfg.optim.lr) is float
    assert cfg.optim.betas == [0.9, 0.95]
    assert (cfg.algo.loss_agg, cfg.algo.norm_len, cfg.algo.advantage) == ("seq-sum-norm", 32, "drgrpo")
    assert cfg.rewards == [{"name": "accuracy", "weight": 1.0}]


def test_integer_for_float_field_becomes_float(tmp_path):
    cfg = load_config(None, ["rollout.temperature=1", "algo.beta=0"])
    assert cfg.rollout.temperature == 1.0 and type(cfg.rollout.temperature) is float
    assert type(cfg.algo.beta) is float


def test_dotted_overrides_apply_over_the_file(tmp_path):
    path = _write(tmp_path, """
        optim: {lr: 1.0e-6}
        rollout: {group_size: 4}
    """)
    cfg = load_config(path, ["optim.lr=3e-5", "rollout.group_size=16", "model.lora.r=8",
                             "train.out_dir=runs/x", "rollout.branching={kind: latent, alpha: 0.1}"])
    assert cfg.optim.lr == 3e-5 and type(cfg.optim.lr) is float
    assert cfg.rollout.group_size == 16
    assert cfg.model.lora.r == 8 and cfg.model.lora.alpha == 16
    assert cfg.train.out_dir == "runs/x"
    assert cfg.rollout.branching == {"kind": "latent", "alpha": 0.1}


def test_later_override_wins():
    assert load_config(None, ["train.steps=5", "train.steps=7"]).train.steps == 7


def test_override_without_equals_sign_raises():
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(None, ["optim.lr"])


def test_unknown_override_key_names_it_and_suggests_nearest():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["optim.lrr=1e-5"])
    msg = str(err.value)
    assert "'optim.lrr'" in msg
    assert "did you mean 'optim.lr'" in msg


def test_unknown_yaml_keys_name_the_dotted_path(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, "rollout:\n  group_sise: 4\n"))
    assert "'rollout.group_sise'" in str(err.value)
    assert "'rollout.group_size'" in str(err.value)

    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, "model:\n  lora:\n    rank: 4\n"))
    assert "'model.lora.rank'" in str(err.value)

    with pytest.raises(ConfigError, match="'rollouts'.*did you mean 'rollout'"):
        load_config(_write(tmp_path, "rollouts:\n  group_size: 4\n"))


@pytest.mark.parametrize("override, key", [
    ("rollout.group_size=abc", "rollout.group_size"),
    ("train.steps=1.5", "train.steps"),
    ("optim.lr=fast", "optim.lr"),
    ("optim.lr=true", "optim.lr"),
    ("model.path=[a, b]", "model.path"),
    ("optim.betas=0.9", "optim.betas"),
    ("rollout.branching=latent", "rollout.branching"),
    ("model.gradient_checkpointing=1", "model.gradient_checkpointing"),
])
def test_wrong_value_type_raises_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=f"'{key}' must be"):
        load_config(None, [override])


def test_bool_is_not_accepted_for_an_int_field():
    # YAML's `true` is a Python bool, and bool subclasses int: it must not pass as a step count
    with pytest.raises(ConfigError, match="'train.steps' must be int"):
        load_config(None, ["train.steps=true"])


def test_section_given_a_scalar_raises_naming_the_section(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, "rollout: 3\n"))
    assert "'rollout'" in str(err.value)


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))


def test_missing_config_file_raises(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("override, key", [
    ("algo.loss_agg=foo", "algo.loss_agg"),
    ("algo.advantage=ppo", "algo.advantage"),
    ("algo.kl_estimator=k2", "algo.kl_estimator"),
    ("rollout.backend=sglang", "rollout.backend"),
    ("data.on_error=ignore", "data.on_error"),
    ("train.device=tpu", "train.device"),
])
def test_invalid_choice_raises_naming_key_and_choices(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    msg = str(err.value)
    assert f"'{key}'" in msg and "choose one of" in msg


def test_loss_agg_choice_lists_all_modes():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algo.loss_agg=foo"])
    assert "'foo'" in str(err.value)
    for mode in ("token", "seq", "seq-sum-norm"):
        assert f"'{mode}'" in str(err.value)


@pytest.mark.parametrize("g", [1, 0, -3])
def test_group_size_below_two_raises(g):
    with pytest.raises(ConfigError, match="'rollout.group_size' must be >= 2"):
        load_config(None, [f"rollout.group_size={g}"])
    assert load_config(None, ["rollout.group_size=2"]).rollout.group_size == 2


def test_reward_without_name_raises():
    with pytest.raises(ConfigError, match=r"'rewards\[1\]' needs a 'name'"):
        load_config(None, ["rewards=[{name: accuracy}, {weight: 1.0}]"])


# --- save / load and docs ---------------------------------------------------------------------

def test_save_then_load_round_trips(tmp_path):
    cfg = load_config(None, ["optim.lr=3e-5", "rollout.group_size=16", "model.lora.r=8",
                             "algo.beta=0.04", "data.train=data/train.jsonl",
                             "rollout.branching={kind: latent, alpha: 0.1}",
                             "objectives=[{name: pirl, weight: 0.1}]"])
    path = tmp_path / "config.yaml"
    save_config(cfg, path)
    again = load_config(path)
    assert again == cfg
    assert again.optim.lr == 3e-5 and type(again.optim.lr) is float
    # defaults round-trip too (1e-6 etc. must not come back as strings)
    save_config(Config(), path)
    assert load_config(path) == Config()


def test_every_config_field_has_a_one_line_docstring():
    rows = describe()
    keys = [k for k, _, _ in rows]
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted(_leaf_keys(Config()))
    missing = [k for k, _, doc in rows if not doc.strip()]
    assert missing == []
    multi_line = [k for k, _, doc in rows if "\n" in doc.strip()]
    assert multi_line == []


def test_describe_covers_the_fixed_keys_with_defaults():
    rows = {k: (d, doc) for k, d, doc in describe()}
    for key in FIXED_KEYS:
        assert key in rows, key
    assert "model.lora.r" in rows                               # `model.lora` is a section
    assert rows["algo.clip_high"] == ("0.28", "Upper PPO clip epsilon (DAPO clip-higher).")
    assert rows["rollout.group_size"][0] == "8"
    assert rows["rewards"][0] == repr(Config().rewards)


# --- the CLI surface --------------------------------------------------------------------------

def test_cli_help_config_prints_every_key(capsys):
    from mmrlvr.cli import main

    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for key, default, doc in describe():
        line = next((ln for ln in lines if ln.split()[:1] == [key]), None)
        assert line is not None, key
        assert doc in line and f"[default: {default}]" in line


def test_cli_train_with_unknown_key_exits_2_before_loading_a_model(tmp_path, capsys, monkeypatch):
    import mmrlvr.train.trainer
    from mmrlvr.cli import main

    def no_training(*args, **kwargs):
        raise AssertionError("train() must not run for a bad config")

    monkeypatch.setattr(mmrlvr.train.trainer, "train", no_training)
    bad = _write(tmp_path, """
        model: {path: /nonexistent/model}
        rollout:
          group_sise: 4
    """, name="bad.yaml")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "'rollout.group_sise'" in err and "'rollout.group_size'" in err

    good = _write(tmp_path, "model: {path: /nonexistent/model}\n", name="good.yaml")
    assert main(["train", str(good), "optim.lrr=1e-5"]) == 2
    err = capsys.readouterr().err
    assert "'optim.lrr'" in err and "'optim.lr'" in err


def test_cli_train_without_config_exits_2(capsys):
    from mmrlvr.cli import main

    assert main(["train"]) == 2
    assert "CONFIG.yaml" in capsys.readouterr().err
