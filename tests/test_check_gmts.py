"""`mmrlvr check-method gmts`: the shaper's own kept fraction and the kept tokens' H·|A| lift on
the tiny real model's sampled groups (recomputed by hand from the same rollouts), through the CLI
end to end, and the verdict's sides on hand-made groups."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch

from mmrlvr.core.method_check import CheckContext, CheckOptions
from mmrlvr.core.registry import METHOD_CHECKS
from mmrlvr.data import Example, load_jsonl

PARITY = "def reward(example, completion):\n    return float(len(completion) % 2)\n"
"""A user reward with spread on any model's text (the tiny model's accuracy is 0 everywhere)."""


def parity_config(tmp_path):
    from mmrlvr.config import Config

    (tmp_path / "parity.py").write_text(PARITY)
    cfg = Config()
    cfg.rewards = [{"name": f"{tmp_path / 'parity.py'}:reward", "weight": 1.0}]
    return cfg


def test_gmts_check_keeps_what_the_shaper_keeps_by_hand(policy, shapes_dir, tmp_path, monkeypatch):
    from mmrlvr.algo import group_advantages
    from mmrlvr.methods.gmts.check import verdict
    from mmrlvr.rollout.hf import HFRolloutEngine

    seen, real = [], HFRolloutEngine.generate
    monkeypatch.setattr(HFRolloutEngine, "generate",
                        lambda self, b, p: seen.append(real(self, b, p)) or seen[-1])
    rows = load_jsonl(shapes_dir / "train.jsonl")[:3]
    opts = CheckOptions(rows=3, group=4, max_new_tokens=8)
    result = METHOD_CHECKS.get("gmts")(CheckContext(rows, opts, lambda: policy, parity_config(tmp_path)))
    (out,) = seen
    mask = out.completion_mask.bool()
    n = int(mask.sum())
    assert result.figures["tokens"] == n and result.figures["fraction"] == 0.2
    assert abs(result.figures["kept_frac"] - math.ceil(0.2 * n) / n) < 1e-4
    texts = [str(t) for t in out.texts]
    rewards = torch.tensor([float(len(t) % 2) for t in texts]).view(3, 4)
    spread = rewards.max(1).values > rewards.min(1).values
    assert result.figures["groups_with_spread"] == float(spread.sum())
    adv = group_advantages(rewards).flatten()                                     # [N]
    proxy = out.stats["token_entropy"][:, :mask.shape[1]] * adv.abs().unsqueeze(1)
    top = proxy[mask].sort(descending=True).values[:math.ceil(0.2 * n)]
    assert abs(result.figures["proxy_kept_mean"] - float(top.mean())) < 1e-3
    if float(proxy[mask].mean()) > 0:
        assert abs(result.figures["proxy_lift"] - float(top.mean() / proxy[mask].mean())) < 1e-3
    assert (result.verdict, result.why) == verdict(result.figures)


def test_cli_runs_the_gmts_check_on_the_tiny_model(tiny_vl, shapes_dir, tmp_path):
    from mmrlvr.cli import main

    out, data = tmp_path / "gmts.json", str(shapes_dir / "train.jsonl")
    assert main(["check-method", "gmts", "--model", str(tiny_vl), "--data", data, "--rows", "2",
                 "--group", "4", "--max-new-tokens", "8", "--json", str(out)]) == 0
    got = json.loads(out.read_text())        # default rewards: a random model earns none of them
    assert got["verdict"] == "inactive" and got["figures"]["groups_with_spread"] == 0
    assert "carries advantage" in got["why"] and got["floors"] == {"kept_frac": 0.95, "proxy_lift": 1.2}
    (tmp_path / "parity.py").write_text(PARITY)
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{path: {tiny_vl}}}\ndata: {{train: {data}}}\n"
                      f"rewards: [{{name: '{tmp_path / 'parity.py'}:reward', weight: 1.0}}]\n"
                      "rollout: {group_size: 4, max_new_tokens: 8}\n"
                      "algo: {shaping: [{name: gmts, fraction: 0.5}]}\n")
    assert main(["check-method", "gmts", "--config", str(config), "--rows", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["figures"]["fraction"] == 0.5            # the config's
    assert main(["check-method", "gmts", "--config", str(config), "--rows", "2",
                 "--option", "fraction=1.0", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["figures"]["kept_frac"] == 1.0 and got["verdict"] == "inactive"
    assert "plain GRPO" in got["why"]


def group(rewards: list[float], entropy: torch.Tensor):
    """One prompt's group: rollouts with per-token entropy [G, C] (every token real) and scores."""
    G, C = entropy.shape
    rollouts = SimpleNamespace(completion_mask=torch.ones(G, C, dtype=torch.long),
                               stats={"token_entropy": entropy}, sample_logprobs=None)
    return rollouts, [[{"overall": r} for r in rewards]]


def test_gmts_verdict_on_hand_made_groups():
    from mmrlvr.methods.gmts.check import measure, verdict

    ex = [Example(id="a", prompt="q", answer="1")]
    entropy = torch.tensor([[4.0, 0.1, 0.1, 0.1, 0.1]] * 4)
    active = measure(*group([1.0, 0.0, 0.0, 0.0], entropy), ex, 0.2)
    assert active["kept_frac"] == 0.2 and active["kept_signal_frac"] == 1.0
    # the 4 kept tokens are the 4 first positions, the only ones with H 4
    assert active["entropy_lift"] == round(4.0 / ((4.0 + 0.4) / 5), 4)
    assert active["proxy_lift"] > 1.2 and verdict(active)[0] == "active"
    flat = measure(*group([1.0, 1.0, 1.0, 1.0], entropy), ex, 0.2)          # no reward spread
    assert flat["groups_with_spread"] == 0 and flat["kept_signal_frac"] == 0
    assert verdict(flat)[0] == "inactive" and "carries advantage" in verdict(flat)[1]
    everything = measure(*group([1.0, 0.0, 0.0, 0.0], entropy), ex, 1.0)
    assert everything["kept_frac"] == 1.0 and "plain GRPO" in verdict(everything)[1]
    uniform = measure(*group([1.0, 1.0, 0.0, 0.0], torch.ones(4, 5)), ex, 0.2)   # g the same everywhere
    assert uniform["proxy_lift"] == 1.0 and "uniform-random" in verdict(uniform)[1]
    assert verdict({**active, "tokens": 0.0})[0] == "inactive"
