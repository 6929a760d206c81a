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
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rewards import verify
from rewards.verify_cases import FAMILIES, FAST_FAMILIES, generate_cases

TARGET_REWRITE = 99.5
TARGET_NEAR = 0.0
TARGET_SPEEDUP = 10.0


def _clear_caches():
    verify._gold_spec.cache_clear()
    verify._parse_expression.cache_clear()
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
    args = ap.parse_args(argv)

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
    s = verify.stats()
    print(
        f"counters: symbolic_calls={s['symbolic_calls']} symbolic_bounded={s['symbolic_bounded']} "
        f"answer_unparsed={s['answer_unparsed']} gold_unparsed={s['gold_unparsed']} "
        f"symbolic_errors={s['symbolic_errors']}"
    )
    if failures and args.show_failures:
        print("\nwrong verdicts of rewards.verify:")
        for c, v in failures[: args.show_failures]:
            print(f"  {c.group}: gold={c.gold!r} pred={c.pred!r} -> {v}")
    return 0 if (ok_rw and ok_nm and ok_speed) else 1


def _run_quiet(cases):
    return [verify.match(c.pred, c.gold, list(c.choices) if c.choices else None) for c in cases]


if __name__ == "__main__":
    sys.exit(main())
