"""Prompt templates: equivalent wrappings of one question, for training pools and stress tests.

A template is a string with one `{question}` slot, e.g. `"Question: {question}"`; the question
(with its option lines, for multiple choice) goes there verbatim. PIRL and multi-template GRPO
train over `TRAIN_TEMPLATES` (`data.templates` in a config): every prompt of a step, and so
every GRPO group, is wrapped in one template drawn from the pool. `mmrlvr stress` swaps in
`HELDOUT_TEMPLATES`, which no shipped config trains on, so a template stress is always a
template the model has never seen.
"""
from __future__ import annotations

import dataclasses
import random

from mmrlvr.data import Example

TRAIN_TEMPLATES: tuple[str, ...] = (
    "{question}",
    "Question: {question}",
    "Look at the medical image and answer the question. {question}",
    "You are reading this scan as a radiologist. {question}",
    "Use the image to answer. {question}",
)
"""The training pool (~5 equivalent templates, docs/methods.md "PIRL")."""

HELDOUT_TEMPLATES: tuple[str, ...] = (
    "Answer this question about the scan: {question}",
    "Clinical query. {question}",
    "Examine the image carefully before answering. {question}",
)
"""Templates reserved for the stress test; never put them in `data.templates`."""

SLOT = "{question}"


def render(template: str, question: str) -> str:
    """`template` with its `{question}` slot filled (no other braces are interpreted)."""
    if SLOT not in template:
        raise ValueError(f"prompt template {template!r} has no {SLOT} slot")
    return template.replace(SLOT, question, 1)


def template_rng(seed: int, step: int) -> random.Random:
    """Step `step`'s own draw of templates: the same on resume, and for a batch drawn ahead."""
    return random.Random(f"templates-{seed}-{step}")


def apply_templates(examples: list[Example], templates: list[str] | tuple[str, ...],
                    rng: random.Random) -> list[Example]:
    """Wrap each example's prompt in a template drawn from `templates` (one draw per prompt).

    With no templates this returns `examples` itself and draws nothing from `rng`, so a run
    without a pool is exactly the plain run. `meta.template` records the template's index.
    """
    if not templates:
        return examples
    out = []
    for ex in examples:
        k = rng.randrange(len(templates))
        out.append(dataclasses.replace(ex, prompt=render(templates[k], ex.prompt),
                                       meta={**ex.meta, "template": k}))
    return out


def with_options(stem: str, choices: list[str] | None) -> str:
    """The question text shown for a multiple-choice item: the stem, then `A. text` lines."""
    if not choices:
        return stem
    return stem + "\n" + "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(choices))


def split_options(prompt: str, choices: list[str] | None) -> tuple[str, bool]:
    """(stem, whether the prompt ended with exactly `with_options`' lines for `choices`)."""
    if not choices:
        return prompt, False
    block = with_options("", choices)
    if prompt.endswith(block):
        return prompt[: len(prompt) - len(block)], True
    return prompt, False
