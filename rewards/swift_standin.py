"""A stand-in for the names an ms-swift reward plugin imports, for when ms-swift is not installed.

An ms-swift GRPO plugin file opens with `from swift.plugin import ORM, orms` (ms-swift 3.x) or
`from swift.rewards import ORM, orms` (later releases), defines `class MyReward(ORM)` with
`__call__(self, completions, **kwargs) -> list[float]` and registers it, `orms['my_reward'] =
MyReward`. mmrlvr calls such a class itself (`rewards.conventions`, style `swift`), so it needs no
ms-swift, only those names to exist while the file loads. `install()` puts them in place as the
modules `swift`, `swift.plugin`, `swift.rewards` and `swift.utils`, only when no `swift` package
can be imported; with ms-swift installed the real one is used and this file does nothing.

What stands in: `ORM` and `AsyncORM` (base classes; a subclass that does not override `__call__`
fails each call, counted), the registries `orms`, `prms`, `rm_plugins`, `multi_turns`, `envs`,
`context_managers` (plain dicts a plugin fills), the bases `PRM`, `DefaultRMPlugin`,
`MultiTurnScheduler`, `Env`, `ContextManager` (so a plugin that also defines those loads; mmrlvr
calls none of them), and `swift.utils.get_logger`. Anything else of ms-swift (`swift.llm`'s
`Template`, its trainers) is not here: a plugin that imports it is told to install ms-swift.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import types
from typing import Any

STANDS_IN = ("swift", "swift.plugin", "swift.rewards", "swift.utils")
"""The modules `install` provides."""


class ORM:
    """ms-swift's outcome reward model base: `__call__(completions, **kwargs) -> list[float]`."""

    def __init__(self, args: Any = None, **kwargs: Any):
        self.args = args

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        raise NotImplementedError(f"{type(self).__name__} does not define __call__(self, "
                                  "completions, **kwargs) -> list[float]")


class AsyncORM(ORM):
    """ms-swift's async ORM: `async def __call__(completions, **kwargs) -> list[float]`."""

    async def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        raise NotImplementedError(f"{type(self).__name__} does not define async __call__(self, "
                                  "completions, **kwargs) -> list[float]")


class _Unused:
    """A base ms-swift defines that mmrlvr never calls; here so a plugin subclassing it loads."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.args, self.kwargs = args, kwargs


class PRM(_Unused):
    """ms-swift's process reward model base (not called by mmrlvr)."""


class DefaultRMPlugin(_Unused):
    """ms-swift's reward-model plugin base (not called by mmrlvr)."""


class MultiTurnScheduler(_Unused):
    """ms-swift's multi-turn rollout scheduler base (not called by mmrlvr)."""


class Env(_Unused):
    """ms-swift's environment base (not called by mmrlvr)."""


class ContextManager(_Unused):
    """ms-swift's context manager base (not called by mmrlvr)."""


orms: dict[str, Any] = {}
"""Plugins register their ORM classes here by name (`orms['my_reward'] = MyReward`)."""
prms: dict[str, Any] = {}
rm_plugins: dict[str, Any] = {}
multi_turns: dict[str, Any] = {}
envs: dict[str, Any] = {}
context_managers: dict[str, Any] = {}


def get_logger(name: str = "swift") -> logging.Logger:
    """`swift.utils.get_logger`: a standard logger."""
    return logging.getLogger(name)


PLUGIN_NAMES = ("ORM", "AsyncORM", "PRM", "DefaultRMPlugin", "MultiTurnScheduler", "Env",
                "ContextManager", "orms", "prms", "rm_plugins", "multi_turns", "envs",
                "context_managers")


def real_swift_installed() -> bool:
    """Whether a `swift` package other than this stand-in can be imported."""
    module = sys.modules.get("swift")
    if module is not None:
        return not getattr(module, "__mmrlvr_standin__", False)
    try:
        return importlib.util.find_spec("swift") is not None
    except (ImportError, ValueError):
        return False


def install() -> bool:
    """Provide `swift`, `swift.plugin`, `swift.rewards` and `swift.utils` from this file unless a
    real `swift` can be imported; True when the stand-in is (now) in place."""
    if real_swift_installed():
        return False
    if "swift" in sys.modules:                  # installed before
        return True
    this = sys.modules[__name__]
    package = types.ModuleType("swift", "mmrlvr's stand-in for ms-swift (rewards/swift_standin.py)")
    package.__path__ = []                       # a package, so `swift.llm` fails as a submodule
    package.__mmrlvr_standin__ = True
    for name in ("plugin", "rewards"):
        module = types.ModuleType(f"swift.{name}", package.__doc__)
        for attr in PLUGIN_NAMES:
            setattr(module, attr, getattr(this, attr))
        setattr(package, name, module)
        sys.modules[f"swift.{name}"] = module
    utils = types.ModuleType("swift.utils", package.__doc__)
    utils.get_logger = get_logger
    package.utils = utils
    sys.modules["swift.utils"] = utils
    sys.modules["swift"] = package
    return True


def missing_name_hint(error: str) -> str:
    """What to say when a plugin imports a part of ms-swift the stand-in lacks (`error`: the
    ImportError's text)."""
    return (f"{error}: ms-swift is not installed, and mmrlvr's stand-in for it does not provide that "
            f"(it provides {', '.join(STANDS_IN)}: {', '.join(PLUGIN_NAMES)}, get_logger); "
            "install ms-swift (pip install ms-swift), or import only those names in the reward "
            "file")
