"""`mmrlvr check-method`: each method's mechanism check measures its figures on a real (tiny)
model and data and gives a verdict; the verdict logic reaches both `active` and `inactive` on
hand-made figures; an unknown name gets "did you mean"; `--json` writes the result."""
from __future__ import annotations

import json

import pytest

from mmrlvr.core.method_check import VERDICTS, CheckContext, CheckOptions
from mmrlvr.core.registry import METHOD_CHECKS, UnknownName
from mmrlvr.data import Example, load_jsonl


def small(**method) -> CheckOptions:
    return CheckOptions(rows=2, group=4, max_new_tokens=8, method=method)


# --- NC-GRPO --------------------------------------------------------------------------------

def test_ncgrpo_check_measures_kl_and_changed_answers(policy, shapes_dir):
    from mmrlvr.methods.ncgrpo.check import verdict

    rows = load_jsonl(shapes_dir / "train.jsonl")
    result = METHOD_CHECKS.get("ncgrpo")(CheckContext(rows, small(alpha=0.1), lambda: policy))
    assert result.method == "ncgrpo" and result.verdict in VERDICTS
    for key in ("ncgrpo/kl_over_entropy", "ncgrpo/clean_entropy", "greedy_answer_changed_frac"):
        assert key in result.figures
    assert result.figures["rows"] == 2 and result.figures["noisy_members"] == 4   # 2 of G=4 each
    assert result.figures["ncgrpo/clean_entropy"] > 0
    assert (result.verdict, result.why) == verdict(result.figures)
    # alpha 0: the rows are tagged noisy but nothing is displaced, so nothing can be active
    placebo = METHOD_CHECKS.get("ncgrpo")(CheckContext(rows, small(alpha=0.0), lambda: policy))
    assert placebo.verdict == "inactive"
    assert placebo.figures.get("ncgrpo/first_step_kl", 0.0) == 0.0


def test_ncgrpo_verdict_reads_kl_floor_and_changed_answers():
    from mmrlvr.methods.ncgrpo.check import KL_FLOOR, verdict

    active = {"ncgrpo/kl_over_entropy": 0.05, "greedy_answer_changed_frac": 0.25, "noisy_members": 8}
    assert verdict(active)[0] == "active"
    assert verdict({**active, "ncgrpo/kl_over_entropy": KL_FLOOR / 2})[0] == "inactive"
    assert "KL/entropy 0.005 < 0.01" in verdict({**active, "ncgrpo/kl_over_entropy": 0.005})[1]
    assert verdict({**active, "ncgrpo/kl_over_entropy": KL_FLOOR})[0] == "active"
    unchanged = verdict({**active, "greedy_answer_changed_frac": 0.0})
    assert unchanged[0] == "inactive" and "no noisy member" in unchanged[1]
    assert verdict({**active, "noisy_members": 0.0})[0] == "inactive"


# --- StructReward ---------------------------------------------------------------------------

def test_structreward_check_reads_the_reference_steps(shapes_dir):
    rows = load_jsonl(shapes_dir / "train.jsonl")
    result = METHOD_CHECKS.get("structreward")(CheckContext(rows))      # no model: data only
    assert result.figures["rows"] == len(rows)
    assert result.figures["refs_self"] == 1.0           # shapes' steps are one step each
    # the warm start's reasoning joins several count steps in one sentence (reference_check)
    assert result.figures["count/reasoning"] < 0.8
    assert result.verdict == "inactive" and "count reasoning" in result.why


def step_rows(reasoning_of) -> list[Example]:
    steps = ["There is 1 red circle.", "There are 2 blue squares.", "1 + 2 = 3"]
    return [Example(id=f"r{i}", prompt="How many shapes?", answer="3", steps=steps,
                    reasoning=reasoning_of(steps), meta={"family": "count"}) for i in range(3)]


def test_structreward_verdict_is_active_when_the_reasoning_follows_the_steps():
    from mmrlvr.methods.structreward.check import check

    active = check(CheckContext(step_rows(lambda s: "\n".join(s))))
    assert active.verdict == "active", active.why
    assert active.figures["reasoning"] == 1.0 and active.figures["count/rows"] == 3
    merged = check(CheckContext(step_rows(lambda s: "I see 1 red circle and 2 blue squares. 1 + 2 = 3.")))
    assert merged.verdict == "inactive" and merged.figures["reasoning"] < 0.8
    none = check(CheckContext([Example(id="x", prompt="q", answer="1")]))
    assert none.verdict == "inactive" and "no row has reference" in none.why


# --- OM-GRPO --------------------------------------------------------------------------------

def test_om_grpo_check_votes_the_starting_models_samples(policy, shapes_dir):
    from mmrlvr.methods.om_grpo.check import verdict

    rows = load_jsonl(shapes_dir / "train.jsonl")
    result = METHOD_CHECKS.get("om_grpo")(CheckContext(rows, small(), lambda: policy))
    assert result.figures["rows"] == 2 and result.figures["rows_with_gold"] == 2
    for key in ("majority_vote_acc", "sample_acc", "parsed_frac", "agree_frac"):
        assert 0.0 <= result.figures[key] <= 1.0
    assert (result.verdict, result.why) == verdict(result.figures)


def test_om_grpo_vote_beats_the_premise_only_when_the_majority_is_right():
    from mmrlvr.methods.om_grpo.check import verdict, vote

    ex = [Example(id="a", prompt="q", answer="2"), Example(id="b", prompt="q", answer="5")]
    right = ["<answer>2</answer>"] * 3 + ["<answer>3</answer>"] + \
            ["<answer>5</answer>"] * 2 + ["<answer>4</answer>", "no answer"]
    figures = vote(ex, right, 4)
    assert figures["majority_vote_acc"] == 1.0 and figures["sample_acc"] == 5 / 8
    assert figures["parsed_frac"] == 7 / 8 and verdict(figures)[0] == "active"
    wrong = ["<answer>3</answer>"] * 3 + ["<answer>2</answer>"] + ["<answer>4</answer>"] * 4
    figures = vote(ex, wrong, 4)
    assert figures["majority_vote_acc"] == 0.0 and figures["sample_acc"] == 1 / 8
    assert verdict(figures)[0] == "inactive"
    assert verdict({**figures, "majority_vote_acc": 0.5})[0] == "inactive"    # must beat 0.5
    unlabelled = vote([Example(id="u", prompt="q", answer="?")], right[:4], 4)
    assert unlabelled["rows_with_gold"] == 0 and "no row has a gold" in verdict(unlabelled)[1]


# --- the registry and the CLI ---------------------------------------------------------------

def test_an_unknown_method_name_gets_did_you_mean(shapes_dir, capsys):
    from mmrlvr.cli import main

    with pytest.raises(UnknownName, match="did you mean 'ncgrpo'"):
        METHOD_CHECKS.get("ncgrp")
    assert main(["check-method", "structreward_", "--data", str(shapes_dir / "train.jsonl")]) == 2
    assert "did you mean 'structreward'" in capsys.readouterr().err


def test_cli_writes_the_verdict_and_figures_as_json(shapes_dir, tmp_path, capsys):
    from mmrlvr.cli import main

    out = tmp_path / "checks" / "structreward.json"
    assert main(["check-method", "structreward", "--data", str(shapes_dir / "train.jsonl"),
                 "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["method"] == "structreward" and got["verdict"] == "inactive"
    assert got["figures"]["refs_self"] == 1.0 and got["floors"] == {"refs_self": 0.8, "reasoning": 0.8}
    assert got["inputs"]["data"] == str(shapes_dir / "train.jsonl")
    assert capsys.readouterr().out.startswith("structreward: inactive (")


def test_a_sampling_check_without_a_model_says_to_give_one(shapes_dir, capsys):
    from mmrlvr.cli import main

    assert main(["check-method", "om_grpo", "--data", str(shapes_dir / "train.jsonl")]) == 2
    assert "give it with --model DIR" in capsys.readouterr().err


def test_cli_takes_model_data_sampling_and_noise_from_a_run_config(tiny_vl, shapes_dir, tmp_path):
    from mmrlvr.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{path: {tiny_vl}}}\ndata: {{train: {shapes_dir / 'train.jsonl'}}}\n"
                      "rollout: {group_size: 4, max_new_tokens: 8, temperature: 0.7,\n"
                      "          branching: {kind: latent_noise, alpha: 0.0, fraction: 0.5}}\n")
    out = tmp_path / "ncgrpo.json"
    assert main(["check-method", "ncgrpo", "--config", str(config), "--rows", "2",
                 "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["inputs"]["model"] == str(tiny_vl) and got["inputs"]["group"] == 4
    assert got["inputs"]["temperature"] == 0.7 and got["inputs"]["max_new_tokens"] == 8
    assert got["figures"]["arm/alpha"] == 0.0 and got["figures"]["arm/fraction"] == 0.5
    assert got["verdict"] == "inactive"                    # the config's placebo noise


def test_cli_feeds_a_text_model_through_the_configs_modality(tmp_path, capsys):
    """A --config with model.modality: text (the SmolLM2 testbed's) loads its model through the
    text adapter; it was fed through `--modality`'s default, vision, and refused."""
    from mmrlvr.cli import main
    from mmrlvr.tasks.arith import make_arith
    from mmrlvr.tiny import build_tiny

    model = build_tiny("llama", tmp_path / "llama")
    make_arith(tmp_path / "arith", n_train=8, n_test=0, seed=0, families=["add"])
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{path: {model}, modality: text}}\n"
                      f"data: {{train: {tmp_path / 'arith' / 'train.jsonl'}}}\n"
                      "rollout: {group_size: 2, max_new_tokens: 4}\n")
    out = tmp_path / "om.json"
    assert main(["check-method", "om_grpo", "--config", str(config), "--rows", "2",
                 "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["inputs"]["modality"] == "text" and got["figures"]["rows"] == 2
    assert 0 <= got["figures"]["majority_vote_acc"] <= 1 and got["figures"]["rows_with_gold"] == 2
