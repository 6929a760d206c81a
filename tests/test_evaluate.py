"""Held-out evaluation figures recompute from the predictions they are made of."""
from __future__ import annotations

from mmrlvr.data import Example
from mmrlvr.train.evaluate import evaluate
from mmrlvr.rollout import make_engine


def test_eval_figures_match_predictions_and_split_closed_from_open(policy):
    examples = [
        Example(id=f"q{i}", prompt=f"What is {i} + 1?", answer=str(i + 1),
                meta={"family": "add" if i % 2 else "sum", "answer_type": "closed" if i < 3 else "open"})
        for i in range(6)
    ]
    res = evaluate(policy, make_engine("hf", policy), examples, max_new_tokens=6, batch_size=4,
                   samples=2, keep_predictions=True)
    preds = res["predictions"]
    assert [p["id"] for p in preds] == [e.id for e in examples]
    correct = [p["correct"] for p in preds]
    assert res["accuracy"] == sum(correct) / 6
    assert res["answer_type/closed"] == sum(correct[:3]) / 3
    assert res["answer_type/open"] == sum(correct[3:]) / 3
    assert res["family/add"] == sum(correct[1::2]) / 3
    assert 0.0 <= res["pass@2"] <= 1.0 and res["n"] == 6
    assert 0 < res["mean_length"] <= 6


def test_eval_scores_greedy_completions_with_a_given_reward(policy):
    from rewards.base import build_combined

    examples = [Example(id=f"q{i}", prompt=f"What is {i} + 1?", answer=str(i + 1)) for i in range(3)]
    reward = build_combined([{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1}])
    res = evaluate(policy, make_engine("hf", policy), examples, max_new_tokens=6, batch_size=2,
                   keep_predictions=True, reward=reward)
    by_hand = [reward.score(ex, [p["completion"]])[0] for ex, p in zip(examples, res["predictions"])]
    assert res["reward"] == sum(s["overall"] for s in by_hand) / 3
    assert res["reward/accuracy"] == res["accuracy"] and res["reward/format"] == res["format_rate"]
    assert "reward" not in evaluate(policy, make_engine("hf", policy), examples, max_new_tokens=6)


def test_the_eval_command_reports_a_named_reward(tiny_vl, shapes_dir, capsys):
    from mmrlvr.cli import main

    assert main(["eval", "--model", str(tiny_vl), "--data", str(shapes_dir / "test.jsonl"),
                 "--limit", "2", "--max-new-tokens", "4", "--reward", "accuracy",
                 "--reward", "format"]) == 0
    out = capsys.readouterr().out
    for key in ("reward ", "reward/accuracy ", "reward/format "):
        assert key in out, out
