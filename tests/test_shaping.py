"""Token-level credit (mmrlvr.algo.shaping) and its plug-ins against hand computations."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mmrlvr.algo import grpo_loss
from mmrlvr.methods.cue_grpo.shaper import answer_form, strategy_cue
from mmrlvr.algo.shaping import SHAPERS, ShapeContext, build, token_credit


def ctx(texts, scores, mask, group_size, entropy=None, sample_logprobs=None):
    stats = {} if entropy is None else {"token_entropy": entropy}
    roll = SimpleNamespace(texts=texts, group_size=group_size, stats=stats,
                           sample_logprobs=sample_logprobs)
    return ShapeContext(roll, scores, mask)


def test_no_plugin_leaves_the_sequence_advantages_untouched():
    adv = torch.tensor([0.5, -0.5])
    credit, stats = token_credit(adv, torch.ones(2, 3), 0.2, 0.28, [], ctx([], [], None, 1))
    assert credit.advantages is adv and credit.weights is None and stats == {}
    assert (credit.clip_low, credit.clip_high) == (0.2, 0.28)


def test_token_advantages_and_weights_in_the_loss():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(2, 4, generator=gen, requires_grad=True)
    old = logp.detach() + 0.1 * torch.randn(2, 4, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv = torch.tensor([0.7, -1.2])
    seq, _ = grpo_loss(logp, old, adv, mask)
    tok, _ = grpo_loss(logp, old, adv.unsqueeze(1).expand(2, 4), mask)
    assert torch.equal(seq, tok)                       # [N] broadcast == the same [N, T]
    weights = torch.tensor([[1.0, 0.0, 2.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    weighted, _ = grpo_loss(logp, old, adv, mask, token_weights=weights)
    (g,) = torch.autograd.grad(weighted, logp)
    assert g[0, 1] == 0 and g[1, 0] == 0               # weight 0: no policy gradient there
    (g_plain,) = torch.autograd.grad(seq, logp)
    torch.testing.assert_close(g[0, 2], 2 * g_plain[0, 2])
    bounds, _ = grpo_loss(logp, old, adv, mask, clip_low=torch.tensor([[0.2], [0.2]]),
                          clip_high=torch.tensor([[0.28], [0.28]]))
    assert torch.equal(bounds, seq)                    # per-row bounds equal to the numbers


def test_gapo_widens_each_rollouts_bounds_by_its_advantage():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    (gapo,) = build([{"name": "gapo", "kappa": 0.5}])
    adv = torch.tensor([2.0, -0.4])
    credit, stats = token_credit(adv, mask, 0.2, 0.28, [gapo], ctx([], [], mask, 2))
    torch.testing.assert_close(credit.clip_high, torch.tensor([[0.28 * 2.0], [0.28 * 1.2]]))
    torch.testing.assert_close(credit.clip_low, torch.tensor([[0.2 * 2.0], [0.2 * 1.2]]))
    (big,) = build([{"name": "gapo", "kappa": 10}])
    credit, _ = token_credit(adv, mask, 0.2, 0.28, [big], ctx([], [], mask, 2))
    assert float(credit.clip_low.max()) == pytest.approx(0.9)          # capped below 1
    assert stats["shaping/gapo/mean_abs_delta_adv"] == 0.0              # advantages untouched


def test_gmts_keeps_the_top_tokens_by_entropy_times_advantage():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    entropy = torch.tensor([[0.1, 2.0, 0.5, 1.0], [3.0, 0.2, 9.0, 9.0]])
    adv = torch.tensor([1.0, -0.5])             # proxies: .1 2 .5 1 | 1.5 .1 (padding ignored)
    (gmts,) = build([{"name": "gmts", "fraction": 0.5}])
    credit, stats = token_credit(adv, mask, 0.2, 0.28, [gmts], ctx([], [], mask, 2, entropy))
    kept = credit.weights > 0
    assert kept.tolist() == [[False, True, False, True], [True, False, False, False]]
    assert float(credit.weights[kept][0]) == pytest.approx(6 / 3)     # n / n_kept
    assert stats["shaping/gmts/kept_frac"] == pytest.approx(3 / 6)


def test_cue_grpo_moves_credit_towards_the_rare_correct_strategy():
    texts = ["<think>2+2=4</think><answer>4</answer>", "<think>2+2=4</think><answer>4</answer>",
             "<think>8/2=4</think><answer>4</answer>", "<answer>5</answer>"]
    assert strategy_cue(texts[0]) == ("integer", "+=") and strategy_cue(texts[2]) == ("integer", "/=")
    assert [answer_form(a) for a in ("3", "0.5", "1/2", "\\frac{1}{2}", "x+1", "blue", None)] == \
        ["integer", "decimal", "fraction", "fraction", "expression", "text", "none"]
    scores = [[{"overall": 1.0, "accuracy": 1.0}] * 3 + [{"overall": 0.0, "accuracy": 0.0}]]
    mask = torch.ones(4, 2)
    adv = torch.tensor([0.5, 0.5, 0.5, -1.5])
    (cue,) = build([{"name": "cue_grpo", "alpha": 1.0}])
    credit, stats = token_credit(adv, mask, 0.2, 0.28, [cue], ctx(texts, scores, mask, 4))
    w = [1 / 2, 1 / 2, 1.0]                      # clusters of 2 and 1, |c|^-1
    scale = 1.5 / sum(0.5 * x for x in w)
    want = [0.5 * x * scale for x in w]
    torch.testing.assert_close(credit.advantages[:3, 0], torch.tensor(want))
    assert float(credit.advantages[:3, 0].sum()) == pytest.approx(1.5)   # total credit kept
    assert float(credit.advantages[3, 0]) == -1.5                        # wrong: untouched
    assert stats["shaping/cue_grpo/clusters_mean"] == 2


def test_plugins_run_in_stage_order_and_unknown_names_are_clear():
    order = [s.name for s in build([{"name": "gapo"}, {"name": "gmts"}, {"name": "cue_grpo"}])]
    assert order == ["cue_grpo", "gmts", "gapo"]
    assert SHAPERS.names() == ["cliff", "cue_grpo", "gapo", "gmts", "om_grpo", "opdvr"]
    with pytest.raises(KeyError, match="unknown shaping method 'gpao'.*did you mean 'gapo'"):
        build([{"name": "gpao"}])
    with pytest.raises(ValueError, match="fraction"):
        build([{"name": "gmts", "fraction": 0}])


def test_a_grpo_step_runs_with_every_plugin_and_logs_what_each_changed(tmp_path, tiny_vl,
                                                                        shapes_dir):
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    (tmp_path / "shaped.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 40) / 40.0\n")
    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "rollout.max_new_tokens=8",
                             "train.batch_prompts=2", "train.steps=1", "optim.lr=1e-2",
                             f"train.out_dir={tmp_path / 'run'}"])
    cfg.rewards.append({"name": f"{tmp_path / 'shaped.py'}:length", "weight": 0.5})
    cfg.algo.shaping = [{"name": "gmts", "fraction": 0.5}, {"name": "gapo"}, {"name": "cue_grpo"}]
    run, _ = build_run(cfg)
    metrics = grpo_step(run, 1)
    assert [s.name for s in run.shapers] == ["cue_grpo", "gmts", "gapo"]
    assert metrics["shaping/gmts/kept_frac"] == pytest.approx(0.5, abs=0.1)
    assert metrics["shaping/gapo/clip_high_mean"] > 0.28
    assert "shaping/cue_grpo/groups_reweighted" in metrics
    assert metrics["optim/grad_norm"] > 0 and metrics["update/skipped"] == 0.0
