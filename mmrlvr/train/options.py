"""Plug-in options checked with the config, before any data or weights load.

Each plug-in a config names (a reward in `rewards` / `eval_rewards`, an objective, an
`algo.shaping` method, a `data.prompt_transforms` entry, the `rollout.branching` kind, the
`train.sampler`) takes its options from the same mapping that names it. Its options are declared once, beside the plug-in: the fields of
the dataclass it names as `options`, or else its constructor's keyword parameters. This module
reads that declaration and reports, one line each and all at once, an option the plug-in does not
take (with the nearest known name), one it needs and was not given, and a value of the wrong
simple type (a bool, an int, a number, a string), so a typo costs a second, not a model load and
a `TypeError` from inside a constructor.

    class LatentNoise:
        options = Branching                  # a dataclass: its fields are the options
    build.options = DifficultySampler        # a callable: its keyword parameters ...
    build.options_filled = ("texts", "seed") # ... less those the core passes itself

Plug-ins that take `**options`, and user code (`file.py:function`, `module:function`, a callable
given to the Python API), are not read here: user code is only ever run isolated, never imported
to look at it.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
from typing import Any

from mmrlvr.config import Config, ConfigError
from mmrlvr.config.checks import _raise
from mmrlvr.core.registry import Registry
from rewards import WRAPPER_KEYS

RESERVED = {
    "rewards": ("name", "weight", "label", "style", *WRAPPER_KEYS),
    "objectives": ("name", "weight"),
    "algo.shaping": ("name",),
    "data.prompt_transforms": ("name",),
}
"""Keys of a spec the core reads itself (`rewards.build_combined` takes the reward wrapper's,
`WRAPPER_KEYS`, and the first four; the plug-in never sees them)."""


def declared(factory: Any) -> tuple[dict[str, Any], set[str]] | None:
    """The options `factory` takes, name -> annotation, and those without a default; None when
    it takes any (`**options`) or cannot be read."""
    source = getattr(factory, "options", factory)
    filled = set(getattr(factory, "options_filled", ()))
    if dataclasses.is_dataclass(source) and isinstance(source, type):
        fields = [f for f in dataclasses.fields(source) if f.init and f.name not in filled]
        required = {f.name for f in fields if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        return {f.name: f.type for f in fields}, required
    try:
        params = inspect.signature(source).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
             and p.name not in filled]
    return ({p.name: p.annotation for p in named},
            {p.name for p in named if p.default is p.empty})


def _type_names(annotation: Any) -> set[str] | None:
    """`'float | None'` -> {'float', 'None'}; None for anything else than simple names."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    if not text:
        return None
    names = {part.strip() for part in text.split("|")}
    return names if names <= {"bool", "int", "float", "str", "None"} else None


def _fits(value: Any, names: set[str]) -> bool:
    if value is None:
        return "None" in names
    if isinstance(value, bool):
        return "bool" in names
    if isinstance(value, int):
        return bool(names & {"int", "float"})
    if isinstance(value, float):
        return "float" in names
    if isinstance(value, str):       # YAML 1.1 leaves `1e-3` a string; constructors cast it
        return "str" in names or ("float" in names and _reads_as_number(value))
    return False


def _reads_as_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
         "None": "null"}


def spec_problems(where: str, plugin: str, factory: Any, options: dict[str, Any],
                  reserved: tuple[str, ...] = ()) -> list[str]:
    """Every problem with the `options` given to `factory` (named `plugin`) at config key `where`
    (`reserved`: the spec's keys the core reads, offered as near names too)."""
    found = declared(factory)
    if found is None:
        return []
    known, required = found
    out = []
    for key in sorted(set(options) - set(known)):
        near = difflib.get_close_matches(key, [*known, *reserved], n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        out.append(f"config key '{where}.{key}': {plugin} takes no option {key!r}{hint}; it "
                   f"takes {sorted(known) or 'no options'}")
    for key in sorted(required - set(options)):
        out.append(f"config key '{where}' needs '{key}' for {plugin}")
    for key in sorted(set(options) & set(known)):
        names = _type_names(known[key])
        if names is not None and not _fits(options[key], names):
            want = " or ".join(WORDS[n] for n in sorted(names, key=list(WORDS).index))
            out.append(f"config key '{where}.{key}' must be {want}, got {options[key]!r}")
    return out


def _registered(registry: Registry, name: Any) -> Any | None:
    """The factory `name` is registered as; None for user code or an unknown name (reported
    elsewhere, with the known names)."""
    if not isinstance(name, str) or ":" in name or name not in registry:
        return None
    return registry.get(name)


def _list_problems(key: str, reserved: tuple[str, ...], registry: Registry,
                   specs: list[Any]) -> list[str]:
    out = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict):
            continue                       # find_problems says how a spec is written
        factory = _registered(registry, spec.get("name"))
        if factory is not None:
            options = {k: v for k, v in spec.items() if k not in reserved}
            out += spec_problems(f"{key}[{i}]", f"{registry.kind} {spec['name']!r}", factory,
                                 options, reserved)
    return out


def plugin_problems(cfg: Config) -> list[str]:
    """Every plug-in option problem of `cfg`, one line each (empty: none)."""
    import rewards
    from mmrlvr.algo.shaping import SHAPERS
    from mmrlvr.core.prompting import PROMPT_TRANSFORMS
    from mmrlvr.objectives import OBJECTIVES
    from mmrlvr.rollout.base import BRANCHINGS
    from mmrlvr.train.sampler import SAMPLERS

    out = []
    for key in ("rewards", "eval_rewards"):
        out += _list_problems(key, RESERVED["rewards"], rewards.REWARDS, getattr(cfg, key))
    out += _list_problems("objectives", RESERVED["objectives"], OBJECTIVES, cfg.objectives)
    out += _list_problems("algo.shaping", RESERVED["algo.shaping"], SHAPERS, cfg.algo.shaping)
    out += _list_problems("data.prompt_transforms", RESERVED["data.prompt_transforms"],
                          PROMPT_TRANSFORMS, cfg.data.prompt_transforms)
    branching = cfg.rollout.branching
    if isinstance(branching, dict) and branching.get("kind", "none") != "none":
        factory = _registered(BRANCHINGS, branching.get("kind"))
        if factory is not None:
            out += spec_problems("rollout.branching", f"branching {branching['kind']!r}",
                                 factory, branching)
    factory = _registered(SAMPLERS, cfg.train.sampler)
    if factory is not None and isinstance(cfg.train.sampler_options, dict):
        out += spec_problems("train.sampler_options", f"sampler {cfg.train.sampler!r}", factory,
                             cfg.train.sampler_options)
    return out


def check_plugins(cfg: Config) -> None:
    """Raise `ConfigError` listing every plug-in option problem of `cfg`."""
    _raise(plugin_problems(cfg))


__all__ = ["ConfigError", "check_plugins", "declared", "plugin_problems", "spec_problems"]
