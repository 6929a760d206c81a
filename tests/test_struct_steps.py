"""StructReward: segmentation, the three matchers, the alignment, the gate, the step-labelled
layout, and (end to end on the tiny Qwen2.5-VL) that leaving it out is plain GRPO exactly."""
from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

import rewards
from mmrlvr.config import load_config
from mmrlvr.data import DataError, Example, load_dataset, load_jsonl
from mmrlvr.train.logger import read_metrics
from mmrlvr.methods.structreward.steps import (
    StructStepsReward,
    align,
    match_lexical,
    match_numeric,
    match_step,
    match_symbolic,
    numbers,
    reasoning_of,
    split_steps,
    token_f1,
)

# ----------------------------------------------------------------------------- segmentation


@pytest.mark.parametrize("text, steps", [
    ("Step 1: Count the circles. There are 2.\nStep 2: Count the squares: 1.\nStep 3: 2 + 1 = 3",
     ["Count the circles. There are 2.", "Count the squares: 1.", "2 + 1 = 3"]),
    ("We add. Step 1: x + 1 = 4 so x = 3. Step 2: check 3 + 1 = 4.",
     ["We add.", "x + 1 = 4 so x = 3.", "check 3 + 1 = 4."]),
    ("**Step 1:** compute 5 - 3 = 2\n**Step 2:** check it twice", ["compute 5 - 3 = 2",
                                                                    "check it twice"]),
    ("1. Find the area.\n2) area = 3 * 4 = 12\n- So the answer is 12",
     ["Find the area.", "area = 3 * 4 = 12", "So the answer is 12"]),
    ("Step 1: set up\nthe equation 2x = 6\nStep 2: x = 3", ["set up the equation 2x = 6", "x = 3"]),
    ("First, x + 1 = 4.\nSo x = 3.\n\nDone.", ["First, x + 1 = 4.", "So x = 3. Done."]),
    ("I see 2 red circles and 1 blue square. 2 + 1 = 3.",
     ["I see 2 red circles and 1 blue square.", "2 + 1 = 3."]),
    ("The radius is 2.5 cm. Area = 3.14 * 2.5^2 = 19.63.",
     ["The radius is 2.5 cm.", "Area = 3.14 * 2.5^2 = 19.63."]),
    ("e.g. the sides are equal", ["e.g. the sides are equal"]),
    ("-3 + 5 = 2\n-2 is negative", ["-3 + 5 = 2", "-2 is negative"]),
    ("Yes. The red circle is on the left.", ["Yes. The red circle is on the left."]),
    ("4", ["4"]),
    ("", []),
])
def test_split_steps_on_markers_newlines_and_sentences(text, steps):
    assert split_steps(text) == steps


def test_reasoning_is_the_think_part():
    assert reasoning_of("<think>a. b.</think><answer>3</answer>") == "a. b."
    assert reasoning_of("<think>cut off before the end") == "cut off before the end"
    assert reasoning_of("<think>no close<answer>3</answer>") == "no close"
    assert reasoning_of("plain text then <answer>3</answer>") == "plain text then "


# ----------------------------------------------------------------------------- matchers

def test_numbers_read_signs_decimals_fractions_and_separators():
    assert numbers("5-3=2, x=-2, 1,234.5, \\frac{1}{2}, 3/4, H2O, 2x, 1e-3") == \
        (5.0, 3.0, 2.0, -2.0, 1234.5, 0.5, 0.75, 2.0, 0.001)


@pytest.mark.parametrize("step, ref, ok", [
    ("So 2 + 1 = 3.", "2 + 1 = 3", True),
    ("The area is 3 × 4 = 12.0001", "area = 12", True),          # 12.0001 within 1e-4 relative
    ("The area is 3 × 4 = 12.01", "area = 12", False),
    ("x = 0.5", "x = \\frac{1}{2}", True),
    ("the answer is 3", "x = 3", True),
    ("2 + 1 = 4", "2 + 1 = 3", False),                           # another final value
    ("So 3 = 3", "2 + 1 = 3", False),                            # the operands are missing
    ("1 + 2 = 3", "2 + 1 = 3", False),                           # out of order: not numeric
    ("There are 2 blue squares", "There are 2 red circles.", False),   # prose, not a computation
    ("x^2 - 1 = (x-1)(x-1)", "x^2 - 1 = (x-1)(x+1)", False),     # variables: left to symbolic
    ("5000 + 5001 = 10001", "5000 + 5000 = 10000", False),       # integers exact: no tolerance
    ("9999 + 2 = 10001", "9999 + 1 = 10000", False),             # (1e-4 relative took 10001)
    ("the total is 10000.0", "total = 10000", True),             # an integer written as x.0
    ("1 / 3 = 0.33333", "1 / 3 = 0.333333", True),               # non-integers: 1e-4 relative
    ("1 / 3 = 0.3", "1 / 3 = 0.333333", False),
])
def test_numeric_matcher(step, ref, ok):
    assert match_numeric(step, ref) is ok


@pytest.mark.parametrize("step, ref, ok", [
    ("1 + 2 = 3", "2 + 1 = 3", True),
    ("We get y = 1 + 2x", "y = 2x + 1", True),
    ("Thus $x^2 - 1 = (x+1)(x-1)$.", "x^2 - 1 = (x-1)(x+1)", True),
    ("Expanding gives x^2 + 2x + 1", "(x+1)^2", True),
    ("x^2 - 1 = (x-1)(x-1)", "x^2 - 1 = (x-1)(x+1)", False),
    ("2x - 1 = 7", "2x + 1 = 7", False),
    ("2 + 2 = 4", "1 + 2 = 3", False),        # two true identities are not the same step
    ("x = 3", "2x + 1 = 7", False),
    ("There are 3", "3", False),              # bare numbers: numeric's job, never symbolic
    ("I count the circles", "y = 2x + 1", False),
])
def test_symbolic_matcher(step, ref, ok):
    assert match_symbolic(step, ref) is ok


def test_lexical_matcher_is_token_f1_at_one_half():
    assert token_f1("the red circle is left", "The red circle is on the left.") == \
        pytest.approx(2 * 1.0 * 0.8 / 1.8)
    assert token_f1("red blue", "red green") == 0.5
    assert match_lexical("red blue", "red green")                 # F1 exactly 0.5 matches
    assert not match_lexical("red blue yellow", "red green")      # 0.4
    assert match_lexical("I see 2 red circles", "There are 2 red circles.")       # 0.6
    assert not match_lexical("The total is 4", "The total is 5")  # other numbers: never
    assert not match_lexical("x^2 - 1 = (x-1)(x-1)", "x^2 - 1 = (x-1)(x+1)")  # formulas: never


def test_matchers_fire_in_order_numeric_symbolic_lexical():
    assert match_step("so 2 + 1 = 3", "2 + 1 = 3") == "numeric"    # lexical would match too
    assert match_step("y = 1 + 2x", "y = 2x + 1") == "symbolic"
    assert match_step("its colour is red", "Its colour is red.") == "lexical"
    assert match_step("it is a square", "Its colour is red.") is None


# ----------------------------------------------------------------------------- alignment

def test_alignment_never_crosses_nor_reuses():
    refs = ["There are 2 red circles.", "There is 1 blue square.", "2 + 1 = 3"]
    # the steps come in the opposite order: only one can be kept
    steps = ["2 + 1 = 3", "There is 1 blue square.", "There are 2 red circles."]
    pairs = align(steps, refs)
    assert len(pairs) == 1
    # one step that matches two references is used once
    assert len(align(["2 + 1 = 3"], ["2 + 1 = 3", "so 2 + 1 = 3"])) == 1
    assert len(align(["2 + 1 = 3", "so 2 + 1 = 3"], ["2 + 1 = 3"])) == 1
    assert align(list(reversed(refs)), list(reversed(refs))) == \
        [(0, 0, "numeric"), (1, 1, "lexical"), (2, 2, "lexical")]


def test_alignment_is_the_largest_order_preserving_matching():
    rng = random.Random(0)
    for _ in range(200):
        n, m = rng.randint(0, 5), rng.randint(0, 5)
        table = {(i, j): rng.random() < 0.35 for i in range(n) for j in range(m)}

        def matcher(s, r, table=table):
            return "x" if table[(int(s), int(r))] else None

        pairs = align([str(i) for i in range(n)], [str(j) for j in range(m)], matcher)
        assert all(table[(i, j)] for i, j, _ in pairs)
        assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(pairs))
        best = 0                                      # brute force over step subsets
        for k in range(min(n, m) + 1):
            for rows in itertools.combinations(range(n), k):
                for cols in itertools.combinations(range(m), k):
                    if all(table[(i, j)] for i, j in zip(rows, cols)):
                        best = max(best, k)
        assert len(pairs) == best


# ----------------------------------------------------------------------------- the reward

EX = Example(id="c1", prompt="How many shapes are in the image?", answer="3",
             steps=["There are 2 red circles.", "There is 1 blue square.", "2 + 1 = 3"])
REASONINGS = [
    "",
    "I am not sure.",
    "There are 2 red circles.",
    "There are 2 red circles. 2 + 1 = 3.",
    "Step 1: There are 2 red circles.\nStep 2: There is 1 blue square.\nStep 3: 2 + 1 = 3",
]


def _completions(answer: str) -> list[str]:
    well = [f"<think>{r}</think><answer>{answer}</answer>" for r in REASONINGS if r]
    badly = [f"{r} The answer is {answer}." for r in REASONINGS] + \
        [f"<think>{r}</think><answer>{answer}</answer> trailing" for r in REASONINGS if r]
    return well + badly


@pytest.mark.parametrize("options", [{}, {"lam": 0.9}, {"gate": "soft"},
                                     {"gate": "soft", "lam": 0.99}])
def test_a_wrong_answer_never_outscores_a_correct_one(options):
    reward = StructStepsReward(**options)
    right = reward.score(EX, _completions("3"))
    wrong = reward.score(EX, _completions("4") + _completions("three or four"))
    assert {s["acc"] for s in right} == {1.0} and {s["acc"] for s in wrong} == {0.0}
    assert {s["r_proc"] for s in wrong} == {0.0, 1 / 3, 2 / 3, 1.0}   # every process score
    assert max(s["overall"] for s in wrong) <= min(s["overall"] for s in right)


def test_gate_values_and_logged_components():
    full = "<think>Step 1: There are 2 red circles.\nStep 2: There is 1 blue square.\n" \
           "Step 3: 2 + 1 = 3</think><answer>3</answer>"
    partial = "<think>I see 2 red circles. 2 + 1 = 3.</think><answer>3</answer>"
    hard = rewards.get("struct_steps")
    s = hard.score(EX, [full])[0]
    assert s == {"overall": 1.5, "acc": 1.0, "valid": 1.0, "r_proc": 1.0, "matched": 3.0,
                 "steps": 3.0, "m_numeric": 1.0, "m_symbolic": 0.0, "m_lexical": 2.0}
    s = hard.score(EX, [partial])[0]
    assert (s["overall"], s["r_proc"], s["matched"]) == (pytest.approx(1 + 0.5 / 1.5), 2 / 3, 2)
    wrong_full = full.replace("<answer>3", "<answer>4")
    assert hard.score(EX, [wrong_full])[0]["overall"] == 0.0
    assert hard.score(EX, [full + " extra"])[0]["overall"] == 0.0          # not valid
    soft = rewards.get("struct_steps", gate="soft", lam=0.5)
    assert soft.score(EX, [wrong_full])[0]["overall"] == 0.5
    assert soft.score(EX, [full + " extra"])[0]["overall"] == 1.5          # soft ignores valid


def test_no_reference_steps_reduces_to_valid_times_acc():
    ex = Example(id="n", prompt="q", answer="3")
    texts = ["<think>2 + 1 = 3</think><answer>3</answer>", "2 + 1 = 3. The answer is 3.",
             "<think>2 + 1 = 3</think><answer>4</answer>"]
    hard = [s["overall"] for s in StructStepsReward().score(ex, texts)]
    soft = [s["overall"] for s in StructStepsReward(gate="soft").score(ex, texts)]
    assert hard == [1.0, 0.0, 0.0] and soft == [1.0, 1.0, 0.0]
    assert all(s["r_proc"] == 0.0 for s in StructStepsReward().score(ex, texts))


@pytest.mark.parametrize("options, message", [({"gate": "both"}, "gate"),
                                              ({"gate": "soft", "lam": 1.0}, "lam"),
                                              ({"lam": -0.1}, "lam")])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        StructStepsReward(**options)


def test_shapes_reference_reasoning_earns_process_credit(shapes_dir):
    from mmrlvr.tasks.shapes import reference_completion

    reward = rewards.get("struct_steps")
    by_family: dict[str, list[float]] = {}
    for ex in load_jsonl(shapes_dir / "train.jsonl"):
        s = reward.score(ex, [reference_completion(ex)])[0]
        assert s["acc"] == s["valid"] == 1.0 and ex.steps
        by_family.setdefault(ex.meta["family"], []).append(s["r_proc"])
    for family in ("color", "kind", "position", "yesno"):   # reasoning written as the steps
        assert min(by_family[family]) == 1.0, family
    assert all(min(v) > 0 for v in by_family.values())


# ----------------------------------------------------------------------------- data

def test_step_labelled_jsonl_layout_loads(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "fig.png")
    rows = [{"id": "p1", "question": "<image>Find x.", "image": "fig.png", "answer": "3",
             "solution_steps": ["2x + 1 = 7", "2x = 6", "x = 3"]},
            {"problem": "What is 2+2?", "steps": "2 + 2 = 4\n", "answer": 4},
            {"problem": "No steps here", "answer": "yes"}]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    exs = load_dataset(f"steps:{path}")
    assert [e.id for e in exs] == ["p1", "train-2", "train-3"]
    assert exs[0].prompt == "Find x." and exs[0].images == [str(tmp_path / "fig.png")]
    assert exs[0].steps == ["2x + 1 = 7", "2x = 6", "x = 3"]
    assert exs[0].reasoning == "2x + 1 = 7\n2x = 6\nx = 3"
    assert (exs[1].steps, exs[1].answer) == (["2 + 2 = 4"], "4")
    assert exs[2].steps is None and exs[2].reasoning is None
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"question": "q", "answer": "1",
                                                             "solution_steps": [1, 2]}) + "\n")
    with pytest.raises(DataError, match="row 2.*solution_steps"):
        load_dataset(f"steps:{path}")


# ----------------------------------------------------------------------------- end to end

VOLATILE = ("time/", "perf/")
PARITY = "def parity(example, completion):\n    return float(len(completion) % 2)\n"


def _config(tmp_path: Path, tiny_vl: Path, shapes_dir: Path, name: str, **extra) -> Path:
    cfg = {"model": {"path": str(tiny_vl)}, "data": {"train": str(shapes_dir / "train.jsonl")},
           "rollout": {"group_size": 4, "max_new_tokens": 8, "temperature": 1.0},
           "optim": {"lr": 1e-3},
           "train": {"steps": 2, "batch_prompts": 3, "micro_batch": 12, "save_every": 0,
                     "out_dir": str(tmp_path / name), "seed": 5},
           "rewards": [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1},
                       {"name": str(tmp_path / "parity.py") + ":parity", "weight": 0.5}]}
    cfg.update(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _stable(run_dir: Path) -> list[dict]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _train(path: Path) -> None:
    from mmrlvr.train.trainer import train

    train(load_config(path), progress=False)


def test_structreward_off_is_plain_grpo_exactly(tmp_path, tiny_vl, shapes_dir, monkeypatch):
    (tmp_path / "parity.py").write_text(PARITY)
    # plain run, with the recycling module made unimportable: the plain path never needs it
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "mmrlvr.methods.structreward.recycling", None)
        _train(_config(tmp_path, tiny_vl, shapes_dir, "plain"))
    plain = _stable(tmp_path / "plain")

    _train(_config(tmp_path, tiny_vl, shapes_dir, "struct",
                   rewards=[{"name": "struct_steps", "weight": 1.0},
                            {"name": str(tmp_path / "parity.py") + ":parity", "weight": 0.5}],
                   objectives=[{"name": "recycling", "weight": 0.1, "correct_key": "parity"}]))
    rows = [r for r in _stable(tmp_path / "struct") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/struct_steps/r_proc", "reward/struct_steps/matched",
                "reward/struct_steps/valid", "reward/struct_steps/m_lexical",
                "objective/recycling/instances"):
        assert all(key in r for r in rows), key
    recycled = [json.loads(ln) for ln in (tmp_path / "struct" / "recycled.jsonl").open()]
    assert recycled and {r["step"] for r in recycled} <= {1, 2}
    assert sum(r["objective/recycling/instances"] for r in rows) == len(recycled)
    assert all("objective/recycling" in r for r in rows if r["objective/recycling/instances"])

    # and with StructReward left out again, the run is the first one, value for value
    _train(_config(tmp_path, tiny_vl, shapes_dir, "plain-again"))
    again = _stable(tmp_path / "plain-again")
    assert again == plain
    assert not any(k.startswith("objective/") or "struct_steps" in k for r in plain for k in r)


# ----------------------------------------------------------------------------- at data load

def test_integers_never_match_with_a_tolerance_anywhere():
    """Lexical steps compare their numbers with the same rule: 10001 red circles are not 10000."""
    assert not match_lexical("There are 10001 red circles.", "There are 10000 red circles.")
    assert match_lexical("There are 10000 red circles.", "There are 10000 red circles.")
    assert match_step("10001", "10000") is None


def test_reference_check_reports_agreement_and_warns_on_coarse_reasoning(tmp_path, capsys):
    from mmrlvr.methods.structreward.reference_check import WARN_BELOW, check_reference_steps

    steps = ["There are 2 red circles.", "There is 1 blue square.", "2 + 1 = 3"]
    rows = [Example(id=f"c{i}", prompt="How many?", answer="3", steps=steps,
                    reasoning="I see 2 red circles and 1 blue square. 2 + 1 = 3",
                    meta={"family": "count"}) for i in range(3)]
    rows += [Example(id="a", prompt="What is 2 + 1?", answer="3", steps=["2 + 1 = 3"],
                     reasoning="2 + 1 = 3.", meta={"family": "add"}),
             Example(id="none", prompt="What is 2 + 1?", answer="3")]           # no steps: not read
    report = check_reference_steps(rows, {"name": "struct_steps"}, tmp_path)
    assert report["count"]["rows"] == 3 and report["add"]["rows"] == 1
    assert report["count"]["refs_self"] == 1.0 and report["add"]["refs_self"] == 1.0
    # the one coarse sentence matches neither "There …" step, only the computation
    assert report["count"]["reasoning"] == pytest.approx(1 / 3) and 1 / 3 < WARN_BELOW
    assert report["count"]["reasoning_full_frac"] == 0.0 and report["add"]["reasoning"] == 1.0
    err = capsys.readouterr().err
    assert "gold reasoning of the 'count' rows scores 0.33" in err and "'add'" not in err.split("agreement:")[0]
    saved = json.loads((tmp_path / "struct_steps_reference.json").read_text())
    assert saved["families"]["count"]["reasoning"] == pytest.approx(1 / 3) and len(saved["warnings"]) == 1


def test_reference_steps_the_matcher_cannot_read_are_named(capsys):
    from mmrlvr.methods.structreward.reference_check import check_reference_steps

    # two references that segment as one step ("So." joins the step before it)
    rows = [Example(id="x", prompt="q", answer="3", steps=["2 + 1 = 3", "So."], meta={"family": "odd"})]
    report = check_reference_steps(rows)
    assert report["odd"]["refs_self"] == 0.5
    assert "reference steps of the 1 'odd' rows match themselves at 0.50" in capsys.readouterr().err


def test_a_run_with_struct_steps_checks_its_rows_at_load(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.train.setup import build_run

    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "train.steps=1", f"train.out_dir={tmp_path / 'run'}"])
    cfg.rewards = [{"name": "struct_steps", "weight": 1.0}]
    run, _ = build_run(cfg)
    run.lock.release()
    saved = json.loads((tmp_path / "run" / "struct_steps_reference.json").read_text())
    assert saved["families"] and all(f["refs_self"] == 1.0 for f in saved["families"].values())
