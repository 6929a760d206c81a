"""TRL's `GRPOConfig` and `SFTConfig` on mmrlvr (`mmrlvr.api_config`): a TRL script's names
become mmrlvr's config keys with TRL's meaning (completions or rows per device, epochs, TRL's
loss and reward-scaling names), a name mmrlvr cannot honour or does not know is one error naming
each with what to use instead, and a GRPOTrainer given `args=GRPOConfig(...)` (an SFTTrainer
given `args=SFTConfig(...)`) trains with them (logging_steps sets its callbacks' cadence)."""
from __future__ import annotations

import json

import datasets
import pytest
from PIL import Image

from mmrlvr import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
from mmrlvr.config import ConfigError, load_config
from mmrlvr.train.logger import read_metrics


def test_trl_names_set_mmrlvr_keys_with_trls_meaning(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = GRPOConfig(output_dir="runs/x", learning_rate=3e-5, per_device_train_batch_size=8,
                      gradient_accumulation_steps=2, num_generations=4, max_completion_length=64,
                      max_steps=30, temperature=0.7, top_k=None, beta=0.04, epsilon=0.1,
                      loss_type="dr_grpo", scale_rewards="batch", importance_sampling_level="sequence",
                      lr_scheduler_type="cosine", warmup_ratio=0.1, bf16=True, seed=42,
                      save_steps=10, save_total_limit=3, report_to="none",
                      remove_unused_columns=False)
    cfg = args.to_config()
    got = (cfg.train.out_dir, cfg.optim.lr, cfg.train.micro_batch, cfg.train.batch_prompts,
           cfg.rollout.group_size, cfg.rollout.max_new_tokens, cfg.train.steps,
           cfg.rollout.temperature, cfg.rollout.top_k, cfg.algo.beta, cfg.algo.clip_low,
           cfg.algo.clip_high, cfg.algo.loss_agg, cfg.algo.advantage, cfg.algo.ratio,
           cfg.optim.schedule, cfg.optim.min_lr_ratio, cfg.optim.warmup_steps, cfg.model.dtype,
           cfg.train.seed, cfg.train.save_every, cfg.train.keep_checkpoints, cfg.train.report_to)
    # 8 completions a forward x 1 process x 2 accumulated = 16 a step = 4 prompts of 4;
    # TRL's epsilon_high is epsilon when not given (not mmrlvr's 0.28); TRL's cosine ends at 0
    assert got == ("runs/x", 3e-5, 8, 4, 4, 64, 30, 0.7, 0, 0.04, 0.1, 0.1, "seq-sum-norm",
                   "reinforce_pp", "sequence", "cosine", 0.0, 3, "bfloat16", 42, 10, 3, [])
    assert args.learning_rate == 3e-5 and args.output_dir == "runs/x"     # read back, as in TRL
    untouched = load_config(None)                  # a name not given keeps mmrlvr's default
    assert (cfg.optim.weight_decay, cfg.train.eval_every) == \
        (untouched.optim.weight_decay, untouched.train.eval_every)
    assert args.to_config(["train.steps=5", "optim.lr=1e-4"]).train.steps == 5   # overrides win


def test_per_device_batch_counts_the_processes_of_the_launch(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")            # as torchrun --nproc_per_node 2 sets it
    cfg = GRPOConfig(per_device_train_batch_size=4, num_generations=4).to_config()
    assert (cfg.train.micro_batch, cfg.train.batch_prompts) == (4, 2)
    with pytest.raises(ConfigError, match=r"4 x 2 x 1 = 8 completions.*num_generations \(3\)"):
        GRPOConfig(per_device_train_batch_size=4, num_generations=3)


def test_epochs_become_steps_from_the_training_set_length():
    args = GRPOConfig(num_train_epochs=2, per_device_train_batch_size=6, num_generations=2,
                      warmup_ratio=0.25)
    cfg = args.to_config(rows=10)                    # 3 prompts a step: ceil(2 x 10 / 3) = 7
    assert (cfg.train.batch_prompts, cfg.train.steps, cfg.optim.warmup_steps) == (3, 7, 2)
    assert GRPOConfig(num_train_epochs=2, max_steps=4).to_config(rows=10).train.steps == 4
    with pytest.raises(ConfigError, match="num_train_epochs=2 needs the training set's length"):
        args.to_config(rows=None)


def test_names_mmrlvr_cannot_honour_are_one_error_naming_each_and_the_way_instead():
    with pytest.raises(ConfigError) as err:
        GRPOConfig(learning_rate=-1, generation_batch_size=64, lora_r=8, learnin_rate=1e-5,
                   fp16=True, loss_type="cispo", lr_scheduler_type="linear", push_to_hub=True,
                   output_dir="runs/x")
    lines = str(err.value).splitlines()
    assert lines[0] == "GRPOConfig: 8 problems (fix them all, then rerun):"
    text = "\n".join(lines[1:])
    for needle in ("learning_rate=-1 (mmrlvr's optim.lr): config key 'optim.lr'",
                   "generation_batch_size: mmrlvr makes one update per step",
                   "lora_r is not a GRPOConfig field; mmrlvr's key is model.lora.r",
                   "learnin_rate: mmrlvr's GRPOConfig does not take it; did you mean 'learning_rate'?",
                   "fp16=True: mmrlvr has no fp16: bf16=True",
                   "loss_type='cispo' has no mmrlvr form; it takes 'dapo', 'bnpo', 'grpo', 'dr_grpo'",
                   "lr_scheduler_type='linear' has no mmrlvr form",
                   "push_to_hub: mmrlvr does not upload"):
        assert needle in text, needle
    args = GRPOConfig(max_steps=2)
    with pytest.raises(ConfigError, match="num_generations=0 .*rollout.group_size"):
        args.num_generations = 0                     # set later: checked the same way
    assert "num_generations" not in args.to_dict()


def _image(i: int) -> Image.Image:
    return Image.new("RGB", (56, 56), (40 * i % 255, 90, 200 - 20 * i))


def counted(completions, solution, **kwargs):       # TRL's convention
    return [float(s in c) for c, s in zip(completions, solution)]


def short(completions, **kwargs):
    return [1.0 - min(len(c), 20) / 20 for c in completions]


def test_a_trainer_given_a_grpo_config_trains_with_its_names(tmp_path, tiny_vl):
    ds = datasets.Dataset.from_dict({"prompt": [f"<image>How many? ({i})" for i in range(4)],
                                     "image": [_image(i) for i in range(4)],
                                     "solution": [str(i % 3 + 1) for i in range(4)]})
    run = tmp_path / "run"
    args = GRPOConfig(output_dir=str(run), learning_rate=1e-4, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=6, num_train_epochs=1,
                      logging_steps=2, save_steps=1, reward_weights=[1.0, 0.25], report_to=[])
    logged = []
    trainer = GRPOTrainer(model=str(tiny_vl), reward_funcs=[counted, short], args=args,
                          train_dataset=ds, callbacks=[lambda step, m: logged.append(step)],
                          overrides=["model.min_pixels=3136", "model.max_pixels=3136"])
    assert (trainer.args.train.batch_prompts, trainer.args.train.steps) == (2, 2)  # 4 rows, 1 epoch
    summary = trainer.train()
    assert summary["steps"] == 2
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]  # every step kept
    assert logged == [2]                             # on_log at TRL's logging_steps
    saved = load_config(run / "config.yaml")
    assert [(r["name"].rpartition(":")[2], r["weight"]) for r in saved.rewards] == \
        [("counted", 1.0), ("short", 0.25)]
    assert (saved.rollout.group_size, saved.optim.lr, saved.train.micro_batch) == (2, 1e-4, 4)
    assert json.loads((run / "summary.json").read_text()) == summary


def test_sft_config_sets_the_warm_starts_keys_with_trls_meaning(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")            # rows a step count the processes, as in TRL
    args = SFTConfig(output_dir="runs/sft", learning_rate=1e-4, per_device_train_batch_size=4,
                     gradient_accumulation_steps=2, num_train_epochs=2, warmup_ratio=0.25,
                     lr_scheduler_type="cosine", seed=42, weight_decay=0.01, report_to="none",
                     bf16=False, max_length=None)
    cfg = args.to_config(rows=40)                    # 4 x 2 x 2 = 16 rows a step: ceil(2 x 40 / 16)
    assert (cfg.sft.out_dir, cfg.sft.lr, cfg.train.micro_batch, cfg.sft.batch_size, cfg.sft.steps,
            cfg.sft.warmup_steps, cfg.optim.min_lr_ratio, cfg.train.seed, cfg.optim.weight_decay,
            cfg.train.report_to, cfg.model.dtype) == \
        ("runs/sft", 1e-4, 4, 16, 5, 2, 0.0, 42, 0.01, [], "float32")
    assert cfg.train.out_dir == load_config(None).train.out_dir     # the GRPO run's: untouched
    assert SFTConfig(max_steps=3).to_config().sft.steps == 3
    held = SFTConfig(lr_scheduler_type="constant").to_config()      # TRL's constant: no warm-up
    assert (held.optim.min_lr_ratio, held.sft.warmup_steps) == (1.0, 0)
    assert args.learning_rate == 1e-4 and "SFTConfig(output_dir='runs/sft'" in repr(args)


def test_sft_config_refuses_what_the_warm_start_cannot_honour_in_one_error():
    with pytest.raises(ConfigError) as err:
        SFTConfig(learning_rate=-1, num_generations=4, max_length=1024, packing=True,
                  save_steps=100, lr_scheduler_type="linear", learnin_rate=1e-5, push_to_hub=True)
    lines = str(err.value).splitlines()
    assert lines[0] == "SFTConfig: 8 problems (fix them all, then rerun):"
    text = "\n".join(lines[1:])
    for needle in ("learning_rate=-1 (mmrlvr's sft.lr): config key 'sft.lr'",
                   "num_generations: a GRPOConfig name (the GRPO stage's)",
                   "max_length=1024: mmrlvr sft trains on whole rows, never truncated",
                   "packing=True: mmrlvr sft pads each batch",
                   "save_steps: mmrlvr sft writes its final model only",
                   "lr_scheduler_type='linear' has no mmrlvr form; it takes 'cosine'",
                   "learnin_rate: mmrlvr's SFTConfig does not take it; did you mean 'learning_rate'?",
                   "push_to_hub: mmrlvr does not upload"):
        assert needle in text, needle
    with pytest.raises(ConfigError, match="'constant' does not warm up: use 'constant_with_warmup'"):
        SFTConfig(lr_scheduler_type="constant", warmup_steps=5)
    with pytest.raises(ConfigError, match=r"SFTTrainer takes args=SFTConfig\(...\), not GRPOConfig"):
        SFTTrainer(model="runs/tiny", train_dataset=[{"prompt": "p"}], args=GRPOConfig())
    with pytest.raises(ConfigError, match=r"GRPOTrainer takes args=GRPOConfig\(...\), not SFTConfig"):
        GRPOTrainer(model="runs/tiny", reward_funcs=[counted], train_dataset=[{"prompt": "p"}],
                    args=SFTConfig())


def test_an_sft_trainer_given_an_sft_config_trains_with_its_names(tmp_path, tiny_vl):
    ds = datasets.Dataset.from_dict({"prompt": [f"<image>How many? ({i})" for i in range(4)],
                                     "image": [_image(i) for i in range(4)],
                                     "solution": [str(i % 3 + 1) for i in range(4)],
                                     "reasoning": ["I count them."] * 4})
    out = tmp_path / "sft"
    args = SFTConfig(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=2,
                     num_train_epochs=1, warmup_steps=0, logging_steps=2, report_to=[])
    logged = []
    sft = SFTTrainer(model=str(tiny_vl), train_dataset=ds, args=args,
                     callbacks=[lambda step, m: logged.append(step)],
                     overrides=["model.min_pixels=3136", "model.max_pixels=3136"])
    assert (sft.args.sft.batch_size, sft.args.sft.steps) == (2, 2)   # 4 rows, 1 epoch
    summary = sft.train()
    assert summary["steps"] == 2 and (sft.model_dir / "config.json").is_file()
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]   # every step kept
    assert logged == [2]                             # on_log at TRL's logging_steps
    saved = load_config(out / "config.yaml")
    assert (saved.sft.lr, saved.sft.warmup_steps, saved.train.micro_batch) == (1e-3, 0, 2)


def test_an_accelerate_launch_asks_for_the_process_count_of_its_flag_or_its_config_file(
        tmp_path, monkeypatch):
    """The count a lone process was meant to be one of: --num_processes, else the --config_file's
    num_processes, else accelerate's default file (read, as accelerate does, only without
    --cpu); 1 when none names one."""
    from mmrlvr.train.launch import asked_processes

    launch = ["accelerate", "launch"]
    named = tmp_path / "four.yaml"
    named.write_text("distributed_type: MULTI_CPU\nnum_processes: 4\n")
    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text("num_processes: 3\n")
    monkeypatch.setenv("HF_HOME", str(home))
    assert asked_processes([*launch, "--num_processes", "2", "x.py"]) == 2
    assert asked_processes([*launch, "--num_processes=2", "--config_file", str(named)]) == 2
    assert asked_processes([*launch, "--config_file", str(named), "x.py"]) == 4
    assert asked_processes([*launch, "--config-file=" + str(named), "x.py"]) == 4
    assert asked_processes([*launch, "x.py"]) == 3                 # the default file
    assert asked_processes([*launch, "--cpu", "x.py"]) == 1        # accelerate skips it then
    monkeypatch.setenv("HF_HOME", str(tmp_path / "none"))
    assert asked_processes([*launch, "x.py"]) == 1
    named.write_text(": not yaml [")
    assert asked_processes([*launch, "--config_file", str(named), "x.py"]) == 1
