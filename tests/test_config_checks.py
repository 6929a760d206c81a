"""Config values are checked before anything loads: ranges, list items, YAML, the model path.

Each bad value is refused by `load_config` and by `mmrlvr train` (exit 2, one line naming the
key, the value, the allowed range and what to do; no traceback), and every problem of a config
is reported in one error. The CLI is exercised in-process for every value and as a real
subprocess for the cases the issue measured (each such process costs ~3 s of imports).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mmrlvr.config import (RANGES, Config, ConfigError, check_model_path, find_problems,
                           load_config, validate)

BASE = """\
model: {path: /nonexistent/model}
data: {train: /nonexistent/train.jsonl}
train: {out_dir: OUT}
"""

# (overrides, key named, allowed range shown, value shown)
BAD = [
    (["optim.lr=-1e-5"], "optim.lr", "a finite number > 0", "got -1e-05"),
    (["optim.lr=0"], "optim.lr", "a finite number > 0", "got 0.0"),
    (["optim.lr=.nan"], "optim.lr", "a finite number > 0", "got nan"),
    (["optim.lr=nan"], "optim.lr", "a finite number > 0", "got nan"),          # a string
    (["optim.lr=.inf"], "optim.lr", "a finite number > 0", "got inf"),
    (["optim.lr=inf"], "optim.lr", "a finite number > 0", "got inf"),
    (["optim.lr=-.inf"], "optim.lr", "a finite number > 0", "got -inf"),
    (["sft.lr=0"], "sft.lr", "a finite number > 0", "got 0.0"),
    (["sft.lr=NaN"], "sft.lr", "a finite number > 0", "got nan"),
    (["sft.pwsd.lr=-1"], "sft.pwsd.lr", "a finite number > 0", "got -1.0"),
    (["sft.pwsd.lr=.inf"], "sft.pwsd.lr", "a finite number > 0", "got inf"),
    (["optim.betas=[0.9, 1.0]"], "optim.betas", "two numbers in [0, 1)", "got [0.9, 1.0]"),
    (["optim.betas=[-0.1, 0.999]"], "optim.betas", "two numbers in [0, 1)", "got [-0.1, 0.999]"),
    (["optim.betas=[0.9]"], "optim.betas", "two numbers in [0, 1)", "got [0.9]"),
    (["optim.betas=[0.9, fast]"], "optim.betas", "two numbers in [0, 1)", "got [0.9, 'fast']"),
    (["optim.betas=[0.9, .nan]"], "optim.betas", "two numbers in [0, 1)", "got [0.9, nan]"),
    (["optim.weight_decay=-0.01"], "optim.weight_decay", "a finite number >= 0", "got -0.01"),
    (["optim.weight_decay=.inf"], "optim.weight_decay", "a finite number >= 0", "got inf"),
    (["optim.warmup_steps=-1"], "optim.warmup_steps", ">= 0", "got -1"),
    (["sft.warmup_steps=-5"], "sft.warmup_steps", ">= 0", "got -5"),
    (["optim.min_lr_ratio=1.5"], "optim.min_lr_ratio", "a finite number in [0, 1]", "got 1.5"),
    (["optim.min_lr_ratio=-0.1"], "optim.min_lr_ratio", "a finite number in [0, 1]", "got -0.1"),
    (["optim.max_grad_norm=-1"], "optim.max_grad_norm", "a finite number >= 0", "got -1.0"),
    (["optim.max_grad_norm=.inf"], "optim.max_grad_norm", "a finite number >= 0", "got inf"),
    (["optim.max_grad_norm=.nan"], "optim.max_grad_norm", "a finite number >= 0", "got nan"),
    (["train.batch_prompts=0"], "train.batch_prompts", ">= 1", "got 0"),
    (["train.micro_batch=0"], "train.micro_batch", ">= 1", "got 0"),
    (["train.eval_batch=0"], "train.eval_batch", ">= 1", "got 0"),
    (["sft.batch_size=0"], "sft.batch_size", ">= 1", "got 0"),
    (["sft.pwsd.batch_prompts=0"], "sft.pwsd.batch_prompts", ">= 1", "got 0"),
    (["sft.pwsd.max_rows=0"], "sft.pwsd.max_rows", ">= 1", "got 0"),
    (["train.steps=0"], "train.steps", ">= 1", "got 0"),
    (["train.steps=-3"], "train.steps", ">= 1", "got -3"),
    (["sft.steps=0"], "sft.steps", ">= 1", "got 0"),
    (["sft.pwsd.steps=-1"], "sft.pwsd.steps", ">= 0", "got -1"),
    (["rollout.max_new_tokens=-1"], "rollout.max_new_tokens", ">= 0", "got -1"),
    (["rollout.temperature=0"], "rollout.temperature", "a finite number > 0", "got 0.0"),
    (["rollout.temperature=-0.5"], "rollout.temperature", "a finite number > 0", "got -0.5"),
    (["rollout.temperature=.nan"], "rollout.temperature", "a finite number > 0", "got nan"),
    (["sft.pwsd.temperature=0"], "sft.pwsd.temperature", "a finite number > 0", "got 0.0"),
    (["rollout.top_p=0"], "rollout.top_p", "a finite number in (0, 1]", "got 0.0"),
    (["rollout.top_p=1.5"], "rollout.top_p", "a finite number in (0, 1]", "got 1.5"),
    (["rollout.top_k=-1"], "rollout.top_k", ">= 0", "got -1"),
    (["rollout.group_size=1"], "rollout.group_size", ">= 2", "got 1"),
    (["sft.pwsd.steps=5", "sft.pwsd.group_size=1"], "sft.pwsd.group_size", ">= 2", "got 1"),
    (["rollout.vllm_gpu_memory_utilization=0"], "rollout.vllm_gpu_memory_utilization",
     "a finite number in (0, 1)", "got 0.0"),
    (["rollout.vllm_gpu_memory_utilization=1"], "rollout.vllm_gpu_memory_utilization",
     "a finite number in (0, 1)", "got 1.0"),
    (["algo.clip_low=-0.1"], "algo.clip_low", "a finite number >= 0", "got -0.1"),
    (["algo.clip_high=-0.2"], "algo.clip_high", "a finite number >= 0", "got -0.2"),
    (["algo.beta=-0.01"], "algo.beta", "a finite number >= 0", "got -0.01"),
    (["algo.beta=.nan"], "algo.beta", "a finite number >= 0", "got nan"),
    (["algo.eps=0"], "algo.eps", "a finite number > 0", "got 0.0"),
    (["algo.ppo_epochs=0"], "algo.ppo_epochs", ">= 1", "got 0"),
    (["algo.norm_len=-1"], "algo.norm_len", ">= 0", "got -1"),
    (["train.save_every=-1"], "train.save_every", ">= 0", "got -1"),
    (["train.eval_every=-1"], "train.eval_every", ">= 0", "got -1"),
    (["train.keep_checkpoints=0"], "train.keep_checkpoints", ">= 1", "got 0"),
    (["train.threads=-2"], "train.threads", ">= 0", "got -2"),
    (["train.max_skipped_steps=0"], "train.max_skipped_steps", ">= 1", "got 0"),
    (["train.seed=-1"], "train.seed", "in [0, 4294967295]", "got -1"),
    (["train.eval_samples=-1"], "train.eval_samples", ">= 0", "got -1"),
    (["model.min_pixels=-1"], "model.min_pixels", ">= 0", "got -1"),
    (["model.max_pixels=-1"], "model.max_pixels", ">= 0", "got -1"),
    (["model.min_pixels=20000", "model.max_pixels=10000"], "model.min_pixels",
     "must be <= model.max_pixels", "(20000)"),
    (["model.lora.r=-1"], "model.lora.r", ">= 0", "got -1"),
    (["model.lora.alpha=0"], "model.lora.alpha", ">= 1", "got 0"),
    (["model.lora.dropout=1"], "model.lora.dropout", "a finite number in [0, 1)", "got 1.0"),
    (["data.max_image_pixels=0"], "data.max_image_pixels", ">= 1", "got 0"),
    (["data.max_audio_seconds=0"], "data.max_audio_seconds", "a finite number > 0", "got 0.0"),
    (["data.max_audio_seconds=.nan"], "data.max_audio_seconds", "a finite number > 0", "got nan"),
    (["data.eval_limit=-1"], "data.eval_limit", ">= 0", "got -1"),
    (["data.max_video_seconds=0"], "data.max_video_seconds", "a finite number > 0", "got 0.0"),
    (["data.video_fps=0"], "data.video_fps", "a finite number > 0", "got 0.0"),
    (["data.video_fps=.nan"], "data.video_fps", "a finite number > 0", "got nan"),
    (["data.max_frames=1"], "data.max_frames", ">= 2", "got 1"),
    (["data.max_frames=15"], "data.max_frames", "must be an even number", "use 14 or 16"),
    (["data.max_video_pixels=-1"], "data.max_video_pixels", ">= 0", "got -1"),
    (["sft.privileged_fraction=1.5"], "sft.privileged_fraction", "a finite number in [0, 1]",
     "got 1.5"),
    (["sft.pwsd.alpha=-1"], "sft.pwsd.alpha", "a finite number >= 0", "got -1.0"),
    (["rewards=[{name: accuracy, weight: .nan}]"], "rewards[0].weight", "a finite number",
     "got nan"),
    (["rewards=[{name: accuracy, weight: inf}]"], "rewards[0].weight", "a finite number",
     "got 'inf'"),
    (["eval_rewards=[{name: accuracy, weight: .inf}]"], "eval_rewards[0].weight",
     "a finite number", "got inf"),
    (["objectives=[{name: pirl_consistency, weight: .nan}]"], "objectives[0].weight",
     "a finite number", "got nan"),
    # list items of the wrong type
    (["data.templates=[3]"], "data.templates[0]", "must be a string", "got 3"),
    (["model.lora.target_modules=[q_proj, 7]"], "model.lora.target_modules[1]",
     "must be a string", "got 7"),
    (["model.lora.r=8", "model.lora.target_modules=[]"], "model.lora.target_modules",
     "is empty", "model.lora.r > 0"),
    (["train.report_to=[3]"], "train.report_to[0]", "must be a string", "got 3"),
    (["train.report_to=[tensorboard, comet]"], "train.report_to[1]",
     "choose from ['tensorboard', 'wandb', 'mlflow', 'trackio']", "is 'comet'"),
    (["data.columns={prompt: 3}"], "data.columns.prompt", "must be a string", "got 3"),
    (["rollout.branching={3: x}"], "rollout.branching", "not a string", "3"),
    (["rewards=[accuracy]"], "rewards[0]", "must be a mapping like {name:", "got 'accuracy'"),
    (["rewards=[{weight: 1.0}]"], "rewards[0]", "needs a 'name'", "e.g. {name: accuracy"),
    (["rewards=[{name: 3}]"], "rewards[0]", "'name' must be", "got 3"),
    (["objectives=[[pirl_consistency, 0.1]]"], "objectives[0]", "must be a mapping like",
     "got ['pirl_consistency', 0.1]"),
    (["objectives=[{weight: 0.1}]"], "objectives[0]", "needs a 'name'",
     "e.g. {name: pirl_consistency"),
]
IDS = [" ".join(ov) for ov, *_ in BAD]

# the five failures the issue measured: each a traceback after the model loaded
MEASURED = ["optim.lr=-1e-5", "optim.lr=.nan", "train.batch_prompts=0", "train.micro_batch=0",
            "rollout.max_new_tokens=-1", "rollout.temperature=0"]


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(BASE.replace("OUT", str(tmp_path / "run")))
    return path


def _write(tmp_path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _message(path, overrides) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    return str(err.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture
def no_training(monkeypatch):
    import mmrlvr.train.trainer

    def train(*args, **kwargs):
        raise AssertionError("train() must not run for a bad config")

    monkeypatch.setattr(mmrlvr.train.trainer, "train", train)


# --- ranges -----------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, key, allowed, shown", BAD, ids=IDS)
def test_bad_value_is_refused_naming_key_value_and_range(base, overrides, key, allowed, shown):
    msg = _message(base, overrides)
    assert "\n" not in msg                                    # one problem, one line
    assert f"'{key}'" in msg and allowed in msg and shown in msg


@pytest.mark.parametrize("overrides, key, allowed, shown", BAD, ids=IDS)
def test_cli_refuses_bad_value_with_exit_2_and_no_traceback(base, capsys, no_training,
                                                            overrides, key, allowed, shown):
    from mmrlvr.cli import main

    assert main(["train", str(base), *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mmrlvr train: error: ") and "Traceback" not in err
    assert f"'{key}'" in err and allowed in err and shown in err


@pytest.mark.parametrize("override", MEASURED)
def test_real_cli_refuses_the_measured_crashers_before_loading(base, override):
    out = _cli("train", str(base), override)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"'{override.split('=')[0]}'" in out.stderr
    assert not (base.parent / "run").exists()               # nothing was started


@pytest.mark.parametrize("override, ours", [
    ("algo.loss_agg=dapo", "'token'"), ("algo.loss_agg=dr_grpo", "'seq-sum-norm'"),
    ("algo.kl_estimator=low_var_kl", "'k3'")])
def test_another_trainers_value_of_a_choice_says_ours(base, override, ours):
    msg = _message(base, [override])
    assert "choose one of" in msg and f"is {ours} here" in msg


def test_range_messages_say_what_to_do(base):
    for key, bound, hint in RANGES:
        assert hint and str(bound) and key.count(".") >= 1
    msg = _message(base, ["train.micro_batch=0"])
    assert msg == ("config key 'train.micro_batch' must be >= 1, got 0: sequences per "
                   "forward/backward, e.g. 16 (lower saves memory)")


def test_greedy_temperature_is_refused_because_grpo_needs_sampled_groups(base):
    msg = _message(base, ["rollout.temperature=0"])
    assert "greedy" in msg and "GRPO needs sampled groups" in msg and "0.7–1.0" in msg


def test_nan_and_inf_written_in_the_yaml_file_are_refused(tmp_path):
    path = _write(tmp_path, """
        optim: {lr: .NaN, weight_decay: .inf, max_grad_norm: "-inf"}
        sft: {lr: "Infinity"}
    """)
    msg = _message(path, [])
    for key in ("optim.lr", "optim.weight_decay", "optim.max_grad_norm", "sft.lr"):
        assert f"'{key}'" in msg


def test_all_problems_are_reported_together(base):
    one_per_key = {}
    for overrides, key, *_ in BAD:
        if len(overrides) == 1 and key not in one_per_key and "[" not in key:
            one_per_key[key] = overrides[0]
    msg = _message(base, [*one_per_key.values(), "optim.lrr=1", "model.modality=5"])
    lines = msg.splitlines()
    assert lines[0] == f"{len(one_per_key) + 2} problems in the config (fix them all, then rerun):"
    assert len(lines) == len(one_per_key) + 3
    for key in one_per_key:
        assert sum(line.startswith(f"  - config key '{key}'") for line in lines) == 1, key
    assert any("unknown config key 'optim.lrr'" in line for line in lines)
    assert any("'model.modality' must be str, got 5" in line for line in lines)


def test_real_cli_reports_all_problems_at_once(base):
    out = _cli("train", str(base), *MEASURED[1:], "rollout.top_p=2", "rewards=[{weight: 1}]")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "7 problems in the config" in out.stderr
    for key in ("optim.lr", "train.batch_prompts", "train.micro_batch", "rollout.max_new_tokens",
                "rollout.temperature", "rollout.top_p", "rewards[0]"):
        assert f"'{key}'" in out.stderr


@pytest.mark.parametrize("overrides", [
    ["optim.lr=1e-12", "optim.betas=[0, 0.999]", "optim.min_lr_ratio=0", "optim.warmup_steps=0",
     "optim.max_grad_norm=0", "optim.weight_decay=0"],
    ["optim.min_lr_ratio=1", "rollout.top_p=1", "rollout.top_k=0", "rollout.temperature=0.01",
     "rollout.group_size=2", "rollout.max_new_tokens=1"],
    ["train.max_skipped_steps=1", "train.keep_checkpoints=1", "train.threads=0", "train.seed=0",
     "train.eval_every=0", "train.save_every=0", "train.steps=1", "train.micro_batch=1"],
    ["rollout.vllm_gpu_memory_utilization=0.99", "algo.beta=0", "algo.clip_low=0",
     "algo.ppo_epochs=1", "model.min_pixels=3136", "model.max_pixels=3136", "sft.pwsd.steps=0",
     "sft.pwsd.group_size=1",
     "rewards=[{name: accuracy, weight: -1}, {name: format, weight: 1e-3}]"],
    ["data.max_frames=2", "data.video_fps=0.5", "data.max_video_pixels=0",
     "data.max_video_seconds=0.1"],
])
def test_values_at_the_edges_of_their_ranges_are_accepted(base, overrides):
    load_config(base, overrides)


def test_validate_reports_a_config_built_in_code():
    cfg = Config()
    cfg.optim.lr = float("nan")
    cfg.train.micro_batch = 0
    cfg.optim.betas = (0.9, 0.999, 0.5)
    assert len(find_problems(cfg)) == 3
    with pytest.raises(ConfigError, match="3 problems"):
        validate(cfg)
    assert find_problems(Config()) == []


# --- YAML -------------------------------------------------------------------------------------

def test_unclosed_bracket_names_file_line_column_and_problem(tmp_path):
    path = _write(tmp_path, """\
        optim:
          betas: [0.9, 0.99
        train:
          steps: 3
    """)
    msg = _message(path, [])
    assert msg == (f"{path}: YAML syntax error at line 3, column 6: expected ',' or ']', but got "
                   "':' (while parsing a flow sequence begun at line 2, column 10)")


def test_bad_indentation_names_the_line(tmp_path):
    path = _write(tmp_path, """\
        optim:
          lr: 1.0e-5
         weight_decay: 0.1
    """)
    msg = _message(path, [])
    assert msg.startswith(f"{path}: YAML syntax error at line 3, column 2: ")
    assert "indentation" in msg and "\n" not in msg


def test_tab_indentation_says_yaml_wants_spaces(tmp_path):
    msg = _message(_write(tmp_path, "optim:\n\tlr: 1\n"), [])
    assert "line 2" in msg and "spaces, not tabs" in msg


def test_a_key_given_twice_is_refused(tmp_path):
    path = _write(tmp_path, "optim: {lr: 1.0e-5}\ntrain: {steps: 3}\noptim: {weight_decay: 0.1}\n")
    msg = _message(path, [])
    assert "line 3" in msg and "duplicate key 'optim' (first given at line 1)" in msg


def test_a_config_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"optim:\n  lr: \xff\xfe\n")
    assert "not UTF-8 text" in _message(path, [])


def test_python_object_tag_is_refused_and_not_executed(tmp_path):
    marker = tmp_path / "ran"
    path = _write(tmp_path, f"""\
        optim:
          lr: !!python/object/apply:os.system ["touch {marker}"]
    """)
    msg = _message(path, [])
    assert msg == (f"{path}: unsafe/unknown YAML tag !!python/object/apply:os.system at line 2; "
                   "mmrlvr configs hold plain values only (numbers, strings, lists, mappings): "
                   "remove the tag")
    assert not marker.exists()


def test_unknown_custom_tag_is_refused(tmp_path):
    msg = _message(_write(tmp_path, "train:\n  steps: !env STEPS\n"), [])
    assert "unsafe/unknown YAML tag !env at line 2" in msg


def test_real_cli_refuses_a_yaml_tag_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "run.yaml"
    path.write_text(f'optim:\n  lr: !!python/object/apply:os.system ["echo hi; touch {marker}"]\n')
    out = _cli("train", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "unsafe/unknown YAML tag !!python/object/apply:os.system at line 2" in out.stderr
    assert "hi" not in out.stdout and not marker.exists()


def test_real_cli_reports_malformed_yaml_in_one_line(tmp_path):
    path = _write(tmp_path, "optim:\n  betas: [0.9, 0.99\ntrain:\n  steps: 3\n")
    out = _cli("train", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"mmrlvr train: error: {path}: YAML syntax error at line 3, column 6: expected ',' or "
        "']', but got ':' (while parsing a flow sequence begun at line 2, column 10)"]


@pytest.mark.parametrize("override, says", [
    ("optim.betas=[0.9, 0.99", "YAML syntax error at column"),
    ("rollout.branching={kind: latent", "YAML syntax error at column"),
    ("data.system_prompt='unclosed", "YAML syntax error at column"),
    ('optim.lr=!!python/object/apply:os.system ["echo hi"]',
     "unsafe/unknown YAML tag !!python/object/apply:os.system;"),
    ("train.steps=!!python/name:os.system", "unsafe/unknown YAML tag !!python/name:os.system;"),
])
def test_override_with_bad_yaml_value_names_the_override(base, capsys, no_training, override, says):
    from mmrlvr.cli import main

    msg = _message(base, [override])
    assert msg.startswith(f"override {override!r}: ") and says in msg and "\n" not in msg
    assert main(["train", str(base), override]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_an_empty_section_takes_overrides(tmp_path):
    cfg = load_config(_write(tmp_path, "optim:\ntrain:\n"), ["optim.lr=3e-5"])
    assert cfg.optim.lr == 3e-5 and cfg.train == Config().train


# --- the model path ---------------------------------------------------------------------------

def test_validate_does_not_require_the_model_to_exist_yet(base):
    assert load_config(base).model.path == "/nonexistent/model"    # an earlier stage may build it


def test_check_model_path_accepts_a_model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    check_model_path(str(tmp_path))


@pytest.mark.parametrize("path", ["/nonexistent/model", "runs/nothing-here/final",
                                  "nobody/NoSuchModel-7B"])
def test_check_model_path_refuses_a_missing_model_offline(path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: True)
    with pytest.raises(ConfigError) as err:
        check_model_path(path)
    assert str(err.value) == (
        f"model.path '{path}': no such local dir, and not in the local Hugging Face cache "
        "(offline); give a model dir (e.g. from `mmrlvr tiny`) or a cached hub id")


def test_check_model_path_refuses_a_dir_that_is_not_a_model(tmp_path):
    with pytest.raises(ConfigError, match="dir without config.json"):
        check_model_path(str(tmp_path))
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_model_path(str(tmp_path / "weights.bin"))
    with pytest.raises(ConfigError, match="model.path is empty"):
        check_model_path("")


def test_check_model_path_accepts_a_hub_id_in_the_local_cache(tmp_path, monkeypatch):
    import huggingface_hub

    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: True)
    check_model_path("org/tiny")
    with pytest.raises(ConfigError, match="offline"):
        check_model_path("org/other")


def test_check_model_path_leaves_an_uncached_hub_id_to_download_when_online(monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)
    check_model_path("nobody/NoSuchModel-7B")                       # no network touched
    with pytest.raises(ConfigError, match="not a hub id, which looks like org/name"):
        check_model_path("/nonexistent/model")


@pytest.mark.parametrize("loader", ["load_processor", "load_model"])
def test_policy_loaders_say_the_model_is_missing(loader):
    import torch

    import mmrlvr.train.policy as policy

    load = getattr(policy, loader)
    args = ("nobody/NoSuchModel-7B",) + ((torch.float32,) if loader == "load_model" else ())
    with pytest.raises(policy.PolicyError) as err:
        load(*args)
    assert str(err.value).startswith("model.path 'nobody/NoSuchModel-7B': no such local dir, "
                                     "and not in the local Hugging Face cache (")


@pytest.mark.parametrize("loader", ["load_processor", "load_model"])
def test_policy_loaders_report_a_failed_download_in_one_line(loader, monkeypatch):
    import huggingface_hub
    import torch

    import mmrlvr.train.policy as policy

    # check_model_path lets the id through as downloadable; transformers, still offline, fails
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)
    load = getattr(policy, loader)
    args = ("nobody/NoSuchModel-7B",) + ((torch.float32,) if loader == "load_model" else ())
    with pytest.raises(policy.PolicyError) as err:
        load(*args)
    msg = str(err.value)
    assert "(download failed: " in msg and "\n" not in msg and "mmrlvr tiny" in msg


def test_real_cli_reports_a_missing_model_dir_without_traceback(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"id": "a", "prompt": "What is 1+1?", "answer": "2"}\n')
    missing = tmp_path / "no-such-model"
    path = _write(tmp_path, f"""
        model: {{path: {missing}}}
        data: {{train: {rows}}}
        train: {{out_dir: {tmp_path / "run"}, steps: 1}}
    """)
    out = _cli("train", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (f"mmrlvr train: error: model.path '{missing}': no such local dir, and not in the "
            "local Hugging Face cache (offline); give a model dir (e.g. from `mmrlvr tiny`) or a "
            "cached hub id") in out.stderr


def test_checks_leave_float_values_finite_and_typed(base):
    cfg = load_config(base, ["optim.lr=3e-5", "optim.betas=[9e-1, '0.95']"])
    assert cfg.optim.betas == [0.9, 0.95] and all(type(b) is float for b in cfg.optim.betas)
    assert math.isfinite(cfg.optim.lr)


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """Nine levels of nine aliases in 500 bytes would expand to ~490 M values (the config's
    copies and dumps build them: > 3.5 GB); one error instead, at once. Ordinary anchors load."""
    import time

    from mmrlvr.config import ConfigError, load_config

    levels = ["opts: &l0 [x, x, x, x, x, x, x, x, x]"] + [
        f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 9)}]" for k in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("rewards:\n  - name: accuracy\n    weight: 1.0\n"
                    + "".join(f"    {line}\n" for line in levels))
    start = time.process_time()
    with pytest.raises(ConfigError, match=r"aliases \(\*name\) expand to 4\d\d,\d{3},\d{3} values"):
        load_config(bomb)
    assert time.process_time() - start < 5
    fine = tmp_path / "anchors.yaml"
    fine.write_text("optim: &o {lr: 0.001}\nsft: {lr: 0.001}\n")
    assert load_config(fine).optim.lr == 0.001


@pytest.mark.parametrize("override, says", [
    ("rewards=[]", "config key 'rewards' is empty"),
    ("rewards=[{name: accuracy, timeout_s: 0}]", "'rewards[0].timeout_s' must be a positive"),
    ("train.out_dir=FILE", "which is a file: give a directory"),
])
def test_configs_that_crashed_after_loading_are_refused_by_name_first(base, tmp_path, capsys,
                                                                      no_training, override, says):
    """Measured (issue on reliability): these ended in a traceback once the run had started."""
    from mmrlvr.cli import main

    (tmp_path / "a-file").write_text("not a dir")
    override = override.replace("FILE", str(tmp_path / "a-file"))
    assert main(["train", str(base), override]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and says in err, err
