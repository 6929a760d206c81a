"""What every demo tab shares: the loaded models (or why there are none), input checks, guards.

A handler never lets an exception reach Gradio: bad input becomes a `UserError` whose message is
shown as it is; anything else is logged with its traceback on the server and shown as one line.
Every text a client sends is capped (`check_text`) before any of it is tokenised: a client is not
held to the page's `max_length`, and a 1 M-character format prompt once held the vision tab (and
everyone queued behind it) for over 2 minutes.
A tab whose modality the loaded model lacks says so and names the exact command that would load
a suitable model (`load_command`).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

import modalities
from apps.runinfo import RunInfo
from mmrlvr.core.prompting import Prompting
from mmrlvr.data import DataError, Example

log = logging.getLogger("mmrlvr.demo")

MAX_SOURCE_PIXELS = 64_000_000
"""Largest uploaded image (before resizing to the adapter's max_pixels): ~8000×8000."""
MAX_IMAGES = 8
"""Most images one question may carry."""
MAX_QUESTION_CHARS = 4000
MAX_FORMAT_CHARS = 2000
"""The format prompt appended to a question (the shipped configs' are under 160 characters); a
run's own may be longer and is always accepted."""
MAX_GOLD_CHARS = 1000
MAX_OPTIONS_CHARS = 4000
"""All the options of a question together (26 at most, one per line)."""
MAX_NAME_CHARS = 64
"""A typed target language."""
MAX_PATH_CHARS = 1024
"""A run dir typed into the monitor."""
SUGGESTED: dict[str, tuple[str, str]] = {
    "vision": ("runs/quickstart", "`bash scripts/quickstart.sh`"),
    "audio": ("runs/tones_grpo", "the steps at the top of `configs/tones_cpu.yaml`"),
    "image_translation": ("runs/banners-grpo",
                          "the steps at the top of `configs/banners_cpu.yaml`"),
}
"""Per modality: the run dir the shipped CPU recipe writes, and how to train it."""
KIND = {"vision": "vision-language", "audio": "audio-language",
        "image_translation": "image-translation (TransAnyText)"}


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


def load_command(modality: str) -> str:
    """The exact command that starts the demo with a `modality` model (and how to train one
    where this machine has none yet)."""
    run, how = SUGGESTED.get(modality, ("runs/NAME", "`mmrlvr train CONFIG.yaml`"))
    command = f"`mmrlvr demo --model {run}/final --run {run}`"
    if not (Path(run) / "final").is_dir():
        command += f" (there is no `{run}/final` here yet: train it with {how})"
    return command


@dataclass
class DemoContext:
    """What the tabs read: the policy (None without `--model`), the model it is compared with,
    the run it came from, prompt settings."""

    policy: Any = None
    model_path: str = ""
    run_dir: str = ""
    system_prompt: str = ""
    format_prompt: str = ""
    base: Any = None
    """The model the trained one is compared with (`--compare`; None: no comparison)."""
    base_path: str = ""
    info: RunInfo = field(default_factory=RunInfo)
    model_config: Any = None
    """The `ModelConfig` the policy was loaded with (a checkpoint switch reuses it)."""
    video: dict[str, Any] = field(default_factory=dict)
    """How videos are sampled: the run's `data.video_fps`/`max_frames`/`max_video_pixels`."""

    def prompting(self, format_prompt: str | None = None) -> Prompting:
        """The run's system turn with `format_prompt` (None: the run's own format instruction);
        a demo transforms no prompt."""
        fmt = self.format_prompt if format_prompt is None else format_prompt
        return Prompting(system=self.system_prompt or "", format=fmt or "")
    lock: threading.Lock = field(default_factory=threading.Lock)
    """One generation at a time: tabs share the models."""

    @property
    def modality(self) -> str:
        """The loaded model's adapter name (empty without a model)."""
        return getattr(self.policy.adapter, "name", "") if self.policy is not None else ""

    def unavailable(self, modality: str, tab: str) -> str | None:
        """Why `tab` cannot run `modality` here, with the command that would load a model for
        it; None when it can."""
        try:
            modalities.get(modality)
        except KeyError:
            return (f"{tab} is not available yet: mmrlvr has no `{modality}` modality adapter. "
                    f"The tab lights up when `modalities.get(\"{modality}\")` exists.")
        kind = KIND.get(modality, modality)
        kind = ("an " if kind[0] in "aeiou" else "a ") + kind
        if self.policy is None:
            return (f"No model is loaded. {tab} needs {kind} model: start the demo with "
                    f"{load_command(modality)}.")
        if self.modality != modality:
            return (f"{tab} needs {kind} model (the `{modality}` adapter); `{self.model_path}`"
                    f" is loaded with `{self.modality}`. Start the demo with "
                    f"{load_command(modality)}.")
        return None


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


VIDEO_TYPES = {"mp4", "webm", "mov", "mkv", "avi", "m4v"}
MAX_VIDEOS = 2
MAX_VIDEO_SECONDS = 120.0
"""The demo's cap on one uploaded video's length (training takes `data.max_video_seconds`)."""


def is_video(path: Any) -> bool:
    return isinstance(path, (str, Path)) and str(path).lower().rsplit(".", 1)[-1] in VIDEO_TYPES


def _uploads(files: Any) -> list[Any]:
    if files is None:
        return []
    if isinstance(files, (str, Path, Image.Image)):
        return [files]
    return [f for f in files if f is not None]


def prepare_images(policy: Any, files: Any) -> tuple[list[Image.Image], list[str]]:
    """Open uploads and resize them to the adapter's min/max pixels: (images, size notes)."""
    files = _uploads(files)
    if not files:
        raise UserError("Upload an image first.")
    return _images(policy, files)


def prepare_media(policy: Any, files: Any) -> tuple[list[Image.Image], list[Any], list[str]]:
    """Uploaded images resized as `prepare_images` does, and uploaded videos sampled into the
    clips training would make of them: (images, clips, notes)."""
    files = _uploads(files)
    if not files:
        raise UserError("Upload an image or a video first.")
    videos = [f for f in files if is_video(f)]
    if len(videos) > MAX_VIDEOS:
        raise UserError(f"{len(videos)} videos uploaded; one question takes at most {MAX_VIDEOS}.")
    images, notes = _images(policy, [f for f in files if not is_video(f)])
    probe = Example(id="demo", prompt="", answer="")
    clips = [_prepare_video(policy, f, i, probe) for i, f in enumerate(videos, 1)]
    notes += [f"video {i}: {len(c.frames)} frames of {c.frames[0].width}×{c.frames[0].height} "
              f"from {c.duration:.1f} s" for i, c in enumerate(clips, 1)]
    return images, clips, notes


def _images(policy: Any, files: list[Any]) -> tuple[list[Image.Image], list[str]]:
    if len(files) > MAX_IMAGES:
        raise UserError(f"{len(files)} images uploaded; one question takes at most {MAX_IMAGES}.")
    images, notes = [], []
    probe = Example(id="demo", prompt="", answer="")
    for i, f in enumerate(files, 1):
        src = open_image(f, f"image {i}")
        try:
            resized = policy.adapter.load_image(src, probe, policy.processor)
        except ValueError as err:  # qwen-vl-utils refuses extreme aspect ratios
            raise UserError(f"image {i} cannot be resized for the model: {err}") from None
        images.append(resized)
        note = f"image {i}: {src.width}×{src.height}"
        if resized.size != src.size:
            note += f" → {resized.width}×{resized.height}"
        notes.append(note)
    return images, notes


def _prepare_video(policy: Any, path: Any, i: int, probe: Example) -> Any:
    """One uploaded video as the clip the model sees, or a UserError saying why not."""
    from mmrlvr.data.video import video_problem

    name = Path(str(path)).name
    problem = video_problem(str(path), max_seconds=MAX_VIDEO_SECONDS)
    if problem:
        raise UserError(f"video {i} ({name}) cannot be used: {problem}")
    if not hasattr(policy.adapter, "load_video") or policy.family.video_key is None:
        raise UserError(f"video {i} ({name}): the {policy.family.name} model takes no video here.")
    try:
        return policy.adapter.load_video(str(path), i - 1, probe, policy.processor)
    except ValueError as err:
        raise UserError(f"video {i} ({name}) cannot be read: {err}") from None


def check_text(value: Any, label: str, limit: int) -> str:
    """A text input, stripped, or a UserError when it is over `limit` characters."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        raise UserError(f"{label[0].upper()}{label[1:]} is {len(text):,} characters long; keep "
                        f"it under {limit:,}.")
    return text.strip()


def check_question(question: Any) -> str:
    question = check_text(question, "the question", MAX_QUESTION_CHARS)
    if not question:
        raise UserError("Type a question first.")
    return question


def check_format(ctx: DemoContext, format_prompt: Any) -> str:
    """The format prompt to append: the run's unless the client sent one (at most
    `MAX_FORMAT_CHARS`, or the run's own length)."""
    if format_prompt is None:
        return ctx.format_prompt
    limit = max(MAX_FORMAT_CHARS, len(ctx.format_prompt))
    text = str(format_prompt)
    if len(text) > limit:
        raise UserError(f"The format prompt is {len(text):,} characters long; keep it under "
                        f"{limit:,}.")
    return text
