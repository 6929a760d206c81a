"""Held-out evaluation figures recompute from the predictions they are made of."""
from __future__ import annotations

from mmrlvr.data import Example
from mmrlvr.evaluate import evaluate
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
