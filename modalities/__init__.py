"""Modality adapters, found by name: `modalities.get("vision", **options)`."""
from __future__ import annotations

import importlib
from typing import Any

from modalities.base import Adapter

_ADAPTERS = {
    "vision": "modalities.vision:VisionAdapter",
    "audio": "modalities.audio:AudioAdapter",
    "image_translation": "modalities.image_translation:ImageTranslationAdapter",
}


def register(name: str, target: str) -> None:
    """Make `get(name)` build the class at `module:Class`."""
    _ADAPTERS[name] = target


def get(name: str, **options: Any) -> Adapter:
    if name not in _ADAPTERS:
        raise KeyError(f"unknown modality {name!r}; known: {sorted(_ADAPTERS)}")
    module, _, cls = _ADAPTERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = ["Adapter", "get", "register"]
