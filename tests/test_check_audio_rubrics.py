"""`mmrlvr check-method audio_rubrics`: the criterion spread on scripted groups of tones rows
against the rule judge's own verdicts counted here, one active and one inactive verdict, the
offline path enforced, and the check end to end on the tiny Qwen2-Audio through the CLI."""
from __future__ import annotations

import json

import pytest

from mmrlvr.config import ConfigError
from mmrlvr.core.method_check import VERDICTS
from mmrlvr.data import load_jsonl
from mmrlvr.methods.audio_rubrics.check import CRITERION_FLOOR, GROUP_FLOOR, measure, verdict
from mmrlvr.methods.audio_rubrics.judges import GroupContext, Rubric, RuleJudge


@pytest.fixture(scope="module")
def tones_dir(tmp_path_factory):
    from mmrlvr.tasks.tones import make_tones

    out = tmp_path_factory.mktemp("tones")
    make_tones(out, n_train=8, n_test=0, seed=0)
    return out


def scripted(row) -> list[str]:
    """Two completions that state the measured count and answer right, two that do neither."""
    n = row.meta["evidence"][0]["onset_count"]
    wrong = next(letter for letter in "ABCD" if letter != row.answer)
    right = f"<think>I hear {n} tones in the clip.</think><answer>{row.answer}</answer>"
    guess = f"<think>Hard to say.</think><answer>{wrong}</answer>"
    return [right, guess, right, guess]


def split_by_hand(row, texts: list[str]) -> tuple[int, int]:
    """(criteria whose rule verdicts differ over the group, criteria judged): the rule judge
    called directly, the proposals included, as the reward's `evolve` calls it."""
    ctx = GroupContext(row.prompt, row.answer, row.choices, row.meta["evidence"],
                       [t.split("<think>")[1].split("</think>")[0] for t in texts],
                       [t.endswith(f"<answer>{row.answer}</answer>") for t in texts])
    static = [Rubric.from_dict(r) for r in row.meta["rubrics"]]
    new, verdicts = RuleJudge().evaluate(ctx, static, 3)
    return sum(len(set(v)) > 1 for v in verdicts), len(verdicts)


def test_scripted_groups_spread_by_the_count_and_answer(tones_dir):
    rows = load_jsonl(tones_dir / "train.jsonl")[:4]
    groups = [scripted(r) for r in rows]
    got = measure(rows, groups)
    split = [split_by_hand(r, g) for r, g in zip(rows, groups)]
    assert got["groups"] == 4 and got["criteria"] == sum(n for _, n in split)
    assert got["criterion_split_frac"] == round(sum(s for s, _ in split) / got["criteria"], 4)
    assert got["group_spread_frac"] == 1.0 and got["rubric_std_mean"] > 0
    assert got["accuracy"] == 0.5 and got["rubric_only_frac"] == 0.0 and got["fallback_frac"] == 0.0
    state, why = verdict(got)
    assert state == "active" and f">= {CRITERION_FLOOR}" in why and f">= {GROUP_FLOOR}" in why


def test_identical_completions_split_nothing_and_are_inactive(tones_dir):
    rows = load_jsonl(tones_dir / "train.jsonl")[:3]
    got = measure(rows, [[scripted(r)[0]] * 4 for r in rows])
    assert got["criterion_split_frac"] == 0.0 and got["group_spread_frac"] == 0.0
    assert got["criteria"] > 0 and got["accuracy"] == 1.0
    state, why = verdict(got)
    assert state == "inactive" and f"(< {CRITERION_FLOOR})" in why and "0.000" in why
    assert verdict({**got, "criterion_split_frac": 0.5})[0] == "inactive"   # groups still flat
    assert "no row has audio" in verdict(measure([], []))[1]


def test_the_check_refuses_a_judge_that_calls_out(tones_dir):
    rows = load_jsonl(tones_dir / "train.jsonl")[:1]
    with pytest.raises(ConfigError, match="offline rule path"):
        measure(rows, [scripted(rows[0])], {"judge": {"kind": "http", "url": "http://x"}})


def test_cli_runs_the_audio_rubrics_check_on_the_tiny_model(tiny_dirs, tones_dir, tmp_path, capsys):
    from mmrlvr.cli import main

    out = tmp_path / "audio_rubrics.json"
    assert main(["check-method", "audio_rubrics", "--model", str(tiny_dirs("qwen2-audio")),
                 "--modality", "audio", "--data", str(tones_dir / "train.jsonl"), "--rows", "2",
                 "--group", "3", "--max-new-tokens", "12", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    figures = got["figures"]
    assert got["method"] == "audio_rubrics" and got["verdict"] in VERDICTS
    assert figures["rows"] == 2 == figures["groups"] and figures["criteria"] > 0
    for key in ("criterion_split_frac", "group_spread_frac", "fallback_frac", "accuracy"):
        assert 0.0 <= figures[key] <= 1.0
    assert (got["verdict"], got["why"]) == verdict(figures)
    assert got["floors"] == {"criterion_split_frac": CRITERION_FLOOR, "group_spread_frac": GROUP_FLOOR}
    assert capsys.readouterr().out.startswith(f"audio_rubrics: {got['verdict']} (")
