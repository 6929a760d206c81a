"""Degenerate completions: extraction, matching and the accuracy, format and pirl rewards stay bounded.

Each case's outcome is pinned: fail closed (no match for garbage, ``too_complex`` where a size
bound cut the check short, the exact answer where a legitimate one is inside). Its cost is pinned
by growth, not by a clock: each kind of input is timed (this process's CPU time, best of 3) at a
size n and at k·n (k = 8 unless said), and the larger may cost at most ``MAX_RATIO`` times the
smaller, or ``MAX_RATIO`` × ``FLOOR_S`` where the smaller is too quick to time. Linear work grows 8x,
quadratic 64x, and every unbounded case below (nested ``\\boxed{`` cubic: 800 levels 65 s of CPU; a
run of 20,000 spaces before an "or" 27 s; in the format and pirl rewards 20,000 ``<think>`` 21 s and
3,000 ``</think>\\boxed{`` 58 s; a symbolic engine let loose on a 135,751-term expansion) costs
seconds or more at the larger size; a busy machine slows both sizes alike, so it cannot fail it.
``python bench/verify.py --adversarial`` prints the absolute figures (the target: < 50 ms a call).
"""

import gc
import random
import time

import pytest

from mmrlvr.data import Example
from rewards import verify
from rewards.accuracy import AccuracyReward
from rewards.format import FormatReward
from mmrlvr.methods.pirl.reward import PirlReward
from rewards.verify import TOO_COMPLEX, extract_outcome, match_outcome

MAX_RATIO = 24  # k·n may cost 24x n: linear work is 8x, quadratic 64x (a 3x margin either side)
FLOOR_S = 0.005  # below 5 ms of CPU a timing is noise: the larger size may then take 24 x 5 ms


@pytest.fixture(scope="module", autouse=True)
def _warm_sympy():
    verify.match("\\sin^2 x + \\cos^2 x", "1")  # the first symbolic call imports sympy


def _cpu(fn, args) -> float:
    """`fn(*args)`'s CPU time in this process (a wall clock counts other jobs), with the garbage
    collector off (a collection of earlier tests' objects once cost a 25 ms call 150 ms): best of
    3, or one run past 0.5 s, where noise is small beside it."""
    times = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            t0 = time.process_time()
            fn(*args)
            times.append(time.process_time() - t0)
            if times[-1] > 0.5:
                break
    finally:
        gc.enable()
    return min(times)


def _boxes(k: int, inner: str = "1") -> str:
    return "\\boxed{" * k + inner + "}" * k


def _random(alphabet, n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(n))


_WORDS = ["lorem", "ipsum", "dolor", "answer", "the", "x", "2"]  # "answer", never "answer is"
_PLAIN = " ".join(random.Random(1).choice(_WORDS) for _ in range(30_000))  # ~180 KB


# ---------------------------------------------------------------------------
# extraction: (completion, extracted answer or None, outcome)
# ---------------------------------------------------------------------------

EXTRACT_CASES = {
    "boxed nested 3": (_boxes(3), "1", "answer"),
    "boxed nested 50 (the depth bound)": (_boxes(verify.MAX_BRACE_DEPTH), "1", "answer"),
    "boxed nested 52": (_boxes(verify.MAX_BRACE_DEPTH + 2), None, TOO_COMPLEX),
    "boxed nested 800": (_boxes(800), None, TOO_COMPLEX),
    "boxed nested 10,000": (_boxes(10_000), None, TOO_COMPLEX),
    "<answer> boxed nested 800": (f"<answer>{_boxes(800)}</answer>", None, TOO_COMPLEX),
    "<answer> boxed nested 10,000": (f"<answer>{_boxes(10_000)}</answer>", None, TOO_COMPLEX),
    "1 MB random braces/backslashes": (_random("{}\\", 1 << 20), None, TOO_COMPLEX),
    "1 MB plain text": (_PLAIN * 6, None, TOO_COMPLEX),
    "180 KB plain text": (_PLAIN, None, "no_answer"),
    "180 KB plain text, then the answer": (_PLAIN + ". The answer is 42.", "42", "answer"),
    "50,000 <answer> tags": ("<answer>" * 50_000, None, TOO_COMPLEX),
    "20,000 <answer> tags, unclosed": ("<answer>" * 20_000, None, "no_answer"),
    "10,000 <answer> pairs, then the answer":
        ("<answer>1</answer>" * 10_000 + "<answer>42</answer>", "42", "answer"),
    "unbalanced: closes before an unclosed open": ("</answer>" * 10_000 + "<answer>5", None, "no_answer"),
    "unbalanced: 10,000 opens then 10,000 closes":
        ("<answer>" * 10_000 + "</answer>" * 10_000, None, TOO_COMPLEX),
    "\\frac nested 1,000": ("\\boxed{" + "\\frac{" * 1000 + "1" + "}{2}" * 1000 + "}", None, TOO_COMPLEX),
    "\\sqrt nested 2,000": ("\\boxed{" + "\\sqrt{" * 2000 + "2" + "}" * 2000 + "}", None, TOO_COMPLEX),
    "100,000 digits": ("\\boxed{" + "1" * 100_000 + "}", None, TOO_COMPLEX),
    "65 boxes in the final span": ("\\boxed{1}" * 65, None, TOO_COMPLEX),
    "64 boxes in the final span": ("\\boxed{1}" * 64, "1", "answer"),
    "3,900 'or' alternatives": ("<answer>" + "1 or " * 3900 + "1</answer>", None, TOO_COMPLEX),
    "answer over MAX_ANSWER_CHARS": ("<answer>" + "a" * 20_001 + "</answer>", None, TOO_COMPLEX),
}


@pytest.mark.parametrize("name", EXTRACT_CASES)
def test_extraction_is_bounded(name):
    text, answer, outcome = EXTRACT_CASES[name]
    assert extract_outcome(text) == (answer, outcome)


def test_random_latex_under_the_length_bound_is_bounded():
    pieces = ["{", "}", "\\", "\\boxed{", "\\boxed ", "<answer>", "</answer>", " ", "x", " or ", "\n"]
    pieces += ["\\frac{", "^{"]
    for seed in range(3):
        text = "".join(random.Random(seed).choice(pieces) for _ in range(40_000))  # ~110 KB
        answer, outcome = extract_outcome(text)
        assert outcome in ("answer", "no_answer", TOO_COMPLEX)
        assert (answer is None) is (outcome != "answer")
        if answer is not None:
            assert match_outcome(answer, "42") != "match"


def test_whitespace_runs_keep_their_answers():
    # formerly quadratic/cubic regex backtracking: 27 s for 20,000 spaces
    text = "<answer>A" + " " * 19_000 + "x or B</answer>"
    answer, outcome = extract_outcome(text)
    assert outcome == "answer" and answer == "A" + " " * 19_000 + "x or B"
    for gold in ("42", "B", "yes", "Paris", "x^2+1"):
        assert match_outcome("1" + " " * 19_000 + "x", gold) == "no_match"
    # past MAX_SYMBOLIC_CHARS the formula is not parsed: too complex
    dots = "1" + "." * 19_000 + "x"
    verdicts = [match_outcome(dots, gold) for gold in ("42", "B", "yes", "x^2+1")]
    assert verdicts == [TOO_COMPLEX, "no_match", "no_match", TOO_COMPLEX]


# ---------------------------------------------------------------------------
# matching: (answer, gold, verdict)
# ---------------------------------------------------------------------------

_SET = ",".join(f"x^{{{k}}}" for k in range(64))
_SET_REVERSED = ",".join(f"x^{{{k}}}" for k in range(63, -1, -1))

MATCH_CASES = {
    "10^{10^{10^{10}}} vs 10": ("10^{10^{10^{10}}}", "10", TOO_COMPLEX),
    "10^{10^{10^{10}}} vs itself + 1": ("10^{10^{10^{10}}}", "10^{10^{10^{10}}}+1", TOO_COMPLEX),
    "10^{10^{10^{10}}} vs itself, same string": ("10^{10^{10^{10}}}", "10^{10^{10^{10}}}", "match"),
    "9^{9^{9^9}} vs 9": ("9^{9^{9^9}}", "9", TOO_COMPLEX),
    "9^{9^{9^9}} vs 9^{9^{9^8}}": ("9^{9^{9^9}}", "9^{9^{9^8}}", TOO_COMPLEX),
    "e^{e^{e^{e^{e^{e^x}}}}} vs the same in y":
        ("e^{e^{e^{e^{e^{e^{x}}}}}}", "e^{e^{e^{e^{e^{e^{y}}}}}}", TOO_COMPLEX),
    "e^{e^{e^{e^{2}}}} (huge but finite) vs 1": ("e^{e^{e^{e^{2}}}}", "1", "no_match"),
    "100,000 digits vs the same": ("1" * 100_000, "1" * 100_000, TOO_COMPLEX),
    "100,000 digits vs one digit off": ("1" * 100_000, "1" * 99_999 + "2", TOO_COMPLEX),
    "100,000 digits vs 42": ("1" * 100_000, "42", TOO_COMPLEX),
    "2,000 digits vs the same": ("1" * 2000, "1" * 2000, "match"),
    "2,000 digits vs one digit off": ("1" * 2000, "1" * 1999 + "2", "no_match"),
    "1,200 digits with separators": (f"{int('1' * 1200):,}", "1" * 1200, "match"),
    "\\frac nested 1,000 vs 1": ("\\frac{" * 1000 + "1" + "}{2}" * 1000, "1", TOO_COMPLEX),
    "\\frac nested 3 vs 1/8": ("\\frac{\\frac{\\frac{1}{2}}{2}}{2}", "\\frac{1}{8}", "match"),
    "continued fraction 1/(1+1/(1+1/2)) vs 0.6":
        ("\\frac{1}{1+\\frac{1}{1+\\frac{1}{2}}}", "0.6", "match"),
    "continued fraction x/(1+x/...) 20 deep vs x (formerly 50 s)":
        ("\\frac{x}{1+" * 20 + "x" + "}" * 20, "x", TOO_COMPLEX),
    "\\sqrt nested 10 vs x^{1/1024}": ("\\sqrt{" * 10 + "x" + "}" * 10, "x^{\\frac{1}{1024}}", "match"),
    "\\sqrt{1+\\sqrt{1+...}} 10 deep vs x": ("\\sqrt{1+" * 10 + "x" + "}" * 10, "x", TOO_COMPLEX),
    "\\sqrt nested 2,000 vs 2": ("\\sqrt{" * 2000 + "2" + "}" * 2000, "2", TOO_COMPLEX),
    "\\log_2 nested 30 vs x": ("\\log_{2}(" * 30 + "x" + ")" * 30, "x", TOO_COMPLEX),
    "24 sin^2+cos^2 terms vs 24 (formerly > 20 s)":
        ("+".join(f"\\sin^2({k}x)+\\cos^2({k}x)" for k in range(1, 25)), "24", TOO_COMPLEX),
    "(x+y+z+w+1)^{40} (sin^2+cos^2) vs (x+y+z+w+1)^{40}: 135,751 terms to expand":
        ("(x+y+z+w+1)^{40}(\\sin^2 x+\\cos^2 x)", "(x+y+z+w+1)^{40}", TOO_COMPLEX),
    "\\binom{10000}{5000} vs 1": ("\\binom{10000}{5000}", "1", "no_match"),
    "set of 64 powers, reversed": ("\\{" + _SET + "\\}", "\\{" + _SET_REVERSED + "\\}", "match"),
    "nested \\boxed 50 vs 1": (_boxes(verify.MAX_BRACE_DEPTH), "1", "match"),
    "nested \\boxed 800 vs 1": (_boxes(800), "1", TOO_COMPLEX),
    "2xy-style letter runs, 20,000 chars, vs 42":
        ("".join(f"2{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}+" for i in range(4000)), "42", TOO_COMPLEX),
    "1 MB random braces/backslashes vs 1": (_random("{}\\", 1 << 20), "1", TOO_COMPLEX),
}


@pytest.mark.parametrize("name", MATCH_CASES)
def test_match_is_bounded(name):
    answer, gold, verdict = MATCH_CASES[name]
    assert match_outcome(answer, gold) == verdict


def test_each_call_returns_its_own_outcome():
    # no process-wide counters: a caller learns "too complex" from the call it made
    assert extract_outcome(_boxes(800)) == (None, TOO_COMPLEX)
    assert match_outcome("10^{10^{10^{10}}}", "10") == TOO_COMPLEX
    assert match_outcome("42", "42") == "match"
    assert extract_outcome("<answer>42</answer>") == ("42", "answer")


@pytest.mark.parametrize("gold", [None, "", "   ", "$$", "\\boxed{}"])
def test_missing_gold_fails_closed(gold):
    assert match_outcome("3", gold) == "no_match"
    assert verify.match("3", gold) is False
    with pytest.raises(ValueError):  # how loading learns of it: the row is refused
        verify.detect_kind(gold)


def test_too_complex_gold_fails_closed():
    assert match_outcome("1", "1" * (verify.MAX_ANSWER_CHARS + 1)) == TOO_COMPLEX
    assert match_outcome("1", _boxes(verify.MAX_BRACE_DEPTH + 1)) == TOO_COMPLEX
    with pytest.raises(ValueError, match="too complex"):
        verify.detect_kind(_boxes(verify.MAX_BRACE_DEPTH + 1))


# ---------------------------------------------------------------------------
# the accuracy reward reports the outcome
# ---------------------------------------------------------------------------


def test_accuracy_reward_flags_too_complex():
    reward = AccuracyReward()
    completions = [
        "<answer>42</answer>",  # correct
        "<answer>41</answer>",  # wrong
        "no answer here",  # unparsed
        _boxes(10_000, "42"),  # extraction too complex
        "\\boxed{10^{10^{10^{10}}}}",  # matching too complex
        "<answer>" * 50_000,  # too long to read
    ]
    scores = reward.score(Example(id="q", prompt="", answer="42"), completions)
    assert [s["overall"] for s in scores] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [s["parsed"] for s in scores] == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert [s["too_complex"] for s in scores] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("gold", ["", "   "])
def test_accuracy_reward_with_empty_gold_scores_zero(gold):
    scores = AccuracyReward().score(Example(id="q", prompt="", answer=gold), ["<answer>3</answer>"])
    assert scores == [{"overall": 0.0, "parsed": 1.0, "too_complex": 0.0}]


# ---------------------------------------------------------------------------
# the format and pirl rewards: tag floods are read in linear time
# ---------------------------------------------------------------------------


def _flood(tag: str, n: int = 1 << 20) -> str:
    return (tag * (n // len(tag) + 1))[:n]


# completion -> (format's overall, pirl's overall and correct at progress 0), against gold "1"
TAG_FLOOD_CASES = {
    "20,000 <think> (pirl: formerly 21 s)": ("<think>" * 20_000, 0.0, 0.0, 0.0),
    "8,000 \\boxed{ after a think block (format: formerly 0.13 s)":
        ("<think>a</think>" + "\\boxed{" * 8000, 0.0, 0.0, 0.0),
    "8,000 </think><answer>b</answer>x (format: formerly 11 s)":
        ("<think>a" + "</think><answer>b</answer>x" * 8000, 0.0, 0.0, 0.0),
    "3,000 </think>\\boxed{ (format: formerly 58 s)": ("<think>a" + "</think>\\boxed{" * 3000, 0.0, 0.0, 0.0),
    "10,000 </think>, then the answer":
        ("<think>a" + "</think>" * 10_000 + "<answer>1</answer>", 1.0, 1.0, 1.0),
    "10,000 \\boxed{, then one closing brace":
        ("<think>a</think>" + "\\boxed{" * 10_000 + "1}", 1.0, 0.0, 0.0),
    "1 MB <think>": (_flood("<think>"), 0.0, 0.0, 0.0),
    "1 MB </think>": ("<think>a" + _flood("</think>"), 0.0, 0.0, 0.0),
    "1 MB <answer>": ("<think>a</think>" + _flood("<answer>"), 0.0, 0.0, 0.0),
    "1 MB </answer>": ("<think>a</think><answer>" + _flood("</answer>"), 0.0, 0.0, 0.0),
    "1 MB \\boxed{": ("<think>a</think>" + _flood("\\boxed{"), 0.0, 0.0, 0.0),
    "1 MB of spaced think blocks": (_flood("< think >a< / think >"), 0.0, 0.0, 0.0),
}


@pytest.mark.parametrize("name", TAG_FLOOD_CASES)
def test_format_and_pirl_rewards_are_bounded(name):
    text, formatted, overall, correct = TAG_FLOOD_CASES[name]
    example = Example(id="q", prompt="", answer="1")
    assert FormatReward().score(example, [text]) == [{"overall": formatted}]
    (pirl,) = PirlReward().score(example, [text])
    assert (pirl["overall"], pirl["correct"], pirl["format"]) == (overall, correct, formatted)


# (completion, formatted, formatted with allow_boxed=False): what the regexes this scan replaced
# answered, so ordinary completions score as before
FORMAT_HAND_CASES = [
    ("<think>x</think><answer>4</answer>", True, True),
    ("  <think>x</think>\n<answer> 4 </answer>\n", True, True),
    ("<think>x</think><answer></answer>", False, False),
    ("<think> </think><answer>4</answer>", False, False),
    ("<answer>4</answer>", False, False),
    ("<think>x</think><answer>4</answer> and more", False, False),
    ("<think>x</think><answer>4</answer><answer>5</answer>", False, False),
    ("<think>x</think><think>y</think><answer>4</answer>", False, False),
    ("<think>x</think> first </think><answer>4</answer>", True, True),
    ("<think>x</think> so the answer is \\boxed{4}", True, False),
    ("<think>x</think>\\boxed{4}.", False, False),
    ("<think>x</think>\\boxed{}", False, False),
    ("<think>x</think>\\boxed{\\frac{1}{2}}  \n", True, False),
    ("<think></think>\\boxed{4}", False, False),
    ("<THINK>x</THINK><answer>4</answer>", False, False),
]


@pytest.mark.parametrize("text, formatted, formatted_unboxed", FORMAT_HAND_CASES)
def test_format_reads_ordinary_completions_as_before(text, formatted, formatted_unboxed):
    example = Example(id="q", prompt="", answer="4")
    assert FormatReward().score(example, [text]) == [{"overall": float(formatted)}]
    assert FormatReward(allow_boxed=False).score(example, [text]) == [{"overall": float(formatted_unboxed)}]


# ---------------------------------------------------------------------------
# growth: each kind of degenerate input at n and k·n (the larger is the case above, or past it)
# ---------------------------------------------------------------------------


def _both_rewards(text: str):
    example = Example(id="q", prompt="", answer="1")
    return FormatReward().score(example, [text]), PirlReward().score(example, [text])


def _tower(base: str, top: str, height: int) -> str:
    return "^{".join([base] * height) + "^{" + top + "}" * height if height else top


def _sets(n: int) -> tuple[str, str]:
    powers = [f"x^{{{k}}}" for k in range(n)]
    return "\\{" + ",".join(powers) + "\\}", "\\{" + ",".join(reversed(powers)) + "\\}"


# name -> (function, args at size n, n, k): timed at n and k·n
GROWTH = {
    "extract: nested \\boxed{ (cubic once: 800 levels, 65 s)":
        (extract_outcome, lambda n: (_boxes(n),), 1250, 8),
    "extract: <answer> around nested \\boxed{": (
        extract_outcome, lambda n: (f"<answer>{_boxes(n)}</answer>",), 1250, 8),
    "extract: random braces and backslashes (1 MB)":
        (extract_outcome, lambda n: (_random("{}\\", n),), 1 << 17, 8),
    "extract: plain text (1 MB)":
        (extract_outcome, lambda n: ((_PLAIN * 6)[:n],), 1 << 17, 8),
    "extract: <answer> tags": (extract_outcome, lambda n: ("<answer>" * n,), 6250, 8),
    "extract: <answer> pairs, then the answer": (
        extract_outcome, lambda n: ("<answer>1</answer>" * n + "<answer>42</answer>",), 1250, 8),
    "extract: closes before an unclosed open":
        (extract_outcome, lambda n: ("</answer>" * n + "<answer>5",), 1250, 8),
    "extract: opens, then closes":
        (extract_outcome, lambda n: ("<answer>" * n + "</answer>" * n,), 1250, 8),
    "extract: \\frac nested": (extract_outcome, lambda n: (
        "\\boxed{" + "\\frac{" * n + "1" + "}{2}" * n + "}",), 125, 8),
    "extract: \\sqrt nested": (extract_outcome, lambda n: (
        "\\boxed{" + "\\sqrt{" * n + "2" + "}" * n + "}",), 250, 8),
    "extract: digits in a box": (extract_outcome, lambda n: ("\\boxed{" + "1" * n + "}",), 12_500, 8),
    "extract: boxes in the final span": (extract_outcome, lambda n: ("\\boxed{1}" * n,), 8, 8),
    "extract: 'or' alternatives": (extract_outcome, lambda n: (
        "<answer>" + "1 or " * n + "1</answer>",), 500, 8),
    "extract: spaces before an 'or' (27 s once at 20,000)": (extract_outcome, lambda n: (
        "<answer>A" + " " * n + "x or B</answer>",), 2375, 8),
    "extract: random LaTeX pieces": (extract_outcome, lambda n: ("".join(
        random.Random(0).choice(["{", "}", "\\", "\\boxed{", "<answer>", " or ", "^{"])
        for _ in range(n)),), 5000, 8),
    "match: spaces in an answer": (match_outcome, lambda n: ("1" + " " * n + "x", "x^2+1"), 2375, 8),
    "match: dots past the symbolic bound":
        (match_outcome, lambda n: ("1" + "." * n + "x", "x^2+1"), 2375, 8),
    "match: digits, one off": (match_outcome, lambda n: ("1" * n, "1" * (n - 1) + "2"), 250, 8),
    "match: digits past the length bound":
        (match_outcome, lambda n: ("1" * n, "1" * (n - 1) + "2"), 12_500, 8),
    "match: digits with separators": (match_outcome, lambda n: (f"{int('1' * n):,}", "1" * n), 150, 8),
    "match: \\frac nested": (match_outcome, lambda n: ("\\frac{" * n + "1" + "}{2}" * n, "1"), 125, 8),
    "match: continued fraction x/(1+x/...) (50 s once at 20 deep)":
        (match_outcome, lambda n: ("\\frac{x}{1+" * n + "x" + "}" * n, "x"), 3, 8),
    "match: \\sqrt{1+\\sqrt{1+...}}": (match_outcome, lambda n: ("\\sqrt{1+" * n + "x" + "}" * n, "x"), 2, 8),
    "match: \\sqrt nested vs a power of x": (match_outcome, lambda n: (
        "\\sqrt{" * n + "x" + "}" * n, f"x^{{\\frac{{1}}{{{2 ** n}}}}}"), 2, 5),
    "match: \\log_2 nested": (match_outcome, lambda n: ("\\log_{2}(" * n + "x" + ")" * n, "x"), 4, 8),
    "match: sin^2+cos^2 terms (> 20 s once at 24)": (match_outcome, lambda n: ("+".join(
        f"\\sin^2({k}x)+\\cos^2({k}x)" for k in range(1, n + 1)), str(n)), 3, 8),
    "match: (x+y+z+w+1)^n (sin^2+cos^2), 135,751 terms at 40": (match_outcome, lambda n: (
        f"(x+y+z+w+1)^{{{n}}}(\\sin^2 x+\\cos^2 x)", f"(x+y+z+w+1)^{{{n}}}"), 4, 10),
    "match: a tower of 10s vs 10": (match_outcome, lambda n: (_tower("10", "10", n), "10"), 1, 3),
    "match: a tower of 9s vs 9": (match_outcome, lambda n: (_tower("9", "9", n), "9"), 1, 3),
    "match: a tower of e vs the same in y": (match_outcome, lambda n: (
        _tower("e", "x", n), _tower("e", "y", n)), 2, 3),
    "match: 2xy-style letter runs": (match_outcome, lambda n: ("".join(
        f"2{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}+" for i in range(n)), "42"), 500, 8),
    "match: random braces and backslashes (1 MB)":
        (match_outcome, lambda n: (_random("{}\\", n), "1"), 1 << 17, 8),
    "match: \\binom{n}{n/2}": (match_outcome, lambda n: (f"\\binom{{{n}}}{{{n // 2}}}", "1"), 1250, 8),
    "match: a set of powers, reversed": (match_outcome, _sets, 8, 8),
    "format, pirl: <think> (21 s once at 20,000)": (_both_rewards, lambda n: ("<think>" * n,), 2500, 8),
    "format, pirl: </think>\\boxed{ (58 s once at 3,000)":
        (_both_rewards, lambda n: ("<think>a" + "</think>\\boxed{" * n,), 375, 8),
    "format, pirl: </think><answer>b</answer>x (11 s once at 8,000)":
        (_both_rewards, lambda n: ("<think>a" + "</think><answer>b</answer>x" * n,), 1000, 8),
    "format, pirl: \\boxed{ after a think block":
        (_both_rewards, lambda n: ("<think>a</think>" + "\\boxed{" * n,), 1000, 8),
    "format, pirl: tag floods (1 MB)": (_both_rewards, lambda n: (
        "<think>a</think><answer>" + _flood("</answer>", n),), 1 << 17, 8),
    "format, pirl: spaced think blocks (1 MB)":
        (_both_rewards, lambda n: (_flood("< think >a< / think >", n),), 1 << 17, 8),
    "accuracy: nested \\boxed{ around the answer": (lambda text: AccuracyReward().score(
        Example(id="q", prompt="", answer="42"), [text]), lambda n: (_boxes(n, "42"),), 1250, 8),
}


@pytest.mark.parametrize("name", GROWTH)
def test_work_grows_at_most_linearly_with_the_input(name):
    """CPU time at k·n against n: a superlinear blow-up fails on any machine, a busy one cannot."""
    fn, make, n, k = GROWTH[name]
    small, large = make(n), make(k * n)
    t_small, t_large = _cpu(fn, small), _cpu(fn, large)
    allowed = MAX_RATIO * max(t_small, FLOOR_S)
    assert t_large <= allowed, (f"{name}: {t_large * 1e3:.1f} ms of CPU at {k}·n against "
                                f"{t_small * 1e3:.1f} ms at n={n} (at most {allowed * 1e3:.0f} ms)")
