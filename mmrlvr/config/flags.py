"""Command-line flags for config settings, generated from the config itself.

`mmrlvr eval`, `stress`, `check-method`, `demo` and `translate` take no config file, yet several
of their flags are config settings under another name: `--format-prompt` is
`data.format_prompt`, `--device` is `train.device`, `--min-pixels` is `model.min_pixels`. Each
such flag is declared here from its config key: its name (the key's last part, dashed), its
type (the field's), its choices (the checks' `CHOICES`) and its help (the field's docstring,
then what the command does differently), so a flag cannot drift from the setting it stands for.

    config_flag(parser, "data.format_prompt", default="")
    config_flag(parser, "model.min_pixels", default=0, note="0: the model's image processor's")
"""
from __future__ import annotations

import argparse
import typing
from functools import lru_cache
from typing import Any

from mmrlvr.config.checks import CHOICES
from mmrlvr.config.schema import Config, describe

_CONFIG_DEFAULT = object()


@lru_cache(maxsize=1)
def _docs() -> dict[str, str]:
    return {key: doc for key, _, doc in describe()}


def field_type(key: str) -> Any:
    """The annotation of config key `key` (e.g. `int` for `model.min_pixels`)."""
    node: Any = Config
    *parents, leaf = key.split(".")
    for part in parents:
        node = typing.get_type_hints(node)[part]
    hints = typing.get_type_hints(node)
    if leaf not in hints:
        raise KeyError(f"no config key {key!r}")
    return hints[leaf]


def config_default(key: str) -> Any:
    node: Any = Config()
    for part in key.split("."):
        node = getattr(node, part)
    return node


def flag_name(key: str) -> str:
    """`data.format_prompt` -> `--format-prompt`."""
    return "--" + key.rsplit(".", 1)[-1].replace("_", "-")


def config_flag(parser: argparse.ArgumentParser, key: str, *, default: Any = _CONFIG_DEFAULT,
                note: str = "", flag: str | None = None) -> argparse.Action:
    """Add the flag for config key `key` to `parser` (`default`: the config's unless given;
    `note`: what this command does with it beyond the config's meaning)."""
    hint = field_type(key)
    kind = hint if hint in (int, float, str) else None
    if kind is None:
        raise TypeError(f"config key {key!r} ({hint}) has no flag form: only int, float and str")
    value = config_default(key) if default is _CONFIG_DEFAULT else default
    doc = _docs().get(key, "").rstrip(".")
    shown = "" if value is None else f" [{value!r}]" if isinstance(value, str) else f" [{value}]"
    help_text = f"{doc} (config key {key}){'; ' + note if note else ''}{shown}"
    return parser.add_argument(flag or flag_name(key), type=kind, default=value,
                               choices=list(CHOICES[key]) if key in CHOICES else None,
                               help=help_text.replace("%", "%%"))


def flag_keys(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{flag: config key} of the flags `config_flag` added to `parser` (read from their help)."""
    out = {}
    for action in parser._actions:                      # argparse keeps no public list
        text = action.help or ""
        if "(config key " in text:
            out[action.option_strings[0]] = text.split("(config key ", 1)[1].split(")", 1)[0]
    return out


__all__ = ["config_flag", "field_type", "flag_keys", "flag_name"]
