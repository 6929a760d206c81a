"""Plug-ins found by name: one small registry type for modalities, rewards, objectives, tasks
and advantage estimators, with one error for a name nobody registered.

    ADAPTERS = Registry("modality")
    ADAPTERS.register("vision", "modalities.vision:VisionAdapter")   # imported on first use
    ADAPTERS.get("vision")          # the class; ADAPTERS.get("visoin") -> UnknownName

Entries given as "module:attribute" strings are imported only when asked for, so naming a
plug-in costs nothing until a run uses it (the audio reward's librosa stays unimported in a
vision run).
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable

from mmrlvr.config.schema import ConfigError


class UnknownName(ConfigError, KeyError):
    """A plug-in name that is not registered; the message lists the known ones."""

    def __str__(self) -> str:            # KeyError would quote the message
        return str(self.args[0])


PLUGINS = ["mmrlvr.methods"]
"""Packages that register plug-ins when imported. The research methods (`mmrlvr.methods`, one
folder each) sit above the core and register their hooks into the core's registries; the core
never imports them. A registry imports these packages (by name, once) the first time it is asked
for a name it does not hold, or for its names. A user's own plug-in package can be appended."""
_discovered: set[str] = set()


def imported(package: str) -> None:
    """Count `package`, imported by the caller, among `PLUGINS` (a config's `plugins:` key)."""
    if package not in PLUGINS:
        PLUGINS.append(package)
    _discovered.add(package)


def discover() -> None:
    """Import every package of `PLUGINS` not imported yet (each registers its plug-ins)."""
    for package in list(PLUGINS):
        if package not in _discovered:
            _discovered.add(package)
            importlib.import_module(package)


class Registry:
    """Names → plug-ins (a class, a function, or a lazy "module:attribute" string)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str, target: Any = None) -> Any:
        """`register(name, target)`, or `@register(name)` on a class or function."""
        if target is None:
            def decorate(obj: Any) -> Any:
                self._entries[name] = obj
                return obj
            return decorate
        self._entries[name] = target
        return target

    def get(self, name: str) -> Any:
        if name not in self._entries:
            discover()
        if name not in self._entries:
            near = difflib.get_close_matches(name, self._entries, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise UnknownName(f"unknown {self.kind} {name!r}{hint}; known: {self.names()}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
            self._entries[name] = entry
        return entry

    def build(self, name: str, **options: Any) -> Any:
        """`get(name)(**options)`."""
        factory: Callable[..., Any] = self.get(name)
        return factory(**options)

    def names(self) -> list[str]:
        discover()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        if name not in self._entries:
            discover()
        return name in self._entries


METHOD_CHECKS = Registry("method check")
"""Mechanism checks by method name (`mmrlvr check-method NAME`): `check(ctx: CheckContext) ->
CheckResult` (`mmrlvr.core.method_check`); each method folder registers its own."""
