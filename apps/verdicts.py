"""What a person reads after an answer: the verdict against the gold and the reward rows, explained.

The verdict is `rewards.verify`'s (`extract_answer`, then `match` with the listed options); the
rewards are the training ones (`accuracy` 0.9 + `format` 0.1 unless the run used other weights of
these two), scored by `rewards.build_combined` exactly as in training.
"""
from __future__ import annotations

import re
from typing import Any

from mmrlvr.data import Example
from rewards.base import build_combined
from rewards.verify import extract_answer, match

DEFAULT_REWARDS = [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1}]
EXPLAINED = {
    "overall": "the weighted sum of the rewards below: what GRPO maximised",
    "accuracy": "1 if the extracted answer matches the gold (rewards.verify.match), else 0",
    "accuracy/parsed": "a diagnostic: 1 if an answer could be extracted at all "
                       "(<answer>…</answer>, \\boxed{} or 'the answer is …'), 0 if not (then "
                       "accuracy is 0 too)",
    "accuracy/too_complex": "a diagnostic: 1 if the answer hit the verifier's size bounds "
                            "(scored as wrong)",
    "format": "1 if the completion is <think>…</think> then <answer>…</answer> and nothing "
              "after, else 0",
}
_OPTION = re.compile(r"^\(?([A-Z])[.)]\s+(.+)$")


def reward_specs(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's rewards when they are accuracy and format only, else the default pair."""
    specs = config.get("rewards") or []
    names = [s.get("name") for s in specs if isinstance(s, dict)]
    if names and set(names) <= {"accuracy", "format"}:
        return [{"name": s["name"], "weight": float(s.get("weight", 1.0))} for s in specs]
    return DEFAULT_REWARDS


def listed_choices(question: str) -> list[str] | None:
    """The options listed under a question as `A. text` lines (None when there are fewer than 2)."""
    found = []
    for line in question.strip().splitlines()[1:]:
        m = _OPTION.match(line.strip())
        if m and m.group(1) == chr(65 + len(found)):
            found.append(m.group(2).strip())
        elif found:
            return None                     # text after the options: not an option list
    return found if len(found) >= 2 else None


def verdict(example: Example, text: str) -> str:
    """The verifier's verdict on one completion, as markdown."""
    answer = extract_answer(text)
    gold = f"`{example.answer}`"
    if answer is None:
        return (f"**No answer found** (scores 0): no `<answer>…</answer>`, `\\boxed{{}}` or "
                f"\"the answer is …\" in the completion. Gold: {gold}.")
    if match(answer, example.answer, example.choices):
        return f"✓ **Correct**: `{answer}` matches the gold {gold}."
    return f"✗ **Wrong**: `{answer}` does not match the gold {gold}."


def reward_rows(example: Example, texts: list[str | None], specs: list[dict[str, Any]]
                ) -> list[list[Any]]:
    """One row per reward and component: name, weight, a score per completion ("—" for None),
    and what the row means."""
    combined = build_combined(specs)
    done = [t for t in texts if t is not None]
    scored = iter(combined.score(example, done) if done else [])
    scores = [next(scored) if t is not None else None for t in texts]

    def row(key: str, label: str, weight: Any) -> list[Any]:
        values = ["—" if s is None else round(float(s[key]), 4) for s in scores]
        return [label, weight, *values, EXPLAINED.get(key, "")]

    rows = [row("overall", "overall (weighted sum)", "")]
    for name, weight, _ in combined.parts:
        rows.append(row(name, name, weight))
        keys = {k for s in scores if s for k in s if k.startswith(f"{name}/")}
        rows += [row(k, f"{k} (not added)", "") for k in sorted(keys)]
    return rows
