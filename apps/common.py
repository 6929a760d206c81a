"""What every demo tab shares: the loaded model (or why there is none), input checks, guards.

A handler never lets an exception reach Gradio: bad input becomes a `UserError` whose message is
shown as it is; anything else is logged with its traceback on the server and shown as one line.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from PIL import Image, UnidentifiedImageError

import modalities
from mmrlvr.data import DataError, Example

log = logging.getLogger("mmrlvr.demo")

NO_MODEL = "No model is loaded: start the demo with `mmrlvr demo --model DIR` to use this tab."
MAX_SOURCE_PIXELS = 64_000_000
"""Largest uploaded image (before resizing to the adapter's max_pixels): ~8000×8000."""
MAX_IMAGES = 8
"""Most images one question may carry."""


class UserError(ValueError):
    """Bad input: the message says what was wrong and what to do, and is shown as it is."""


def explain(err: BaseException) -> str:
    """One line for the status box: the message of bad input, a short note for anything else."""
    if isinstance(err, (UserError, DataError)):
        return f"⚠ {err}"
    log.exception("demo handler failed")
    return (f"✗ {type(err).__name__}: {err}. The server keeps running; the traceback is in its "
            "log.")


def warn(message: str) -> None:
    """A toast in the browser (a Python warning when called outside a Gradio event)."""
    import gradio as gr

    gr.Warning(message)


@dataclass
class DemoContext:
    """What the tabs read: the policy (None without `--model`), the run dir, prompt settings."""

    policy: Any = None
    model_path: str = ""
    run_dir: str = ""
    system_prompt: str = ""
    format_prompt: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """One generation at a time: tabs share the model."""

    def unavailable(self, modality: str, tab: str) -> str | None:
        """Why `tab` cannot run `modality` here, or None when it can."""
        try:
            modalities.get(modality)
        except KeyError:
            return (f"{tab} is not available yet: mmrlvr has no `{modality}` modality adapter. "
                    "The tab lights up when `modalities.get(\"" + modality + "\")` exists.")
        if self.policy is None:
            return NO_MODEL
        name = getattr(self.policy.adapter, "name", "?")
        if name != modality:
            return (f"{tab} needs a model loaded with the `{modality}` adapter; "
                    f"`{self.model_path}` is loaded with `{name}`.")
        return None


def run_config(run_dir: str | Path | None, model_path: str | Path | None = None) -> dict[str, Any]:
    """The resolved `config.yaml` of a run: RUN_DIR's, else the nearest one above the model dir.

    A checkpoint (`runs/NAME/checkpoints/step-N`) or a run's `final/` model finds its run's config,
    so the demo prompts the model the way it was trained.
    """
    candidates = [Path(run_dir) / "config.yaml"] if run_dir else []
    if model_path and Path(model_path).exists():
        candidates += [p / "config.yaml" for p in list(Path(model_path).resolve().parents)[:3]]
    for path in candidates:
        if path.is_file():
            try:
                loaded = yaml.safe_load(path.read_text())
            except yaml.YAMLError:
                continue
            if isinstance(loaded, dict):
                return loaded
    return {}


def open_image(path: Any, label: str) -> Image.Image:
    """An uploaded image as RGB, or a UserError saying why it cannot be used."""
    if isinstance(path, Image.Image):
        return path.convert("RGB")
    name = Path(str(path)).name
    try:
        with Image.open(path) as img:
            w, h = img.size
            if w * h > MAX_SOURCE_PIXELS:
                raise UserError(f"{label} ({name}) is {w}×{h} = {w * h / 1e6:.0f} MP; the demo "
                                f"takes images up to {MAX_SOURCE_PIXELS / 1e6:.0f} MP (they are "
                                "resized to the model's max_pixels anyway): downscale it first.")
            img.load()
            return img.convert("RGB")
    except Image.DecompressionBombError:
        raise UserError(f"{label} ({name}) is too large for the demo (over "
                        f"{MAX_SOURCE_PIXELS / 1e6:.0f} MP): downscale it first.") from None
    except UnidentifiedImageError:
        raise UserError(f"{label} ({name}) is not an image file PIL can read; upload a PNG, "
                        "JPEG, WebP, BMP or GIF.") from None
    except (OSError, SyntaxError) as err:  # truncated or corrupt files
        raise UserError(f"{label} ({name}) cannot be read: {err}") from None


def prepare_images(policy: Any, files: Any) -> tuple[list[Image.Image], list[str]]:
    """Open uploads and resize them to the adapter's min/max pixels: (images, size notes)."""
    if files is None:
        files = []
    elif isinstance(files, (str, Path, Image.Image)):
        files = [files]
    files = [f for f in files if f is not None]
    if not files:
        raise UserError("Upload an image first.")
    if len(files) > MAX_IMAGES:
        raise UserError(f"{len(files)} images uploaded; one question takes at most {MAX_IMAGES}.")
    images, notes = [], []
    probe = Example(id="demo", prompt="", answer="")
    for i, f in enumerate(files, 1):
        src = open_image(f, f"image {i}")
        try:
            resized = policy.adapter.load_image(src, probe)
        except ValueError as err:  # qwen-vl-utils refuses extreme aspect ratios
            raise UserError(f"image {i} cannot be resized for the model: {err}") from None
        images.append(resized)
        note = f"image {i}: {src.width}×{src.height}"
        if resized.size != src.size:
            note += f" → {resized.width}×{resized.height}"
        notes.append(note)
    return images, notes


def check_question(question: Any) -> str:
    question = (question or "").strip()
    if not question:
        raise UserError("Type a question first.")
    if len(question) > 4000:
        raise UserError(f"The question is {len(question)} characters long; keep it under 4000.")
    return question
