"""Hand-written cases for rewards.verify: extraction, match kinds, outcomes, bounds."""

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rewards import verify
from rewards.verify import detect_kind, extract_answer, match

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# extract_answer
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>42</answer>", "42"),
        ("<think>maybe 41?</think><answer> 42 </answer>", "42"),
        ("<answer>1</answer> wait, no. <answer>2</answer>", "2"),  # last tag wins
        ("<ANSWER>7</ANSWER>", "7"),
        ("<answer>The result is \\boxed{5}.</answer>", "5"),
        ("<answer>\\boxed{\\frac{1}{2}}</answer>", "\\frac{1}{2}"),
        ("So it is \\boxed{\\frac{\\sqrt{3}}{2}}.", "\\frac{\\sqrt{3}}{2}"),  # nested braces
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces inside
        ("First \\boxed{3}.\nOn reflection the answer is \\boxed{4}.", "4"),  # last boxed
        ("same twice \\boxed{4} = \\boxed{4}", "4"),
        ("\\fbox{9}", "9"),
        ("The answer is 42.", "42"),
        ("Thus, the final answer is $\\frac{1}{2}$. Done.", "$\\frac{1}{2}$"),
        ("The answer is 3.5.", "3.5"),
        ("Final Answer: B", "B"),
        ("the answer is (C)\nbecause reasons", "(C)"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no answer anywhere here",
        "<answer></answer>",
        "<answer>   \n </answer>",
        "<answer>42",  # unclosed trailing tag: fail closed
        "<answer>1</answer> <answer>2",  # last tag unclosed
        "\\boxed{}",
        "\\boxed{ }",
        "the final result is \\boxed{\\frac{1}{2}",  # truncated boxed
        "<answer>A or B</answer>",  # ambiguous
        "<answer>3 or 5</answer>",
        "<answer>yes or no</answer>",
        "<answer>\\boxed{2} and \\boxed{3}</answer>",
        "so x = \\boxed{2} or x = \\boxed{3}",  # two boxes in the final span
        "The answer is A or B.",
        "The answer is .",
    ],
)
def test_extract_answer_none(text):
    assert extract_answer(text) is None


def test_extract_non_string_is_none():
    assert extract_answer(None) is None  # type: ignore[arg-type]


def test_boxed_in_earlier_line_is_not_ambiguous():
    text = "Intermediate: \\boxed{7}\nTherefore the answer is \\boxed{8}"
    assert extract_answer(text) == "8"


def test_or_inside_free_text_is_kept():
    # "or" inside prose is not an ambiguity between two atomic answers
    assert extract_answer("<answer>to be or not to be</answer>") == "to be or not to be"


# ---------------------------------------------------------------------------
# match: numbers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("42", "42"),
        (" 42\n", "42"),
        ("42.", "42"),
        ("$42$", "42"),
        ("$$42$$", "42"),
        ("\\(42\\)", "42"),
        ("\\boxed{42}", "42"),
        ("\\text{42}", "42"),
        ("1,234,567", "1234567"),
        ("1{,}234", "1234"),
        ("1234", "1,234"),
        ("3.50", "3.5"),
        ("2.0", "2"),
        (".5", "0.5"),
        ("-.5", "-0.5"),
        ("\\frac{3}{4}", "0.75"),
        ("\\dfrac{6}{8}", "3/4"),
        ("\\tfrac34", "\\frac{3}{4}"),
        ("-\\frac{3}{4}", "\\frac{-3}{4}"),
        ("50%", "50\\%"),
        ("50", "50\\%"),
        ("30", "30^\\circ"),
        ("30^{\\circ}", "30"),
        ("\\$18.90", "18.9"),
        ("x = 5", "5"),
        ("1e20", "100000000000000000000"),
        ("1.5 \\times 10^{3}", "1500"),
        ("2^{10}", "1024"),
        ("\\sqrt{16}", "4"),
        ("−7", "-7"),  # unicode minus
    ],
)
def test_number_accepts(answer, gold):
    assert detect_kind(gold) == "number"
    assert match(answer, gold)


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("41", "42"),
        ("43", "42"),
        ("-42", "42"),
        ("100000000000000000001", "100000000000000000000"),
        ("1e20", "100000000000000000001"),
        ("999999999999999999999999999999", "1000000000000000000000000000000"),
        ("4/3", "3/4"),
        ("\\frac{4}{3}", "\\frac{3}{4}"),
        ("0.5", "50\\%"),  # conservative: 0.5 is not accepted for 50%
        ("3.05", "3.5"),
        ("35", "3.5"),
        ("1", "1,000"),
        ("1.000", "1,000"),
        ("12 cm", "12"),  # units are not stripped
        ("twelve", "12"),
        ("42x", "42"),
        ("", "42"),
        ("   ", "42"),
        ("3.14159", "\\pi"),  # no tolerance
    ],
)
def test_number_rejects(answer, gold):
    assert not match(answer, gold)


def test_none_answer_is_false():
    assert match(None, "42") is False
    assert match(None, "B") is False
    assert match(None, "yes") is False
    assert match(None, "Paris") is False
    assert match(None, "x^2") is False


@pytest.mark.parametrize("gold", ["", "   ", "\n\t"])
def test_empty_gold_fails_closed(gold):
    # mid-run a bad row scores 0; detect_kind (data loading) refuses it
    assert match("1", gold) is False
    assert verify.match_outcome("1", gold) == "no_match"
    with pytest.raises(ValueError):
        detect_kind(gold)


def test_numeric_gold_is_coerced():
    assert match("42", 42)
    assert not match("43", 42)
    assert detect_kind(42) == "number"


def test_none_gold_fails_closed():
    assert match("1", None) is False  # type: ignore[arg-type]
    assert match(None, None) is False  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        detect_kind(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# match: expressions, sets, intervals
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, gold, ok",
    [
        ("2\\sqrt{3}", "\\sqrt{12}", True),
        ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),
        ("2 \\pi", "2\\pi", True),
        ("\\pi\\cdot 2", "2\\pi", True),
        ("1 + x^{2}", "x^2+1", True),
        ("(x+1)(x-1)", "x^2-1", True),
        ("x^2 - 1", "x^2+1", False),
        ("3\\pi", "2\\pi", False),
        ("\\sqrt{3}", "\\sqrt{2}", False),
        ("6.283185307179586", "2\\pi", False),
        ("e^{i\\pi}", "-1", True),
        ("\\log_2 8", "3", True),
        ("\\sin^2 x + \\cos^2 x", "1", True),
        ("(1, 2)", "(1,2)", True),
        ("(2, 1)", "(1, 2)", False),
        ("[0, 1)", "[0,1)", True),
        ("[0, 1]", "[0,1)", False),
        ("\\{3, 2, 1\\}", "\\{1,2,3\\}", True),
        ("1, 2, 3", "\\{1,2,3\\}", True),
        ("\\{1, 2\\}", "\\{1,2,3\\}", False),
        ("(-\\infty, 0) \\cup (1, \\infty)", "(1,\\infty)\\cup(-\\infty,0)", True),
        ("(-\\infty, 0] \\cup (1, \\infty)", "(1,\\infty)\\cup(-\\infty,0)", False),
        ("y = 2x + 3", "2x+3", True),
        ("\\emptyset", "\\varnothing", True),
        ("[-2, 7]", "x \\in [-2, 7]", True),
        ("25 = y^2 + x^2", "x^2+y^2=25", True),
        ("x^2+y^2=26", "x^2+y^2=25", False),
        ("2 \\pm \\sqrt{3}", "2+\\sqrt3, 2-\\sqrt3", True),
        ("\\frac{1 \\pm \\sqrt{5}}{2}", "\\frac{1-\\sqrt5}{2}, \\frac{1+\\sqrt5}{2}", True),
        ("\\pm 3", "3", False),
        ("2\\frac{1}{2}", "\\frac{5}{2}", False),  # mixed number: ambiguous, fail closed
    ],
)
def test_expressions(answer, gold, ok):
    assert match(answer, gold) is ok


def test_expression_kinds():
    assert detect_kind("\\sqrt{2}") == "expression"
    assert detect_kind("x^2+1") == "expression"
    assert detect_kind("(0, 1]") == "expression"
    assert detect_kind("\\{1, 2\\}") == "expression"
    assert detect_kind("2\\pi") == "expression"


# ---------------------------------------------------------------------------
# match: multiple choice, yes/no, text
# ---------------------------------------------------------------------------

CHOICES = ["Paris", "London", "Berlin", "Madrid"]


@pytest.mark.parametrize(
    "answer",
    [
        "B",
        "(B)",
        "B.",
        "B)",
        "Option B",
        "option b",
        "**B**",
        "b",
        "B: London",
        "(B) London",
        "\\boxed{B}",
        "\\text{B}",
        "London",
        "london.",
        "the London",
    ],
)
def test_choice_accepts(answer):
    assert detect_kind("B", CHOICES) == "choice"
    assert match(answer, "B", CHOICES)


@pytest.mark.parametrize(
    "answer",
    ["C", "(A)", "c.", "Option D", "Paris", "B or C", "B, C", "B: Paris", "Both", "E", ""],
)
def test_choice_rejects(answer):
    assert not match(answer, "B", CHOICES)


def test_choice_without_choices():
    assert detect_kind("C") == "choice"
    assert match("(c)", "C")
    assert match("C: anything", "C")
    assert not match("D", "C")
    assert not match("Paris", "C")


def test_choice_gold_given_as_text():
    assert detect_kind("London", CHOICES) == "choice"
    assert match("B", "London", CHOICES)
    assert not match("A", "London", CHOICES)


def test_choice_labels_in_choices_are_ignored():
    choices = ["A. red", "B. green", "C. blue"]
    assert match("green", "B", choices)
    assert match("B. green", "B", choices)
    assert not match("blue", "B", choices)


def test_choice_numeric_options():
    choices = ["1", "\\frac{1}{2}", "3", "4"]
    assert match("1/2", "B", choices)
    assert match("0.5", "B", choices)
    assert match("(B)", "B", choices)
    assert not match("3", "B", choices)
    assert not match("0.25", "B", choices)


def test_choice_option_text_that_looks_like_a_label():
    choices = ["E. coli", "C. elegans", "yeast"]
    assert match("C. elegans", "B", choices)
    assert match("B", "B", choices)
    assert not match("E. coli", "B", choices)


@pytest.mark.parametrize("gold", ["$$", "\\boxed{}", "\\text{ }"])
def test_gold_empty_after_unwrapping_fails_closed(gold):
    assert match("1", gold) is False
    with pytest.raises(ValueError):
        detect_kind(gold)


@pytest.mark.parametrize(
    "answer, gold, ok",
    [
        ("Yes", "yes", True),
        ("YES.", "Yes", True),
        ("**yes**", "Yes", True),
        ("\\text{No}", "no", True),
        ("No!", "NO", True),
        ("no", "yes", False),
        ("Yes", "No", False),
        ("yes and no", "yes", False),
        ("maybe", "no", False),
        ("True", "true", True),
        ("yes", "true", False),
    ],
)
def test_yesno(answer, gold, ok):
    assert detect_kind(gold) == "yesno"
    assert match(answer, gold) is ok


@pytest.mark.parametrize(
    "answer, gold, ok",
    [
        ("The Eiffel Tower", "eiffel tower", True),
        ("  eiffel   TOWER. ", "The Eiffel Tower", True),
        ("\\text{Marie Curie}", "Marie Curie", True),
        ("Newton's", "Newtons", True),
        ("Eiffel", "Eiffel Tower", False),  # never substring
        ("Eiffel Tower Paris", "Eiffel Tower", False),  # never superstring
        ("Marie Curry", "Marie Curie", False),
        ("", "Marie Curie", False),
    ],
)
def test_text(answer, gold, ok):
    assert detect_kind(gold) == "text"
    assert match(answer, gold) is ok


# ---------------------------------------------------------------------------
# outcomes, bounds
# ---------------------------------------------------------------------------


def test_outcomes_say_what_each_call_found():
    # what a caller learns is in what the call returns: no process-wide counters to read
    assert verify.extract_outcome("<answer>4</answer>") == ("4", "answer")
    assert verify.extract_outcome("nothing") == (None, "no_answer")
    assert verify.extract_outcome("<answer>") == (None, "no_answer")  # unclosed: fails closed
    assert verify.extract_outcome("<answer>" * 50_000) == (None, verify.TOO_COMPLEX)
    assert verify.match_outcome("4", "4") == "match"
    assert verify.match_outcome(None, "4") == "no_match"
    assert verify.match_outcome("\\sqrt{16}", "4") == "match"  # the symbolic path
    assert verify.match_outcome("x", "4") == "no_match"  # not readable as a number
    assert verify.match_outcome("10^{10^{10}}", "4") == verify.TOO_COMPLEX
    assert detect_kind("4") == "number"
    assert not hasattr(verify, "stats") and not hasattr(verify, "reset_stats")


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("10^{10^{10}}", "10"),
        ("2^{2^{2^{2^{2}}}}", "4"),
        ("(x+1)^{100000}", "x"),
        ("99999!", "1"),
        ("9!!!", "1"),
        ("(" * 400 + "1" + ")" * 400, "1"),
        ("x" * 50000, "x"),
    ],
)
def test_pathological_inputs_are_bounded(answer, gold):
    assert verify.match_outcome(answer, gold) == verify.TOO_COMPLEX
    assert match(answer, gold) is False


def test_fast_path_never_imports_sympy():
    code = textwrap.dedent(
        """
        import sys
        from rewards import verify
        from mmrlvr.audit.cases import FAST_FAMILIES, generate_cases
        cases = generate_cases(8, seed=3, families=FAST_FAMILIES)
        for c in cases:
            # near misses like 2^{10} are not in the fast families by construction
            verdict = verify.match_outcome(c.pred, c.gold, list(c.choices) if c.choices else None)
            assert verdict == ("match" if c.expect else "no_match"), c
        for t in ("<answer>42</answer>", "\\\\boxed{B}", "The answer is yes."):
            assert verify.extract_outcome(t)[1] == "answer"
        assert "sympy" not in sys.modules, "fast path imported sympy"
        print("ok", len(cases))
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_the_package_layout_imports_point_down_its_list():
    # the package docstring lists its files in order; each may import only files above it
    layout = re.findall(r"^    (\w+)\.py  ", verify.__doc__, re.MULTILINE)
    files = sorted(p.stem for p in (ROOT / "rewards" / "verify").glob("*.py") if p.stem != "__init__")
    assert sorted(layout) == files
    for i, name in enumerate(layout):
        tree = ast.parse((ROOT / "rewards" / "verify" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rewards"):
                target = node.module.removeprefix("rewards.verify.")
                assert target in layout[:i], f"rewards/verify/{name}.py imports {node.module}"
