"""Arithmetic: seeded text-only questions with checkable answers, for a text language model
(`mmrlvr data arith`; the pretrained SmolLM2 of `mmrlvr pretrained smollm2`). Three families:

    add        What is 13 + 6?                                              -> "19"
    expr       What is (3 + 4) * 2?                                         -> "14"
    countdown  Using the numbers 3, 5 and 7, each exactly once, and only +, - and *,
               write an expression equal to 22.                             -> "3 * 5 + 7"

`add` adds a number in 0..9 to one in 0..19 (200 questions). `expr` is one of five two-step
shapes over operands 1..9 (`a + b + c`, `a + b - c`, `a * b + c`, `a * b - c`, `(a + b) * c`,
never negative); its `steps` are the evaluation in order, one equation each ("3 + 4 = 7", "7 * 2 = 14"), the
process-labelled references StructReward and Cliff align a completion's steps to. A countdown
row's gold is one solution; the `countdown` reward (`rewards/countdown.py`) checks any
expression against `meta.numbers` and `meta.target` (each number used once, the value the
target). Targets are kept only where at least two solutions differ by more than the order and
grouping of a sum's (signed) or a product's terms (`meta.solutions` counts them), so a group can
find several strategies (Cue-GRPO); its steps evaluate the gold innermost first.

`make_arith(out, ...)` writes `train.jsonl`, `test.jsonl`, `unlabelled.jsonl` and `info.json`.
`unlabelled.jsonl` holds the test questions (same ids) with the placeholder answer "?" and no
steps: test-time training without labels (OM-GRPO's consensus reward never reads the answer),
evaluated on `test.jsonl`. The test questions are drawn first, all different; the train split may
repeat a question but never holds a test one. The same arguments give the same files.
"""
from __future__ import annotations

import functools
import itertools
import json
import random
from pathlib import Path
from typing import Any, Callable

from mmrlvr.data import Example, write_jsonl
from mmrlvr.tasks import Task

OPS: dict[str, Callable[[int, int], int]] = {"+": lambda x, y: x + y, "-": lambda x, y: x - y,
                                              "*": lambda x, y: x * y}
EXPR_SHAPES: tuple[str, ...] = ("a + b + c", "a + b - c", "a * b + c", "a * b - c", "(a + b) * c")
"""The `expr` family's two-step shapes; the first operation written is the first evaluated."""


def gen_add(rng: random.Random) -> dict[str, Any]:
    a, b = rng.randint(0, 19), rng.randint(0, 9)
    eq = f"{a} + {b} = {a + b}"
    return {"prompt": f"What is {a} + {b}?", "answer": str(a + b), "reasoning": f"{eq}.",
            "steps": [eq], "meta": {"operands": [a, b]}}


def gen_expr(rng: random.Random) -> dict[str, Any]:
    shape = rng.choice(EXPR_SHAPES)
    while True:
        a, b, c = (rng.randint(1, 9) for _ in range(3))
        op1, op2 = ("+", "*") if shape.startswith("(") else (shape[2], shape[6])
        first = OPS[op1](a, b)
        value = OPS[op2](first, c)
        if value >= 0:
            break
    text = shape.replace("a", str(a)).replace("b", str(b)).replace("c", str(c))
    steps = [f"{a} {op1} {b} = {first}", f"{first} {op2} {c} = {value}"]
    return {"prompt": f"What is {text}?", "answer": str(value), "reasoning": ". ".join(steps) + ".",
            "steps": steps, "meta": {"shape": shape, "operands": [a, b, c]}}


def _trees(nums: tuple[int, ...]):
    """Every (text, value, steps, strategy) of an expression using each of `nums` once (+, -, *)
    with no negative value on the way.

    `steps` evaluate it innermost first, one equation each. The strategy is the same for two
    expressions that differ only in the order or grouping of the terms of a sum (with their
    signs: `6 + (9 - 6)` and `9 - (6 - 6)`) or of a product."""
    if len(nums) == 1:
        yield str(nums[0]), nums[0], [], ("n", nums[0])
        return
    for k in range(1, len(nums)):
        for left_idx in itertools.combinations(range(len(nums)), k):
            left = tuple(nums[i] for i in left_idx)
            right = tuple(nums[i] for i in range(len(nums)) if i not in left_idx)
            for (lt, lv, ls, lc), (rt, rv, rs, rc) in itertools.product(_trees(left),
                                                                          _trees(right)):
                for op, fn in OPS.items():
                    value = fn(lv, rv)
                    if value < 0:             # Countdown's rule: no negative intermediate
                        continue
                    yield (f"({lt} {op} {rt})", value, ls + rs + [f"{lv} {op} {rv} = {value}"],
                           _strategy(op, lc, rc))


def _strategy(op: str, left: tuple, right: tuple) -> tuple:
    if op == "*":
        factors = [f for side in (left, right) for f in (side[1] if side[0] == "*" else (side,))]
        return ("*", tuple(sorted(factors, key=repr)))
    terms = []
    for sign, side in ((1, left), (1 if op == "+" else -1, right)):
        terms += [(sign * s, t) for s, t in side[1]] if side[0] == "+" else [(sign, side)]
    return ("+", tuple(sorted(terms, key=repr)))


@functools.lru_cache(maxsize=4096)
def _all_trees(nums: tuple[int, ...]) -> tuple:
    return tuple(_trees(nums))


def solutions(numbers: list[int], target: int) -> list[tuple[str, list[str]]]:
    """(text, steps) of one solution per distinct strategy, outer parentheses dropped."""
    found: dict[str, tuple[str, list[str]]] = {}
    for text, value, steps, strategy in _all_trees(tuple(numbers)):
        if value == target and repr(strategy) not in found:
            found[repr(strategy)] = (text[1:-1], steps)
    return sorted(found.values(), key=lambda t: (len(t[0]), t[0]))


def gen_countdown(rng: random.Random) -> dict[str, Any]:
    while True:
        numbers = sorted(rng.randint(1, 15) for _ in range(3))
        target = rng.choice([value for _, value, _, _ in _all_trees(tuple(numbers))])
        if not 1 <= target <= 100:
            continue
        found = solutions(numbers, target)
        if len(found) >= 2:
            break
    listed = f"{numbers[0]}, {numbers[1]} and {numbers[2]}"
    gold, steps = rng.choice(found)
    return {"prompt": f"Using the numbers {listed}, each exactly once, and only +, - and *, "
                      f"write an expression equal to {target}.",
            "answer": gold, "reasoning": ". ".join(steps) + ".", "steps": steps,
            "meta": {"numbers": numbers, "target": target, "solutions": len(found)}}


FAMILIES: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "add": gen_add, "expr": gen_expr, "countdown": gen_countdown}
"""Family name -> generator `(rng) -> row fields`."""


def _split(name: str, n: int, families: list[str], rng: random.Random, avoid: set[str],
           unique: bool) -> tuple[list[Example], dict[str, int]]:
    """`n` rows, the families in turn (exact balance), never a question in `avoid`; `unique`:
    never one question twice either."""
    order = [families[i % len(families)] for i in range(n)]
    rng.shuffle(order)
    rows, seen = [], set(avoid)
    for i, family in enumerate(order):
        for _ in range(1000):
            row = FAMILIES[family](rng)
            if row["prompt"] not in seen:
                break
        else:
            raise RuntimeError(f"arith: could not draw a {name} {family} question unlike the "
                               f"{len(seen)} drawn before; ask for fewer test rows")
        if unique:
            seen.add(row["prompt"])
        rows.append(Example(id=f"{name}-{i:06d}", prompt=row["prompt"], answer=row["answer"],
                            reasoning=row["reasoning"], steps=row["steps"],
                            meta={"family": family, **row["meta"]}))
    return rows, {f: order.count(f) for f in families}


def make_arith(out_dir: str | Path, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
               families: list[str] | None = None) -> dict:
    """Write the arithmetic set to `out_dir`; returns its info dict (also `info.json`)."""
    families = list(dict.fromkeys(families or ["add", "expr"]))
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown arith families {unknown}; known: {list(FAMILIES)}")
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train}, {n_test}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the test questions first, all different; train may repeat a question, never a test one
    test, test_counts = _split("test", n_test, families, random.Random(f"arith-test-{seed}"),
                               set(), unique=True)
    train, train_counts = _split("train", n_train, families, random.Random(f"arith-train-{seed}"),
                                 {ex.prompt for ex in test}, unique=False)
    write_jsonl(train, out / "train.jsonl")
    write_jsonl(test, out / "test.jsonl")
    write_jsonl([Example(id=ex.id, prompt=ex.prompt, answer="?", meta=ex.meta) for ex in test],
                out / "unlabelled.jsonl")
    info = {"task": "arith", "seed": seed, "families": families, "n_train": n_train,
            "n_test": n_test, "counts": {"train": train_counts, "test": test_counts},
            "files": {"train": "train.jsonl", "test": "test.jsonl",
                      "unlabelled": "unlabelled.jsonl"}}
    (out / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


TASK = Task(
    "text arithmetic: a + b, two-step expressions with step references, countdown (text models; "
    "--families add,expr,countdown)",
    lambda out, o: make_arith(out, n_train=o.n_train, n_test=o.n_test, seed=o.seed,
                              families=o.families))
