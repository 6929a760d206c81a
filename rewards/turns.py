"""Per-turn format reward for multi-turn rollouts with tools (docs/tools.md): every turn but the
last must be one well-formed tool call to a tool that answered, the last must follow the
think/answer format; the score is the share of turns that did. A single-turn completion (no
trajectory) is one turn: the plain format reward.

Components: `turns`, `calls` (tool calls made), `tool_errors` (calls whose tool raised, hung or
returned something unusable) and `final_format` (1 when the last turn is well formatted).
"""
from __future__ import annotations

from mmrlvr.core.trajectory import trajectory_of
from mmrlvr.data import Example
from rewards.format import is_well_formatted


class TurnFormatReward:
    """`{name: turn_format}`: the share of well-formed turns (tool calls, then the answer)."""

    def __init__(self, allow_boxed: bool = True, error_counts: bool = True):
        self.name = "turn_format"
        self.allow_boxed = allow_boxed
        self.error_counts = error_counts
        """A call whose tool failed still counts as well formed (its fault is the tool's); False:
        it does not (a policy that calls a tool with arguments it cannot take learns not to)."""

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        return [self._one(c) for c in completions]

    def _one(self, completion: str) -> dict[str, float]:
        traj = trajectory_of(completion)
        final_ok = float(is_well_formatted(str(completion), self.allow_boxed))
        if traj is None or not traj.turns:
            return {"overall": final_ok, "turns": 1.0, "calls": 0.0, "tool_errors": 0.0,
                    "final_format": final_ok}
        *calls, last = traj.turns
        good = [t.call is not None and not t.call_error
                and (self.error_counts or not t.tool_error) for t in calls]
        if last.call is not None or last.call_error:       # it stopped on a call: no answer
            good.append(False)
            final_ok = 0.0
        else:
            good.append(bool(final_ok))
        return {"overall": sum(good) / len(good), "turns": float(len(traj.turns)),
                "calls": float(len(traj.calls)), "tool_errors": float(traj.tool_errors),
                "final_format": final_ok}
