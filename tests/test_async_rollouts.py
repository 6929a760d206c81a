"""One-step-off rollouts (`train.async_rollouts: one_step_off`, mmrlvr/train/async_rollout.py) on a
tiny model: which steps train on a batch generated a step ahead, that such a batch was sampled by
the weights before the last update and the ratio is taken against them, that the behaviour
logprobs a forward recomputes equal the engine's, that `--resume` keeps which steps are generated
ahead, and the option combinations refused by name."""
from __future__ import annotations

import pytest
import torch

from mmrlvr.config import ConfigError, load_config
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.setup import build_run
from mmrlvr.train.trainer import grpo_step, train

LENGTH = "def length(example, completion):\n    return min(len(completion), 24) / 24.0\n"
TIMING = ("time/", "perf/", "async/wait_s")


def _cfg(tmp_path, tiny_vl, shapes_dir, name, *overrides):
    (tmp_path / "len.py").write_text(LENGTH)
    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "rollout.max_new_tokens=8",
                             "train.batch_prompts=2", "train.micro_batch=8", "train.seed=5",
                             "optim.lr=5e-3", "optim.schedule=constant", "optim.warmup_steps=0",
                             "train.async_rollouts=one_step_off",
                             f"train.out_dir={tmp_path / name}", *overrides])
    cfg.rewards = [{"name": f"{tmp_path / 'len.py'}:length", "weight": 1.0}]   # spread everywhere
    return cfg


def _plain(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(TIMING) and not k.endswith("_s")}


def test_a_batch_generated_ahead_comes_from_the_weights_before_the_last_update(
        tmp_path, tiny_vl, shapes_dir, monkeypatch):
    from mmrlvr.train.update import Update

    run = build_run(_cfg(tmp_path, tiny_vl, shapes_dir, "run", "train.steps=3"))[0]
    seen = []
    real = Update._old_logprobs

    def spy(self, part, width, logp):
        old = real(self, part, width, logp)
        seen.append((self.rollouts, part, width, old, logp.detach()))
        return old

    monkeypatch.setattr(Update, "_old_logprobs", spy)
    start = {n: p.detach().clone() for n, p in run.policy.model.named_parameters()}
    first = grpo_step(run, 1)                          # generated now; step 2's starts meanwhile
    assert first["async/stale"] == 0.0 and first["optim/grad_norm"] > 0
    assert all(torch.equal(old, logp) for *_, old, logp in seen)      # on-policy: ratio 1
    flight = run.prefetch.flight
    assert flight is not None and flight.step == 2
    flight.thread.join()
    live = dict(run.policy.model.named_parameters())
    behaviour = dict(run.prefetch.copy.named_parameters())
    assert all(torch.equal(behaviour[n], start[n]) for n in start)    # the weights before update 1
    assert any(not torch.equal(live[n], start[n]) for n in start)     # which update 1 moved
    seen.clear()
    second = grpo_step(run, 2)
    assert second["async/stale"] == 1.0 and seen
    for rollouts, part, width, old, logp in seen:
        assert rollouts is flight.box["rollouts"]
        # the ratio's denominator: the behaviour policy's logprobs (the engine's, here)
        assert torch.equal(old, rollouts.sample_logprobs[part, :width].to(old.dtype))
        m = rollouts.completion_mask[part, :width].bool()
        assert (logp - old)[m].abs().max() > 1e-4      # the moved weights score them otherwise
    assert run.prefetch.flight is not None and run.prefetch.flight.step == 3
    run.prefetch.drop()


def test_the_behaviour_forward_equals_the_engines_sample_logprobs(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.train.trainer import next_prompts, sampling_params

    run = build_run(_cfg(tmp_path, tiny_vl, shapes_dir, "run", "train.steps=2"))[0]
    _, _, prompts = next_prompts(run, run.prompting.draw(1))
    rollouts = run.prefetch.engine.generate(prompts, sampling_params(run.cfg))
    mask = rollouts.completion_mask.bool()
    got = run.prefetch.logprobs(rollouts)
    assert mask.sum() > 0 and (got - rollouts.sample_logprobs)[mask].abs().max() < 1e-4


def test_which_steps_train_on_a_batch_generated_ahead_and_resume_keeps_the_schedule(
        tmp_path, tiny_vl, shapes_dir):
    whole = _cfg(tmp_path, tiny_vl, shapes_dir, "whole", "train.steps=5", "train.save_every=2")
    train(whole, progress=False)
    rows = [r for r in read_metrics(tmp_path / "whole" / "metrics.jsonl") if "reward/mean" in r]
    # a batch is generated ahead except across a checkpoint (steps 2, 4) and before step 1
    assert [r["async/stale"] for r in rows] == [0.0, 1.0, 0.0, 1.0, 0.0]
    cut = _cfg(tmp_path, tiny_vl, shapes_dir, "cut", "train.steps=2", "train.save_every=2")
    train(cut, progress=False)
    more = _cfg(tmp_path, tiny_vl, shapes_dir, "cut", "train.steps=5", "train.save_every=2")
    train(more, resume=True, progress=False)
    resumed = [r for r in read_metrics(tmp_path / "cut" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    assert [r["async/stale"] for r in resumed] == [r["async/stale"] for r in rows]
    # the step before any batch generated ahead is the same run; later ones are not bit for bit
    # on a CPU with several intra-op threads (docs/grpo-step.md: train.threads 1 for that)
    assert _plain(resumed[0]) == _plain(rows[0])


def test_off_is_the_synchronous_step(tmp_path, tiny_vl, shapes_dir):
    run = build_run(_cfg(tmp_path, tiny_vl, shapes_dir, "off", "train.steps=2",
                         "train.async_rollouts=none"))[0]
    assert run.prefetch is None
    assert not [k for k in grpo_step(run, 1) if k.startswith("async/")]


@pytest.mark.parametrize("clash, named", [
    ("rollout.backend=vllm", "rollout.backend vllm"),
    ("train.dynamic_sampling=true", "train.dynamic_sampling"),
    ("rollout.branching.kind=latent_noise", "rollout.branching")])
def test_what_it_does_not_run_with_is_refused_by_name(tmp_path, clash, named):
    with pytest.raises(ConfigError, match=f"one_step_off does not run with {named}"):
        load_config(None, ["train.async_rollouts=one_step_off", clash,
                           f"train.out_dir={tmp_path / 'x'}"])
    with pytest.raises(ConfigError, match="train.async_rollouts"):
        load_config(None, ["train.async_rollouts=two_steps_off"])
