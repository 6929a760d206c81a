"""A worker for tests/test_multiprocess.py: one GRPO update on a fixed global batch.

Run as `python tests/mp_worker.py CONFIG OUT [CONFIG OUT ...]` (one process) or under `torchrun
--nproc_per_node 2` with the same arguments; several pairs run one after the other in the same
processes (one launch, one import of torch and transformers, for a test's several cases). Every rank draws the same rollouts for the whole global batch (same
seed, same weights), scores them, then trains only its share of the prompts through the
trainer's own `policy_update`. Rank 0 writes the full gradient and weights after the update to
OUT (torch.save), with the fraction of trainable weights the update changed, so the test can
compare a 2-process update with the 1-process update of the whole batch.
"""
from __future__ import annotations

import sys

import torch


def full(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient as one whole tensor (DTensor shards gathered)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu().clone()


def main(config: str, out: str) -> None:
    from mmrlvr.algo import group_advantages
    from mmrlvr.config import load_config
    from mmrlvr.rollout import SamplingParams
    from mmrlvr.train.setup import build_run, seed_everything
    from mmrlvr.train.update import policy_update
    from mmrlvr.core.types import subset

    cfg = load_config(config)
    run, _ = build_run(cfg)
    d, policy, G = run.dist, run.policy, cfg.rollout.group_size
    examples = [run.train_data[i] for i in range(cfg.train.batch_prompts)]
    prompts = policy.adapter.encode(examples, policy.processor)
    seed_everything(123)                      # the same rollouts on every rank
    rollouts = run.engine.generate(prompts, SamplingParams(
        n=G, max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature))
    scores = [run.reward.score(ex, rollouts.texts[b * G:(b + 1) * G])
              for b, ex in enumerate(examples)]
    rewards = torch.tensor([[s["overall"] for s in g] for g in scores])            # [B, G]
    advantages = group_advantages(rewards, cfg.algo.advantage, cfg.algo.eps).flatten()

    share = list(range(d.rank, len(examples), d.world))                            # its prompts
    rows = [b * G + g for b in share for g in range(G)]
    mine = rollouts.__class__(
        prompts=subset(rollouts.prompts, share), group_size=G,
        completion_ids=rollouts.completion_ids[rows], completion_mask=rollouts.completion_mask[rows],
        sample_logprobs=None if rollouts.sample_logprobs is None else rollouts.sample_logprobs[rows],
        texts=[rollouts.texts[r] for r in rows], branch=[rollouts.branch[r] for r in rows],
        stats=rollouts.stats)
    params = dict(policy.base_model().named_parameters())
    before = {k: full(p) for k, p in params.items() if p.requires_grad}
    stats = policy_update(run, mine, advantages[rows], [scores[b] for b in share], step=1)
    grads = {k: full(p.grad) for k, p in params.items() if p.grad is not None}
    after = {k: full(p) for k, p in params.items() if p.requires_grad}
    changed = sum(int((after[k] != before[k]).sum()) for k in after)
    total = sum(v.numel() for v in after.values())
    if d.main:
        torch.save({"grads": grads, "after": after, "changed": changed / total,
                    "loss": stats["loss/policy"], "world": d.world, "strategy": d.strategy,
                    "rewards": rewards, "padded_frac": stats["update/padded_frac"]}, out)
    d.barrier()


if __name__ == "__main__":
    pairs = sys.argv[1:]
    if not pairs or len(pairs) % 2:
        sys.exit("usage: mp_worker.py CONFIG OUT [CONFIG OUT ...]")
    for config, out in zip(pairs[::2], pairs[1::2]):
        main(config, out)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
