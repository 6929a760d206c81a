"""Rubric checks read claims, not stray numbers; the rule judge weighs rubrics by how much they
separate the group (σ_k / Σ σ), computed here by hand."""
from __future__ import annotations

import json

import pytest

from mmrlvr.data import Example
from mmrlvr.methods.audio_rubrics.reward import AudioRubricsReward
from mmrlvr.methods.audio_rubrics.checks import check_satisfied, count_claims, infer_check, numbers_in
from mmrlvr.methods.audio_rubrics.judges import GroupContext, Rubric, RuleJudge, separation_weights

COUNT_3 = {"kind": "count", "value": 3}


@pytest.mark.parametrize("reasoning", [
    "I hear 3 beeps.", "I hear three beeps.", "There are three short beeps.", "It beeps 3 times.",
    "The count is 3.", "I count three.", "Number of beeps: 3.", "beeps: 3",
    "The number of distinct sounds is three.", "A 3-beep pattern.", "I hear 3 beeps, not 4.",
])
def test_a_count_stated_as_the_count_satisfies_the_count_rubric(reasoning):
    assert check_satisfied(COUNT_3, reasoning)


@pytest.mark.parametrize("reasoning", [
    "Option (3) fits.", "The answer is option 3.", "The answer is 3.", "A is 1, B is 2, C is 3.",
    "C. 3", "A single 300 Hz tone.", "A 3 kHz tone beeping.", "3 kHz tones.", "It starts after 3 s.",
    "Each is about 3 seconds long.", "The second is 3 times louder.", "I hear 2 or 3 beeps.",
    "Two-three beeps.", "2-3 beeps.", "Not 3 beeps.", "I don't hear 3 beeps.",
    "The last 3 beeps are louder.", "More than 3 beeps.", "I count 3 seconds.",
    "Beeps at 0.3 s and 1.3 s.", "I hear 3.5 beeps.", "(3) beeps",
])
def test_a_number_that_is_not_the_count_does_not(reasoning):
    assert not check_satisfied(COUNT_3, reasoning), count_claims(reasoning)


def test_restating_the_options_no_longer_satisfies_every_count_rubric():
    """A wrong rollout that lists the options used to pass the count rubric of any count."""
    assert 3 in numbers_in("A is 1, B is 2, C is 3, D is 4.")     # what the old check read
    ex = Example(id="c", prompt="How many beeps are in the clip?\nA. 1\nB. 2\nC. 3\nD. 4",
                 answer="C", choices=["1", "2", "3", "4"],
                 meta={"evidence": [{"onset_count": 3}],
                       "rubrics": [{"id": "s1", "category": "perception", "weight": 1.0,
                                    "criterion": "States 3 distinct sounds.", "check": COUNT_3}]})
    group = ["<think>I hear 3 beeps, so C.</think><answer>C</answer>",
             "<think>A is 1, B is 2, C is 3, D is 4. I hear 2 beeps, so B.</think><answer>B</answer>"]
    scores = AudioRubricsReward(max_proposals=0).score(ex, group)
    assert [s["rubric"] for s in scores] == [1.0, 0.0]


def test_rule_judge_proposes_counts_only_from_stated_counts():
    ctx = GroupContext("How many beeps?", "C", ["1", "2", "3", "4"], [{"onset_count": 3}],
                       ["I hear 3 beeps.", "Options 1 2 3 4; I hear 4 beeps.",
                        "Options 1 2 3 4; I hear 4 beeps.", "Three beeps."],
                       [True, False, False, True])
    proposed = RuleJudge().propose(ctx, [], 3)
    assert [(r.polarity, r.check) for r in proposed] == [
        (1, COUNT_3), (-1, {"kind": "count", "value": 4})]      # no rubric on 1 or 2


def test_rule_judge_weights_are_the_groups_spread_by_hand(tmp_path):
    """σ_k over the flipped verdicts, normalised; a zero-spread rubric is dropped first."""
    group = ["<think>I hear 2 beeps.</think><answer>B</answer>",
             "<think>I hear 1 beep.</think><answer>A</answer>",
             "<think>Two beeps, the second is higher.</think><answer>B</answer>",
             "<think>I count 5.</think><answer>D</answer>"]
    rubrics = [
        {"id": "a", "criterion": "states 2", "check": {"kind": "count", "value": 2}},   # 1 0 1 0
        {"id": "b", "criterion": "beeps", "check": {"kind": "mentions", "words": ["beep", "beeps"]}},
        {"id": "c", "criterion": "short", "check": {"kind": "max_words", "value": 40}},  # 1 1 1 1
        {"id": "d", "criterion": "claims 5", "check": {"kind": "count", "value": 5},
         "polarity": -1}]                                          # 0 0 0 1 -> flipped 1 1 1 0
    ex = Example(id="w", prompt="How many beeps?\nA. 1\nB. 2\nC. 3\nD. 5", answer="B",
                 choices=["1", "2", "3", "5"],
                 meta={"evidence": [{"onset_count": 2}],
                       "rubrics": [{"category": "perception", "weight": 0.25, **r} for r in rubrics]})
    reward = AudioRubricsReward(max_proposals=0, log_path=str(tmp_path / "log.jsonl"))
    scores = reward.score(ex, group)
    row = json.loads((tmp_path / "log.jsonl").read_text())
    sigma_a, sigma_bd = 0.5, 3 ** 0.5 / 4                          # sqrt(p(1-p)): p 1/2, 3/4
    total = sigma_a + 2 * sigma_bd
    weights = {r["id"]: r["weight"] for r in row["rubrics"]}
    assert weights == pytest.approx({"a": sigma_a / total, "b": sigma_bd / total, "c": None,
                                     "d": sigma_bd / total})
    assert [r["weight_source"] for r in row["rubrics"]] == ["judge", "judge", None, "judge"]
    assert [s["rubric"] for s in scores] == pytest.approx([1.0, 2 * sigma_bd / total, 1.0, 0.0])


def test_separation_weights_formula():
    assert separation_weights([[1, 0, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0]]) == pytest.approx(
        [0.5 / (0.5 + 2 * 0.75 ** 0.5 / 2), 0.75 ** 0.5 / 2 / (0.5 + 0.75 ** 0.5),
         0.75 ** 0.5 / 2 / (0.5 + 0.75 ** 0.5)])
    assert separation_weights([[1, 1], [0, 0]]) == [0.5, 0.5]     # nothing varies: uniform
    judge = RuleJudge()                                            # not the category weights
    ctx = GroupContext("q", "A", None, [{}], ["I hear 2 beeps.", "nothing"], [True, False])
    same_spread = [Rubric("x", "style", "2", check={"kind": "count", "value": 2}),
                   Rubric("y", "perception", "2", check={"kind": "count", "value": 2})]
    assert judge.weigh(ctx, same_spread) == [0.5, 0.5]


def test_a_check_is_read_off_a_criterion_that_names_one_claim():
    assert infer_check("States that the clip holds three beeps.") == COUNT_3
    assert infer_check("Says the second tone is higher in pitch (440 Hz then 880 Hz).") == {
        "kind": "order", "attribute": "pitch", "winner": "second"}
    assert infer_check("Mentions the 300 Hz tone and option 3.") is None
    assert infer_check("States 3 beeps and that the second is louder.") is None   # two claims
