"""DASH on PWSD: the gated backward recursion by hand, masking, off = PWSD bit for bit, one GRPO step."""
from __future__ import annotations

import math

import pytest
import torch

from mmrlvr.methods.transanytext.dash import DashOptions, dash_weights
from mmrlvr.methods.transanytext.pwsd import PWSD, pwsd_loss

D = [1.0, 2.0, 0.0, 4.0, 2.0]                   # per-token divergence, masked mean d̄ = 1.8


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_backward_recursion_matches_a_hand_computation():
    d, mask = torch.tensor([D]), torch.ones(1, 5)
    # β 0: every gate is 1/2; γ 1, no horizon: ŝ = [2.625, 3.25, 2.5, 5, 2], u = 1 + (ŝ − d)/1.8
    u, g = dash_weights(d, mask, beta=0.0, gamma=1.0, horizon=None, normalize=False)
    expected = [1 + 1.625 / 1.8, 1 + 1.25 / 1.8, 1 + 2.5 / 1.8, 1 + 1 / 1.8, 1.0]
    assert u[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert g[0].tolist() == [0.5] * 5
    m, _ = dash_weights(d, mask, beta=0.0, gamma=1.0, horizon=None, normalize=True)
    assert m[0].tolist() == pytest.approx([x * 5 / sum(expected) for x in expected], rel=1e-6)
    assert float(m.mean()) == pytest.approx(1.0)                       # loss scale kept
    # horizon 1: only the next token passes signal back
    u1, _ = dash_weights(d, mask, beta=0.0, gamma=1.0, horizon=1, normalize=False)
    assert u1[0].tolist() == pytest.approx([1 + 1 / 1.8, 1.0, 1 + 2 / 1.8, 1 + 1 / 1.8, 1.0], rel=1e-6)
    # β 1, γ 0.5, horizon 2: g_t = σ(d_t − 1.8); ahead_t = γ g1 d1 + γ² g1 g2 d2 (next two tokens)
    gs = [sig(x - 1.8) for x in D]
    ahead = [0.5 * gs[t + 1] * D[t + 1] + (0.25 * gs[t + 1] * gs[t + 2] * D[t + 2] if t + 2 < 5 else 0.0)
             if t + 1 < 5 else 0.0 for t in range(5)]
    ub, gb = dash_weights(d, mask, beta=1.0, gamma=0.5, horizon=2, normalize=False)
    assert gb[0].tolist() == pytest.approx(gs, rel=1e-6)
    assert ub[0].tolist() == pytest.approx([1 + a / 1.8 for a in ahead], rel=1e-6)
    assert ub[0, 2] > ub[0, 1]                         # token 2 leads into the 4.0 stretch


def test_padding_never_receives_or_passes_signal():
    big = 1e6                                          # divergence on padding must be ignored
    d = torch.tensor([D, D[:3] + [big, big], [1.0, 2.0, big, 4.0, 2.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 1, 1]])
    m, g = dash_weights(d, mask, beta=1.0, gamma=0.9, horizon=None)
    alone, _ = dash_weights(torch.tensor([D[:3]]), torch.ones(1, 3), beta=1.0, gamma=0.9, horizon=None)
    torch.testing.assert_close(m[1, :3], alone[0])     # right padding: as if the row were shorter
    assert m[1, 3:].tolist() == [0.0, 0.0] and g[1, 3:].tolist() == [0.0, 0.0]
    assert m[2, 2] == 0 and g[2, 2] == 0               # an interior hole receives nothing ...
    u, _ = dash_weights(d, mask, beta=1.0, gamma=0.9, horizon=None, normalize=False)
    assert float(u[2, 1]) == 1.0                       # ... and passes nothing back across it
    dbar = (1 + 2 + 4 + 2) / 4
    assert float(u[2, 3]) == pytest.approx(1 + 0.9 * sig(2.0 - dbar) * 2.0 / dbar, rel=1e-6)
    assert torch.isfinite(m).all()
    empty, _ = dash_weights(torch.zeros(1, 3), torch.zeros(1, 3))
    assert empty.tolist() == [[0.0, 0.0, 0.0]]


def distributions():
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(2, 4, 6, generator=gen).log_softmax(-1).requires_grad_(True)
    teacher = torch.randn(2, 4, 6, generator=gen).log_softmax(-1)
    ids = torch.randint(0, 6, (2, 4), generator=gen)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    return student, teacher, ids, mask


def test_off_is_pwsd_bit_for_bit_and_on_reweights_the_kl():
    student, teacher, ids, mask = distributions()
    off, st_off = pwsd_loss(student, teacher, ids, mask, alpha=1.0)
    # today's PWSD, written out: w_t·KL_t over the masked tokens
    gap = (teacher.gather(-1, ids[..., None]) - student.gather(-1, ids[..., None])).squeeze(-1)
    kl = (student.exp() * (student - teacher)).sum(-1)
    m = mask.float()
    assert torch.equal(off, (torch.sigmoid(gap).detach() * kl * m).sum() / m.sum())
    assert not any(k.startswith("dash_") for k in st_off)
    zero, _ = pwsd_loss(student, teacher, ids, mask, dash=DashOptions.parse({"gamma": 0.0}))
    assert torch.equal(zero, off)                                        # γ 0: m_t = 1 exactly
    on, st = pwsd_loss(student, teacher, ids, mask, dash=DashOptions.parse({"gamma": 0.9}))
    mult, _ = dash_weights(kl.detach(), mask, 1.0, 0.9, 8)
    expected = (torch.sigmoid(gap).detach() * mult * kl * m).sum() / m.sum()
    assert float(on.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    assert float(on.detach()) != float(off.detach())
    assert 0 < st["dash_gate_mean"] < 1 and 0 < st["dash_rose_frac"] < 1
    assert st["dash_rose_frac"] == pytest.approx(float(((mult > 1) * m).sum() / m.sum()))
    assert not st["weights"].requires_grad                              # stop-gradient on gates
    on.backward()
    assert student.grad[1, 3].abs().sum() == 0                           # padding gets no gradient


def test_dash_options_come_from_the_objective_config_with_clear_errors():
    assert PWSD().dash is None
    assert PWSD(dash={"gamma": 0.5, "horizon": None}).dash == DashOptions(1.0, 0.5, None, True)
    with pytest.raises(ValueError, match=r"objectives\[pwsd\]\.dash.*gama"):
        PWSD(dash={"gama": 0.9})
    with pytest.raises(ValueError, match=r"dash\.gamma must be in \[0, 1\]"):
        PWSD(dash={"gamma": 1.5})
    with pytest.raises(ValueError, match=r"dash\.horizon"):
        PWSD(dash={"horizon": 0})
    with pytest.raises(ValueError, match="mapping"):
        PWSD(dash=0.9)


@pytest.fixture(scope="module")
def banners_dir(tmp_path_factory):
    from mmrlvr.tasks.banners import make_banners

    out = tmp_path_factory.mktemp("banners-dash")
    make_banners(out, n_train=4, n_test=0, width=112, height=56, seed=1)
    return out


def test_a_grpo_step_runs_with_pwsd_and_dash(tmp_path, tiny_vl, banners_dir):
    import yaml

    from mmrlvr.config import load_config
    from mmrlvr.train.logger import read_metrics
    from mmrlvr.train.trainer import train

    cfg = {"model": {"path": str(tiny_vl), "modality": "image_translation"},
           "data": {"train": str(banners_dir / "train.jsonl")},
           "rollout": {"group_size": 2, "max_new_tokens": 6},
           "rewards": [{"name": "translation", "weight": 1.0}],
           "objectives": [{"name": "pwsd", "weight": 1.0, "dash": {"gamma": 0.9, "horizon": 4}}],
           "train": {"steps": 1, "batch_prompts": 2, "out_dir": str(tmp_path / "run")}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    train(load_config(tmp_path / "c.yaml"), progress=False)
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert row["objective/pwsd/rows"] == 4 and row["objective/pwsd"] > 0
    assert 0 < row["objective/pwsd/dash_gate_mean"] < 1
    assert 0 <= row["objective/pwsd/dash_rose_frac"] <= 1
    assert row["optim/grad_norm"] > 0
