"""Cliff's mechanism check (`mmrlvr check-method cliff`): does the starting model's wrong
reasoning have cliffs the shaper can place, spread over the steps?

Cliff (docs/cliff.md) credits the tokens of a wrong rollout before its first wrong step and
penalises those from it on. That changes the update only where the judge locates a cliff, and
only where the cliff lies past the first step: a cliff at the first step leaves no sound prefix
to credit (the update is GRPO's, bar the `<think>` tag). The check samples G completions per
question from the starting model (the HF engine, clean, as `om_grpo`'s check), scores them with
the `accuracy` reward (the shaper's default `correct_key`) and runs the shaper's own judge
(`Cliff(**--option).judge.first_mistake`, the rule judge by default) and token mapping
(`cliff_token`) on every completion. Figures: the share of completions and of wrong completions
with a located cliff, the share of located cliffs (on wrong completions) at the first located
step, the mean cliff token over the completion's length (the shaper's `cliff_pos_mean`), and the
share of wrong completions in a group with a right one (those have A_i < 0 under accuracy alone,
so the shaper would judge them; informational, the run's total reward decides). Inactive when no
row has reference `steps`, no completion is wrong, under `FOUND_FLOOR` of the wrong completions
have a cliff, or over `FIRST_STEP_CEILING` of the cliffs are at the first step.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmrlvr.core.method_check import CheckContext, CheckResult
from mmrlvr.rollout.groups import sample_groups

FOUND_FLOOR = 0.2
"""Share of wrong completions with a located cliff under which Cliff is inactive (our choice):
with fewer than one wrong rollout in five shaped, the shaped tokens are a small minority of the
penalised ones and the update is, to that share, plain GRPO's."""
FIRST_STEP_CEILING = 0.9
"""Share of located cliffs at the first step above which Cliff is inactive (our choice): a cliff
at the first step credits no sound prefix, so with nine in ten there the shaper changes almost
no token's advantage."""
ROWS = 32
"""Rows read by default (`--rows 0`)."""
BATCH = 8
"""Prompts per generate call."""


def _first_step_start(text: str) -> int:
    """Where the first step the rule judge numbers starts (where the reasoning resumes if none)."""
    import rewards

    _, starts, tail = rewards.get("struct_steps").located_steps(text)
    return starts[0] if starts else tail


def locate(cliff: Any, tokenizer: Any, example: Any, text: str, ids: list[int]
           ) -> tuple[float | None, bool, bool]:
    """(cliff token / completion length or None, cliff at the first step, judge failed) for one
    completion, by the shaper's own judge and `cliff_token`."""
    from mmrlvr.methods.cliff.shaper import JudgeError, cliff_token

    try:
        offset = cliff.judge.first_mistake(example, text)
    except JudgeError:
        return None, False, True
    if offset is None:
        return None, False, False
    k = cliff_token(tokenizer, ids, offset)
    return k / max(len(ids), 1), offset <= _first_step_start(text), False


def measure(examples: Sequence[Any], texts: list[str], group: int, tokenizer: Any,
            ids: list[list[int]] | None = None, options: dict[str, Any] | None = None
            ) -> dict[str, float]:
    """The cliff figures over prompt-major groups of `group` completions per example; `ids` are
    the completions' token ids (None: `tokenizer` encodes the texts, for scripted completions)."""
    import rewards
    from mmrlvr.methods.cliff.shaper import Cliff

    cliff, accuracy = Cliff(**(options or {})), rewards.get("accuracy")
    if ids is None:
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    wrong, found, wrong_found, first, pos, shapeable, fails = 0, 0, 0, 0, [], 0, 0
    for b, ex in enumerate(examples):
        members = texts[b * group:(b + 1) * group]
        right = [s["overall"] >= cliff.threshold for s in accuracy.score(ex, members)]
        for g, text in enumerate(members):
            at, at_first, failed = locate(cliff, tokenizer, ex, text, ids[b * group + g])
            fails += failed
            found += at is not None
            if right[g]:
                continue
            wrong += 1
            shapeable += any(right)
            if at is not None:
                wrong_found += 1
                first += at_first
                pos.append(at)
    n = len(texts)
    ratio = lambda a, b: round(a / b, 4) if b else 0.0  # noqa: E731
    return {"rows": float(len(examples)),
            "rows_with_steps": float(sum(bool(ex.steps) for ex in examples)),
            "completions": float(n), "wrong_frac": ratio(wrong, n), "found_frac": ratio(found, n),
            "wrong_found_frac": ratio(wrong_found, wrong), "first_step_frac": ratio(first, wrong_found),
            "cliff_pos_mean": ratio(sum(pos), len(pos)), "shapeable_frac": ratio(shapeable, wrong),
            "judge_failures": float(fails)}


def verdict(figures: dict[str, float]) -> tuple[str, str]:
    """(`active`/`inactive`, why) from `measure`'s figures."""
    if not figures.get("rows_with_steps", 0.0):
        return "inactive", "no row has reference `steps`: the rule judge locates no cliff"
    if not figures.get("wrong_frac", 0.0):
        return "inactive", "no sampled completion is wrong: Cliff shapes only wrong rollouts"
    found, first = figures["wrong_found_frac"], figures["first_step_frac"]
    if found < FOUND_FLOOR:
        return "inactive", (f"only {found:.3f} of wrong completions have a located cliff "
                            f"(< {FOUND_FLOOR}): the shaper leaves almost every penalty as GRPO's")
    if first > FIRST_STEP_CEILING:
        return "inactive", (f"{first:.3f} of the located cliffs are at the first step "
                            f"(> {FIRST_STEP_CEILING}): no sound prefix is left to credit")
    return "active", (f"{found:.3f} of wrong completions have a located cliff (>= {FOUND_FLOOR}), "
                      f"{first:.3f} of them at the first step (<= {FIRST_STEP_CEILING}), mean "
                      f"position {figures['cliff_pos_mean']:.3f} of the completion")


def check(ctx: CheckContext) -> CheckResult:
    """Sample the starting model's groups on the first rows and measure where their cliffs fall."""
    opts = ctx.options
    rows = ctx.rows(ROWS)
    texts: list[str] = []
    ids: list[list[int]] = []
    for out in sample_groups(ctx.policy("cliff"), opts, rows, BATCH):
        texts += out.texts
        ids += [row[mask.bool()].tolist() for row, mask in zip(out.completion_ids, out.completion_mask)]
    figures = measure(rows, texts, opts.group, ctx.policy("cliff").tokenizer, ids, opts.method)
    state, why = verdict(figures)
    return CheckResult("cliff", state, why, figures,
                       {"wrong_found_frac": FOUND_FLOOR, "first_step_frac": FIRST_STEP_CEILING})
