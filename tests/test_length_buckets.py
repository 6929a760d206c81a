"""`train.length_buckets`: micro-batches of similar completion length run less padding and
give the same gradient as the rollout order (up to float summation order)."""
from __future__ import annotations

import copy
import dataclasses

import torch

from mmrlvr.algo import group_advantages
from mmrlvr.rollout.base import SamplingParams


def uneven_update_inputs(tmp_path, tiny_vl, shapes_dir, *overrides: str):
    """A run (4 prompts x 4 rollouts of the tiny Qwen2.5-VL, `overrides` on top) and one
    step's rollouts with completions of different lengths mixed within every group (as EOS
    ends them), rewards with spread in every group: (run, rollouts, advantages, scores)."""
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run

    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "rollout.max_new_tokens=24",
                             "rollout.temperature=1.5", "train.batch_prompts=4",
                             "train.micro_batch=4", "train.steps=1", "optim.lr=1e-12",
                             "optim.max_grad_norm=0", f"train.out_dir={tmp_path / 'run'}",
                             *overrides])
    run, _ = build_run(cfg)
    policy = run.policy
    prompts = policy.adapter.encode([run.train_data[i] for i in range(4)], policy.processor)
    torch.manual_seed(0)
    rollouts = run.engine.generate(prompts, SamplingParams(n=4, max_new_tokens=24, temperature=1.5))
    ids, mask = rollouts.completion_ids.clone(), rollouts.completion_mask.clone()   # [16, C]
    for r in range(16):
        keep = 2 + (7 * r) % (ids.shape[1] - 2)
        mask[r, keep:] = 0
        ids[r, keep:] = policy.pad_id
    rollouts = dataclasses.replace(rollouts, completion_ids=ids, completion_mask=mask)
    rewards = torch.linspace(0, 1, 16).reshape(4, 4)                  # every group has spread
    advantages = group_advantages(rewards, "grpo", 1e-6).flatten()
    scores = [[{"overall": float(v)} for v in row] for row in rewards]
    return run, rollouts, advantages, scores


def test_length_buckets_cut_padding_and_keep_the_gradient(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.train.update import policy_update

    run, rollouts, advantages, scores = uneven_update_inputs(tmp_path, tiny_vl, shapes_dir)
    policy = run.policy
    rollouts = dataclasses.replace(rollouts, sample_logprobs=None)
    start = copy.deepcopy(policy.model.state_dict())

    def update(buckets: bool):
        policy.model.load_state_dict(start)
        run.cfg.train.length_buckets = buckets
        stats = policy_update(run, rollouts, advantages, scores, 1)
        grads = [p.grad.detach().clone() for p in policy.trainable_parameters()]
        return stats, grads

    plain, g_plain = update(False)
    bucketed, g_bucketed = update(True)
    assert bucketed["update/padded_frac"] < plain["update/padded_frac"]
    assert bucketed["loss/policy"] == torch.tensor(plain["loss/policy"]).item() or \
        abs(bucketed["loss/policy"] - plain["loss/policy"]) < 1e-6
    flat_plain, flat_b = torch.cat([g.flatten() for g in g_plain]), torch.cat([g.flatten() for g in g_bucketed])
    assert flat_plain.abs().sum() > 0
    torch.testing.assert_close(flat_b, flat_plain, rtol=1e-4, atol=1e-7)
    assert bucketed["update/prompt_forwards"] >= plain["update/prompt_forwards"] == 4
