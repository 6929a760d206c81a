"""Multi-turn rollouts with tools (mmrlvr/rollout/multiturn.py): a tool's image or audio inside a
completion is scored by the update's forward exactly as generation saw it, tool tokens get no
loss, the trainer runs and resumes exactly with tools, and off is the single-turn path.

A tiny random model never writes a `<tool_call>` by itself, so `Scripted` writes the first turn
(a fixed call, its logprobs the model's own) and every later turn is sampled by the real engine.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mmrlvr.core.trajectory import format_call
from mmrlvr.core.types import Rollouts
from mmrlvr.rollout.base import SamplingParams
from mmrlvr.rollout.hf import HFRolloutEngine
from mmrlvr.rollout.multiturn import MultiTurnEngine, with_tools
from mmrlvr.tools import Tool, ToolRunner
from mmrlvr.tools.builtin import clip, zoom

ZOOM = "look " + format_call("zoom", x=0, y=0, w=56, h=56)


class Scripted:
    """Turn 1 (the encoded prompts) is `text` for every row; later turns sample."""

    def __init__(self, real: HFRolloutEngine, text: str):
        self.real, self.text, self.branching = real, text, None
        self.policy = real.policy

    def generate(self, batch, params):
        if not batch.prompt_texts:          # a context the multi-turn engine built: sample
            return self.real.generate(batch, params)
        policy, n = self.policy, params.n
        ids = torch.tensor([policy.tokenizer(self.text, add_special_tokens=False)["input_ids"]]
                           * (len(batch) * n))
        mask = torch.ones_like(ids)
        logp, _ = policy.rollout_logprobs(batch, [r // n for r in range(len(ids))], ids, mask,
                                          params.temperature)
        return Rollouts(batch, n, ids, mask, logp, [self.text] * len(ids), ["clean"] * len(ids),
                        {"rollout/prefill_tokens": 0, "rollout/placeholder_scrubbed": 0})

    def wake_up(self):
        pass

    sleep = mark_weights_changed = wake_up

    def without_branching(self):
        return self


def first_batch(policy, examples):
    return policy.adapter.encode(examples, policy.processor)


def examples_of(data_dir: Path, n: int):
    from mmrlvr.data.loading import load_jsonl

    return load_jsonl(data_dir / "train.jsonl")[:n]


def test_a_tool_image_in_the_completion_scores_as_generation_saw_it(policy, shapes_dir):
    torch.manual_seed(0)
    engine = MultiTurnEngine(Scripted(HFRolloutEngine(policy), ZOOM), policy,
                             ToolRunner([Tool("zoom", zoom, 10.0)]), max_turns=3, max_tokens=120)
    out = engine.generate(first_batch(policy, examples_of(shapes_dir, 2)),
                          SamplingParams(n=2, max_new_tokens=12))
    image = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (out.completion_ids == image).sum(dim=1).min() >= 4          # the crop's tokens
    assert out.loss_mask[out.completion_ids == image].sum() == 0           # tool tokens: no loss
    assert bool((out.loss_mask <= out.completion_mask).all())
    assert out.prompt_index == [0, 1, 2, 3] and out.stats["tools/results_image"] == 4
    for text in out.texts:
        turns = text.trajectory.turns
        assert turns[0].call.name == "zoom" and turns[0].result_kind == "image"
        assert str(text) == turns[-1].text and len(turns) >= 2
    rows = [out.prompt_row(r) for r in range(4)]
    with torch.no_grad():
        logp, _ = policy.rollout_logprobs(out.prompts, rows, out.completion_ids,
                                          out.completion_mask)
    sampled = out.loss_mask.bool()
    sampled[:, :len(policy.tokenizer(ZOOM)["input_ids"])] = False         # scripted turn
    assert sampled.sum() >= 4 * 4
    gap = (logp - out.sample_logprobs).abs()[sampled]
    assert float(gap.max()) < 1e-4             # generate's logprobs after the image = the update's
    # without the image's type ids the update's positions (M-RoPE) would not match the image
    types, policy.media_types = policy.media_types, {}
    try:
        with torch.no_grad():
            wrong, _ = policy.rollout_logprobs(out.prompts, rows, out.completion_ids,
                                               out.completion_mask)
        assert float((wrong - out.sample_logprobs).abs()[sampled].max()) > 1e-3
    except RuntimeError:                 # or the positions' shapes do not even fit
        pass
    finally:
        policy.media_types = types


def test_a_text_tool_and_a_failing_tool_continue_the_trajectory(policy, shapes_dir):
    def boom(example, x, y, w, h):
        raise RuntimeError("disk on fire")

    torch.manual_seed(0)
    runner = ToolRunner([Tool("zoom", boom, 10.0)])
    engine = MultiTurnEngine(Scripted(HFRolloutEngine(policy), ZOOM), policy, runner, 2, 300)
    out = engine.generate(first_batch(policy, examples_of(shapes_dir, 1)),
                          SamplingParams(n=2, max_new_tokens=8))
    for text in out.texts:
        first = text.trajectory.turns[0]
        assert first.tool_error.startswith("raised: zoom raised RuntimeError: disk on fire")
        assert first.result_text.startswith("error: raised")
        assert len(text.trajectory.turns) == 2             # the policy answered after the error
    assert out.stats["tools/errors_raised"] == 2
    decoded = policy.tokenizer.decode(out.completion_ids[0])
    assert "disk on fire" in decoded and "<|im_start|>tool" in decoded


def test_max_turns_and_the_token_budget_end_a_trajectory(policy, shapes_dir):
    torch.manual_seed(0)
    runner = ToolRunner([Tool("zoom", lambda ex, **kw: "three shapes", 10.0)])
    engine = MultiTurnEngine(Scripted(HFRolloutEngine(policy), ZOOM), policy, runner, 1, 100)
    out = engine.generate(first_batch(policy, examples_of(shapes_dir, 1)),
                          SamplingParams(n=2, max_new_tokens=8))
    assert [t.trajectory.ended for t in out.texts] == ["max_turns"] * 2
    assert out.stats.get("tools/results_text", 0) == 0                   # no tool ran
    budget = len(policy.tokenizer(ZOOM)["input_ids"]) + 3             # no room for the result
    engine = MultiTurnEngine(Scripted(HFRolloutEngine(policy), ZOOM), policy, runner, 3, budget)
    out = engine.generate(first_batch(policy, examples_of(shapes_dir, 1)),
                          SamplingParams(n=2, max_new_tokens=8))
    assert [t.trajectory.ended for t in out.texts] == ["budget"] * 2
    assert int(out.completion_mask.sum(dim=1).max()) <= budget


def test_an_audio_clip_from_a_tool_scores_as_generation_saw_it(tiny_dirs, tmp_path):
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.tasks.tones import make_tones
    from mmrlvr.train.policy import Policy

    make_tones(tmp_path, n_train=4, n_test=2, seed=0)
    torch.manual_seed(0)
    audio = Policy.load(ModelConfig(path=str(tiny_dirs("qwen2-audio"))), modalities.get("audio"),
                        torch.device("cpu"))
    call = format_call("clip", t0=0.0, t1=0.5)
    engine = MultiTurnEngine(Scripted(HFRolloutEngine(audio), call), audio,
                             ToolRunner([Tool("clip", clip, 10.0)]), 2, 200)
    batch = audio.adapter.encode(examples_of(tmp_path, 1), audio.processor)
    out = engine.generate(batch, SamplingParams(n=2, max_new_tokens=8))
    assert out.stats["tools/results_audio"] == 2
    token = audio.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    assert (out.completion_ids == token).sum() > 0
    with torch.no_grad():
        logp, _ = audio.rollout_logprobs(out.prompts, [0, 1], out.completion_ids,
                                         out.completion_mask)
    sampled = out.loss_mask.bool()
    sampled[:, :len(audio.tokenizer(call)["input_ids"])] = False
    assert float((logp - out.sample_logprobs).abs()[sampled].max()) < 1e-4


def test_without_tools_the_engine_is_the_single_turn_one(policy, shapes_dir):
    """Off (the defaults) builds no multi-turn engine, and a single-turn Rollouts trains every
    kept token and reads its prompt row as r // G, as before the multi-turn fields existed."""
    from mmrlvr.config import load_config

    cfg = load_config(None, [])
    engine = HFRolloutEngine(policy)
    assert cfg.rollout.max_turns == 1 and cfg.rollout.tools == []
    assert with_tools(engine, policy, cfg.rollout) is engine
    out = engine.generate(policy.adapter.encode(examples_of(shapes_dir, 2), policy.processor),
                          SamplingParams(n=3, max_new_tokens=4))
    assert out.loss_mask is None and out.prompt_index is None
    assert out.train_mask is out.completion_mask
    assert [out.prompt_row(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]


def config(tiny_vl, shapes_dir, out_dir, tools=True, steps=4):
    """A 4-step run; its reward (the final turn's length mod 3) spreads every group."""
    from mmrlvr.config import load_config

    reward = Path(out_dir).parent / "spread.py"
    reward.write_text("def spread(example, completion):\n    return (len(completion) % 3) / 2\n")
    extra = [f"rewards=[{{name: '{reward}:spread', weight: 1}}]", "rollout.max_turns=2", "rollout.tools=[{name: zoom}]",
             "rollout.max_trajectory_tokens=160"] if tools else []
    return load_config(None, [
        f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
        "rollout.group_size=4", "rollout.max_new_tokens=8", "train.batch_prompts=2",
        "train.micro_batch=8", f"train.steps={steps}", "train.save_every=2", "train.seed=3",
        "rollout.backend=hf", f"train.out_dir={out_dir}", *extra])


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time", "rollout/time", "perf"))
             and not k.endswith(("_s", "seconds"))} for r in rows]


@pytest.fixture
def scripted_setup(monkeypatch):
    """The trainer's multi-turn engine with its first turn scripted (a zoom call)."""
    import mmrlvr.train.setup as setup

    def wrap(engine, policy, rollout_cfg):
        wrapped = with_tools(engine, policy, rollout_cfg)
        if isinstance(wrapped, MultiTurnEngine):
            wrapped.inner = Scripted(engine, ZOOM)
        return wrapped
    monkeypatch.setattr(setup, "with_tools", wrap)


def test_training_with_tools_resumes_exactly(tmp_path, tiny_vl, shapes_dir, scripted_setup):
    from mmrlvr.train.trainer import train

    cfg = config(tiny_vl, shapes_dir, tmp_path / "whole")
    train(cfg, progress=False)
    rows = metrics(tmp_path / "whole")
    assert all(r["tools/calls_per_rollout"] == 1.0 for r in rows if "tools/calls_per_rollout" in r)
    assert all(r["tools/results_image"] == 8 for r in rows if "tools/results_image" in r)
    assert all(0 < r["tools/tool_token_frac"] < 1 for r in rows if "tools/tool_token_frac" in r)
    assert all(r["rollout/logprob_gap_max"] < 1e-3 for r in rows if "rollout/logprob_gap_max" in r)
    assert sum("rollout/logprob_gap_max" in r for r in rows) >= 3        # the update trained
    assert any(r.get("optim/grad_norm", 0) > 0 for r in rows)
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-4")
    train(config(tiny_vl, shapes_dir, tmp_path / "resumed"), resume=True, progress=False)
    assert metrics(tmp_path / "resumed") == rows
