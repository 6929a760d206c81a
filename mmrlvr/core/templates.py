"""Prompt templates: equivalent wrappings of one question, for training pools and stress tests.

A template is a string with one `{question}` slot, e.g. `"Question: {question}"`; the question
(with its option lines, for multiple choice) goes there verbatim. PIRL and multi-template GRPO
train over `TRAIN_TEMPLATES` (`data.templates` in a config): every prompt of a step, and so
every GRPO group, is wrapped in one template drawn from the pool. `mmrlvr stress` swaps in
`HELDOUT_TEMPLATES`, which no shipped config trains on, so a template stress is always a
template the model has never seen.

`data.format_prompt` (the instruction every question gets) is either text appended after the
question, or a Jinja template rendered with the question as `content`, as EasyR1 renders its
`format_prompt` files (`Template(text.strip()).render(content=prompt)` in its
`verl/utils/dataset.py`): a path ending in `.jinja`, `.jinja2` or `.j2` (relative paths from the
working dir, as EasyR1's are) is read, and any text holding `{{` or `{%` is a template.
`format_question` is the one place that applies it.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import random
from pathlib import Path

from mmrlvr.data import DataError, Example

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


TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2")
"""A `data.format_prompt` ending in one of these is a template file to read (EasyR1's)."""


def is_template_file(value: str) -> bool:
    return value.strip().lower().endswith(TEMPLATE_SUFFIXES)


def format_prompt_text(value: str) -> str:
    """The format prompt `value` gives: a template file's text, else `value` itself."""
    if not is_template_file(value):
        return value
    path = Path(value.strip()).expanduser()
    try:
        stat = path.stat()
    except OSError as err:
        raise DataError(f"data.format_prompt: cannot read the template file {value} "
                        f"({err.strerror}); give an existing .jinja file (a relative path is read "
                        f"from the working dir {os.getcwd()}, as EasyR1 reads it) or the "
                        "instruction text itself") from None
    return _read_template(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_template(path: str, mtime_ns: int, size: int) -> str:   # an edited file is read anew
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"data.format_prompt: cannot read the template file {path} ({err}); "
                        "it must be UTF-8 text") from None


def is_jinja(text: str) -> bool:
    return "{{" in text or "{%" in text


@functools.lru_cache(maxsize=16)
def _compiled(text: str):
    import jinja2

    # EasyR1's `Template(...)` with its default environment, except that a variable other than
    # `content` is an error here (EasyR1 renders it empty, silently dropping what it meant)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    try:
        return env.from_string(text.strip())
    except jinja2.TemplateSyntaxError as err:
        raise DataError(f"data.format_prompt: Jinja syntax error at line {err.lineno} of the "
                        f"template: {err.message}") from None


def format_question(question: str, format_prompt: str) -> str:
    """The question as the model sees it: `format_prompt` rendered with `content` = the
    question when it is a Jinja template (or names one), else appended after a space."""
    if not format_prompt:
        return question
    text = format_prompt_text(format_prompt)
    if not is_jinja(text):
        return f"{question} {text}"
    import jinja2

    try:
        return _compiled(text).render(content=question)
    except jinja2.UndefinedError as err:
        raise DataError(f"data.format_prompt: the template uses a variable it is not given "
                        f"({err.message}); the question is its only variable, `content` "
                        "(as in EasyR1's format_prompt files: {{ content | trim }})") from None


def check_format_prompt(value: str) -> str | None:
    """The problem with `data.format_prompt` `value` (an unreadable file, a template that does
    not parse or render), else None: checked when a config loads, before any model does."""
    try:
        format_question("q", value)
    except DataError as err:
        return str(err)
    return None
