"""`train.packing`: each group's completions packed after one copy of its prompt give the
logprobs, entropies and gradients of the padded rows, and run no completion padding."""
from __future__ import annotations

import copy

import pytest
import torch

import modalities
from mmrlvr.config import ModelConfig
from mmrlvr.core.types import select
from mmrlvr.train.packing import Layout, block_mask, packed_logprobs, prompt_lengths
from mmrlvr.train.policy import Policy
from tests.test_policy import _completions, mixed_examples  # noqa: F401  (a fixture)


def packing_check(policy, batch, rows, ids, mask, grad_of, shared=True):
    """packed_logprobs against the padded path (`rollout_logprobs`, or whole rows with
    `shared=False`): the same logprobs, entropies and gradients at every real position."""
    results = []
    for packed in (False, True):
        policy.model.zero_grad()
        if packed:
            logp, entropy = packed_logprobs(policy, batch, rows, ids, mask, 0.7, with_entropy=True)
        elif shared:
            logp, entropy = policy.rollout_logprobs(batch, rows, ids, mask, 0.7, with_entropy=True)
        else:
            inputs, _ = select(batch, rows)
            logp, entropy = policy.completion_logprobs(inputs, ids, mask, 0.7, with_entropy=True)
        (logp * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        results.append((logp.detach() * mask, entropy * mask, grads))
    policy.model.zero_grad()
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    assert lp_a.abs().sum() > 0
    torch.testing.assert_close(lp_b, lp_a, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ent_b, ent_a, atol=2e-5, rtol=1e-4)
    assert g_a.keys() == g_b.keys() and grad_of in g_a
    for name, g in g_a.items():
        torch.testing.assert_close(g_b[name], g, atol=1e-5, rtol=1e-4, msg=name)


# groups of different sizes, out of order, one completion of a single token: each group in a
# row of its own; then a long text-only group, so the two image groups share the second row
LAYOUTS = {"own rows": ([2, 2, 0, 1, 2, 1, 0], [5, 9, 2, 7, 1, 9, 3]),
           "shared rows": ([0, 0, 0, 1, 2, 2, 1], [31, 30, 30, 3, 2, 4, 1])}


@pytest.mark.parametrize("which,attn,layout", [
    ("qwen2.5-vl", "sdpa", "own rows"), ("qwen2.5-vl", "sdpa", "shared rows"),
    ("qwen2-vl", "sdpa", "shared rows"), ("qwen2.5-vl", "eager", "shared rows")])
def test_packed_groups_give_the_logprobs_and_gradients_of_padded_rows(
        which, attn, layout, tiny_vl, tiny_qwen2vl, mixed_examples):  # noqa: F811
    path = tiny_vl if which == "qwen2.5-vl" else tiny_qwen2vl
    policy = Policy.load(ModelConfig(path=str(path), attn_implementation=attn),
                         modalities.get("vision"), torch.device("cpu"))
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    rows, widths = LAYOUTS[layout]
    ids, mask = _completions(policy, len(rows), widths)
    packs = Layout(rows, widths, prompt_lengths(batch, rows))
    assert packs.rows == (3 if layout == "own rows" else 2)
    if layout == "shared rows":                # both image prompts, in one row: media in order
        assert packs.row_of[1] == packs.row_of[2] and packs.order == [0, 2, 1]
    packing_check(policy, batch, rows, ids, mask, "model.visual.patch_embed.proj.weight")


def test_packing_matches_whole_rows_under_gradient_checkpointing(tiny_vl, mixed_examples):  # noqa: F811
    """Checkpointing keeps no cache in a training forward, so the padded path runs every row
    whole; the packs need no cache and give the same numbers."""
    policy = Policy.load(ModelConfig(path=str(tiny_vl), gradient_checkpointing=True),
                         modalities.get("vision"), torch.device("cpu"))
    policy.model.train()
    batch = policy.adapter.encode(mixed_examples, policy.processor)
    rows = [1, 1, 1, 2, 2]
    ids, mask = _completions(policy, len(rows), [6, 2, 8, 4, 7])
    packing_check(policy, batch, rows, ids, mask, "model.visual.patch_embed.proj.weight",
                  shared=False)


def test_groups_share_rows_and_the_block_mask_keeps_them_apart():
    # prompt 0 (2 tokens) with completions 0 and 1, prompt 2 (1 token) with completion 3,
    # prompt 1 (1 token) with completion 2 of one token (no inputs)
    layout = Layout([0, 0, 1, 2], [3, 2, 1, 2], {0: 2, 1: 1, 2: 1})
    assert (layout.rows, layout.width, layout.padded_positions()) == (2, 5, 2)
    assert layout.order == [0, 2, 1]               # largest group first, then first fit
    owner, seg = layout.segments()
    assert owner.tolist() == [[0, 0, 0, 0, 0], [2, 2, 1, -1, -1]]
    assert seg.tolist() == [[-1, -1, 0, 0, 1], [-1, 3, -1, -2, -2]]
    assert [layout.last_prompt_position(u) for u in (0, 1, 2)] == [1, 2, 0]
    allowed = block_mask(owner, seg).int()         # [2, 5, 5]
    assert allowed[0, 2].tolist() == [1, 1, 1, 0, 0]   # completion 0: its prompt + itself
    assert allowed[0, 3].tolist() == [1, 1, 1, 1, 0]
    assert allowed[0, 4].tolist() == [1, 1, 0, 0, 1]   # completion 1: not completion 0
    assert allowed[1, 1].tolist() == [1, 1, 0, 0, 0]
    assert allowed[1, 2].tolist() == [0, 0, 1, 0, 0]   # prompt 1 sees nothing of group 2
    assert allowed[1, 4].tolist() == [0, 0, 0, 0, 1]   # padding: only itself (never read)


def test_packing_updates_like_padded_micro_batches_with_less_padding(tmp_path, tiny_vl,
                                                                     shapes_dir, monkeypatch):
    """Two PPO epochs (old logprobs) and a KL to a frozen reference: every forward packed."""
    import mmrlvr.train.policy as policy_mod
    from mmrlvr.train.update import policy_update

    calls = []
    real = policy_mod.packed_logprobs

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(policy_mod, "packed_logprobs", counted)
    from tests.test_length_buckets import uneven_update_inputs

    run, rollouts, advantages, scores = uneven_update_inputs(
        tmp_path, tiny_vl, shapes_dir, "train.micro_batch=8", "algo.ppo_epochs=2",
        "algo.beta=0.04")
    policy = run.policy
    start = copy.deepcopy(policy.model.state_dict())

    def update(packing: bool):
        policy.model.load_state_dict(start)
        run.cfg.train.packing = policy.packing = packing   # policy.packing: as load_policy sets it
        calls.clear()
        stats = policy_update(run, rollouts, advantages, scores, 1)
        assert bool(calls) == packing      # the policy's one logprob path took the packed rows
        return stats, torch.cat([p.grad.flatten() for p in policy.trainable_parameters()])

    plain, g_plain = update(False)
    packed, g_packed = update(True)
    assert plain["update/padded_frac"] > 0.2 and packed["update/padded_frac"] < \
        plain["update/padded_frac"] / 2
    assert packed["update/padded_frac_unpacked"] == plain["update/padded_frac"]
    assert "update/padded_frac_unpacked" not in plain
    assert abs(packed["loss/policy"] - plain["loss/policy"]) < 1e-6
    assert abs(packed["loss/kl"] - plain["loss/kl"]) < 1e-7      # the reference packed too
    assert abs(packed["policy/entropy"] - plain["policy/entropy"]) < 1e-5
    assert abs(packed["rollout/logprob_gap"] - plain["rollout/logprob_gap"]) < 1e-5
    assert g_plain.abs().sum() > 0
    torch.testing.assert_close(g_packed, g_plain, rtol=1e-4, atol=1e-7)


def test_packing_is_refused_with_flash_attention_and_length_buckets():
    from mmrlvr.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="train.packing' needs model.attn_implementation"):
        load_config(None, ["train.packing=true", "model.attn_implementation=flash_attention_2"])
    with pytest.raises(ConfigError, match="pick one"):
        load_config(None, ["train.packing=true", "train.length_buckets=true"])
