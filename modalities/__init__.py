"""Modality adapters, found by name: `modalities.get("vision", **options)`."""
from __future__ import annotations

from typing import Any

from mmrlvr.core.registry import Registry
from modalities.base import Adapter

ADAPTERS = Registry("modality")
ADAPTERS.register("vision", "modalities.vision:VisionAdapter")
ADAPTERS.register("audio", "modalities.audio:AudioAdapter")
ADAPTERS.register("image_translation", "modalities.image_translation:ImageTranslationAdapter")
ADAPTERS.register("text", "modalities.text:TextAdapter")
register = ADAPTERS.register
"""`modalities.register(name, "module:Class")`: a new model family is a new adapter file."""


def get(name: str, **options: Any) -> Adapter:
    return ADAPTERS.build(name, **options)


__all__ = ["ADAPTERS", "Adapter", "get", "register"]
