"""Defaults that depend on the model: image pixel bounds and the completion budget.

`model.min_pixels`, `model.max_pixels` and `rollout.max_new_tokens` default to 0, "the model's":
the pixel bounds of its image processor (`processor_config.json` / `preprocessor_config.json`)
and the `max_new_tokens` of its `generation_config.json`. A tiny CPU model carries small ones
(`mmrlvr tiny`: 56·56..112·112 pixels, 64 tokens), a 7B checkpoint its real ones, so neither
inherits the other's. Only json files are read, from a local model dir or, for a hub id, the
local Hugging Face cache: never the network, never weights.

    cfg = resolve_model_defaults(cfg)            # what a run calls before it starts
    cfg, sources = fill_model_defaults(cfg)      # the same, plus where each value came from
"""
from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmrlvr.config.schema import Config, ConfigError

FALLBACK_MAX_NEW_TOKENS = 1024
"""Completion budget for a model whose generation config names none (Qwen2.5-VL's does not)."""
FALLBACK_PIXELS = (56 * 56, 28 * 28 * 1280)
"""Pixel bounds for an image processor that states none, or a model not found locally: the
Qwen2-VL image processor's own defaults (4 to 1,280 image tokens)."""
UNUSED_PIXELS = (56 * 56, 112 * 112)
"""Pixel bounds for a model without an image processor (audio-only), where none are read."""
MODEL_DERIVED = ("model.min_pixels", "model.max_pixels", "rollout.max_new_tokens")
"""The keys whose 0 means "the model's"."""


@dataclass
class ModelDefaults:
    """The model's own values of the `MODEL_DERIVED` keys and, for each, where it came from."""

    min_pixels: int
    max_pixels: int
    max_new_tokens: int
    sources: dict[str, str] = field(default_factory=dict)


def model_file(path: str, name: str) -> Path | None:
    """`name` in the local model dir `path`, or in the local HF cache of hub id `path`."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local / name if (local / name).is_file() else None
    if not path or local.exists():
        return None
    import huggingface_hub

    try:
        found = huggingface_hub.try_to_load_from_cache(path, name)
    except ValueError:                       # not of the form org/name (HFValidationError)
        return None
    return Path(found) if isinstance(found, str) else None


def _read_json(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{file}: cannot read the model's json ({err}); fix or remove the "
                          "file, or set the value in the config") from None
    return data if isinstance(data, dict) else {}


def _image_processors(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, settings) of each image-processor block the model's processor files hold."""
    out = []
    for name in ("processor_config.json", "preprocessor_config.json"):
        file = model_file(path, name)
        if file is None:
            continue
        data = _read_json(file)
        if isinstance(data.get("image_processor"), dict):
            out.append((f"{file}: image_processor.", data["image_processor"]))
        if any(k in data for k in ("image_processor_type", "min_pixels", "merge_size")):
            out.append((f"{file}: ", data))
    return out


def _pixel_bounds(settings: dict[str, Any]) -> tuple[Any, Any, str, str]:
    """(min, max, their keys) as an image processor states them; `size` edges count pixels only
    in the dynamic-resolution (Qwen-VL style, with `merge_size`) processors."""
    size = settings.get("size") if isinstance(settings.get("size"), dict) else {}
    if "min_pixels" in settings or "max_pixels" in settings:
        return settings.get("min_pixels"), settings.get("max_pixels"), "min_pixels", "max_pixels"
    if "min_pixels" in size or "max_pixels" in size:
        return size.get("min_pixels"), size.get("max_pixels"), "size.min_pixels", "size.max_pixels"
    if "merge_size" in settings:
        return (size.get("shortest_edge"), size.get("longest_edge"), "size.shortest_edge",
                "size.longest_edge")
    return None, None, "", ""


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def model_defaults(path: str) -> ModelDefaults:
    """The model at `path` (local dir or cached hub id)'s pixel bounds and completion budget,
    each with its source; what the model does not state gets the documented fallback."""
    found = bool(path) and model_file(path, "config.json") is not None
    missing = f"fallback: model {path!r} not found locally (no dir, not in the HF cache)"
    out = ModelDefaults(0, 0, 0)

    processors = _image_processors(path) if found else []
    for where, settings in processors:
        low, high, low_key, high_key = _pixel_bounds(settings)
        if _positive_int(low) and _positive_int(high):
            out.min_pixels, out.max_pixels = low, high
            out.sources["model.min_pixels"] = f"from {where}{low_key}"
            out.sources["model.max_pixels"] = f"from {where}{high_key}"
            break
    if not out.min_pixels:
        if not found:
            why = missing
        elif processors:
            why = f"fallback: {processors[0][0].split(': ')[0]} states no pixel bounds"
        else:
            why = "unused: the model has no image processor"
        out.min_pixels, out.max_pixels = UNUSED_PIXELS if why.startswith("unused") \
            else FALLBACK_PIXELS
        out.sources["model.min_pixels"] = out.sources["model.max_pixels"] = why

    gen = model_file(path, "generation_config.json") if found else None
    budget = _read_json(gen).get("max_new_tokens") if gen is not None else None
    if _positive_int(budget):
        out.max_new_tokens = budget
        out.sources["rollout.max_new_tokens"] = f"from {gen}: max_new_tokens"
    else:
        out.max_new_tokens = FALLBACK_MAX_NEW_TOKENS
        out.sources["rollout.max_new_tokens"] = (
            missing if not found else f"fallback: {gen} has no max_new_tokens" if gen
            else "fallback: the model has no generation_config.json")
    return out


def _get(cfg: Config, dotted: str) -> Any:
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def fill_model_defaults(cfg: Config, model_path: str | None = None
                        ) -> tuple[Config, dict[str, str]]:
    """A copy of `cfg` with each `MODEL_DERIVED` key left at 0 taken from the model at
    `model_path` (default `cfg.model.path`), and {key: where its value came from} for those.
    Values the config sets are kept: with none left at 0 this returns `cfg` itself."""
    unset = [key for key in MODEL_DERIVED if _get(cfg, key) == 0]
    if not unset:
        return cfg, {}
    found = model_defaults(model_path if model_path is not None else cfg.model.path)
    out = copy.deepcopy(cfg)
    values = {"model.min_pixels": found.min_pixels, "model.max_pixels": found.max_pixels,
              "rollout.max_new_tokens": found.max_new_tokens}
    for key in unset:
        section, name = key.split(".")
        setattr(getattr(out, section), name, values[key])
    sources = {key: found.sources[key] for key in unset}
    low, high = out.model.min_pixels, out.model.max_pixels
    if low > high:
        said = {key: sources.get(key, "set in the config")
                for key in ("model.min_pixels", "model.max_pixels")}
        raise ConfigError(f"config key 'model.min_pixels' ({low}, {said['model.min_pixels']}) "
                          f"must be <= model.max_pixels ({high}, {said['model.max_pixels']}): "
                          "set both, or neither")
    return out, sources


def resolve_model_defaults(cfg: Config, model_path: str | None = None) -> Config:
    """`fill_model_defaults` without the record: what a run calls before anything loads (a
    no-op for every value the config sets)."""
    return fill_model_defaults(cfg, model_path)[0]


def render_config(cfg: Config, sources: dict[str, str] | None = None) -> str:
    """`cfg` as YAML, each key of `sources` marked with a comment saying where it came from."""
    sources = sources or {}
    lines, section = [], ""
    for line in yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False).splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            section = line[:-1]
        key = line.strip().split(":", 1)[0]
        if line.startswith("  ") and not line.startswith("   ") and f"{section}.{key}" in sources:
            line = f"{line}  # {sources[f'{section}.{key}']}"
        lines.append(line)
    return "\n".join(lines) + "\n"
