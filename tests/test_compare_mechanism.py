"""`mmrlvr compare --mechanism ARM=CHECK.json` (issue "evidence", item 2: mechanism checks
before outcomes): an arm whose mechanism check says inactive is reported as such, not compared,
even where its difference would have been "shown"; an active one keeps its verdict with the
check beside it; a checked arm that was never run is listed; a bad check file is named."""
from __future__ import annotations

import json

import pytest

from mmrlvr.cli import main
from mmrlvr.compare import CompareError, add_mechanisms, compare, load_mechanisms, markdown, parse_arms
from tests.test_compare_stats import nested_arm


def check_file(tmp_path, name: str, verdict: str, why: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"method": name, "verdict": verdict, "why": why, "figures": {},
                                "floors": {}, "inputs": {}}))
    return str(path)


@pytest.fixture
def arms(tmp_path):
    """A baseline and two arms whose runs are clearly better (an effect a t test shows)."""
    return [nested_arm(tmp_path, "base", [100, 110, 120]),
            nested_arm(tmp_path, "noisy", [130, 140, 150]),
            nested_arm(tmp_path, "steps", [130, 140, 150])]


def test_an_inactive_mechanism_is_reported_not_compared(tmp_path, arms):
    report = compare(parse_arms([], arms), n_boot=500)
    shown = report["sets"]["eval"]["rows"][1]["run_level"]["verdict"]
    assert shown == "effect shown (better)"                  # what it says without the check
    add_mechanisms(report, load_mechanisms([
        f"noisy={check_file(tmp_path, 'ncgrpo', 'inactive', 'first-step KL 2e-06 < 0.01')}",
        f"steps={check_file(tmp_path, 'structreward', 'active', 'self-agreement 0.95 >= 0.8')}"]))
    rows = report["sets"]["eval"]["rows"]
    assert rows[1]["run_level"]["verdict"] == ("mechanism inactive (first-step KL 2e-06 < 0.01): "
                                               "not compared")
    assert rows[1]["mechanism"]["method"] == "ncgrpo"
    assert rows[2]["run_level"]["verdict"] == ("effect shown (better) · structreward mechanism "
                                               "active")
    text = markdown(report)
    assert "| mechanism inactive (first-step KL 2e-06 < 0.01): not compared |" in text
    assert "effect shown (better) · structreward mechanism active" in text
    assert report["not_run"] == []


def test_a_checked_arm_with_no_runs_is_listed_as_not_run(tmp_path, arms, capsys):
    path = check_file(tmp_path, "om_grpo", "inactive", "majority right 0.42 <= 0.5")
    rc = main(["compare", "--arm", arms[0], "--arm", arms[1], "--mechanism", f"om={path}",
               "--json", str(tmp_path / "c.json")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "- om: not run; om_grpo mechanism inactive (majority right 0.42 <= 0.5)" in out
    assert json.loads((tmp_path / "c.json").read_text())["not_run"][0]["arm"] == "om"


@pytest.mark.parametrize("spec, named", [
    ("noisy", "write it as ARM=CHECK.json"),
    ("noisy=/nonexistent/check.json", "/nonexistent/check.json is not an mmrlvr check-method"),
])
def test_a_bad_mechanism_argument_is_named(spec, named):
    with pytest.raises(CompareError, match=named):
        load_mechanisms([spec])


def test_a_check_file_without_a_verdict_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"method": "ncgrpo"}))
    with pytest.raises(CompareError, match=r"noisy: .*bad.json is not an mmrlvr check-method"):
        load_mechanisms([f"noisy={bad}"])
