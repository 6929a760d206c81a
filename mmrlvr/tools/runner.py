"""Running tools under isolation: a timeout per call, and every way a call can go wrong turned
into an error message the policy reads in the tool turn, counted by kind.

Kinds of failure (`ERROR_KINDS`): `unknown_tool` (a name no configured tool has), `bad_args`
(arguments the function does not take, or that collide with the spec's options), `raised` (the
tool raised; its last line is shown), `timeout` (no answer within `timeout_s`: the call's thread
is left behind, as a daemon, and the rollout goes on) and `bad_result` (not text, an image or
an audio clip, or one that is empty, huge or non-finite). All calls of one turn run at once, so
a turn waits at most the longest timeout, not their sum.
"""
from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mmrlvr.core.trajectory import ToolCall

ERROR_KINDS = ("unknown_tool", "bad_args", "raised", "timeout", "bad_result")
MAX_SIDE = 8192
"""Largest image side a tool may return (pixels); the family resizes what it gets anyway."""
MAX_AUDIO_S = 600.0
MAX_TEXT = 2000
"""Characters of a tool's text shown to the policy (the rest is cut, and counted)."""


@dataclass
class Tool:
    label: str
    fn: Callable[..., Any]
    timeout_s: float
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolResult:
    """What one call gave: `kind` is `text`, `image`, `audio` or `error`."""

    kind: str
    text: str = ""
    image: Any = None
    audio: tuple[np.ndarray, int] | None = None
    error: str = ""
    """`kind: detail` for a failed call ("" otherwise)."""
    seconds: float = 0.0


class ToolRunner:
    def __init__(self, tools: list[Tool]):
        self.tools = {t.label: t for t in tools}
        self.counts: dict[str, float] = {}
        """Running totals since the last `take_counts` (calls, errors by kind, seconds)."""

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def run_all(self, calls: list[tuple[Any, ToolCall]]) -> list[ToolResult]:
        """Every `(example, call)` at once, each under its tool's timeout; results in order."""
        slots: list[ToolResult | None] = [None] * len(calls)
        threads, deadlines = [], []
        t0 = time.perf_counter()
        for i, (example, call) in enumerate(calls):
            tool = self.tools.get(call.name)
            problem = self._refusal(tool, call)
            if problem is not None:
                slots[i] = problem
                continue
            box: list[ToolResult] = []     # the thread's own: a late answer changes nothing
            thread = threading.Thread(target=self._call, args=(tool, example, call, box),
                                      daemon=True, name=f"tool-{tool.label}")
            thread.start()
            threads.append((i, thread, tool, box))
            deadlines.append(t0 + tool.timeout_s)
        for (i, thread, tool, box), deadline in zip(threads, deadlines):
            thread.join(max(0.0, deadline - time.perf_counter()))
            if not thread.is_alive() and box:
                slots[i] = box[0]
            else:
                slots[i] = ToolResult("error", error=f"timeout: {tool.label} gave no answer "
                                                     f"within {tool.timeout_s:g} s")
        for result in slots:
            self._count(result)
        return slots

    def _refusal(self, tool: Tool | None, call: ToolCall) -> ToolResult | None:
        if tool is None:
            return ToolResult("error", error=f"unknown_tool: no tool named {call.name!r}; the "
                                             f"tools are {self.names}")
        clash = sorted(set(call.arguments) & set(tool.options))
        if clash:
            return ToolResult("error", error=f"bad_args: {tool.label} sets {clash} itself")
        try:
            inspect.signature(tool.fn).bind(None, **call.arguments, **tool.options)
        except TypeError as err:
            return ToolResult("error", error=f"bad_args: {tool.label}({', '.join(call.arguments)}):"
                                             f" {err}")
        except ValueError:          # no signature to check (a builtin): let the call tell
            pass
        return None

    @staticmethod
    def _call(tool: Tool, example: Any, call: ToolCall, box: list) -> None:
        t0 = time.perf_counter()
        try:
            value = tool.fn(example, **call.arguments, **tool.options)
            result = checked(value, tool.label)
        except BaseException as err:   # noqa: BLE001 — a tool's failure is the policy's message
            last = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            result = ToolResult("error", error=f"raised: {tool.label} raised {last}")
        result.seconds = time.perf_counter() - t0
        box.append(result)

    def _count(self, result: ToolResult) -> None:
        c = self.counts
        c["calls"] = c.get("calls", 0) + 1
        c["seconds"] = c.get("seconds", 0.0) + result.seconds
        c[f"results_{result.kind}"] = c.get(f"results_{result.kind}", 0) + 1
        if result.kind == "error":
            kind = result.error.partition(":")[0]
            c[f"errors_{kind}"] = c.get(f"errors_{kind}", 0) + 1
        if result.text.endswith("[cut]"):
            c["text_cut"] = c.get("text_cut", 0) + 1

    def count_late_error(self, was: str, result: ToolResult) -> None:
        """A result of kind `was` that proved unusable later (its medium would not encode)."""
        c = self.counts
        c[f"results_{was}"] = c.get(f"results_{was}", 1) - 1
        self._count(result)
        c["calls"] -= 1

    def take_counts(self) -> dict[str, float]:
        out, self.counts = self.counts, {}
        return out


def checked(value: Any, label: str) -> ToolResult:
    """A tool's return value as a `ToolResult`, or a `bad_result` error saying what was wrong."""
    text, medium = "", value
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"text", "image", "audio"})
        media = [k for k in ("image", "audio") if value.get(k) is not None]
        if unknown or len(media) > 1 or not isinstance(value.get("text", ""), str):
            return _bad(label, f"a dict with keys {sorted(value)}; give `text` and at most one of "
                               "`image`, `audio`")
        text, medium = value.get("text", ""), value.get(media[0]) if media else None
    if isinstance(medium, str):
        text, medium = medium, None
    text = text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + " [cut]"
    if medium is None:
        return ToolResult("text", text=text)
    if _is_image(medium):
        w, h = medium.size
        if not (0 < w <= MAX_SIDE and 0 < h <= MAX_SIDE):
            return _bad(label, f"an image of {w}x{h} px (sides must be 1..{MAX_SIDE})")
        try:
            image = medium.convert("RGB")
        except Exception as err:  # noqa: BLE001 — PIL raises several kinds for broken images
            return _bad(label, f"an image that cannot be read as RGB ({err})")
        return ToolResult("image", text=text, image=image)
    if isinstance(medium, (tuple, list)) and len(medium) == 2 and np.isscalar(medium[1]):
        try:
            wave, sr = np.asarray(medium[0], dtype=np.float32), int(medium[1])
        except (TypeError, ValueError) as err:
            return _bad(label, f"an audio clip that is not numbers ({err})")
        if wave.ndim == 2:
            wave = wave.mean(axis=0 if wave.shape[0] < wave.shape[1] else 1)
        if wave.ndim != 1 or wave.size == 0 or sr <= 0:
            return _bad(label, f"an audio clip of shape {wave.shape} at {sr} Hz")
        if not np.isfinite(wave).all():
            return _bad(label, "an audio clip with non-finite samples")
        if wave.size / sr > MAX_AUDIO_S:
            return _bad(label, f"an audio clip of {wave.size / sr:.0f} s (at most {MAX_AUDIO_S:g})")
        return ToolResult("audio", text=text, audio=(wave, sr))
    return _bad(label, f"{type(medium).__name__}; return text, a PIL image, (array, sample_rate) "
                       "or a dict of them")


def _is_image(value: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:             # pragma: no cover — PIL is a dependency
        return False
    return isinstance(value, Image.Image)


def _bad(label: str, what: str) -> ToolResult:
    return ToolResult("error", error=f"bad_result: {label} returned {what}")
