"""GRPO's pure tensor functions against hand computations: advantages, KL, surrogate, aggregation."""
from __future__ import annotations

import math

import pytest
import torch

from mmrlvr.algo.advantages import group_advantages, zero_spread_fraction
from mmrlvr.algo.loss import aggregate, clipped_surrogate, grpo_loss, kl_estimate

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def close(actual: torch.Tensor, expected, tol: float = 1e-9) -> None:
    torch.testing.assert_close(actual, t(expected) if not torch.is_tensor(expected) else expected,
                               rtol=0, atol=tol)


# A masked [3, 4] batch used by the aggregation tests:
#   row 0: 4 tokens 1+2+3+4 = 10, row 1: 2 tokens 5+6 = 11, row 2: 1 token 9.
VALUES = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]]
MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]


# --- advantages -----------------------------------------------------------------------------

def test_grpo_advantage_uses_population_std_plus_eps():
    rewards = t([[2.0, 0.0, 2.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # row 0: mean 1, population std 1 (sample std would be 1.1547); eps 0.25 -> A = ±1/1.25 = ±0.8
    # row 1: mean 0.25, centred [0.75, -0.25, -0.25, -0.25], population var 0.75/4 = 0.1875,
    #        std √3/4; 1/(√3/4 + 1/4) = 4/(√3+1) = 2(√3−1) = 1.4641016
    #        A = [0.75·1.4641016, -0.25·1.4641016, ...] = [1.0980762, -0.3660254, ...]
    k = 2 * (math.sqrt(3) - 1)
    adv = group_advantages(rewards, "grpo", eps=0.25)
    close(adv, [[0.8, -0.8, 0.8, -0.8], [0.75 * k, -0.25 * k, -0.25 * k, -0.25 * k]])


def test_grpo_advantage_with_default_eps_is_nearly_unit_std():
    rewards = t([[1.0, 0.0, 0.0, 0.0]])
    adv = group_advantages(rewards)           # eps 1e-6: A ≈ [√3, -1/√3, -1/√3, -1/√3]
    close(adv, [[math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]], tol=1e-5)
    assert float(adv.mean()) == pytest.approx(0.0, abs=1e-12)


def test_drgrpo_advantage_is_centred_reward_without_std():
    rewards = t([[2.0, 0.0, 2.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    close(group_advantages(rewards, "drgrpo"), [[1.0, -1.0, 1.0, -1.0], [0.75, -0.25, -0.25, -0.25]])


@pytest.mark.parametrize("kind", ["grpo", "drgrpo"])
def test_zero_spread_group_gets_all_zero_advantages(kind):
    rewards = t([[0.5, 0.5, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0]])
    adv = group_advantages(rewards, kind)
    assert torch.equal(adv[:2], torch.zeros(2, 4, dtype=F64))
    assert torch.isfinite(adv).all()
    assert adv[2].abs().min() > 0          # the group with spread keeps its signal


@pytest.mark.parametrize("shape", [(4,), (2, 2, 2), ()])
def test_advantages_reject_non_2d_rewards(shape):
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        group_advantages(torch.zeros(shape))


def test_unknown_advantage_kind_raises():
    with pytest.raises(ValueError, match="ppo"):
        group_advantages(torch.zeros(2, 4), "ppo")


def test_zero_spread_fraction_counts_constant_groups():
    rewards = t([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0],
                 [0.3, 0.3, 0.3, 0.2]])
    assert zero_spread_fraction(rewards) == 0.5          # groups 0 and 2 of 4
    assert zero_spread_fraction(t([[0.0, 1.0]])) == 0.0
    assert zero_spread_fraction(t([[0.7, 0.7]])) == 1.0


# --- KL estimators ----------------------------------------------------------------------------

def test_kl_k1_and_k3_hand_values():
    log2 = math.log(2)
    logp = t([[math.log(0.5), math.log(0.25)]])
    ref = t([[math.log(0.25), math.log(0.5)]])
    # k1 = logp − ref = [log 2, −log 2]
    close(kl_estimate(logp, ref, "k1"), [[log2, -log2]])
    # k3 = e^d − d − 1 with d = ref − logp = [−log 2, log 2]:
    #   [0.5 + log 2 − 1, 2 − log 2 − 1] = [0.1931472, 0.3068528]
    close(kl_estimate(logp, ref, "k3"), [[0.5 + log2 - 1, 1 - log2]])
    close(kl_estimate(logp, ref), [[0.5 + log2 - 1, 1 - log2]])      # k3 is the default


def test_kl_k3_is_nonnegative_and_zero_when_equal():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(64, 16, generator=gen, dtype=F64) * 5
    ref = -torch.rand(64, 16, generator=gen, dtype=F64) * 5
    assert (kl_estimate(logp, ref, "k3") >= 0).all()
    assert torch.equal(kl_estimate(logp, logp, "k3"), torch.zeros(64, 16, dtype=F64))
    assert torch.equal(kl_estimate(logp, logp, "k1"), torch.zeros(64, 16, dtype=F64))


def test_unknown_kl_estimator_raises():
    with pytest.raises(ValueError, match="k2"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k2")


# --- clipped surrogate ------------------------------------------------------------------------

def _surrogate(ratios, advs, clip_low=0.2, clip_high=0.28):
    logp = t([[math.log(r) for r in ratios]]).requires_grad_()
    loss, clipped = clipped_surrogate(logp, torch.zeros_like(logp), t(advs), clip_low, clip_high)
    return logp, loss, clipped


@pytest.mark.parametrize("ratio, adv, loss, clipped", [
    # inside [0.8, 1.28]: loss = −ρA
    (1.1, 2.0, -2.2, 0.0),
    (0.9, -1.0, 0.9, 0.0),
    # above 1+ε_high with A > 0: capped at 1.28·A
    (1.5, 1.0, -1.28, 1.0),
    # below 1−ε_low with A < 0: capped at 0.8·A -> loss −(0.8·−1) = 0.8
    (0.5, -1.0, 0.8, 1.0),
    # the pessimistic side is never clipped: ρ high with A < 0, ρ low with A > 0
    (1.5, -1.0, 1.5, 0.0),
    (0.5, 1.0, -0.5, 0.0),
    # A = 0: nothing to clip
    (2.0, 0.0, 0.0, 0.0),
])
def test_clipped_surrogate_hand_cases(ratio, adv, loss, clipped):
    _, got_loss, got_clipped = _surrogate([ratio], [adv])
    close(got_loss, [[loss]], tol=1e-12)
    close(got_clipped, [[clipped]])


def test_clip_higher_is_asymmetric():
    # ε_low 0.2, ε_high 0.28: ρ 1.25 with A > 0 stays unclipped, ρ 1.3 is capped at 1.28
    _, loss, clipped = _surrogate([1.25, 1.3], [1.0])
    close(loss, [[-1.25, -1.28]], tol=1e-12)
    close(clipped, [[0.0, 1.0]])
    # symmetric PPO (0.2, 0.2) would clip ρ 1.25 to 1.2
    _, loss, clipped = _surrogate([1.25], [1.0], clip_low=0.2, clip_high=0.2)
    close(loss, [[-1.2]], tol=1e-12)
    close(clipped, [[1.0]])
    # the low side still uses ε_low = 0.2: ρ 0.75 with A < 0 is clipped to 0.8, ρ 0.85 is not
    _, loss, clipped = _surrogate([0.75, 0.85], [-1.0])
    close(loss, [[0.8, 0.85]], tol=1e-12)
    close(clipped, [[1.0, 0.0]])


def test_clipped_tokens_carry_no_gradient():
    # d(−ρA)/d logp = −ρA inside the bound, 0 where the clip is active
    logp, loss, _ = _surrogate([1.1, 1.5, 0.5, 1.5], [2.0])
    loss.sum().backward()
    close(logp.grad, [[-2.2, 0.0, -1.0, 0.0]], tol=1e-12)
    logp, loss, _ = _surrogate([0.5, 0.9, 1.5], [-1.0])
    loss.sum().backward()
    close(logp.grad, [[0.0, 0.9, 1.5]], tol=1e-12)


def test_surrogate_broadcasts_one_advantage_per_row():
    logp = t([[0.0, 0.0], [0.0, 0.0]])
    loss, clipped = clipped_surrogate(logp, logp, t([1.0, -3.0]))
    close(loss, [[-1.0, -1.0], [3.0, 3.0]])
    close(clipped, [[0.0, 0.0], [0.0, 0.0]])


# --- aggregation ------------------------------------------------------------------------------

def test_aggregate_token_mode_is_mean_over_unmasked_tokens():
    # (10 + 11 + 9) / 7 tokens
    close(aggregate(t(VALUES), t(MASK), "token"), 30 / 7)
    close(aggregate(t(VALUES), torch.tensor(MASK, dtype=torch.bool)), 30 / 7)   # default, bool mask


def test_aggregate_seq_mode_is_mean_of_per_sequence_means():
    # per-sequence means 10/4 = 2.5, 11/2 = 5.5, 9/1 = 9 -> (2.5 + 5.5 + 9) / 3 = 17/3
    close(aggregate(t(VALUES), t(MASK), "seq"), 17 / 3)


def test_aggregate_seq_sum_norm_divides_by_constant_budget():
    # 30 / (3 sequences · norm_len)
    close(aggregate(t(VALUES), t(MASK), "seq-sum-norm", norm_len=4), 30 / 12)
    close(aggregate(t(VALUES), t(MASK), "seq-sum-norm", norm_len=8), 30 / 24)
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(t(VALUES), t(MASK), "seq-sum-norm")


def test_aggregate_token_and_seq_modes_differ_on_uneven_lengths():
    # the reason token mode is the default: long sequences are not down-weighted per token
    assert float(aggregate(t(VALUES), t(MASK), "token")) != float(aggregate(t(VALUES), t(MASK), "seq"))


def test_unknown_aggregation_mode_raises():
    with pytest.raises(ValueError, match="mean"):
        aggregate(t(VALUES), t(MASK), "mean")
    with pytest.raises(ValueError, match="foo"):
        grpo_loss(t(VALUES), t(VALUES), t([1.0, 1.0, 1.0]), t(MASK), loss_agg="foo")


MICRO_SPLITS = [[[0], [1, 2]], [[0], [1], [2]], [[2, 0], [1]]]


@pytest.mark.parametrize("split", MICRO_SPLITS)
@pytest.mark.parametrize("mode", ["token", "seq", "seq-sum-norm"])
def test_micro_batch_aggregates_sum_to_whole_batch(mode, split):
    values, mask = t(VALUES), t(MASK)
    whole = aggregate(values, mask, mode, norm_len=4)
    parts = [aggregate(values[rows], mask[rows], mode, norm_len=4, total_tokens=7.0, total_seqs=3)
             for rows in split]
    close(sum(parts), whole)
    expected = {"token": 30 / 7, "seq": 17 / 3, "seq-sum-norm": 30 / 12}[mode]
    close(whole, expected)


def _random_batch(seed: int, n: int = 6, T: int = 5):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, T, generator=gen, dtype=F64) * 3
    old = logp + (torch.rand(n, T, generator=gen, dtype=F64) - 0.5) * 0.8   # ratios e^±0.4
    ref = logp + (torch.rand(n, T, generator=gen, dtype=F64) - 0.5)
    adv = torch.randn(n, generator=gen, dtype=F64)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("mode", ["token", "seq", "seq-sum-norm"])
def test_grpo_loss_gradient_accumulates_over_micro_batches(mode):
    logp, old, ref, adv, mask = _random_batch(1)
    kw = dict(loss_agg=mode, norm_len=5, beta=0.05)

    full = logp.clone().requires_grad_()
    loss, stats = grpo_loss(full, old, adv, mask, ref_logp=ref, **kw)
    loss.backward()
    assert 0 < stats["clip_frac"] < 1           # the example exercises both sides of the clip

    acc = logp.clone().requires_grad_()
    total_loss = 0.0
    for rows in ([0, 1], [2, 3, 4], [5]):
        part, _ = grpo_loss(acc[rows], old[rows], adv[rows], mask[rows],
                            ref_logp=ref[rows], **kw,
                            total_tokens=float(mask.sum()), total_seqs=mask.shape[0])
        part.backward()
        total_loss += float(part.detach())
    assert total_loss == pytest.approx(float(loss.detach()), abs=1e-12)
    close(acc.grad, full.grad, tol=1e-12)


# --- the GRPO loss ----------------------------------------------------------------------------

def test_grpo_loss_adds_beta_times_k3_kl():
    logp = t([[0.0, 0.0]])
    ref = t([[math.log(0.5), math.log(2.0)]])
    mask = t([[1, 1]])
    # surrogate at ratio 1 with A = 1: −1 per token.
    # k3 with d = ref − logp: [0.5 − log 0.5 − 1, 2 − log 2 − 1], mean = (2.5 − 2)/2 = 0.25
    loss, stats = grpo_loss(logp, logp, t([1.0]), mask, beta=0.1, ref_logp=ref)
    close(loss, -1.0 + 0.1 * 0.25, tol=1e-12)        # −0.975
    assert stats["kl"] == pytest.approx(0.25, abs=1e-12)
    # k1 on the same tokens: [log 2, −log 2] averages to 0
    loss, stats = grpo_loss(logp, logp, t([1.0]), mask, beta=0.1, ref_logp=ref, kl_estimator="k1")
    close(loss, -1.0, tol=1e-12)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-12)


def test_grpo_loss_with_beta_needs_reference_logprobs():
    logp = t([[0.0, 0.0]])
    with pytest.raises(ValueError, match="reference"):
        grpo_loss(logp, logp, t([1.0]), t([[1, 1]]), beta=0.1)


def test_grpo_loss_with_beta_zero_ignores_reference():
    logp = t([[0.0, 0.0]])
    ref = t([[math.log(0.5), math.log(2.0)]])
    loss, stats = grpo_loss(logp, logp, t([1.0]), t([[1, 1]]), ref_logp=ref)
    close(loss, -1.0)
    assert "kl" not in stats


def test_unknown_kl_estimator_in_grpo_loss_raises():
    logp = t([[0.0]])
    with pytest.raises(ValueError, match="k9"):
        grpo_loss(logp, logp, t([1.0]), t([[1]]), beta=0.1, ref_logp=logp, kl_estimator="k9")


def test_on_policy_loss_is_minus_token_mean_advantage_and_its_gradient():
    adv = t([1.0, -2.0, 0.5])
    logp = (-t(VALUES) / 10).requires_grad_()
    loss, stats = grpo_loss(logp, logp.detach(), adv, t(MASK))
    # ratio 1 everywhere: −(4·1 + 2·(−2) + 1·0.5) / 7 tokens = −0.5/7
    close(loss, -0.5 / 7, tol=1e-12)
    assert stats["clip_frac"] == 0.0
    assert stats["approx_kl_old"] == pytest.approx(0.0, abs=1e-15)
    loss.backward()
    # d loss / d logp_it = −A_i · M_it / 7
    expected = -adv[:, None] * t(MASK) / 7
    close(logp.grad, expected, tol=1e-12)
    assert torch.equal(logp.grad[t(MASK) == 0], torch.zeros(5, dtype=F64))


def test_grpo_loss_clip_fraction_counts_only_unmasked_tokens():
    # row 0: ratios [1.5, 1.0] with A = 1 -> one clipped; the masked third token (ratio 2) is ignored
    logp = t([[math.log(1.5), 0.0, math.log(2.0)]])
    loss, stats = grpo_loss(logp, torch.zeros_like(logp), t([1.0]), t([[1, 1, 0]]))
    assert stats["clip_frac"] == pytest.approx(0.5)
    close(loss, -(1.28 + 1.0) / 2, tol=1e-12)


def test_zero_spread_group_has_exactly_zero_advantage_despite_rounding():
    """Eight equal rewards of 0.9 (not exact in binary) must not leave rounding residues."""
    from mmrlvr.algo import group_advantages

    rewards = torch.tensor([[0.9] * 8, [0.9 * 1 + 0.1 * 1] * 7 + [0.1]], dtype=torch.float32)
    for kind in ("grpo", "drgrpo"):
        adv = group_advantages(rewards, kind)
        assert torch.equal(adv[0], torch.zeros(8))
        assert (adv[1] != 0).all()


def test_gspo_sequence_ratio_has_gspo_value_and_gradient():
    """ratio 'sequence' with loss_agg 'seq': the loss is GSPO's −mean_i min(s_i·A_i, clip(s_i)·A_i)
    with s_i = exp(mean_t (logp − old)), and its gradient is GSPO's (computed here through s_i
    itself, not through the GSPO-token form)."""
    from mmrlvr.algo.loss import grpo_loss

    torch.manual_seed(0)
    old = torch.randn(3, 5) * 0.1 - 1.0
    base = old + torch.randn(3, 5) * 0.002
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 2.0])
    lo, hi = 3e-4, 4e-4
    a = base.clone().requires_grad_(True)
    loss, _ = grpo_loss(a, old, adv, mask, clip_low=lo, clip_high=hi, loss_agg="seq",
                        ratio="sequence")
    loss.backward()
    b = base.clone().requires_grad_(True)
    m = mask.float()
    s = torch.exp(((b - old) * m).sum(1) / m.sum(1))                          # [N]
    want = -torch.minimum(s * adv, torch.clamp(s, 1 - lo, 1 + hi) * adv).mean()
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(a.grad * m, b.grad * m)
    assert (a.grad * m).abs().sum() > 0          # some sequences inside the bounds carry gradient
    far = old + torch.randn(3, 5) * 0.3          # where token ratios spread, the objectives differ
    token, _ = grpo_loss(far, old, adv, mask, loss_agg="seq")
    seq, _ = grpo_loss(far, old, adv, mask, loss_agg="seq", ratio="sequence")
    assert abs(float(token - seq)) > 1e-3
