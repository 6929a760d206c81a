"""A multi-turn trajectory (docs/tools.md): the policy's turns, the tool calls they end with and
what the tools returned; and the tool-call format a turn is parsed with.

The format is the Qwen families' own (their chat templates' `tools` section): a turn that calls
a tool ends with one JSON object between `<tool_call>` and `</tool_call>`,

    <tool_call>
    {"name": "zoom", "arguments": {"x": 0, "y": 0, "w": 224, "h": 224}}
    </tool_call>

and the turn is cut right after `</tool_call>` (anything sampled after it is dropped). A turn
with no `<tool_call>` is the final answer. Rewards get each completion as a `Completion`: the
final turn's text (what a single-turn reward has always scored) carrying `.trajectory`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    """One parsed call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass
class Turn:
    """One policy turn and, when it called a tool, the call and the tool's answer."""

    text: str
    """What the policy wrote in this turn (cut after `</tool_call>`)."""
    call: ToolCall | None = None
    call_error: str = ""
    """Why the turn's `<tool_call>` block could not be parsed ("" when it parsed or was absent)."""
    result_kind: str = ""
    """What the tool returned: `text`, `image`, `audio`, `error` ("" when no tool ran)."""
    result_text: str = ""
    """The tool message's text (the tool's text, or the error shown to the policy)."""
    tool_error: str = ""
    """Set when the tool raised, timed out or returned something unusable (`kind: detail`)."""


@dataclass
class Trajectory:
    """The turns of one rollout, in order; the last turn is the final answer unless `ended`
    says the trajectory stopped early."""

    turns: list[Turn] = field(default_factory=list)
    ended: str = "answer"
    """Why it stopped: `answer` (a turn without a tool call), `max_turns`, `budget` (the token
    budget ran out) or `bad_call` (a tool call that could not be parsed)."""

    @property
    def final(self) -> str:
        return self.turns[-1].text if self.turns else ""

    @property
    def calls(self) -> list[ToolCall]:
        return [t.call for t in self.turns if t.call is not None]

    @property
    def tool_errors(self) -> int:
        return sum(bool(t.tool_error) for t in self.turns)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (eval records, the demo): every turn with its call and result text."""
        return {"ended": self.ended, "turns": [
            {"text": t.text, "call": None if t.call is None else
             {"name": t.call.name, "arguments": t.call.arguments},
             "call_error": t.call_error, "result_kind": t.result_kind,
             "result_text": t.result_text, "tool_error": t.tool_error} for t in self.turns]}


class Completion(str):
    """A completion as rewards get it: the final turn's text, with the whole `trajectory`
    beside it (a plain `str` to any reward that does not look)."""

    trajectory: Trajectory

    def __new__(cls, text: str, trajectory: Trajectory) -> "Completion":
        out = super().__new__(cls, text)
        out.trajectory = trajectory
        return out

    def __reduce__(self):          # pickles (process-isolated rewards) with its trajectory
        return (Completion, (str(self), self.trajectory))


def trajectory_of(completion: Any) -> Trajectory | None:
    """The trajectory a completion carries, None for a single-turn one."""
    return getattr(completion, "trajectory", None)


def cut_after_call(text: str) -> int | None:
    """The end of the first `</tool_call>` that closes an opened `<tool_call>` (an index into
    `text`), None when the text calls no tool."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return None
    end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
    return None if end < 0 else end + len(CALL_CLOSE)


def parse_call(text: str) -> tuple[ToolCall | None, str]:
    """The tool call in a turn's text: (call, "") or (None, why it is malformed); (None, "")
    when the text holds no complete `<tool_call>…</tool_call>` block (a final answer)."""
    end = cut_after_call(text)
    if end is None:
        return None, ("an unclosed <tool_call>" if CALL_OPEN in text else "")
    start = text.find(CALL_OPEN) + len(CALL_OPEN)
    body = text[start:end - len(CALL_CLOSE)].strip()
    try:
        obj = json.loads(body)
    except ValueError as err:
        return None, f"the <tool_call> body is not JSON ({err.msg} at {err.pos})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, 'the <tool_call> body must be an object {"name": ..., "arguments": {...}}'
    args = obj.get("arguments", {})
    if isinstance(args, str):            # some templates write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None, "the call's arguments are a string that is not JSON"
    if not isinstance(args, dict):
        return None, "the call's arguments must be a JSON object"
    return ToolCall(obj["name"], args), ""


def format_call(name: str, **arguments: Any) -> str:
    """A call written in the format `parse_call` reads (reference trajectories, tests)."""
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CALL_CLOSE}"
