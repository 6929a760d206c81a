"""`data.format_prompt`, the instruction every question gets: text appended after the question,
or a Jinja template rendered with the question as `content`, as EasyR1 renders its
`format_prompt` files (`Template(text.strip()).render(content=prompt)` in its
`verl/utils/dataset.py`). A value ending in `.jinja`, `.jinja2` or `.j2` names a template file
(a relative path is read from the working dir, as EasyR1 reads it); any text holding `{{` or `{%`
is a template. `format_question` is the one place that applies it; `check_format_prompt` says
what is wrong with one when a config loads.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from mmrlvr.data.rows import DataError

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
