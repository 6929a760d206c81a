"""Run reports: every plot has axis labels with units, whole-number step ticks on short runs,
and a title that names only what it draws; SFT runs write report.md and plots like GRPO runs
(the PWSD stage's report: tests/test_pwsd.py)."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest
import yaml

from mmrlvr.train.report import GRPO_PANELS, SFT_PANELS, figure, objective_panels, write_report
from test_metrics_doc import undocumented


def _rows(steps: int, eval_reward: bool) -> list[dict]:
    rows = [{"step": 0, "eval/accuracy": 0.2, **({"eval/reward": 0.3} if eval_reward else {})}]
    for s in range(1, steps + 1):
        rows.append({"step": s, "reward/mean": 0.1 * s, "reward/accuracy": 0.05 * s,
                     "response/length_mean": 40.0 - s, "response/length_max": 48.0,
                     "loss/kl": 0.01 * s, "rollout/logprob_gap": 0.002, "loss/clip_frac": 0.1,
                     "policy/entropy": 1.5, "reward/zero_spread_frac": 0.25,
                     "objective/pwsd": 0.4 / s, "sft/loss": 2.0 / s, "optim/lr": 1e-4})
    rows.append({"step": steps, "eval/accuracy": 0.4, **({"eval/reward": 0.5} if eval_reward else {})})
    return rows


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_reward_title_says_held_out_only_when_a_held_out_line_is_drawn():
    reward = next(p for p in GRPO_PANELS if p.name == "reward")
    fig = figure(reward, _rows(3, eval_reward=False))
    ax = fig.axes[0]
    assert ax.get_title() == "Mean total reward: training batch"
    assert _legend(ax) == ["training batch (reward/mean)"] and len(ax.lines) == 1
    plt.close(fig)
    fig = figure(reward, _rows(3, eval_reward=True))
    ax = fig.axes[0]
    assert ax.get_title() == "Mean total reward: training batch and greedy held-out"
    assert _legend(ax) == ["training batch (reward/mean)", "greedy held-out (eval/reward)"]
    assert list(ax.lines[1].get_xdata()) == [0, 3]                # the held-out points
    plt.close(fig)


@pytest.mark.parametrize("panel", [*GRPO_PANELS, *SFT_PANELS], ids=lambda p: p.name)
def test_every_panel_has_labelled_axes_and_whole_step_ticks(panel):
    rows = _rows(3, eval_reward=True)
    fig = figure(panel, rows, xlabel="SFT step" if panel in SFT_PANELS else "step")
    assert fig is not None
    ax = fig.axes[0]
    fig.canvas.draw()
    assert ax.get_xlabel() in ("step", "SFT step") and ax.get_ylabel()
    unit = ax.get_ylabel()
    assert any(word in unit for word in ("reward", "fraction", "tokens", "nats", "learning rate")), unit
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks     # no step 0.5
    drawn = [label.split(" (")[0] for label in _legend(ax)]
    for label in drawn:                                   # the title names each drawn series
        assert label in ax.get_title(), (label, ax.get_title())
    plt.close(fig)


def test_a_panel_the_run_logged_nothing_for_is_left_out_and_objectives_get_theirs():
    rows = [{"step": 1, "sft/loss": 1.0}]
    assert figure(GRPO_PANELS[0], rows) is None
    panels = objective_panels(_rows(2, eval_reward=False))
    assert [(p.name, p.title(["objective/pwsd"])) for p in panels] == [
        ("objective_pwsd", "Objective pwsd: training batch")]


def test_a_long_run_gets_its_moving_average_named():
    rows = [{"step": s, "reward/mean": s % 3 / 3} for s in range(1, 41)]
    ax = figure(GRPO_PANELS[0], rows).axes[0]
    assert _legend(ax) == ["training batch (reward/mean)", "training batch (10-step mean)"]
    plt.close(ax.figure)


def test_write_report_links_each_plot(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                     for r in _rows(3, eval_reward=False)))
    path = write_report(tmp_path, {"steps": 3, "pwsd": {"steps": 2}}, title="SFT run x",
                        panels=SFT_PANELS, xlabel="SFT step")
    text = path.read_text()
    assert text.startswith("# SFT run x")
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["accuracy.png", "lr.png", "objective_pwsd.png", "sft_loss.png"]
    for name in names:
        assert f"](plots/{name})" in text
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3


def test_an_sft_run_writes_its_report_plots_and_documented_metrics(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.config import load_config
    from mmrlvr.train.sft import sft

    cfg = {"model": {"path": str(tiny_vl)},
           "data": {"train": str(shapes_dir / "train.jsonl"), "eval": str(shapes_dir / "test.jsonl"),
                    "eval_limit": 2},
           "rollout": {"max_new_tokens": 6}, "train": {"report_to": []},
           "sft": {"steps": 3, "batch_size": 4, "out_dir": str(tmp_path / "sft")}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    summary = sft(load_config(tmp_path / "c.yaml"), progress=False)
    run = tmp_path / "sft"
    report = (run / "report.md").read_text()
    assert report.startswith("# SFT run sft") and "| train_rows | 96 |" in report
    for name in ("sft_loss", "accuracy", "lr"):
        assert (run / "plots" / f"{name}.png").stat().st_size > 1000
        assert f"](plots/{name}.png)" in report
    assert json.loads((run / "summary.json").read_text())["accuracy_end"] == summary["accuracy_end"]
    keys = {k for line in (run / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert {"sft/loss", "optim/lr", "optim/grad_norm", "eval/accuracy"} <= keys
    assert undocumented(keys) == []
