"""The anchors' GRPO toolkit against hand computations: RLOO's and REINFORCE++'s advantages (the
latter's step-wide std the same from two ranks as from one), rollout correction (TIS / MIS),
DAPO's soft overlong penalty, and, on a tiny model, the trainer paths of mask_truncated and
rollout_correction; each off by default, leaving plain GRPO."""
from __future__ import annotations

import pytest
import torch

from mmrlvr.algo import group_advantages
from mmrlvr.algo.loss import rollout_correction
from mmrlvr.data import Example
from rewards import build_combined


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32),
                               torch.as_tensor(b, dtype=torch.float32), atol=tol, rtol=0)


def test_rloo_subtracts_the_mean_of_the_others():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    # member 0: 1 - mean(0, 0, 0) = 1; the others: 0 - mean(1, 0, 0) = -1/3; a flat group: 0
    close(group_advantages(r, "rloo"), [[1.0, -1 / 3, -1 / 3, -1 / 3], [0.0] * 4])


def test_reinforce_pp_normalises_by_one_std_over_the_step():
    r = torch.tensor([[1.0, 0.0], [3.0, 1.0]])
    centred = torch.tensor([[0.5, -0.5], [1.0, -1.0]])
    std = float(centred.pow(2).mean().sqrt())                  # the centred values' mean is 0
    close(group_advantages(r, "reinforce_pp", eps=0.0), centred / std)


def test_reinforce_pp_from_two_ranks_equals_one_rank():
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(4, 3, generator=gen)
    whole = group_advantages(r, "reinforce_pp")
    halves = r[:2], r[2:]

    def from_rank(mine, other):              # all_sum as two ranks see it: own + the other's
        seen = []
        group_advantages(other, "reinforce_pp", batch_sum=lambda x: seen.append(x) or x)
        queue = iter(seen)
        # the other rank's sums arrive in the same order (its count, then its squares)
        return group_advantages(mine, "reinforce_pp", batch_sum=lambda x: x + next(queue))

    close(torch.cat([from_rank(halves[0], halves[1]), from_rank(halves[1], halves[0])]), whole)


def test_tis_caps_the_ratio_and_mis_masks_what_passes_it():
    trainer = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    rollout = torch.log(torch.tensor([[0.5, 0.1, 0.3]]))       # ratios 1, 5, 3
    mask = torch.tensor([[1, 1, 0]])
    tis, st = rollout_correction("tis", trainer, rollout, mask, cap=2.0)
    close(tis, [[1.0, 2.0, 0.0]])
    assert st["capped_frac"] == 0.5 and st["ratio_mean"] == pytest.approx(3.0)
    mis, _ = rollout_correction("mis", trainer, rollout, mask, cap=2.0)
    close(mis, [[1.0, 0.0, 0.0]])
    assert rollout_correction("none", trainer, rollout, mask) == (None, {})


def test_overlong_penalty_ramps_over_the_buffer():
    combined = build_combined([{"name": "overlong", "max_tokens": 10, "buffer": 4}])
    ex = Example(id="x", prompt="p", answer="a")
    ids = [[[1] * n for n in (3, 6, 8, 10, 12)]]
    scores = combined.score_groups([ex], [["t"] * 5], completion_ids=ids)[0]
    assert [s["overall"] for s in scores] == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="max_tokens"):
        build_combined([{"name": "overlong"}])


def _step(tmp_path, tiny_vl, shapes_dir, *overrides):
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    (tmp_path / "len.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 40) / 40.0\n")
    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "train.batch_prompts=2", "train.steps=1",
                             f"train.out_dir={tmp_path / 'run'}", *overrides])
    cfg.rewards.append({"name": f"{tmp_path / 'len.py'}:length", "weight": 0.5})
    return grpo_step(build_run(cfg)[0], 1)


def test_mask_truncated_leaves_cut_completions_no_gradient(tmp_path, tiny_vl, shapes_dir):
    # 3 new tokens: a random tiny model ends almost no completion in time
    m = _step(tmp_path, tiny_vl, shapes_dir, "rollout.max_new_tokens=3", "algo.mask_truncated=true")
    assert m["update/truncated_masked_frac"] == pytest.approx(m["response/truncated_frac"])
    if m["update/truncated_masked_frac"] == 1.0:
        assert m["update/trained_rows"] == 0 and m["optim/grad_norm"] == 0.0


def test_tis_on_the_cpu_engine_weighs_tokens_by_a_ratio_of_one(tmp_path, tiny_vl, shapes_dir):
    m = _step(tmp_path, tiny_vl, shapes_dir, "rollout.max_new_tokens=8",
              "algo.rollout_correction=tis")
    # fp32 on one CPU: the engine's and the trainer's logprobs agree to ~1e-6, so w = 1
    assert m["rollout/correction_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert m["rollout/correction_capped_frac"] == 0.0 and m["optim/grad_norm"] > 0


HALF_SPREAD = '''
import zlib
def half(example, completion):
    """Spread only on about half of the prompts: the others score 0.5 whatever is written."""
    if zlib.crc32(example.id.encode()) % 2:
        return 0.5
    return min(len(completion), 40) / 40.0
'''


def test_dynamic_sampling_trains_only_groups_with_spread(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    (tmp_path / "half.py").write_text(HALF_SPREAD)
    out = {}
    for on in (False, True):
        cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                                 "rollout.group_size=4", "rollout.max_new_tokens=8",
                                 "train.batch_prompts=4", "train.steps=2", "train.seed=2",
                                 f"train.dynamic_sampling={str(on).lower()}",
                                 "train.dynamic_max_draws=6", f"train.out_dir={tmp_path / str(on)}"])
        cfg.rewards = [{"name": f"{tmp_path / 'half.py'}:half", "weight": 1.0}]
        run = build_run(cfg)[0]
        out[on] = [grpo_step(run, step) for step in (1, 2)]
    assert max(m["reward/zero_spread_frac"] for m in out[False]) > 0     # plain: some flat groups
    for m in out[True]:
        assert m["reward/zero_spread_frac"] == 0.0 and m["sampling/spread_groups"] == 4
        assert m["sampling/draws"] >= 1 and m["update/trained_rows"] == 16


def test_the_router_loss_of_a_moe_model_joins_the_update(tmp_path, tiny_dirs, shapes_dir):
    model = tiny_dirs("qwen3-vl-moe")
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    off = _step(tmp_path / "off", model, shapes_dir, "rollout.max_new_tokens=6")
    on = _step(tmp_path / "on", model, shapes_dir, "rollout.max_new_tokens=6",
               "algo.router_aux_coef=0.5")
    assert "loss/router_aux" not in off
    # a load-balancing loss is about 1 (top-k over E experts, balanced) and never below 0
    assert 0.5 < on["loss/router_aux"] < 10 and on["optim/grad_norm"] != off["optim/grad_norm"]


def test_the_router_loss_on_a_dense_model_is_refused(tmp_path, tiny_vl, shapes_dir):
    with pytest.raises(ValueError, match="has no router"):
        _step(tmp_path, tiny_vl, shapes_dir, "algo.router_aux_coef=0.01")
