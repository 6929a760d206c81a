"""Checks of the multi-turn keys (`rollout.max_turns`, `rollout.tools`,
`rollout.max_trajectory_tokens`; docs/tools.md), reported with every other config problem."""
from __future__ import annotations

from typing import Any

TOOL_EXCLUDES = (
    (lambda c: c.rollout.backend == "vllm", "rollout.backend: vllm",
     "multi-turn rollouts run on the hf engine only (a vLLM request per turn is not built); "
     "set rollout.backend: hf"),
    (lambda c: (c.rollout.branching or {}).get("kind", "none") != "none", "rollout.branching",
     "branching is single-turn; set rollout.branching.kind: none"),
    (lambda c: bool(c.train.packing), "train.packing",
     "packing shares one prompt per group, a trajectory has a prompt row of its own; turn it off"),
    (lambda c: c.train.async_rollouts != "none", "train.async_rollouts",
     "one-step-off rollouts are single-turn; set train.async_rollouts: none"),
    (lambda c: bool(c.train.dynamic_sampling), "train.dynamic_sampling",
     "dynamic sampling merges single-turn groups; turn it off"),
    (lambda c: bool(c.objectives), "objectives",
     "the auxiliary objectives re-run prompts one row per group; leave them out with tools"),
)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tool_problems(cfg: Any) -> list[str]:
    """One line per problem with the multi-turn keys (empty when off or fine)."""
    r = cfg.rollout
    out = []
    if not _int(r.max_turns) or r.max_turns < 1:
        out.append(f"config key 'rollout.max_turns' must be an integer >= 1, got {r.max_turns!r}: "
                   "1 is single-turn, e.g. 3 lets the policy call tools twice")
    if not _int(r.max_trajectory_tokens) or r.max_trajectory_tokens < 0:
        out.append(f"config key 'rollout.max_trajectory_tokens' must be an integer >= 0, got "
                   f"{r.max_trajectory_tokens!r}: 0 is max_turns x max_new_tokens")
    if not isinstance(r.tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                 for t in r.tools):
        out.append(f"config key 'rollout.tools' must be a list of {{name, ...}} mappings, got "
                   f"{r.tools!r}: e.g. [{{name: zoom}}, {{name: my_tools.py:lookup, timeout_s: 5}}]")
        return out
    if out:
        return out
    if r.tools and r.max_turns < 2:
        out.append("config key 'rollout.max_turns' is 1 but rollout.tools are given: a tool's "
                   "result needs a turn after it; set rollout.max_turns: 2 or more")
    if r.max_turns > 1 and not r.tools:
        out.append(f"config key 'rollout.max_turns' is {r.max_turns} but rollout.tools is empty: "
                   "with nothing to call every rollout is one turn; give tools or set max_turns: 1")
    labels = [t.get("label") or t["name"].rpartition(":")[2] for t in r.tools]
    for label in sorted({x for x in labels if labels.count(x) > 1}):
        out.append(f"config key 'rollout.tools' names {label!r} twice; give one a `label`")
    for t in r.tools:
        timeout = t.get("timeout_s", 10.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            out.append(f"config key 'rollout.tools' entry {t['name']!r}: timeout_s must be a "
                       f"number > 0, got {timeout!r}")
    if r.tools:
        out += [f"config keys 'rollout.tools' and '{key}': {why}"
                for clash, key, why in TOOL_EXCLUDES if clash(cfg)]
    return out
