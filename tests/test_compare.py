"""`mmrlvr compare`: paired differences, intervals and McNemar against hand computations."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mmrlvr.compare import CompareError, compare, markdown, parse_arms, run
from mmrlvr.core.stats import mcnemar_exact, paired_bootstrap


def write_run(root, name, correct, rewards=None, step=5, set_name=None):
    folder = root / name / "eval" if set_name is None else root / name / "eval" / set_name
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, c in enumerate(correct):
        row = {"id": f"q{i}", "correct": bool(c), "completion": "", "prompt": "", "gold": ""}
        if rewards is not None:
            row["reward"] = rewards[i]
        rows.append(row)
    (folder / f"step-{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "step-0.jsonl").write_text("".join(json.dumps({**r, "correct": False}) + "\n"
                                                 for r in rows))   # an earlier eval: not used
    return str(root / name)


def test_paired_bootstrap_and_mcnemar_by_hand():
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)
    a, b = np.array([1, 0, 1, 0, 1.0]), np.array([1, 1, 1, 1, 0.0])
    mean, (lo, hi) = paired_bootstrap(a, b, n_boot=4000, seed=0)
    assert mean == pytest.approx(0.2)
    assert lo < 0.2 < hi and lo >= -1 and hi <= 1
    with pytest.raises(ValueError):
        paired_bootstrap(a, b[:3])


def test_one_run_per_arm_is_paired_by_question(tmp_path):
    base = write_run(tmp_path, "grpo", [1, 0, 0, 1, 0, 0, 1, 0], rewards=[0.5] * 8)
    new = write_run(tmp_path, "ncgrpo", [1, 1, 1, 1, 0, 1, 1, 0], rewards=[0.75] * 8)
    report = compare(parse_arms([base, new], []), n_boot=1000)
    block = report["sets"]["eval"]
    assert block["questions"] == 8 and block["left_out"] == 0
    base_row, row = block["rows"]
    assert base_row["accuracy"] == pytest.approx(3 / 8) and "diff_points" not in base_row
    assert row["diff_points"] == pytest.approx(100 * 3 / 8)
    assert (row["worse"], row["better"]) == (0, 3)
    assert row["mcnemar_p"] == pytest.approx(2 / 8)            # 3 discordant, all one way
    assert row["reward_diff"] == pytest.approx(0.25) and row["reward_diff_ci95"] == [0.25, 0.25]
    table = markdown(report)
    assert "| ncgrpo | 1 | 0.750 | +37.5 |" in table and "(baseline)" in table


def test_seeds_pool_into_a_mean_with_an_interval(tmp_path):
    base = [write_run(tmp_path, f"g{s}", c) for s, c in enumerate([[1, 0, 0, 0], [0, 1, 0, 0]])]
    arm = [write_run(tmp_path, f"n{s}", c) for s, c in enumerate([[1, 1, 0, 0], [1, 1, 1, 0]])]
    report = compare(parse_arms([], [f"grpo={','.join(base)}", f"nc={','.join(arm)}"]), n_boot=500)
    base_row, row = report["sets"]["eval"]["rows"]
    assert (base_row["seeds"], row["seeds"]) == (2, 2)
    assert row["accuracy"] == pytest.approx(0.625)
    half = 12.706 * math.sqrt(((0.5 - 0.625) ** 2 + (0.75 - 0.625) ** 2) / 1) / math.sqrt(2)
    assert row["accuracy_ci95_half"] == pytest.approx(half, rel=1e-3)
    assert row["diff_points"] == pytest.approx(100 * (0.625 - 0.25))
    assert (row["worse"], row["better"]) == (0 + 0, 1 + 2)     # seed k paired with seed k, pooled


def test_eval_out_files_and_eval_sets_and_missing_questions(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"metrics": {}, "predictions": [
        {"id": "x", "correct": True, "reward": 0.8}, {"id": "y", "correct": False, "reward": 0.2}]}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"metrics": {}, "predictions": [
        {"id": "x", "correct": True, "reward": 0.9}, {"id": "z", "correct": True, "reward": 1.0},
        {"id": "y", "correct": True, "reward": 0.6}]}))
    block = compare(parse_arms([str(a), str(b)], []), n_boot=200)["sets"]["eval"]
    assert block["questions"] == 2 and block["left_out"] == 1
    assert block["rows"][1]["reward_diff"] == pytest.approx((0.1 + 0.4) / 2)
    r1 = write_run(tmp_path, "r1", [1, 0], set_name="ood")
    r2 = write_run(tmp_path, "r2", [1, 1], set_name="ood")
    assert list(compare(parse_arms([r1, r2], []))["sets"]) == ["ood"]


def test_bad_inputs_name_what_is_wrong(tmp_path):
    with pytest.raises(CompareError, match="at least two"):
        parse_arms([str(tmp_path)], [])
    with pytest.raises(CompareError, match="NAME=RUN"):
        parse_arms([str(tmp_path)], ["oops"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="no per-question eval records"):
        run([str(tmp_path / "empty"), str(tmp_path / "empty")], [])
    with pytest.raises(CompareError, match="no such run dir"):
        run([str(tmp_path / "nope"), str(tmp_path / "nope")], [])


def test_plot_and_json_are_written(tmp_path):
    base = write_run(tmp_path, "a", [1, 0, 1, 0])
    new = write_run(tmp_path, "b", [1, 1, 1, 0])
    table = run([base, new], [], json_out=str(tmp_path / "r.json"), plot_out=str(tmp_path / "r.png"))
    assert "| b | 1 |" in table
    assert json.loads((tmp_path / "r.json").read_text())["baseline"] == "a"
    assert (tmp_path / "r.png").stat().st_size > 1000


def write_pass_run(root, name, correct, passed, set_name=None, k=4):
    folder = root / name / "eval" if set_name is None else root / name / "eval" / set_name
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"q{i}", "correct": bool(c), "passed": bool(p), "k": k}
            for i, (c, p) in enumerate(zip(correct, passed))]
    (folder / "step-3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(root / name)


def test_pass_at_k_rows_by_hand(tmp_path):
    base = write_pass_run(tmp_path, "grpo", [1, 0, 0, 0, 0], [1, 1, 0, 0, 1])
    new = write_pass_run(tmp_path, "nc", [1, 1, 0, 0, 0], [1, 1, 1, 1, 0])
    block = compare(parse_arms([base, new], []), n_boot=500)["sets"]["eval"]
    assert block["pass"]["k"] == 4
    b_row, row = block["pass"]["rows"]
    assert (b_row["accuracy"], row["accuracy"]) == (pytest.approx(3 / 5), pytest.approx(4 / 5))
    assert row["diff_points"] == pytest.approx(20.0)
    assert (row["worse"], row["better"]) == (1, 2)               # q4 lost, q2 and q3 gained
    assert row["mcnemar_p"] == pytest.approx(mcnemar_exact(1, 2)) == pytest.approx(1.0)
    assert block["rows"][1]["diff_points"] == pytest.approx(20.0)   # greedy accuracy unchanged
    assert "reward_diff" not in row
    table = markdown(compare(parse_arms([base, new], []), n_boot=100))
    assert "pass@4" in table and "| nc | 1 | 0.800 | +20.0 |" in table
    plain = write_run(tmp_path, "plain", [1, 0, 0, 0, 0])            # no sampled outcomes
    assert "pass" not in compare(parse_arms([base, plain], []), n_boot=50)["sets"]["eval"]


def test_sets_pool_into_one_block_with_pooled_mcnemar(tmp_path):
    a = write_pass_run(tmp_path, "a", [1, 0, 0], [1, 0, 0])
    write_pass_run(tmp_path, "a", [0, 0], [1, 0], set_name="ood")
    b = write_pass_run(tmp_path, "b", [1, 1, 0], [1, 1, 0])
    write_pass_run(tmp_path, "b", [1, 1], [1, 1], set_name="ood")
    report = compare(parse_arms([a, b], []), n_boot=500)
    assert list(report["sets"]) == ["eval", "ood"]
    pooled = report["pooled"]
    assert pooled["questions"] == 5 and pooled["sets"] == ["eval", "ood"]
    row = pooled["rows"][1]                  # q1 of eval, q0 and q1 of ood gained; none lost
    assert (row["worse"], row["better"]) == (0, 3)
    assert row["mcnemar_p"] == pytest.approx(2 / 8)
    assert row["accuracy"] == pytest.approx(4 / 5) and pooled["rows"][0]["accuracy"] == pytest.approx(1 / 5)
    assert row["diff_points"] == pytest.approx(60.0)
    assert (pooled["pass"]["rows"][1]["worse"], pooled["pass"]["rows"][1]["better"]) == (0, 2)
    assert "### all sets (pooled: the 5 questions of eval, ood" in markdown(report)
    one = compare(parse_arms([write_run(tmp_path, "x", [1, 0]), write_run(tmp_path, "y", [1, 1])], []))
    assert "pooled" not in one
