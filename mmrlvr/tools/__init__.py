"""Tools a policy may call in a multi-turn rollout (docs/tools.md), found by name like rewards.

A tool is a Python function `fn(example, **arguments) -> result`: `example` is the
`mmrlvr.data.Example` being answered (its images and audio paths, its meta), `arguments` the
JSON object of the policy's `<tool_call>` (`mmrlvr.core.trajectory`), plus the spec's options.
It returns text (`str`), an image (`PIL.Image.Image`), an audio clip (`(array, sample_rate)`) or
a dict with `text` and at most one of `image` / `audio`; the result is the next turn.

Config: `rollout.tools: [{name: zoom}, {name: my_tools.py:lookup, timeout_s: 5, ...options}]`.
Built-in names: `zoom` (a crop of the example's first image, `mmrlvr.tools.builtin`) and
`clip` (a cut of its first audio). Every tool runs under `runner.ToolRunner`: a timeout per
call, and exceptions, hangs and unusable results become an error message in the tool turn and
are counted (`tools/errors_<kind>`); the trajectory goes on.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from mmrlvr.core.registry import Registry, UnknownName
from mmrlvr.tools.runner import ERROR_KINDS, Tool, ToolResult, ToolRunner

TOOLS = Registry("tool")
TOOLS.register("zoom", "mmrlvr.tools.builtin:zoom")
TOOLS.register("clip", "mmrlvr.tools.builtin:clip")

register = TOOLS.register
"""`@mmrlvr.tools.register("name")` on a function makes `rollout.tools: [{name: name}]` call it."""

SPEC_KEYS = ("name", "timeout_s", "label")
"""A tool spec's keys the runner takes; every other key is an option passed to each call."""


def _load_user(spec: str) -> Callable[..., Any]:
    path, _, func = spec.rpartition(":")
    file = Path(path)
    if not file.is_file():
        raise UnknownName(f"tool {spec!r}: file {file} not found")
    module_name = f"mmrlvr_user_tool_{file.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    if not callable(getattr(module, func, None)):
        raise UnknownName(f"tool {spec!r}: {file} defines no function '{func}'")
    return getattr(module, func)


def get(name: str) -> Callable[..., Any]:
    """The tool registered as `name`, or the function `file.py:function`."""
    return _load_user(name) if ".py:" in name else TOOLS.get(name)


def names() -> list[str]:
    return TOOLS.names()


def build_runner(specs: list[dict[str, Any]], default_timeout_s: float = 10.0):
    """A `ToolRunner` over the configured tools (`rollout.tools`), each by its label (the
    function's name unless `label` is given): what a `<tool_call>`'s `name` must say."""
    tools = []
    for spec in specs:
        spec = dict(spec)
        if "name" not in spec:
            raise UnknownName(f"rollout.tools entry {spec!r} has no `name`")
        name = spec.pop("name")
        label = spec.pop("label", None) or name.rpartition(":")[2]
        timeout = float(spec.pop("timeout_s", default_timeout_s))
        tools.append(Tool(label, get(name), timeout, spec))
    return ToolRunner(tools)


__all__ = ["ERROR_KINDS", "SPEC_KEYS", "TOOLS", "Tool", "ToolResult", "ToolRunner", "build_runner",
           "get", "names", "register"]
