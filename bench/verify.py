"""Benchmark rewards.verify against math-verify on metamorphic cases.

For every answer family, the same generated rewrites (must be accepted) and
near misses (must be rejected) used by tests/test_verify_metamorphic.py are
judged by ``rewards.verify.match`` and by math-verify in its default
configuration (``verify(parse(gold), parse(pred))``, run in the main thread so
its signal-based timeouts work).  Prints per family: rewrite acceptance %,
near-miss acceptance %, checks/second for both, and the speed ratio.

    python bench/verify.py --n 20 --seed 0

Throughput of rewards.verify is measured cold (its caches cleared before each
timed pass, best of ``--repeat`` passes); math-verify is timed over one pass.

    python bench/verify.py --adversarial

times instead each degenerate completion of ``adversarial_cases()`` (nested boxes, megabyte
strings, tag floods, power towers, ...) through ``extract_outcome``, ``match_outcome`` and the
accuracy reward, cold, best of ``--repeat``; each must finish under 50 ms with a bounded,
fail-closed result (tests/test_verify_adversarial.py asserts 1 s and the outcomes).

The cases come from ``mmrlvr/audit/cases.py`` (also behind ``mmrlvr audit-verifier``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from mmrlvr.audit.cases import FAMILIES, FAST_FAMILIES, generate_cases  # noqa: E402
from rewards import verify  # noqa: E402
from rewards.verify.kinds import gold_spec  # noqa: E402 - its cache, cleared for cold timing
from rewards.verify.structure import parse_expression  # noqa: E402 - likewise

TARGET_REWRITE = 99.5
TARGET_NEAR = 0.0
TARGET_SPEEDUP = 10.0
TARGET_ADVERSARIAL_MS = 50.0


def _clear_caches():
    gold_spec.cache_clear()
    parse_expression.cache_clear()
    if "sympy" in sys.modules:  # sympy's own global cache too: honest cold timing
        from sympy.core.cache import clear_cache

        clear_cache()


def _run_ours(cases, repeat):
    verdicts = [verify.match(c.pred, c.gold, list(c.choices) if c.choices else None) for c in cases]
    best = float("inf")
    for _ in range(repeat):
        _clear_caches()
        t0 = time.perf_counter()
        for c in cases:
            verify.match(c.pred, c.gold, list(c.choices) if c.choices else None)
        best = min(best, time.perf_counter() - t0)
    return verdicts, best


def _run_math_verify(cases, mv_parse, mv_verify):
    verdicts = []
    t0 = time.perf_counter()
    for c in cases:
        try:
            ok = bool(mv_verify(mv_parse(c.gold), mv_parse(c.pred)))
        except Exception:  # noqa: BLE001 - a crash counts as a rejection
            ok = False
        verdicts.append(ok)
    return verdicts, time.perf_counter() - t0


def _rates(cases, verdicts):
    rw = [v for c, v in zip(cases, verdicts) if c.expect]
    nm = [v for c, v in zip(cases, verdicts) if not c.expect]
    return (100.0 * sum(rw) / max(len(rw), 1), 100.0 * sum(nm) / max(len(nm), 1), len(rw), len(nm))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20, help="gold answers per family (each has ~10-25 cases)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="timed passes for rewards.verify (best kept)")
    ap.add_argument("--no-math-verify", action="store_true", help="skip the math-verify column")
    ap.add_argument("--show-failures", type=int, default=5, help="print up to N wrong verdicts of ours")
    ap.add_argument("--adversarial", action="store_true", help="time degenerate completions instead")
    args = ap.parse_args(argv)
    if args.adversarial:
        return _adversarial(args.repeat)

    mv_parse = mv_verify = None
    if not args.no_math_verify:
        try:
            from math_verify import parse as mv_parse
            from math_verify import verify as mv_verify
        except ImportError:
            print("math-verify is not installed: its columns are skipped")
    have_mv = mv_parse is not None

    cases = generate_cases(n_per_family=args.n, seed=args.seed)
    by_fam = {f: [c for c in cases if c.family == f] for f in FAMILIES}

    # warm imports (sympy) outside the timed region for both tools
    verify.match("\\sqrt{4}", "2")
    if have_mv:
        mv_verify(mv_parse("$\\sqrt{4}$"), mv_parse("2"))

    rows, failures = [], []
    tot = {"ours_t": 0.0, "mv_t": 0.0, "n": 0, "fast_ours_t": 0.0, "fast_mv_t": 0.0, "fast_n": 0}
    for fam in FAMILIES:
        fc = by_fam[fam]
        ours, t_ours = _run_ours(fc, args.repeat)
        o_rw, o_nm, n_rw, n_nm = _rates(fc, ours)
        failures += [(c, v) for c, v in zip(fc, ours) if v is not c.expect]
        row = [fam, f"{n_rw}/{n_nm}", f"{o_rw:.1f}", f"{o_nm:.1f}", f"{len(fc) / t_ours:,.0f}"]
        tot["ours_t"] += t_ours
        tot["n"] += len(fc)
        if fam in FAST_FAMILIES:
            tot["fast_ours_t"] += t_ours
            tot["fast_n"] += len(fc)
        if have_mv:
            mv, t_mv = _run_math_verify(fc, mv_parse, mv_verify)
            m_rw, m_nm, _, _ = _rates(fc, mv)
            row += [f"{m_rw:.1f}", f"{m_nm:.1f}", f"{len(fc) / t_mv:,.0f}", f"{t_mv / t_ours:.0f}x"]
            tot["mv_t"] += t_mv
            if fam in FAST_FAMILIES:
                tot["fast_mv_t"] += t_mv
        rows.append(row)

    head = ["family", "cases rw/near", "ours rw%", "ours near%", "ours chk/s"]
    if have_mv:
        head += ["mv rw%", "mv near%", "mv chk/s", "speedup"]
    all_rw = _rates(cases, [v for fam in FAMILIES for v in _run_quiet(by_fam[fam])])
    total_row = [
        "ALL",
        f"{all_rw[2]}/{all_rw[3]}",
        f"{all_rw[0]:.1f}",
        f"{all_rw[1]:.1f}",
        f"{tot['n'] / tot['ours_t']:,.0f}",
    ]
    fast_row = [
        "fast-path families",
        f"{tot['fast_n']}",
        "",
        "",
        f"{tot['fast_n'] / tot['fast_ours_t']:,.0f}",
    ]
    if have_mv:
        total_row += ["", "", f"{tot['n'] / tot['mv_t']:,.0f}", f"{tot['mv_t'] / tot['ours_t']:.0f}x"]
        fast_row += [
            "",
            "",
            f"{tot['fast_n'] / tot['fast_mv_t']:,.0f}",
            f"{tot['fast_mv_t'] / tot['fast_ours_t']:.0f}x",
        ]
    table = rows + [total_row, fast_row]
    widths = [max(len(str(r[i])) for r in [head] + table) for i in range(len(head))]

    def line(r):
        return "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"

    print(f"rewards.verify metamorphic bench: n={args.n} per family, seed={args.seed}, {len(cases)} cases")
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print(line(total_row))
    print(line(fast_row))

    print()
    min_rw = min(float(r[2]) for r in rows)
    max_nm = max(float(r[3]) for r in rows)
    ok_rw = min_rw >= TARGET_REWRITE
    ok_nm = max_nm <= TARGET_NEAR
    print(
        f"target: >= {TARGET_REWRITE}% rewrites accepted in every family: "
        f"min {min_rw:.1f}% -> {'PASS' if ok_rw else 'FAIL'}"
    )
    print(
        f"target: {TARGET_NEAR:.0f} near misses accepted: max {max_nm:.1f}% -> {'PASS' if ok_nm else 'FAIL'}"
    )
    ok_speed = True
    if have_mv:
        fast_ratio = tot["fast_mv_t"] / tot["fast_ours_t"]
        ok_speed = fast_ratio >= TARGET_SPEEDUP
        print(
            f"target: >= {TARGET_SPEEDUP:.0f}x math-verify throughput on the fast path: "
            f"{fast_ratio:.0f}x -> {'PASS' if ok_speed else 'FAIL'} "
            f"(all families incl. symbolic: {tot['mv_t'] / tot['ours_t']:.0f}x)"
        )
    outcomes = Counter(verify.match_outcome(c.pred, c.gold, list(c.choices) if c.choices else None)
                       for c in cases)
    print(f"outcomes: match={outcomes['match']} no_match={outcomes['no_match']} "
          f"too_complex={outcomes[verify.TOO_COMPLEX]}")
    if failures and args.show_failures:
        print("\nwrong verdicts of rewards.verify:")
        for c, v in failures[: args.show_failures]:
            print(f"  {c.group}: gold={c.gold!r} pred={c.pred!r} -> {v}")
    return 0 if (ok_rw and ok_nm and ok_speed) else 1


def adversarial_cases() -> list[tuple[str, str, str]]:
    """(name, completion, gold): completions built to be slow to verify."""
    rng = random.Random(0)
    mb = 1 << 20
    boxes = lambda k: "\\boxed{" * k + "1" + "}" * k  # noqa: E731
    words = ["lorem", "ipsum", "dolor", "answer", "the", "is", "x", "2"]
    return [
        ("boxed nested 50", boxes(50), "1"),
        ("boxed nested 400", boxes(400), "1"),
        ("boxed nested 800", boxes(800), "1"),
        ("boxed nested 10,000", boxes(10_000), "1"),
        ("<answer> boxed nested 400", f"<answer>{boxes(400)}</answer>", "1"),
        ("<answer> boxed nested 800", f"<answer>{boxes(800)}</answer>", "1"),
        ("<answer> boxed nested 10,000", f"<answer>{boxes(10_000)}</answer>", "1"),
        ("1 MB random braces/backslashes", "".join(rng.choice("{}\\") for _ in range(mb)), "1"),
        ("130 KB random braces, boxes", "".join(rng.choice(["{", "}", "\\", "\\boxed{", "x"]) for _ in range(60_000)),
         "1"),
        ("1 MB plain text", " ".join(rng.choice(words) for _ in range(mb // 5))[:mb], "1"),
        ("170 KB plain text + answer", " ".join(rng.choice(words) for _ in range(38_000)) + ". The answer is 42.",
         "42"),
        ("50,000 <answer> tags", "<answer>" * 50_000, "1"),
        ("10,000 <answer> pairs + answer", "<answer>1</answer>" * 10_000 + "<answer>42</answer>", "42"),
        ("unbalanced tags", "<answer>" * 10_000 + "</answer>" * 10_000, "1"),
        ("\\frac nested 1,000", "\\boxed{" + "\\frac{" * 1000 + "1" + "}{2}" * 1000 + "}", "1"),
        ("continued fraction x/(1+x/...) 20", "\\boxed{" + "\\frac{x}{1+" * 20 + "x" + "}" * 20 + "}", "x"),
        ("10^{10^{10^{10}}}", "\\boxed{10^{10^{10^{10}}}}", "10"),
        ("9^{9^{9^9}}", "\\boxed{9^{9^{9^9}}}", "9"),
        ("e^{e^{e^{e^{e^{e^x}}}}}", "\\boxed{e^{e^{e^{e^{e^{e^{x}}}}}}}", "e^{e^{e^{e^{e^{e^{y}}}}}}"),
        ("log_2 nested 30", "\\boxed{" + "\\log_{2}(" * 30 + "x" + ")" * 30 + "}", "x"),
        ("24 sin^2+cos^2 terms", "\\boxed{" + "+".join(f"\\sin^2({k}x)+\\cos^2({k}x)" for k in range(1, 25)) + "}",
         "24"),
        ("100,000 digits", "\\boxed{" + "1" * 100_000 + "}", "1" * 99_999 + "2"),
        ("2,000 digits", "\\boxed{" + "1" * 2000 + "}", "1" * 1999 + "2"),
        ("\\sqrt nested 2,000", "\\boxed{" + "\\sqrt{" * 2000 + "2" + "}" * 2000 + "}", "2"),
        ("19,000 spaces then 'or'", "<answer>A" + " " * 19_000 + "x or B</answer>", "A"),
        ("'1 or ' x 3,900", "<answer>" + "1 or " * 3900 + "1</answer>", "1"),
        ("set of 64, reversed", "\\boxed{\\{" + ",".join(f"x^{{{k}}}" for k in range(64)) + "\\}}",
         "\\{" + ",".join(f"x^{{{k}}}" for k in range(63, -1, -1)) + "\\}"),
    ]


def _adversarial(repeat):
    from mmrlvr.data import Example
    from rewards.accuracy import AccuracyReward

    reward = AccuracyReward()
    verify.match("\\sin^2 x + \\cos^2 x", "1")  # sympy imported and warm outside the timed region

    def best_ms(fn, *args):
        best, out = float("inf"), None
        for _ in range(repeat):
            _clear_caches()
            t0 = time.perf_counter()
            out = fn(*args)
            best = min(best, time.perf_counter() - t0)
        return 1000 * best, out

    head = ["completion", "chars", "extract ms", "extracted", "match ms", "verdict", "reward ms", "reward"]
    rows, worst = [], 0.0
    for name, text, gold in adversarial_cases():
        t_ex, (answer, extracted) = best_ms(verify.extract_outcome, text)
        # an answer that extracts is matched; otherwise the raw completion is, as an answer
        t_m, verdict = best_ms(verify.match_outcome, answer if answer is not None else text, gold)
        t_r, (score,) = best_ms(reward.score, Example(id=name, prompt="", answer=gold), [text])
        worst = max(worst, t_ex, t_m, t_r)
        shown = extracted if answer is None else f"{answer[:12]!r}" + ("..." if len(answer) > 12 else "")
        rows.append([name, f"{len(text):,}", f"{t_ex:.2f}", shown, f"{t_m:.2f}", verdict, f"{t_r:.2f}",
                     " ".join(f"{k}={v:g}" for k, v in score.items())])
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    print(f"rewards.verify adversarial bench: cold, best of {repeat}")
    for r in [head, ["-" * w for w in widths]] + rows:
        print("| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |")
    ok = worst < TARGET_ADVERSARIAL_MS
    verdict = "PASS" if ok else "FAIL"
    print(f"\ntarget: every call < {TARGET_ADVERSARIAL_MS:.0f} ms: worst {worst:.1f} ms -> {verdict}")
    return 0 if ok else 1


def _run_quiet(cases):
    return [verify.match(c.pred, c.gold, list(c.choices) if c.choices else None) for c in cases]


if __name__ == "__main__":
    sys.exit(main())
