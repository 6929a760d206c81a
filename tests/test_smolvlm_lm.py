"""The SmolVLM-shaped VLM around a pretrained language model (`mmrlvr pretrained smolvlm --lm DIR`,
mmrlvr/tiny/smolvlm_lm.py), built here from the tiny Llama stand-in so the suite never needs the
93 MB wheel; from the real SmolLM2 only with MMRLVR_TEST_PRETRAINED=1 and `runs/smollm2` built."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from mmrlvr.config import load_config
from mmrlvr.train.logger import read_metrics

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def wrapped(tiny_llama, tmp_path_factory):
    from mmrlvr.cli import main

    out = tmp_path_factory.mktemp("smolvlm-lm") / "vlm"
    assert main(["pretrained", "smolvlm", "--lm", str(tiny_llama), "--out", str(out)]) == 0
    return out


def test_the_decoder_is_the_language_model_unchanged_and_images_are_its_tokens(tiny_llama,
                                                                              wrapped):
    """Every decoder weight equals the language model's (the embedding's original rows too; the
    added image tokens' rows are new), the chat turns are the LM's own ChatML with `<image>`
    where the image goes, and a 112 px image becomes 16 image tokens the model consumes."""
    from PIL import Image
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    lm = AutoModelForCausalLM.from_pretrained(tiny_llama)
    vlm = AutoModelForImageTextToText.from_pretrained(wrapped)
    assert type(vlm).__name__ == "SmolVLMForConditionalGeneration"
    theirs, ours = lm.model.state_dict(), vlm.model.text_model.state_dict()
    assert theirs.keys() == ours.keys()
    for name, weight in theirs.items():
        mine = ours[name][:weight.shape[0]] if name == "embed_tokens.weight" else ours[name]
        assert torch.equal(mine, weight), name
    info = json.loads((wrapped / "smolvlm.json").read_text())
    assert ours["embed_tokens.weight"].shape[0] == lm.config.vocab_size + info["added_tokens"]

    processor = AutoProcessor.from_pretrained(wrapped)
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": "How many shapes?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n<image>How many shapes?<|im_end|>\n<|im_start|>assistant\n"
    batch = processor(text=[text], images=[[Image.new("RGB", (112, 112), (200, 30, 30))]],
                      return_tensors="pt")
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert int((batch["input_ids"] == image_id).sum()) == info["image_seq_len"] == 16
    with torch.no_grad():
        logits = vlm(**batch).logits
    assert logits.shape[:2] == batch["input_ids"].shape and torch.isfinite(logits).all()
    assert vlm.generation_config.eos_token_id == processor.tokenizer.convert_tokens_to_ids(
        "<|im_end|>")


def test_a_grpo_step_trains_the_wrapped_model_on_shapes(wrapped, shapes_dir, tmp_path):
    """Through the smolvlm family and the vision adapter: one GRPO step with eval, and the update
    reaches the random tower as well as the pretrained decoder."""
    from safetensors.torch import load_file

    from mmrlvr.train.trainer import train

    cfg = {"model": {"path": str(wrapped)},
           "data": {"train": str(shapes_dir / "train.jsonl"), "eval": str(shapes_dir / "test.jsonl"),
                    "eval_limit": 4},
           "rollout": {"group_size": 4, "max_new_tokens": 8, "temperature": 1.0},
           # a length-shaped reward gives spread (rows to train) whatever the model writes
           "rewards": [{"name": "accuracy", "weight": 0.5},
                       {"name": str(tmp_path / "shaped.py") + ":length", "weight": 0.5}],
           "optim": {"lr": 1e-3},
           "train": {"steps": 1, "batch_prompts": 2, "micro_batch": 8, "save_every": 0,
                     "out_dir": str(tmp_path / "run"), "seed": 0, "report_to": []}}
    (tmp_path / "shaped.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 40) / 40.0\n")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    summary = train(load_config(path), progress=False)
    assert summary["steps"] == 1 and summary["accuracy_start"] is not None
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["update/trained_rows"] > 0
    before = load_file(wrapped / "model.safetensors")
    after = load_file(tmp_path / "run" / "final" / "model.safetensors")
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("model.vision_model.") for k in moved), sorted(moved)[:5]
    assert any(k.startswith("model.text_model.layers.") for k in moved), sorted(moved)[:5]


def test_freeze_language_trains_the_tower_and_connector_alone(wrapped, shapes_dir, tmp_path):
    """The alignment stage: SFT on the shapes rows' reference sentences with model.freeze_language
    moves the tower and connector and leaves every language-model weight as it was; with LoRA or
    on a text model the switch is refused by key."""
    from safetensors.torch import load_file

    from mmrlvr.config import ConfigError
    from mmrlvr.train.sft import sft

    cfg = {"model": {"path": str(wrapped), "freeze_language": True},
           "data": {"train": str(shapes_dir / "train.jsonl")},
           "rewards": [{"name": "accuracy", "weight": 1.0}],
           "sft": {"init": str(wrapped), "steps": 2, "batch_size": 4, "lr": 1e-3,
                   "out_dir": str(tmp_path / "align")},
           "train": {"report_to": []}}
    path = tmp_path / "align.yaml"
    path.write_text(yaml.safe_dump(cfg))
    sft(load_config(path), progress=False)
    before = load_file(wrapped / "model.safetensors")
    after = load_file(tmp_path / "align" / "final" / "model.safetensors")
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith(("model.vision_model.", "model.connector.")) for k in moved)
    assert any(k.startswith("model.connector.") for k in moved)
    with pytest.raises(ConfigError, match="'model.freeze_language' is true with model.lora.r > 0"):
        load_config(path, ["model.lora.r=4"])
    with pytest.raises(ConfigError, match="'model.freeze_language' is true on a text model"):
        load_config(path, ["model.modality=text"])


def test_a_missing_or_non_llama_language_model_is_refused(tmp_path, tiny_vl, capsys):
    from mmrlvr.cli import main

    assert main(["pretrained", "smolvlm", "--out", str(tmp_path / "a")]) == 2
    assert "give --lm DIR" in capsys.readouterr().err
    assert main(["pretrained", "smolvlm", "--lm", str(tmp_path / "nowhere"), "--out",
                 str(tmp_path / "a")]) == 2
    assert "no config.json there" in capsys.readouterr().err
    assert main(["pretrained", "smolvlm", "--lm", str(tiny_vl), "--out", str(tmp_path / "a")]) == 2
    assert "a 'qwen2_5_vl' model; SmolVLM's decoder is a Llama one" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MMRLVR_TEST_PRETRAINED") != "1"
                    or not (ROOT / "runs" / "smollm2" / "config.json").is_file(), reason=(
    "needs runs/smollm2 (mmrlvr pretrained smollm2 --out runs/smollm2) and "
    "MMRLVR_TEST_PRETRAINED=1"))
def test_the_real_smollm2_wraps_and_still_adds_as_text(tmp_path):
    """Around SmolLM2-135M-Instruct: a text-only prompt through the VLM answers as the language
    model alone does (greedy, the same tokens)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    from mmrlvr.tiny.smolvlm_lm import build_smolvlm_from_lm

    lm_dir = ROOT / "runs" / "smollm2"
    build_smolvlm_from_lm(lm_dir, tmp_path / "vlm")
    processor = AutoProcessor.from_pretrained(tmp_path / "vlm")
    vlm = AutoModelForImageTextToText.from_pretrained(tmp_path / "vlm")
    lm = AutoModelForCausalLM.from_pretrained(lm_dir)
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is 7 + 5?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = processor.tokenizer(text, return_tensors="pt")
    a = vlm.generate(**ids, max_new_tokens=40, do_sample=False)
    b = lm.generate(**ids, max_new_tokens=40, do_sample=False)
    assert torch.equal(a, b)
    assert "12" in processor.tokenizer.decode(a[0, ids["input_ids"].shape[1]:])
