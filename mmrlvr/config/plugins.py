"""`plugins:` in a config: the user's own packages that register plug-ins (a method, a reward, a
modality, a model family; docs/extending.md), imported when the config loads so that every
name the config uses is found, from `mmrlvr train` as from Python.

An entry is an importable module name (`my_methods`), or a path to a package dir
(`path/to/my_methods`) or a single file (`path/to/my_reward.py`): its parent dir goes on
`sys.path` and it is imported by its name. Each is also appended to
`mmrlvr.core.registry.PLUGINS`, so a lookup that misses imports it again only if it was not yet.
Unlike a `file.py:function` reward, which only ever runs isolated, a plug-in package is imported
into the training process: it is code you chose to run, the way an import in your own script is.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from mmrlvr.config.schema import ConfigError


def module_of(entry: str) -> tuple[str, Path | None]:
    """(module name, the dir to put on `sys.path` or None) of one `plugins` entry."""
    path = Path(entry)
    if entry.endswith(".py") or path.is_dir() or "/" in entry or "\\" in entry:
        if entry.endswith(".py") and path.is_file():
            return path.stem, path.resolve().parent
        if (path / "__init__.py").is_file():
            return path.name, path.resolve().parent
        raise ConfigError(f"config key 'plugins': {entry!r} is not a package dir (with an "
                          "__init__.py) or a .py file")
    if not all(part.isidentifier() for part in entry.split(".")):
        raise ConfigError(f"config key 'plugins': {entry!r} is neither a module name nor a path")
    return entry, None


def load_plugins(entries: list[str]) -> None:
    """Import every entry (see the module docstring); a missing or failing one is a
    ConfigError naming it and, for an import error, what failed inside it."""
    from mmrlvr.core import registry      # here: the registry's module imports the config's

    for entry in entries:
        name, where = module_of(entry)
        if where is not None and str(where) not in sys.path:
            sys.path.insert(0, str(where))
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name.split(".")[0] or err.name == name:
                raise ConfigError(f"config key 'plugins': no module {name!r} (give an importable "
                                  "module name, or a path to a package dir or a .py file)") from None
            raise ConfigError(f"config key 'plugins': importing {name!r} failed: {err}") from err
        except Exception as err:    # the package's own error, named with where it came from
            raise ConfigError(f"config key 'plugins': importing {name!r} failed: "
                              f"{type(err).__name__}: {err}") from err
        registry.imported(name)
