"""YAML onto the config dataclasses: safe loading with one-line errors for bad YAML and tags,
dotted overrides, unknown keys with the nearest known one, then `validate`."""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from mmrlvr.config.checks import _as_float, _raise, find_problems
from mmrlvr.config.plugins import load_plugins
from mmrlvr.config.easyr1 import easyr1_keys
from mmrlvr.config.schema import Config, ConfigError
from mmrlvr.config.synonyms import leaf_keys, suggest

_LEAVES = leaf_keys(Config)


def _from_dict(cls: type, data: Any, prefix: str, problems: list[str]) -> Any:
    """`cls` built from `data`; every unknown key and mistyped value is added to `problems`
    (the field keeps its default) so that one error can list them all."""
    if data is None:                         # `optim:` with nothing under it
        data = {}
    if not isinstance(data, dict):
        problems.append(f"config key '{prefix.rstrip('.') or '<root>'}' must be a mapping, "
                        f"got {data!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            hint, exact = suggest(prefix, key, names, _LEAVES)
            known = "" if exact else f"; known: {sorted(names)}"
            problems.append(f"unknown config key '{dotted}'{hint or ''}{known}")
            continue
        try:
            kwargs[key] = _coerce(hints[key], value, dotted, problems)
        except ConfigError as err:
            problems.append(str(err))
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, dotted: str, problems: list[str]) -> Any:
    if dataclasses.is_dataclass(hint):
        return _from_dict(hint, value, dotted + ".", problems)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):           # `data.eval`: a path or {name: path}
        for option in typing.get_args(hint):
            try:
                return _coerce(option, value, dotted, problems)
            except ConfigError:
                pass
        raise ConfigError(f"config key '{dotted}' must be a path or a mapping {{name: path}}, "
                          f"got {value!r}")
    if hint is float:
        value = _as_float(value)
    if hint in (int, float, str, bool) and type(value) is not hint:  # bool is an int subclass
        raise ConfigError(f"config key '{dotted}' must be {hint.__name__}, got {value!r}")
    if origin is list and not isinstance(value, list):
        raise ConfigError(f"config key '{dotted}' must be a list, got {value!r}")
    if origin is list and typing.get_args(hint) == (float,):
        value = [_as_float(v) for v in value]
    if origin is dict and not isinstance(value, dict):
        raise ConfigError(f"config key '{dotted}' must be a mapping, got {value!r}")
    return value


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# --- YAML: plain values only ------------------------------------------------------------------


MAX_YAML_VALUES = 100_000
"""Values a config may hold once its aliases are expanded: a 523-byte nest of aliases (an
"alias bomb") expands to billions, which the config's copies and dumps would then build."""


class _Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` (no tag builds an object) that also refuses a key given twice in one
    mapping, which YAML would resolve silently to the last (a second `optim:` section would
    drop the first), and a document whose aliases expand past `MAX_YAML_VALUES` values."""

    def construct_document(self, node: yaml.Node) -> Any:
        values = _expanded_size(node, {})
        if values > MAX_YAML_VALUES:
            raise yaml.constructor.ConstructorError(
                problem=f"its aliases (*name) expand to {values:,} values, more than "
                        f"{MAX_YAML_VALUES:,}; write the values out, or fewer nested aliases",
                problem_mark=node.start_mark)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[str, yaml.Mark] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key '{key_node.value}' (first given at line "
                            f"{seen[key_node.value].line + 1}); keep one",
                    problem_mark=key_node.start_mark)
            seen[key_node.value] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Values under `node` with every alias expanded (each node counted once per reference)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1                                # a cycle counts once, not forever
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[id(node)] = size
    return size


def _yaml_error(err: yaml.YAMLError, where: str, of_value: bool = False) -> str:
    """One line for a YAML error: `where`, the position, the parser's problem."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if mark is None:
        at = ""
    elif of_value:
        at = f" at column {mark.column + 1} of its value"
    else:
        at = f" at line {mark.line + 1}, column {mark.column + 1}"
    tag = re.search(r"constructor for the tag '([^']*)'", problem)
    if tag:
        name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        line = f" at line {mark.line + 1}" if mark is not None and not of_value else ""
        return (f"{where}: unsafe/unknown YAML tag {name}{line}; mmrlvr configs hold plain values "
                f"only (numbers, strings, lists, mappings): remove the tag")
    if isinstance(err, yaml.constructor.ConstructorError):         # e.g. a duplicate key
        return f"{where}: YAML error{at}: {problem}"
    context, cmark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and cmark is not None and not of_value:
        problem += f" ({context} begun at line {cmark.line + 1}, column {cmark.column + 1})"
    elif context:
        problem += f" ({context})"
    if "'\\t'" in problem:
        problem += "; YAML indents with spaces, not tabs"
    elif "block end" in problem or "mapping values are not allowed" in problem:
        problem += "; check the indentation there, and quote values that hold ': '"
    if of_value:
        problem += "; quote the value if it is text"
    return f"{where}: YAML syntax error{at}: {problem}"


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); a config "
                          "is a YAML text file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config ({err.strerror})") from None
    try:
        return yaml.load(text, Loader=_Loader)      # a SafeLoader: no tag builds an object
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error(err, str(path))) from None


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply `a.b.c=value` (value parsed as YAML) to a nested dict in place."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value")
    key, _, text = override.partition("=")
    try:
        value = yaml.load(text, Loader=_Loader) if text != "" else ""
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error(err, f"override {override!r}", of_value=True)) from None
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        if node.get(part) is None:           # absent, or `optim:` with nothing under it
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            hint = (f"; it holds one value here: give the whole mapping, e.g. "
                    f"{'.'.join(parts[:-1])}='{{in: A, {parts[-1]}: B}}'"
                    if part == "eval" else "")
            raise ConfigError(f"override {override!r}: '{part}' is not a section{hint}")
    node[parts[-1]] = value


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a YAML config (or start from defaults), apply dotted overrides, validate.

    Every problem found (unknown keys, wrong types, values out of range) is reported in one
    ConfigError, one line each."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        raw = _read_yaml(path) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    problems: list[str] = []
    for ov in overrides:
        try:
            apply_override(raw, ov)
        except ConfigError as err:
            problems.append(str(err))
    raw, easyr1 = easyr1_keys(raw, _LEAVES)    # EasyR1's nested keys, each answered by name
    cfg = _from_dict(Config, raw, "", problems)
    if isinstance(cfg.plugins, list) and all(isinstance(p, str) for p in cfg.plugins):
        try:                       # the user's plug-ins register the names the run will look up
            load_plugins(cfg.plugins)
        except ConfigError as err:
            problems.append(str(err))
    _raise(problems + find_problems(cfg) + easyr1)
    return cfg



def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
