"""The edges an EasyR1 user hits first: its `format_prompt` Jinja files are rendered as EasyR1
renders them (not appended as a path), and every key of its nested config (`worker: rollout: n`)
is answered by name with mmrlvr's key, or with what mmrlvr does instead."""
from __future__ import annotations

import textwrap

import jinja2
import pytest
import yaml

from mmrlvr.config import ConfigError, describe, load_config
from mmrlvr.config.easyr1 import EASYR1
from mmrlvr.core.format_prompt import format_question
from mmrlvr.data import DataError, Example

KEYS = {key for key, _, _ in describe()}
SECTIONS = {key.split(".")[0] for key in KEYS}

# EasyR1's examples/config.yaml (hiyouga/EasyR1 at b44b311, comments and blank lines dropped)
EASYR1_CONFIG = """\
    data:
      train_files: hiyouga/math12k@train
      val_files: hiyouga/math12k@test
      prompt_key: problem
      answer_key: answer
      image_key: images
      video_key: videos
      image_dir: null
      video_fps: 2.0
      max_prompt_length: 2048
      max_response_length: 2048
      rollout_batch_size: 512
      mini_rollout_batch_size: null
      val_batch_size: 1024
      format_prompt: ./examples/format_prompt/math.jinja
      override_chat_template: null
      shuffle: true
      seed: 1
      min_pixels: 262144
      max_pixels: 4194304
      filter_overlong_prompts: true
    algorithm:
      adv_estimator: grpo
      disable_kl: false
      use_kl_loss: true
      kl_penalty: low_var_kl
      kl_coef: 1.0e-2
      online_filtering: false
      filter_key: overall
      filter_low: 0.01
      filter_high: 0.99
    worker:
      actor:
        global_batch_size: 128
        micro_batch_size_per_device_for_update: 1
        micro_batch_size_per_device_for_experience: 2
        max_grad_norm: 1.0
        padding_free: true
        dynamic_batching: true
        ulysses_size: 1
        model:
          model_path: Qwen/Qwen2.5-7B-Instruct
          enable_gradient_checkpointing: true
          trust_remote_code: false
          freeze_vision_tower: false
          lora:
            rank: 0
            alpha: 64
            target_modules: all-linear
            exclude_modules: .*visual.*
        optim:
          lr: 1.0e-6
          weight_decay: 1.0e-2
          strategy: adamw
          lr_warmup_ratio: 0.0
        fsdp:
          enable_full_shard: true
          enable_cpu_offload: false
          enable_rank0_init: true
        offload:
          offload_params: true
          offload_optimizer: true
      rollout:
        n: 5
        temperature: 1.0
        top_p: 1.0
        limit_images: 0
        gpu_memory_utilization: 0.6
        enforce_eager: false
        enable_chunked_prefill: false
        tensor_parallel_size: 2
        disable_tqdm: false
        val_override_config:
          temperature: 0.6
          top_p: 0.95
          n: 1
      ref:
        fsdp:
          enable_full_shard: true
          enable_cpu_offload: true
          enable_rank0_init: true
        offload:
          offload_params: false
      reward:
        reward_function: ./examples/reward_function/math.py:compute_score
    trainer:
      total_epochs: 15
      max_steps: null
      project_name: easy_r1
      experiment_name: qwen2_5_7b_math_grpo
      logger: ["file", "wandb"]
      nnodes: 1
      n_gpus_per_node: 8
      max_try_make_batch: 20
      val_freq: 5
      val_before_train: true
      val_only: false
      val_generations_to_log: 3
      save_freq: 5
      save_limit: 3
      save_model_only: false
      save_checkpoint_path: null
      load_checkpoint_path: null
      find_last_checkpoint: true
"""

# EasyR1's examples/format_prompt/*.jinja, as they are (dapo's `\\n` are two characters there too)
MATH = ("{{ content | trim }} You FIRST think about the reasoning process as an internal monologue "
        "and then provide the final answer. The reasoning process MUST BE enclosed within <think> "
        "</think> tags. The final answer MUST BE put in \\boxed{}.\n")
R1V = ("{{ content | trim }} A conversation between User and Assistant. The user asks a question, "
       "and the Assistant solves it. The assistant first thinks about the reasoning process in the "
       "mind and then provides the user with the answer. The reasoning process and answer are "
       "enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., <think> "
       "reasoning process here </think><answer> answer here </answer>\n")
DAPO = ("Solve the following math problem step by step. The last line of your response should be "
        "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
        "\\n\\n{{ content | trim }}\\n\\nRemember to put your answer on its own line after "
        "\"Answer:\".\n")


def _error(path=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, list(overrides))
    return str(err.value)


def _leaves(node: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items():
        if isinstance(value, dict) and value and f"{prefix}{key}" not in EASYR1:
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


@pytest.fixture
def easyr1_dir(tmp_path, monkeypatch):
    """A working dir laid out as EasyR1's repo: the config and its format_prompt file."""
    (tmp_path / "examples" / "format_prompt").mkdir(parents=True)
    (tmp_path / "examples" / "format_prompt" / "math.jinja").write_text(MATH)
    (tmp_path / "examples" / "config.yaml").write_text(EASYR1_CONFIG)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- format_prompt files ------------------------------------------------------------------------


@pytest.mark.parametrize("name, text", [("math", MATH), ("r1v", R1V), ("dapo", DAPO)])
def test_a_jinja_format_prompt_renders_as_easyr1_renders_it(tmp_path, name, text):
    path = tmp_path / f"{name}.jinja"
    path.write_text(text)
    question = "  How many circles are in the image?\n"
    # EasyR1's verl/utils/dataset.py: Template(self.format_prompt.strip()).render(content=prompt_str)
    easyr1 = jinja2.Template(text.strip()).render(content=question)
    assert format_question(question, str(path)) == easyr1
    assert str(path) not in easyr1 and "{{" not in easyr1


def test_the_math_template_puts_the_question_first_then_the_instruction(tmp_path):
    path = tmp_path / "math.jinja"
    path.write_text(MATH)
    assert format_question("How many circles are in the image?", str(path)) == (
        "How many circles are in the image? You FIRST think about the reasoning process as an "
        "internal monologue and then provide the final answer. The reasoning process MUST BE "
        "enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}.")


def test_plain_text_is_still_appended_and_inline_templates_render():
    assert format_question("How many?", "Answer in <answer></answer>.") == (
        "How many? Answer in <answer></answer>.")
    assert format_question("How many?", "Q: {{ content }} Think first.") == "Q: How many? Think first."
    assert format_question("How many?", "") == "How many?"


def test_an_edited_template_file_is_read_again(tmp_path):
    path = tmp_path / "fmt.jinja"
    path.write_text("A {{ content }}")
    assert format_question("q", str(path)) == "A q"
    path.write_text("Bee {{ content }}")            # another size: a new stat, read anew
    assert format_question("q", str(path)) == "Bee q"


def test_template_problems_are_errors_that_say_what_to_do(tmp_path):
    with pytest.raises(DataError, match=r"cannot read the template file .*missing\.jinja.*working "
                                        r"dir"):
        format_question("q", str(tmp_path / "missing.jinja"))
    with pytest.raises(DataError, match="Jinja syntax error at line 2"):
        format_question("q", "line one\n{{ content ")
    with pytest.raises(DataError, match="'question' is undefined.*only variable, `content`"):
        format_question("q", "{{ question }} Think.")


def test_a_config_naming_a_template_that_cannot_be_read_fails_at_load(tmp_path):
    missing = tmp_path / "examples" / "format_prompt" / "math.jinja"
    msg = _error(None, [f"data.format_prompt={missing}"])
    assert msg.startswith(f"config key 'data.format_prompt': cannot read the template file "
                          f"{missing} (No such file or directory)")
    assert "Jinja syntax error at line 1" in _error(None, ["data.format_prompt='{{ content '"])
    missing.parent.mkdir(parents=True)
    missing.write_text(MATH)
    assert load_config(None, [f"data.format_prompt={missing}"]).data.format_prompt == str(missing)


def test_the_model_sees_the_rendered_instruction_not_the_path(easyr1_dir, policy, shapes_dir):
    import json

    row = json.loads((shapes_dir / "train.jsonl").read_text().splitlines()[0])
    ex = Example(id="s0", prompt=row["prompt"], answer=str(row["answer"]),
                 images=[str(shapes_dir / row["images"][0])])
    relative = "./examples/format_prompt/math.jinja"       # EasyR1's own relative spelling
    batch = policy.adapter.encode([ex], policy.processor, format_prompt=relative)
    text = policy.tokenizer.decode(batch.inputs["input_ids"][0])
    assert row["prompt"].strip() + " You FIRST think about the reasoning process" in text
    assert "math.jinja" not in text and "{{" not in text
    plain = policy.adapter.encode([ex], policy.processor, format_prompt="Answer.")
    assert row["prompt"] + " Answer." in policy.tokenizer.decode(plain.inputs["input_ids"][0])


# --- EasyR1's nested config ---------------------------------------------------------------------


def test_every_key_of_easyr1s_example_config_is_answered_by_name(easyr1_dir):
    msg = _error(easyr1_dir / "examples" / "config.yaml")
    assert "known:" not in msg                           # no list of keys to search
    ours = {"data.video_fps", "data.format_prompt"}       # the same keys in mmrlvr
    leaves = [leaf for leaf in _leaves(yaml.safe_load(EASYR1_CONFIG)) if leaf not in ours]
    assert len(leaves) == 84
    for leaf in leaves:
        line = next(line for line in msg.splitlines() if f"unknown config key '{leaf}'" in line)
        said = line.split(f"unknown config key '{leaf}': ", 1)[1]
        if " has no mmrlvr key; " in said:
            assert len(said.split(" has no mmrlvr key; ", 1)[1]) > 10, line   # what to do instead
        else:
            start = f"EasyR1's {leaf} is mmrlvr's '"
            assert said.startswith(start), line
            key = said[len(start):].split("'")[0]
            assert key in KEYS or key in SECTIONS, line


def test_every_easyr1_entry_names_a_real_key_or_says_what_to_do():
    for theirs, (ours, note) in EASYR1.items():
        assert theirs.split(".")[0] in ("data", "algorithm", "trainer", "worker"), theirs
        assert theirs not in KEYS, theirs                    # ours: never answered as theirs
        if ours is None:
            assert note, theirs
        else:
            assert ours in KEYS or ours in SECTIONS, (theirs, ours)


def test_the_settings_that_carry_over_paste_into_a_config_that_loads(easyr1_dir):
    msg = _error(easyr1_dir / "examples" / "config.yaml")
    head = "the EasyR1 settings above that carry over unchanged, in mmrlvr's keys"
    block = textwrap.dedent(msg.split(head, 1)[1].split("\n", 1)[1])
    carried = yaml.safe_load(block)
    assert carried["rollout"]["group_size"] == 5 and carried["rollout"]["max_new_tokens"] == 2048
    assert carried["algo"] == {"advantage": "grpo", "kl_estimator": "k3", "beta": 0.01}
    assert carried["optim"]["lr"] == 1e-6 and carried["train"]["batch_prompts"] == 512
    assert carried["data"] == {"train": "hiyouga/math12k@train", "eval": "hiyouga/math12k@test"}
    path = easyr1_dir / "ours.yaml"
    path.write_text(yaml.safe_dump(carried))
    cfg = load_config(path)                               # a config mmrlvr reads as it is
    assert (cfg.rollout.group_size, cfg.algo.kl_estimator, cfg.model.freeze_vision) == (5, "k3", False)


def test_an_easyr1_key_on_the_command_line_names_ours(tmp_path, capsys, monkeypatch):
    import mmrlvr.train.trainer
    from mmrlvr.cli import main

    monkeypatch.setattr(mmrlvr.train.trainer, "train", lambda *a, **k: pytest.fail("trained"))
    path = tmp_path / "run.yaml"
    path.write_text("model: {path: /nonexistent/model}\n")
    assert main(["train", str(path), "worker.rollout.n=8"]) == 2
    err = capsys.readouterr().err
    assert ("unknown config key 'worker.rollout.n': EasyR1's worker.rollout.n is mmrlvr's "
            "'rollout.group_size'") in err
    assert "rollout:\n" in err and "group_size: 8" in err


def test_easyr1_section_keys_neither_trainer_has_and_whole_sections(tmp_path):
    msg = _error(None, ["worker.actor.no_such_knob=1", "worker.critic.model.model_path=x",
                        "worker.ref.offload.offload_params=true", "data.train_files=a.jsonl"])
    assert ("unknown config key 'worker.actor.no_such_knob': EasyR1's worker section, but no key "
            "EasyR1 or mmrlvr has") in msg
    assert "'worker.critic.model.model_path': EasyR1's worker.critic.model.model_path has no " \
           "mmrlvr key; GRPO has no critic" in msg
    assert "'worker.ref.offload.offload_params': EasyR1's worker.ref.offload.offload_params has " \
           "no mmrlvr key; the reference model is loaded when algo.beta > 0" in msg
    assert "EasyR1's data.train_files is mmrlvr's 'data.train'" in msg
