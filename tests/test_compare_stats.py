"""`mmrlvr compare`'s run-level statistics (the training run as the unit) against hand
computations: Welch's t, the hierarchical bootstrap, the MDE, the power helper, and a case where
the question-level and run-level intervals disagree."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mmrlvr.cli import build_parser, cmd_compare
from mmrlvr.compare import (
    _verdict,
    compare,
    hierarchical_bootstrap,
    markdown,
    min_detectable_effect,
    parse_arms,
    seeds_needed,
    welch_t,
)
from tests.test_compare import write_run

T975_4, T80_4 = 2.776445, 0.940965          # t quantiles at df 4, from a printed t table


def t_cdf_df4(t: float) -> float:
    """Student's t CDF at 4 degrees of freedom, closed form (no library)."""
    u = t * t / (1 + t * t / 4)
    return 0.5 + 3 / 8 * t / math.sqrt(1 + t * t / 4) * (1 - u / 12)


def nested_arm(root, name: str, corrects: list[int], n: int = 200) -> str:
    """An arm of one run per entry: run k answers its first corrects[k] of n questions right."""
    runs = [write_run(root, f"{name}{s}", [int(i < k) for i in range(n)])
            for s, k in enumerate(corrects)]
    return f"{name}={','.join(runs)}"


def test_t_cdf_helper_matches_the_table():
    assert t_cdf_df4(T975_4) == pytest.approx(0.975, abs=1e-6)
    assert t_cdf_df4(T80_4) == pytest.approx(0.80, abs=1e-6)


def test_welch_t_by_hand_on_three_runs_each_and_the_effect_is_shown(tmp_path):
    # per-run means 0.50, 0.55, 0.60 against 0.65, 0.70, 0.75: s² = 0.0025 in both arms
    arms = parse_arms([], [nested_arm(tmp_path, "base", [100, 110, 120]),
                           nested_arm(tmp_path, "new", [130, 140, 150])])
    run = compare(arms, n_boot=1000)["sets"]["eval"]["rows"][1]["run_level"]
    t = 0.15 / math.sqrt(0.0025 / 3 + 0.0025 / 3)                   # 3.674
    assert run["welch_t"] == pytest.approx(t)
    assert run["welch_df"] == pytest.approx(4.0)                    # equal s², equal n: n_a+n_b−2
    assert run["welch_p"] == pytest.approx(2 * (1 - t_cdf_df4(t)), rel=1e-6)   # 0.0213
    assert run["sd_points"] == pytest.approx(5.0)
    assert run["mde_points"] == pytest.approx((T975_4 + T80_4) * 5.0 * math.sqrt(2 / 3), rel=1e-5)
    assert run["diff_ci95"][0] > 0       # every resample: the new arm's runs nest over the base's
    assert run["verdict"] == "effect shown (better)"


def test_welch_t_with_unequal_spread_by_hand():
    a, b = np.array([0.50, 0.55, 0.60]), np.array([0.70, 0.75, 0.85])
    va, vb = 0.0025 / 3, ((0.7 - 0.7667) ** 2 + (0.75 - 0.7667) ** 2 + (0.85 - 0.7667) ** 2) / 2 / 3
    t, df, p = welch_t(a, b)
    assert t == pytest.approx(0.21667 / math.sqrt(va + vb), rel=1e-3)      # 4.111
    assert df == pytest.approx((va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2), rel=1e-3)   # 3.448
    assert 0.01 < p < 0.05
    assert welch_t(b, a)[0] == pytest.approx(-t) and welch_t(b, a)[2] == pytest.approx(p)


def test_question_level_excludes_zero_where_run_level_does_not(tmp_path):
    # seeds spread widely (0.30, 0.50, 0.70 vs 0.40, 0.60, 0.80); seed k of the new arm gets 20
    # more questions right than seed k of the base and none wrong, so per question it looks sure
    arms = parse_arms([], [nested_arm(tmp_path, "base", [60, 100, 140]),
                           nested_arm(tmp_path, "new", [80, 120, 160])])
    report = compare(arms, n_boot=2000)
    row = report["sets"]["eval"]["rows"][1]
    assert row["diff_points"] == pytest.approx(10.0)
    assert row["diff_ci95"][0] > 0 and row["mcnemar_p"] < 1e-10           # 60 better, 0 worse
    run = row["run_level"]
    assert run["diff_ci95"][0] < 0 < run["diff_ci95"][1]
    t = 0.10 / math.sqrt(0.04 / 3 + 0.04 / 3)                             # 0.612
    assert run["welch_t"] == pytest.approx(t)
    assert run["welch_p"] == pytest.approx(2 * (1 - t_cdf_df4(t)), rel=1e-6)   # 0.573
    mde = (T975_4 + T80_4) * 20.0 * math.sqrt(2 / 3)                       # 60.7 points
    assert run["mde_points"] == pytest.approx(mde, rel=1e-5)
    assert run["verdict"] == "no effect at MDE 60.7"
    table = markdown(report)
    assert "| 0.573 | no effect at MDE 60.7 |" in table
    assert "question-level 95 % CI" in table and "run-level 95 % CI" in table


def test_hierarchical_bootstrap_resamples_runs_within_arms_and_pairs_questions():
    rows = np.array([[1, 0, 1, 1, 0, 0, 1, 0.0]] * 3)                      # [3 runs, 8 questions]
    assert hierarchical_bootstrap(rows, rows.copy(), 500)[1] == pytest.approx((0, 0), abs=1e-12)
    zeros, ones = np.zeros((3, 8)), np.ones((3, 8))                        # (one question resample)
    assert hierarchical_bootstrap(zeros, ones, 500)[1] == pytest.approx((1, 1))   # runs stay in arms
    mixed = np.array([np.ones(8), np.zeros(8)])                            # [2 runs, 8]
    diff, ci = hierarchical_bootstrap(np.zeros((2, 8)), mixed, 4000)
    assert diff == 0.5 and ci == (0.0, 1.0)      # both runs drawn as one run a quarter each


def test_mde_formula_by_hand():
    # 3.9 points between seeds, 3 seeds per arm: the "about 12 points"
    assert min_detectable_effect(3.9, 3, 3) == pytest.approx((T975_4 + T80_4) * 3.9 * math.sqrt(2 / 3),
                                                             rel=1e-5)                 # 11.84
    assert min_detectable_effect(3.9, 2, 4) == pytest.approx((T975_4 + T80_4) * 3.9 * math.sqrt(3 / 4),
                                                             rel=1e-5)                 # 12.56


def test_power_helper_seed_count_by_hand(capsys):
    # n = 10: df 18, (2.100922 + 0.862353) · 3.9 · √(2/10) = 5.17 > 5
    # n = 11: df 20, (2.085963 + 0.860037) · 3.9 · √(2/11) = 4.90 ≤ 5
    assert (2.100922 + 0.862353) * 3.9 * math.sqrt(2 / 10) > 5
    assert (2.085963 + 0.860037) * 3.9 * math.sqrt(2 / 11) <= 5
    assert seeds_needed(5, 3.9) == 11
    assert seeds_needed(12, 3.9) == 3                   # 11.84 at 3 seeds; 20.9 at 2
    assert seeds_needed(0.01, 3.9) is None              # past the search's end
    assert cmd_compare(build_parser().parse_args(["compare", "--power", "5", "--sd", "3.9"])) == 0
    assert "needs 11 seeds per arm" in capsys.readouterr().out


def test_power_flag_with_runs_adds_seeds_to_each_verdict(tmp_path, capsys):
    base = nested_arm(tmp_path, "base", [60, 100, 140])
    new = nested_arm(tmp_path, "new", [80, 120, 160])
    out = tmp_path / "r.json"
    args = ["compare", "--arm", base, "--arm", new, "--power", "10", "--bootstrap", "200",
            "--json", str(out)]
    assert cmd_compare(build_parser().parse_args(args)) == 0
    run = json.loads(out.read_text())["sets"]["eval"]["rows"][1]["run_level"]
    assert run["seeds_for_effect"] == seeds_needed(10, 20.0) == 64
    assert "no effect at MDE 60.7; 10 points needs 64 seeds per arm" in capsys.readouterr().out


def test_power_flags_misused_are_errors(tmp_path, capsys):
    run = write_run(tmp_path, "a", [1, 0])
    for argv in (["--sd", "3"], ["--power", "5"], ["--power", "5", "--sd", "3", run, run],
                 ["--power", "0", "--sd", "3"], ["--power", "-2", run, run]):
        assert cmd_compare(build_parser().parse_args(["compare", *argv])) == 2, argv
    assert "--sd" in capsys.readouterr().err


def test_one_run_in_an_arm_says_the_run_level_cannot_be_computed(tmp_path):
    a, b = write_run(tmp_path, "a", [1, 0, 0, 1]), write_run(tmp_path, "b", [1, 1, 0, 1])
    arms = parse_arms([a, b], [nested_arm(tmp_path, "c", [1, 2, 3], n=4)])
    report = compare(arms, n_boot=100)
    rows = report["sets"]["eval"]["rows"]
    assert rows[1]["run_level"] == {"unavailable": "'a' has 1 run and 'b' has 1 run; the run "
                                                   "level needs 2+ per arm"}
    assert rows[2]["run_level"] == {"unavailable": "'a' has 1 run; the run level needs 2+ per arm"}
    assert "| cannot be computed | | no run-level verdict: 'a' has 1 run;" in markdown(report)


def test_identical_runs_within_arms_cannot_be_tested(tmp_path):
    arms = parse_arms([], [nested_arm(tmp_path, "a", [2, 2], n=4), nested_arm(tmp_path, "b", [3, 3], n=4)])
    run = compare(arms, n_boot=100)["sets"]["eval"]["rows"][1]["run_level"]
    assert run["welch_p"] is None and run["verdict"].startswith("cannot test")


def test_verdict_needs_both_the_t_test_and_the_interval():
    assert _verdict(0.1, 0.01, (0.02, 0.2), 0.3) == "effect shown (better)"
    assert _verdict(-0.1, 0.01, (-0.2, -0.02), 0.3) == "effect shown (worse)"
    assert _verdict(0.1, 0.01, (-0.01, 0.2), 0.3) == "no effect at MDE 30.0"   # interval has 0
    assert _verdict(0.1, 0.20, (0.02, 0.2), 0.3) == "no effect at MDE 30.0"    # t test does not
