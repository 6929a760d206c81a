"""Text-only prompts (rows without images) beside image prompts, everywhere training runs.

Qwen2/2.5-VL keep the M-RoPE offsets of their last prefill on the module (`rope_deltas`); a
batch without any image that came after an image batch reused them, and the rollout's one
prefill per prompt died of a shape error (`The size of tensor a (4) must match the size of
tensor b (16)`), or, on a first text-only batch, decoded its left-padded rows at positions the
training forward does not use. The rollout now passes the positions the training forward
computes (`mmrlvr.rollout.hf.prompt_positions`). Under FSDP2 a rank whose micro-batch holds no
image still runs the vision tower (`mmrlvr.train.parallel.keep_towers_in_step`; the
2-process tests are in tests/test_multiprocess.py).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml

import modalities
from mmrlvr.config import ModelConfig, load_config
from mmrlvr.core.types import select
from mmrlvr.data import Example
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.train.policy import Policy
from tests.test_policy import _completions, _image, _logprobs

TEXT_ROWS = [
    {"id": "text-0", "prompt": "What is 2 + 3?", "answer": "5", "reasoning": "2 + 3 = 5."},
    {"id": "text-1", "prompt": "How many sides do a triangle and a square have together?",
     "answer": "7", "reasoning": "A triangle has 3 sides and a square 4: 7."},
    {"id": "text-2", "prompt": "Name the colour of grass.", "answer": "green",
     "reasoning": "Grass is green."},
]


def write_rows(tmp_path: Path, shapes_dir: Path, kinds: list[str], name: str = "mixed") -> Path:
    """A JSONL file of `kinds` ("image" or "text") rows in that order: image rows are the
    shapes set's (absolute image paths: needs data.allow_outside), text rows carry no images."""
    shapes = [json.loads(line) for line in (shapes_dir / "train.jsonl").read_text().splitlines()]
    rows, n_image, n_text = [], 0, 0
    for kind in kinds:
        if kind == "image":
            row = dict(shapes[n_image])
            row["images"] = [str(shapes_dir / p) for p in row["images"]]
            n_image += 1
        else:
            row = dict(TEXT_ROWS[n_text % len(TEXT_ROWS)], id=f"text-{n_text}")
            n_text += 1
        rows.append(row)
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_config(tmp_path: Path, tiny_vl: Path, train_file: Path, name: str, **sections) -> Path:
    (tmp_path / "shaped.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 40) / 40.0\n")
    cfg = {
        "model": {"path": str(tiny_vl)},
        "data": {"train": str(train_file), "eval": "", "allow_outside": True},
        "rollout": {"group_size": 4, "max_new_tokens": 8, "temperature": 1.0},
        "optim": {"lr": 1e-3},
        "train": {"steps": 2, "batch_prompts": 1, "micro_batch": 4, "save_every": 0,
                  "out_dir": str(tmp_path / name), "seed": 3},
        # a length-shaped reward gives spread (rows to train) even for random weights
        "rewards": [{"name": "accuracy", "weight": 0.5},
                    {"name": str(tmp_path / "shaped.py") + ":length", "weight": 0.5}],
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture()
def mixed(tmp_path):
    """Two text-only prompts of different lengths (so one is left-padded) and one image prompt."""
    a = _image(tmp_path, "a", 56, (220, 20, 20))
    return [Example(id="t-short", prompt="What is 2 + 3?", answer="5"),
            Example(id="t-long", prompt="How many sides do a triangle and a square have "
                                        "together, counted one by one?", answer="7"),
            Example(id="img", prompt="What colour is the shape?", answer="red", images=[a])]


@pytest.mark.parametrize("kinds", [["image", "text"], ["text", "text"]],
                         ids=["image-then-text", "text-only"])
def test_grpo_trains_a_text_only_batch_after_an_image_batch(tmp_path, tiny_vl, shapes_dir, kinds):
    """The reproduction: batch_prompts=1 draws the image row at step 1 and the text row at
    step 2 (or a text-only file): before the fix step 2 died in the rollout's prefill."""
    from mmrlvr.train.logger import read_metrics
    from mmrlvr.train.sampler import PromptSampler
    from mmrlvr.train.trainer import train

    order = PromptSampler(2, 3)._order(0)              # what the seed-3 sampler draws first
    data = write_rows(tmp_path, shapes_dir, [kinds[order.index(i)] for i in range(2)])
    train(load_config(write_config(tmp_path, tiny_vl, data, "run")), progress=False)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["update/trained_rows"] > 0
        assert r["rollout/logprob_gap_max"] < 1e-5     # fp32: rollout and trainer agree


@pytest.mark.parametrize("which", ["qwen2.5-vl", "qwen2-vl"])
def test_padded_text_only_and_mixed_batches_equal_each_row_alone(which, tiny_vl, tiny_qwen2vl,
                                                                mixed):
    path = tiny_vl if which == "qwen2.5-vl" else tiny_qwen2vl
    policy = Policy.load(ModelConfig(path=str(path)), modalities.get("vision"), torch.device("cpu"))
    for examples in (mixed[:2], mixed):                # all text (one row padded), then mixed
        batch = policy.adapter.encode(examples, policy.processor)
        assert (batch.inputs["attention_mask"] == 0).any()
        ids, mask = _completions(policy, len(examples), [5, 9, 3][:len(examples)])
        together = _logprobs(policy, batch, list(range(len(examples))), ids, mask)
        for i in range(len(examples)):
            alone = policy.adapter.encode([examples[i]], policy.processor)
            w = int(mask[i].sum())
            torch.testing.assert_close(together[i, :w],
                                       _logprobs(policy, alone, [0], ids[i:i + 1, :w],
                                                 mask[i:i + 1, :w])[0], atol=2e-5, rtol=1e-4)


def rollout_gap(policy, engine, batch, n: int = 4) -> float:
    """Largest |sampled logprob - training logprob| over the real completion tokens of the
    members sampled from the clean model (NC-GRPO displaces the others on purpose), the
    training side through the shared-prompt path the update takes."""
    torch.manual_seed(0)
    roll = engine.generate(batch, SamplingParams(n=n, max_new_tokens=8, temperature=1.0))
    with torch.no_grad():
        logp, _ = policy.rollout_logprobs(batch, [r // n for r in range(len(roll.texts))],
                                          roll.completion_ids, roll.completion_mask)
    clean = torch.tensor([tag == "clean" for tag in roll.branch])
    m = roll.completion_mask.bool() & clean[:, None]
    assert m.any()
    return float((logp - roll.sample_logprobs)[m].abs().max())


@pytest.mark.parametrize("which, decode, branching", [
    ("qwen2.5-vl", "eager", None), ("qwen2.5-vl", "static", None), ("qwen2-vl", "eager", None),
    ("qwen2.5-vl", "eager", {"kind": "latent_noise", "alpha": 0.5, "fraction": 0.5})])
def test_rollout_and_trainer_agree_on_text_only_rows_after_image_rows(
        which, decode, branching, policy, tiny_qwen2vl, mixed):
    """One prefill per prompt (eager, static), or whole prefills with NC-GRPO noise on some
    members: an image batch, then a text-only batch (padded), then a mixed one, then a single
    text prompt (a different batch size again): every clean sampled logprob is the trainer's,
    and greedy (eval) decoding of a text batch runs too."""
    if which == "qwen2-vl":
        policy = Policy.load(ModelConfig(path=str(tiny_qwen2vl)), modalities.get("vision"),
                             torch.device("cpu"))
    engine = make_engine("hf", policy, branching, decode)
    for examples in (mixed[2:], mixed[:2], mixed, mixed[:1]):
        batch = policy.adapter.encode(examples, policy.processor)
        assert rollout_gap(policy, engine, batch) < 1e-5, [ex.id for ex in examples]
    greedy = engine.generate(policy.adapter.encode(mixed[:2], policy.processor),
                             SamplingParams(max_new_tokens=4, greedy=True))
    assert greedy.completion_ids.shape[0] == 2


@pytest.mark.parametrize("layout", ["own rows", "shared rows"])
def test_packed_text_only_and_mixed_groups_equal_padded_rows(tiny_vl, mixed, layout):
    from tests.test_packing import packing_check

    policy = Policy.load(ModelConfig(path=str(tiny_vl)), modalities.get("vision"),
                         torch.device("cpu"))
    batch = policy.adapter.encode(mixed, policy.processor)
    rows, widths = {"own rows": ([1, 0, 0, 1, 0], [5, 9, 2, 7, 4]),      # text only
                    "shared rows": ([0, 2, 1, 1, 2, 0], [3, 6, 2, 5, 4, 1])}[layout]
    ids, mask = _completions(policy, len(rows), widths)
    grad_of = "model.language_model.embed_tokens.weight"
    packing_check(policy, batch, rows, ids, mask, grad_of)
    if layout == "shared rows":        # the image's gradient reaches the tower packed too
        packing_check(policy, batch, rows, ids, mask, "model.visual.patch_embed.proj.weight")


def test_packed_update_equals_padded_update_on_a_mixed_batch(tmp_path, tiny_vl, shapes_dir):
    """One micro-batch of an image group and a text group, one of two text groups: the packed
    update makes the padded one's loss and gradients, and both agree with the rollout."""
    from mmrlvr.train.update import policy_update
    from tests.test_length_buckets import uneven_update_inputs

    data = write_rows(tmp_path, shapes_dir, ["image", "text", "text", "text"])
    run, rollouts, advantages, scores = uneven_update_inputs(
        tmp_path, tiny_vl, shapes_dir, f"data.train={data}", "data.allow_outside=true",
        "train.micro_batch=8")
    assert [bool(r) for r in rollouts.prompts.media_rows] == [True, False, False, False]
    policy = run.policy
    start = copy.deepcopy(policy.model.state_dict())

    def update(packing: bool):
        policy.model.load_state_dict(start)
        run.cfg.train.packing = packing
        stats = policy_update(run, rollouts, advantages, scores, 1)
        return stats, torch.cat([p.grad.flatten() for p in policy.trainable_parameters()])

    plain, g_plain = update(False)
    packed, g_packed = update(True)
    assert abs(packed["loss/policy"] - plain["loss/policy"]) < 1e-6
    for stats in (plain, packed):
        assert stats["rollout/logprob_gap_max"] < 1e-5
    assert g_plain.abs().sum() > 0
    torch.testing.assert_close(g_packed, g_plain, rtol=1e-4, atol=1e-7)


def test_sft_and_eval_run_on_a_mixed_file(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.data import load_split
    from mmrlvr.train.evaluate import evaluate
    from mmrlvr.train.logger import read_metrics
    from mmrlvr.train.sft import sft

    data = write_rows(tmp_path, shapes_dir, ["text", "image", "text", "text"])
    cfg = load_config(write_config(
        tmp_path, tiny_vl, data, "run",
        data={"eval": str(data)},
        sft={"init": str(tiny_vl), "steps": 1, "batch_size": 4, "lr": 1e-3, "warmup_steps": 0,
             "out_dir": str(tmp_path / "sft")},
        train={"micro_batch": 1, "eval_batch": 2}))
    summary = sft(cfg, progress=False)       # micro-batches of one row: text, then image, ...
    assert summary["steps"] == 1 and "accuracy_end" in summary
    rows = read_metrics(tmp_path / "sft" / "metrics.jsonl")
    assert all(r["sft/loss"] > 0 for r in rows if "sft/loss" in r)
    # pass@k samples G completions per prompt (one prefill each): text batches after image ones
    policy = Policy.load(ModelConfig(path=str(tmp_path / "sft" / "final")),
                         modalities.get("vision"), torch.device("cpu"))
    examples = list(load_split(cfg.data, "train"))
    result = evaluate(policy, make_engine("hf", policy), examples, max_new_tokens=6,
                      batch_size=1, samples=3)
    assert result["n"] == 4 and "pass@3" in result


def test_training_positions_of_a_text_only_row_skip_its_left_padding(policy, mixed):
    """The training forward's positions (which the rollout now passes to generate) count real
    tokens only: a left-padded text-only row starts at 0 after its padding."""
    batch = policy.adapter.encode(mixed[:2], policy.processor)
    inputs, _ = select(batch, [0, 1])
    ids, mask = _completions(policy, 2, [3, 3])
    full = policy.training_inputs(inputs, ids, mask)
    positions = full["position_ids"]                                     # [3, 2, P + C]
    pad = int((full["attention_mask"][0] == 0).sum())
    assert pad > 0
    assert positions[:, 0, pad].tolist() == [0, 0, 0]
    torch.testing.assert_close(positions[:, 0, pad:], positions[:, 1, :positions.shape[-1] - pad])


@pytest.mark.parametrize("which", ["qwen2-audio", "qwen2.5-omni"])
def test_audio_models_agree_on_text_only_rows_after_audio_rows(tmp_path, which):
    """The audio families: an audio prompt (encoded once, `inputs_embeds`), then a padded
    text-only batch (one prefill per prompt): the rollout samples what the trainer scores."""
    import numpy as np
    import soundfile as sf

    from mmrlvr.tiny import build_tiny

    path = build_tiny(which, tmp_path / "model")
    policy = Policy.load(ModelConfig(path=str(path), modality="audio"), modalities.get("audio"),
                         torch.device("cpu"))
    t = np.arange(16000) / 16000
    sf.write(tmp_path / "a.wav", (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
    clip = Example(id="clip", prompt="How many beeps?", answer="1",
                   audios=[str(tmp_path / "a.wav")])
    short, long = [Example(id=r["id"], prompt=r["prompt"], answer=r["answer"])
                   for r in TEXT_ROWS[:2]]
    engine = make_engine("hf", policy)
    for examples in ([clip], [short, long], [clip, short], [short]):
        batch = policy.adapter.encode(examples, policy.processor)
        assert rollout_gap(policy, engine, batch) < 1e-5, [ex.id for ex in examples]
