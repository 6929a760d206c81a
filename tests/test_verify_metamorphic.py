"""Metamorphic suite for rewards.verify.

Rewrites of a gold answer (meaning-preserving, by construction) must be
accepted and near misses (different answers, by construction) rejected, per
answer family and per rewrite / near-miss kind.  Cases come from
``mmrlvr/audit/cases.py`` (shared with ``bench/verify.py``); each test id names
``family/rewrite|near/kind``.
"""

import random
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from mmrlvr.audit.cases import (
    COMPLETION_STYLES,
    FAMILIES,
    generate_cases,
    wrap_completion,
)
from rewards import verify
from rewards.verify import extract_answer, match

# 31 items per family: integer item i has magnitude 10**i, i = 0..30.
CASES = generate_cases(n_per_family=31, seed=0)
GROUPS = defaultdict(list)
for _c in CASES:
    GROUPS[_c.group].append(_c)


def _choices(c):
    return list(c.choices) if c.choices else None


def _failures(cases, judge):
    bad = []
    for c in cases:
        got = judge(c)
        if got is not c.expect:
            bad.append(f"gold={c.gold!r} pred={c.pred!r} choices={c.choices} -> {got}")
    return bad


def test_every_family_has_rewrites_and_near_misses():
    fams = {c.family for c in CASES}
    assert fams == set(FAMILIES)
    for fam in FAMILIES:
        assert any(c.family == fam and c.expect for c in CASES), fam
        assert any(c.family == fam and not c.expect for c in CASES), fam


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_metamorphic(group):
    bad = _failures(GROUPS[group], lambda c: match(c.pred, c.gold, _choices(c)))
    verdict = "rewrite rejected" if "/rewrite/" in group else "near miss accepted"
    assert not bad, f"{group}: {len(bad)}/{len(GROUPS[group])} {verdict}:\n" + "\n".join(bad[:10])


# ---------------------------------------------------------------------------
# integers: off-by-one at every magnitude 10^0 .. 10^30
# ---------------------------------------------------------------------------


def _thousands(n: int) -> str:
    return f"{n:,}"


@pytest.mark.parametrize("k", range(31), ids=lambda k: f"1e{k}")
def test_integer_magnitude(k):
    rng = random.Random(k)
    for n in (10**k, 10**k + rng.randrange(10**k), 2 * 10**k - 1):
        for v in (n, -n):
            g = str(v)
            for rewrite in (
                g,
                f" {g}.\n",
                f"$\\boxed{{{g}}}$",
                _thousands(v),
                _thousands(v).replace(",", "{,}"),
                g + ".00",
                f"\\frac{{{2 * v}}}{{2}}",
            ):
                assert match(rewrite, g), (k, g, rewrite)
            for near in (v + 1, v - 1, -v, v * 10):
                assert not match(str(near), g), (k, g, near)
                assert not match(_thousands(near), g), (k, g, near)
                assert not match(f"{near}.0", g), (k, g, near)
            # the gold written with separators, answer off by one
            assert not match(str(v + 1), _thousands(v)), (k, v)
            assert match(str(v), _thousands(v)), (k, v)


# ---------------------------------------------------------------------------
# extraction: rewrites / near misses inside whole completions
# ---------------------------------------------------------------------------

_EXTRACT_CASES = generate_cases(n_per_family=6, seed=1)
_EXTRACT_GROUPS = defaultdict(list)
for _c in _EXTRACT_CASES:
    _EXTRACT_GROUPS[_c.family].append(_c)


@pytest.mark.parametrize("style", sorted(COMPLETION_STYLES))
@pytest.mark.parametrize("family", FAMILIES)
def test_extraction_then_match(family, style):
    cases = _EXTRACT_GROUPS[family]
    bad = _failures(
        cases, lambda c: match(extract_answer(wrap_completion(c.pred, style)), c.gold, _choices(c))
    )
    assert not bad, f"{family}/{style}: {len(bad)}/{len(cases)} wrong:\n" + "\n".join(bad[:10])


@pytest.mark.parametrize(
    "text, gold, ok",
    [
        ("<think>it might be 41</think><answer>42</answer>", "42", True),
        ("<think>it might be 42</think><answer>41</answer>", "42", False),
        ("<think>\\boxed{42}</think><answer></answer>", "42", False),  # empty answer scores 0
        ("<answer>\\boxed{\\frac{\\sqrt{3}}{2}}</answer>", "\\frac{\\sqrt3}{2}", True),
        ("So we get $\\boxed{\\frac{1}{\\sqrt{2}}}$.", "\\frac{\\sqrt{2}}{2}", True),
        ("So we get $\\boxed{\\frac{1}{\\sqrt{3}}}$.", "\\frac{\\sqrt{2}}{2}", False),
        ("The answer is 42.", "42", True),
        ("The answer is 42.", "43", False),
        ("The answer is 1,234,567.", "1234567", True),
        ("<answer>42", "42", False),  # unclosed: fail closed
        ("<answer>B or C</answer>", "B", False),
        ("\\boxed{2} or \\boxed{3}", "2", False),
    ],
)
def test_extraction_hand(text, gold, ok):
    assert match(extract_answer(text), gold) is ok


# ---------------------------------------------------------------------------
# thread safety
# ---------------------------------------------------------------------------


def test_thread_safety_same_results():
    cases = generate_cases(n_per_family=8, seed=7)

    def run(c):
        return (verify.match_outcome(c.pred, c.gold, _choices(c)),
                verify.extract_outcome(wrap_completion(c.pred, "answer_tag")))

    serial = [run(c) for c in cases]
    work = cases * 3
    with ThreadPoolExecutor(max_workers=8) as ex:
        results = list(ex.map(run, work))
    assert results == serial * 3
    assert all((r[0] == "match") is c.expect for r, c in zip(results, work))
