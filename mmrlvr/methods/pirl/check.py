"""PIRL's mechanism check (`mmrlvr check-method pirl`): do the starting model's answers change
when only the prompt template changes?

PIRL trains over a pool of equivalent templates (`data.templates`) to make the answer invariant
to the wrapping; that fixes something only where the starting model is not already invariant. The
check decodes every row greedily (the HF engine, deterministic, so a change is the template's and
not the sampler's) under the plain question and under each template of the pool (the run config's
`data.templates` where `--config` has them, else `mmrlvr.core.templates.TRAIN_TEMPLATES`; a
template that leaves the question as it is, `{question}`, is the plain prompt and is skipped). It
extracts each answer (`rewards.verify.extract_answer`) and reports, per template and over the
pool: how many answers differ from the plain prompt's (`answer_changed_frac`), the share of
questions whose answer changes under at least one template (`question_changed_frac`), and the
accuracy under the plain prompt, under the templates, and its drop (`acc_drop`, `worst_acc_drop`).
Active when some template changes answers at a rate above `CHANGED_FLOOR`; inactive otherwise
(the model is already invariant on these rows: nothing for PIRL to fix), or where no answer
parses under any prompt (nothing can be compared).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmrlvr.core.method_check import CheckContext, CheckResult

CHANGED_FLOOR = 0.05
"""Share of a template's answers that must differ from the plain prompt's for the swap to count
(strictly above). Greedy decoding is deterministic, so an invariant model changes none; but
batched decoding pads prompts of different lengths differently, and that flips a near-tied
argmax now and then, so one changed answer in the default 32 rows (3 %) is not evidence. 5 %
needs two such questions and is the size of the template-swap drops PIRL reports on (our choice)."""
ROWS = 32
"""Rows read by default (`--rows 0`)."""
BATCH = 8
"""Prompts per generate call."""


def pool(ctx: CheckContext) -> list[str]:
    """The templates checked: the config's `data.templates`, else the training pool, less the
    identity template (the plain prompt itself)."""
    from mmrlvr.core.templates import SLOT, TRAIN_TEMPLATES

    configured = list(getattr(getattr(ctx.config, "data", None), "templates", None) or [])
    return [t for t in (configured or list(TRAIN_TEMPLATES)) if t.strip() != SLOT]


def same_answer(a: str | None, b: str | None) -> bool:
    """Whether two extracted answers are the same (whitespace and case aside; None only equals
    None: an answer that stops parsing under a template has changed)."""
    if a is None or b is None:
        return a is None and b is None
    return " ".join(a.split()).lower() == " ".join(b.split()).lower()


def swap_figures(examples: Sequence[Any], plain: list[str], swapped: list[list[str]]
                 ) -> dict[str, float]:
    """The figures from the plain prompt's greedy completions [R] and each template's [T][R]."""
    from rewards.verify import extract_answer, match

    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    base = [extract_answer(t) for t in plain]
    correct = lambda a, ex: float(a is not None and match(a, ex.answer, ex.choices))  # noqa: E731
    plain_acc = mean([correct(a, ex) for a, ex in zip(base, examples)])
    figures: dict[str, float] = {"rows": float(len(examples)), "templates": float(len(swapped)),
                                 "plain_acc": round(plain_acc, 4)}
    changed_any = [False] * len(examples)
    parsed = [a is not None for a in base]
    rates, accs = [], []
    for k, texts in enumerate(swapped):
        answers = [extract_answer(t) for t in texts]
        changed = [not same_answer(a, b) for a, b in zip(answers, base)]
        changed_any = [x or y for x, y in zip(changed_any, changed)]
        parsed += [a is not None for a in answers]
        rates.append(mean([float(c) for c in changed]))
        accs.append(mean([correct(a, ex) for a, ex in zip(answers, examples)]))
        figures[f"template{k}/answer_changed_frac"] = round(rates[-1], 4)
        figures[f"template{k}/acc"] = round(accs[-1], 4)
    figures.update({
        "template_acc": round(mean(accs), 4), "acc_drop": round(plain_acc - mean(accs), 4),
        "worst_acc_drop": round(plain_acc - min(accs, default=plain_acc), 4),
        "answer_changed_frac": round(mean(rates), 4),
        "worst_template_changed_frac": round(max(rates, default=0.0), 4),
        "question_changed_frac": round(mean([float(c) for c in changed_any]), 4),
        "parsed_frac": round(mean([float(p) for p in parsed]), 4)})
    return figures


def verdict(figures: dict[str, float]) -> tuple[str, str]:
    """(`active`/`inactive`, why) from `swap_figures`' figures."""
    if not figures.get("templates", 0.0):
        return "inactive", "the pool has no template other than the plain question: nothing to swap"
    if not figures.get("parsed_frac", 0.0):
        return "inactive", "no greedy answer parses under any prompt: there is no answer to compare"
    worst = figures["worst_template_changed_frac"]
    drop = figures["acc_drop"]
    if worst <= CHANGED_FLOOR:
        return "inactive", (f"no template changes more than {CHANGED_FLOOR:.0%} of the answers "
                            f"(worst {worst:.1%}, accuracy drop {drop:+.3f}): the model is "
                            "already invariant, nothing for PIRL to fix")
    return "active", (f"a template changes {worst:.1%} of the answers (> {CHANGED_FLOOR:.0%}; "
                      f"{figures['question_changed_frac']:.1%} of questions change under some "
                      f"template, accuracy drop {drop:+.3f})")


def greedy(policy: Any, engine: Any, rows: list[Any], ctx: CheckContext) -> list[str]:
    """Greedy completions of `rows`, `BATCH` prompts per generate call."""
    from mmrlvr.rollout import SamplingParams

    params = SamplingParams(n=1, max_new_tokens=ctx.options.max_new_tokens, greedy=True)
    texts: list[str] = []
    for start in range(0, len(rows), BATCH):
        batch = ctx.options.prompting.encode(policy, rows[start:start + BATCH])
        texts += engine.generate(batch, params).texts
    return texts


def check(ctx: CheckContext) -> CheckResult:
    """Greedy answers under the plain question and under each template, and the verdict."""
    from mmrlvr.core.prompting import TemplatePool
    from mmrlvr.rollout import make_engine

    templates = pool(ctx)
    rows = ctx.rows(ROWS)
    policy = ctx.policy("pirl")
    engine = make_engine("hf", policy, None)
    variants = [TemplatePool(tuple(templates)).variants(ex) for ex in rows]        # [R][T]
    plain = greedy(policy, engine, rows, ctx)
    swapped = [greedy(policy, engine, [v[k] for v in variants], ctx) for k in range(len(templates))]
    figures = swap_figures(rows, plain, swapped)
    state, why = verdict(figures)
    return CheckResult("pirl", state, why, figures, {"worst_template_changed_frac": CHANGED_FLOOR})
