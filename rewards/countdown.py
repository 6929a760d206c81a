"""Countdown reward: the final answer is an arithmetic expression that uses each of the row's
numbers exactly once (`meta.numbers`) and equals its target (`meta.target`).

The answer is read with `rewards.verify.extract_answer` (its `<answer>` block, final box or
"the answer is" sentence; fails closed as it does). `×`, `·`, `\\times` and `\\cdot` count as `*`,
`−` as `-`; a trailing `= target` is allowed. Only integers, `+`, `-`, `*` and parentheses parse
(Python's `ast`, never `eval`): anything else, a number used twice, missing or not given, or
another value scores 0. Components: `parsed` (an expression of that grammar was found),
`uses_numbers`, `hits_target`. A row without `meta.numbers` and `meta.target` is an error naming it.
"""
from __future__ import annotations

import ast
import re
from collections import Counter

from mmrlvr.data import Example
from rewards.verify import extract_answer

_TIMES = re.compile(r"\\times|\\cdot|[×·]")
_MAX_CHARS = 200


def parse_expression(text: str) -> tuple[int, list[int]] | None:
    """(value, the integers it uses) of an expression of integers, + - * and parentheses."""
    text = _TIMES.sub("*", text.replace("−", "-")).strip().strip("$").strip()
    if not text or len(text) > _MAX_CHARS:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    numbers: list[int] = []

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult):
            left, right = value(node.left), value(node.right)
            return {ast.Add: left + right, ast.Sub: left - right,
                    ast.Mult: left * right}[type(node.op)]
        raise ValueError(type(node).__name__)

    try:
        return value(tree), numbers
    except ValueError:
        return None


class CountdownReward:
    """1 when the completion's answer uses exactly the row's numbers and equals its target."""

    def __init__(self):
        self.name = "countdown"

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        numbers, target = example.meta.get("numbers"), example.meta.get("target")
        if not isinstance(numbers, list) or not isinstance(target, int):
            raise ValueError(f"sample {example.id}: the countdown reward needs meta.numbers (a "
                             f"list of integers) and meta.target (an integer); this row has "
                             f"{sorted(example.meta)} (`mmrlvr data arith --families countdown` "
                             "writes them)")
        return [self._one(text, numbers, target) for text in completions]

    @staticmethod
    def _one(text: str, numbers: list[int], target: int) -> dict[str, float]:
        answer = extract_answer(text)
        if answer is not None:
            left, eq, right = answer.rpartition("=")
            if eq and right.strip() == str(target):
                answer = left
        parsed = parse_expression(answer) if answer is not None else None
        if parsed is None:
            return {"overall": 0.0, "parsed": 0.0, "uses_numbers": 0.0, "hits_target": 0.0}
        value, used = parsed
        uses = Counter(used) == Counter(numbers)
        hits = value == target
        return {"overall": float(uses and hits), "parsed": 1.0, "uses_numbers": float(uses),
                "hits_target": float(hits)}
