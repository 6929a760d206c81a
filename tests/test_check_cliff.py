"""`mmrlvr check-method cliff`: the cliff figures on scripted groups against a hand count (and a
token position found by a linear scan, not the shaper's binary search), one active and two
inactive verdicts, and the check end to end on the tiny Qwen2.5-VL through the CLI."""
from __future__ import annotations

import json

from mmrlvr.core.method_check import VERDICTS
from mmrlvr.data import Example, load_jsonl
from mmrlvr.methods.cliff.check import FIRST_STEP_CEILING, FOUND_FLOOR, measure, verdict

EX = Example(id="c1", prompt="How many shapes are in the image?", answer="3",
             steps=["There are 2 red circles.", "There is 1 blue square.", "2 + 1 = 3"])
RIGHT = ("<think>Step 1: There are 2 red circles.\nStep 2: There is 1 blue square.\n"
         "Step 3: 2 + 1 = 3</think><answer>3</answer>")
AT_STEP_2 = ("<think>Step 1: There are 2 red circles.\nStep 2: There are 3 blue squares.\n"
             "Step 3: 2 + 3 = 5</think><answer>5</answer>")          # the cliff: "Step 2"
AT_STEP_1 = ("<think>Step 1: There are 5 red circles.\nStep 2: There is 1 blue square.\n"
             "Step 3: 5 + 1 = 6</think><answer>6</answer>")          # the cliff: "Step 1"
NO_CLIFF = RIGHT.replace("<answer>3", "<answer>4")                   # sound steps, wrong answer


def linear_cliff_token(tokenizer, ids: list[int], offset: int) -> int:
    """The first token whose decoded prefix passes `offset`, by scanning every prefix."""
    for k in range(len(ids)):
        if len(tokenizer.decode(ids[:k + 1], skip_special_tokens=True)) > offset:
            return k
    return len(ids)


def test_figures_count_the_wrong_completions_cliffs_by_hand(policy):
    tok = policy.tokenizer
    texts = [RIGHT, AT_STEP_2, AT_STEP_2, NO_CLIFF]
    got = measure([EX], texts, 4, tok)
    # 3 wrong; 2 of them with a cliff (both at "Step 2"), none at the first step; 2 of 4 located
    assert got["wrong_frac"] == 0.75 and got["found_frac"] == 0.5
    assert got["wrong_found_frac"] == round(2 / 3, 4) and got["first_step_frac"] == 0.0
    assert got["shapeable_frac"] == 1.0 and got["rows_with_steps"] == 1 == got["rows"]
    ids = tok(AT_STEP_2, add_special_tokens=False)["input_ids"]
    k = linear_cliff_token(tok, ids, AT_STEP_2.index("Step 2"))
    assert 0 < k < len(ids) and got["cliff_pos_mean"] == round(k / len(ids), 4)
    state, why = verdict(got)
    assert state == "active" and f">= {FOUND_FLOOR}" in why and "0.667" in why


def test_cliffs_all_at_the_first_step_or_none_found_are_inactive(policy):
    tok = policy.tokenizer
    first = measure([EX], [AT_STEP_1] * 4, 4, tok)
    assert first["wrong_found_frac"] == 1.0 and first["first_step_frac"] == 1.0
    assert first["shapeable_frac"] == 0.0                    # an all-wrong group: A_i = 0
    state, why = verdict(first)
    assert state == "inactive" and f"> {FIRST_STEP_CEILING}" in why and "1.000" in why
    none = measure([EX], [NO_CLIFF] * 4, 4, tok)
    assert none["wrong_frac"] == 1.0 and none["wrong_found_frac"] == 0.0
    assert verdict(none)[0] == "inactive" and f"< {FOUND_FLOOR}" in verdict(none)[1]
    right = measure([EX], [RIGHT] * 2, 2, tok)
    assert "no sampled completion is wrong" in verdict(right)[1]
    bare = Example(id="b", prompt="q", answer="3")
    assert "no row has reference" in verdict(measure([bare], [AT_STEP_2], 1, tok))[1]


def test_cli_runs_the_cliff_check_on_the_tiny_model(tiny_vl, shapes_dir, tmp_path, capsys):
    from mmrlvr.cli import main

    out = tmp_path / "cliff.json"
    data = shapes_dir / "train.jsonl"
    assert main(["check-method", "cliff", "--model", str(tiny_vl), "--data", str(data),
                 "--rows", "2", "--group", "3", "--max-new-tokens", "12", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    figures = got["figures"]
    assert got["method"] == "cliff" and got["verdict"] in VERDICTS
    assert figures["rows"] == 2 and figures["completions"] == 6
    assert figures["rows_with_steps"] == sum(bool(r.steps) for r in load_jsonl(data)[:2])
    for key in ("wrong_frac", "found_frac", "wrong_found_frac", "first_step_frac", "cliff_pos_mean"):
        assert 0.0 <= figures[key] <= 1.0
    assert (got["verdict"], got["why"]) == verdict(figures)
    assert got["floors"] == {"wrong_found_frac": FOUND_FLOOR, "first_step_frac": FIRST_STEP_CEILING}
    assert capsys.readouterr().out.startswith(f"cliff: {got['verdict']} (")
