"""What the hand-built family tests share (tests/test_hand_built_*.py): a tokenizer with other ids
than `mmrlvr tiny`'s, saving a model dir the way a user with a checkpoint made elsewhere has it,
and two GRPO steps on it through `mmrlvr.train.trainer.train` with the checks every case makes."""
from __future__ import annotations

import math
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from mmrlvr import models
from mmrlvr.config import load_config
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.trainer import train


def retrained_tokenizer(tiny_dir: Path, vocab_target: int = 680):
    """The tokenizer of a `mmrlvr tiny` dir trained again by the tiny builders' helper with its
    added tokens in reverse order and a larger vocabulary: every special token gets another id
    than the tiny model's, its roles (bos/eos/pad/unk, `image_token`, ...) and chat template kept."""
    from transformers import AutoTokenizer

    from mmrlvr.tiny.common import set_named_tokens
    from mmrlvr.tiny.tokenizer import build_tokenizer

    src = AutoTokenizer.from_pretrained(tiny_dir)
    specials = [t.content for _, t in sorted(src.added_tokens_decoder.items())][::-1]
    tok = build_tokenizer(None, None, vocab_target, specials, chat_template=src.chat_template,
                          eos_token=src.eos_token, pad_token=src.pad_token, bos_token=src.bos_token,
                          unk_token=src.unk_token, model_max_length=src.model_max_length)
    roles = src.init_kwargs.get("model_specific_special_tokens")
    if roles:
        set_named_tokens(tok, roles)
    for token in specials:
        assert tok.convert_tokens_to_ids(token) != src.convert_tokens_to_ids(token), token
    return tok


def padded_vocab(tok, multiple: int = 64) -> int:
    """An embedding table rounded up past the tokenizer, as released checkpoints have (Qwen2-VL:
    151,936 rows for 151,657 tokens)."""
    return (len(tok) // multiple + 2) * multiple


def save_model_dir(model, processor, out: Path, *, generation: dict | None = None) -> Path:
    """`model` and `processor` saved into `out` with transformers' own `save_pretrained`, and a
    generation config when the checkpoint's ids are not the ones transformers infers."""
    from transformers import GenerationConfig

    if generation is not None:
        model.generation_config = GenerationConfig(**generation)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


LENGTH_REWARD = "def length(example, completion):\n    return min(len(completion), 200) / 200.0\n"
"""A reward that differs between completions of a random model, so advantages (and gradients)
are not all zero."""


def train_two_steps(model_dir: Path, data: Path, tmp_path: Path, modality: str, **rollout) -> dict:
    """Two GRPO steps on `model_dir` (group 2, batch 2, 8 new tokens, no eval); asserts the run
    finished, weights of the language model and of the media tower moved (the images or clips
    reached the loss), every logged metric is finite and the rollout scored what the
    trainer scores. Returns the run's resolved
    config (`out_dir/config.yaml`: the pixel bounds read off the model's processor files)."""
    torch.set_num_threads(1)
    (tmp_path / "len.py").write_text(LENGTH_REWARD)
    cfg = {"model": {"path": str(model_dir), "modality": modality},
           "data": {"train": str(data / "train.jsonl")},
           "rollout": {"group_size": 2, "max_new_tokens": 8, "temperature": 1.0, **rollout},
           "optim": {"lr": 1e-3},
           "train": {"steps": 2, "batch_prompts": 2, "micro_batch": 4, "out_dir": str(tmp_path / "run"),
                     "seed": 1, "threads": 1, "report_to": []},
           "rewards": [{"name": "accuracy", "weight": 1.0},
                       {"name": str(tmp_path / "len.py") + ":length", "weight": 0.5}]}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert train(load_config(path), progress=False)["steps"] == 2
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        # the rollout's logprobs equal the trainer's (fp32, CPU): positions and media features agree
        assert row["rollout/logprob_gap_max"] < 1e-4, row["rollout/logprob_gap_max"]
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"step {row['step']}: non-finite metrics {bad}"
    before = load_file(str(model_dir / "model.safetensors"))
    after = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    moved = {n for n, w in after.items() if n in before and not torch.equal(w, before[n])}
    family = models.resolve(str(model_dir))
    towers = {"vision": "vision tower", "audio": "audio tower", "text": "language model"}
    for part in ("language model", towers[family.modality]):     # the media reached the loss
        assert any(family.tower_of(n) == part for n in moved), f"no {part} weight changed"
    return yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
