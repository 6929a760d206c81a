"""`mmrlvr audit-verifier`: metamorphic audit of a reward (mmrlvr/audit/run.py).

Our `accuracy` reward passes every family (tests/test_verify_metamorphic.py pins the same cases
on `rewards.verify.match`), a weak exact-match verifier is caught rejecting rewrites, a verifier
that raises or hangs is counted as an error and never as a rejection, and the CLI writes JSON.
"""
import json
import textwrap

import pytest

from mmrlvr.audit.cases import FAMILIES, generate_cases
from mmrlvr.audit.run import audit, bucket, markdown, off_by_one_magnitude, summarize
from mmrlvr.cli import main
from mmrlvr.config import ConfigError


def _user_reward(tmp_path, body: str) -> str:
    path = tmp_path / "my_verifier.py"
    path.write_text(textwrap.dedent(body))
    return f"{path}:verify"


def test_accuracy_accepts_every_rewrite_and_rejects_every_near_miss():
    report = audit("accuracy", n_per_family=2, seed=3, progress=False)
    assert set(report["families"]) == set(FAMILIES)
    for name, fam in report["families"].items():
        assert fam["rewrite"]["n"] > 0 and fam["near"]["n"] > 0, name
        assert fam["rewrite"]["accepted"] == fam["rewrite"]["n"], name
        assert fam["near"]["accepted"] == 0 and fam["near"]["error"] == 0, name
    assert report["misjudged_total"] == 0 and report["errors"] == {}
    rewrites = sum(c.expect for c in generate_cases(2, seed=3))
    assert report["totals"]["rewrite"] == {"n": rewrites, "accepted": rewrites, "rejected": 0,
                                           "error": 0}
    # every style was used, each with full acceptance of its rewrites
    assert len(report["styles"]) == 4
    assert all(s["rewrite"]["accepted"] == s["rewrite"]["n"] > 0 for s in report["styles"].values())
    table = markdown(report)
    assert "| integer | " in table and "| **all** |" in table and "worst kinds" not in table


def test_off_by_one_cases_are_bucketed_by_the_golds_magnitude():
    cases = generate_cases(4, seed=0, families=["integer", "decimal", "percent", "expression"])
    near = {(c.family, c.kind, c.gold): off_by_one_magnitude(c) for c in cases}
    # hand-checked: integer item i has magnitude 10^i, so item 2 (3 digits) lands in <1e3
    ints = sorted({g for (f, k, g), m in near.items() if f == "integer" and m is not None},
                  key=lambda g: abs(int(g)))
    assert [bucket(abs(int(g))) for g in ints] == ["<10", "<1e3", "<1e3", "<1e6"]
    assert off_by_one_magnitude(next(c for c in cases if c.kind == "times_ten")) is None
    assert off_by_one_magnitude(next(c for c in cases if c.expect)) is None
    assert [bucket(x) for x in (9.99, 10, 999, 1000, 999_999, 10**6, 10**30)] == \
        ["<10", "<1e3", "<1e3", "<1e6", "<1e6", ">=1e6", ">=1e6"]
    # a verifier that accepts everything accepts every off-by-one case
    rows = [{"outcome": "accepted", "expect": c.expect, "style": "answer_tag"} for c in cases]
    obo = summarize(cases, rows)["off_by_one"]
    expected = sum(m is not None for m in map(off_by_one_magnitude, cases))
    assert sum(t["accepted"] for t in obo.values()) == sum(t["n"] for t in obo.values()) == expected


def test_exact_string_verifier_rejects_most_rewrites(tmp_path):
    spec = _user_reward(tmp_path, """
        import re

        def verify(example, completion):
            found = re.findall(r"<answer>(.*?)</answer>", completion, re.DOTALL)
            return float(bool(found) and found[-1] == example.answer)
        """)
    report = audit(spec, n_per_family=2, families=["integer", "yesno"], progress=False)
    rw, near = report["totals"]["rewrite"], report["totals"]["near"]
    # only the identity rewrite in the <answer> styles matches exactly: far below 20 %
    assert 0 < rw["accepted"] < 0.2 * rw["n"]
    assert near["accepted"] == 0 and rw["error"] == near["error"] == 0
    assert report["settings"]["label"] == "verify"


def test_a_verifier_that_raises_is_counted_as_error_not_rejection(tmp_path):
    spec = _user_reward(tmp_path, """
        def verify(example, completion):
            if example.answer.lower() == "yes":
                raise RuntimeError("cannot parse")
            return 0.0
        """)
    report = audit(spec, n_per_family=2, families=["yesno"], progress=False)
    n = report["totals"]["rewrite"]["n"] + report["totals"]["near"]["n"]
    errors = report["totals"]["rewrite"]["error"] + report["totals"]["near"]["error"]
    rejected = report["totals"]["rewrite"]["rejected"] + report["totals"]["near"]["rejected"]
    # item 0's gold is "yes" (raises), item 1's "No" (returns 0): half errors, half rejections
    yes = sum(c.gold.lower() == "yes" for c in generate_cases(2, families=["yesno"]))
    assert 0 < yes < n
    assert errors == yes and rejected == n - yes
    assert report["errors"] == {"error": yes}
    assert "Errors (not rejections) by kind: error" in markdown(report)


def test_a_verifier_that_hangs_times_out_as_errors_and_never_blocks(tmp_path):
    import time

    spec = _user_reward(tmp_path, """
        import time

        def verify(example, completion):
            time.sleep(60)
            return 1.0
        """)
    start = time.perf_counter()
    report = audit(spec, n_per_family=1, families=["yesno"], timeout_s=0.05, progress=False)
    assert time.perf_counter() - start < 30          # no call waited out its 60 s sleep
    t = report["totals"]
    assert t["rewrite"]["accepted"] == t["near"]["accepted"] == 0
    assert t["rewrite"]["rejected"] == t["near"]["rejected"] == 0
    assert t["rewrite"]["error"] + t["near"]["error"] == report["settings"]["cases"]
    assert report["errors"]["timeout"] == 8          # MAX_HUNG calls, then the rest not run
    assert report["errors"]["not_run"] == report["settings"]["cases"] - 8
    assert "hangs" in report["settings"]["aborted"]


def test_cli_audit_verifier_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "audit.json", tmp_path / "audit.png"
    rc = main(["audit-verifier", "--reward", "accuracy", "--n", "1", "--families", "integer",
               "choice", "--json", str(out), "--plot", str(png), "--no-progress"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert list(report["families"]) == ["integer", "choice"]
    assert report["totals"]["near"]["accepted"] == 0
    assert report["totals"]["rewrite"]["accepted"] == report["totals"]["rewrite"]["n"] > 0
    assert png.stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "| integer |" in printed and f"wrote {out}" in printed


def test_cli_names_a_missing_reward_file(tmp_path, capsys):
    rc = main(["audit-verifier", "--reward", f"{tmp_path}/nope.py:f", "--no-progress"])
    assert rc == 2
    assert "nope.py not found" in capsys.readouterr().err


def test_unknown_family_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown family.*'integr'"):
        audit("accuracy", families=["integr"], progress=False)


def test_math_verify_missing_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "math_verify", None)      # import then raises ImportError
    with pytest.raises(ConfigError, match="pip install math-verify"):
        audit("math-verify", n_per_family=1, progress=False)
