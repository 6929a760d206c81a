"""Layer 2: model families, found by the `model_type` of a model dir's own `config.json`.

    family = models.resolve("runs/x/final")      # reads config.json only: no weights
    family = models.of_model(model)              # the family of a loaded model
    models.names()                               # every supported family
    models.register(MyFamily())                  # a family of your own (docs/extending.md)

An unsupported `model_type` is refused before any weights load, naming the supported families.
One file per family line (`qwen_vl`, and `glm4v` on it; `gemma3`, `internvl` and `mistral3`, on
`tiled`; `qwen_audio`);
`mmrlvr.models.base.Family` says what a family answers.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrlvr.core.registry import discover
from mmrlvr.models.base import Family, FamilyError, VllmNames
from mmrlvr.models.gemma3 import Gemma3
from mmrlvr.models.glm4v import Glm4v
from mmrlvr.models.internvl import InternVL
from mmrlvr.models.llama import Llama
from mmrlvr.models.llava_onevision import LlavaOnevision
from mmrlvr.models.mistral3 import Mistral3
from mmrlvr.models.qwen_audio import Qwen2Audio, Qwen3Omni, Qwen25Omni
from mmrlvr.models.qwen_vl import Qwen2VL, Qwen3VL, Qwen3VLMoe, Qwen25VL, Qwen35, Qwen35Moe
from mmrlvr.models.smolvlm import SmolVLM

FAMILIES: tuple[Family, ...] = (Qwen2VL(), Qwen25VL(), Qwen3VL(), Qwen3VLMoe(), Qwen35(), Qwen35Moe(),
                                Gemma3(), InternVL(), SmolVLM(), LlavaOnevision(), Mistral3(), Glm4v(),
                                Qwen2Audio(), Qwen25Omni(), Qwen3Omni(),
                                Llama())
"""Every supported family, in the order the README's model table lists them."""

_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types + f.wrapper_types}


def register(family: Family) -> Family:
    """Serve `family`'s `model_type`s too (one from a user's package: docs/extending.md).

    A package in `mmrlvr.core.registry.PLUGINS` that calls this is imported the first time a
    `model_type` or family name is not found, as the other registries import it. Registering a
    family of the same name again replaces it; a `model_type` another family serves is refused.
    """
    global FAMILIES
    taken = {t: _BY_TYPE[t].name for t in family.model_types + family.wrapper_types
             if t in _BY_TYPE and _BY_TYPE[t].name != family.name}
    if taken:
        raise FamilyError(f"family {family.name}: " + ", ".join(
            f"model_type {t!r} is already the {name} family's" for t, name in taken.items()))
    FAMILIES = (*(f for f in FAMILIES if f.name != family.name), family)
    _BY_TYPE.clear()
    _BY_TYPE.update({t: f for f in FAMILIES for t in f.model_types + f.wrapper_types})
    return family


def names() -> list[str]:
    return [f.name for f in FAMILIES]


def get(name: str) -> Family:
    if name not in names():
        discover()
    for f in FAMILIES:
        if f.name == name:
            return f
    raise FamilyError(f"unknown model family {name!r}; supported: {', '.join(names())}")


def supported() -> str:
    """One line naming every family and the `model_type`s it trains."""
    return "; ".join(f"{f.name} ({', '.join(f.model_types + f.wrapper_types)})" for f in FAMILIES)


def of_type(model_type: str, where: str = "the model") -> Family:
    if model_type not in _BY_TYPE:
        discover()
    if model_type not in _BY_TYPE:
        raise FamilyError(f"{where}: model_type {model_type!r} is not a family mmrlvr trains. "
                          f"Supported: {supported()}")
    return _BY_TYPE[model_type]


def of_config(config: Any, where: str = "the model") -> Family:
    return of_type(getattr(config, "model_type", ""), where)


def of_model(model: Any) -> Family:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return of_config(base.config, type(base).__name__)


def of_processor(processor: Any) -> Family | None:
    """The family a processor class belongs to, where it names one (None: unknown)."""
    name = type(processor).__name__
    for f in FAMILIES:
        if name in f.processors:
            return f
    return None


def resolve(path: str) -> Family:
    """The family of the model at `path` from its `config.json` alone (a local dir, or a hub id in
    the local HF cache); FamilyError before any weights load when no family serves it."""
    from mmrlvr.config.model_defaults import model_file

    file = model_file(path, "config.json")
    if file is None:
        raise FamilyError(f"{path}: no config.json (not a model dir, and not in the HF cache)")
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FamilyError(f"{file}: cannot read the model's config.json ({err})") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not model_type:
        raise FamilyError(f"{file} names no model_type; it is not a transformers model config")
    return of_type(model_type, str(file))


__all__ = ["FAMILIES", "Family", "FamilyError", "VllmNames", "get", "names", "of_config",
           "of_model", "of_processor", "of_type", "register", "resolve", "supported"]
