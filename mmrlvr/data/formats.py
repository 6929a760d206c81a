"""Layouts: which column holds each `Example` field, and the reading of one row into an Example.

A layout maps each field to the columns that may hold it (the first one present and not null in
a row wins). With `data.columns` empty, the layout is told from the column names:

- `prompt` and nothing but Example fields (`id prompt answer images audios videos choices
  steps reasoning meta`): mmrlvr's own JSONL. Strict: any other column is an error (a typo such as
  `imgaes` must not vanish into `meta`).
- `prompt` and other columns: TRL. `prompt` is text or chat messages; the answer is `answer`,
  else `solution`, else `ground_truth`; media are `images`/`image`, `audios`/`audio` and
  `videos`/`video`.
- `messages` (or ShareGPT's `conversations`), no `prompt`: ms-swift. The user turn is the prompt;
  the assistant turn is the gold answer (its `<answer>` part when tagged, the `<think>` part
  becoming `reasoning`), or the reasoning when an answer column (`solution`, ...) is there.
- `problem` or `question`, no `prompt`: EasyR1 (`problem`, `answer`, `images`).

`data.columns` ({field: column}) overrides these fields of the detected layout; the named
layouts (`geo3k:`, `steps:`) are mappings of the same kind. In every layout except the strict
one, each column no field uses goes to `Example.meta` under its own name (rewards receive it),
and so does the answer column when it is not called `answer` (TRL's `solution` reaches TRL
reward functions); a chat prompt's system turn is kept as `meta["system"]`.

Media may be paths (relative to the data's dir), `{"bytes", "path"}` dicts (datasets' Image and
Audio storage), raw bytes, PIL images, arrays, or `{"array", "sampling_rate"}` dicts; in-dataset
images stay in memory as PIL images (decoded when used), audio becomes `(array, rate)`. A video is
a file or a folder of frames (a path), a list of frames (each a path, PIL image, array or image
bytes: a list inside the row's list of videos), or the encoded bytes of a file, kept as bytes
(decoded when used, `mmrlvr.data.video`) or, in a layout that writes media files, written beside
the data.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrlvr.data.chat import (TAGS, Prompt, answer_and_reasoning, read_prompt, reasoning_of,
                              unwrap_answer)
from mmrlvr.data.media import audio_from_bytes, image_from_bytes
from mmrlvr.data.rows import DataError, Example, _media_path, gold_answer, row_error

NATIVE_FIELDS = ("id", "prompt", "answer", "images", "audios", "videos", "choices", "steps",
                 "reasoning", "meta")
MAPPABLE = ("id", "prompt", "messages", "answer", "images", "audios", "videos", "choices", "steps",
            "reasoning")
"""The keys `data.columns` accepts: Example fields, and `messages` for a conversation column."""
_COMMON = {"id": ("id",), "answer": ("answer", "solution", "ground_truth"),
           "images": ("images", "image"), "audios": ("audios", "audio"),
           "videos": ("videos", "video"), "choices": ("choices",), "steps": ("steps",), "reasoning": ("reasoning",)}


@dataclass(frozen=True)
class Layout:
    """Where each Example field comes from in a dataset's rows."""

    name: str
    columns: dict[str, tuple[str, ...]]
    """Field -> candidate columns, tried in order."""
    strict: bool = False
    """Columns no field uses are errors (mmrlvr's own JSONL) instead of going to `meta`."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Entries every row's meta starts with (e.g. the source dataset's name)."""
    id_prefix: str | None = None
    """Row ids are `PREFIX-ROW` when the row has none (default: the data file's stem)."""
    reasoning_from_steps: bool = False
    """The reference steps, one per line, also serve as `reasoning`."""
    media_files: bool = False
    """In-dataset image and video bytes are written to files beside the data (geo3k's way)
    instead of staying in memory."""

    def describe(self) -> str:
        """`NAME (prompt <- problem, answer <- answer, ...)`, for messages."""
        parts = ", ".join(f"{f} <- {'|'.join(cols)}" for f, cols in self.columns.items())
        return f"{self.name} ({parts})"


NATIVE = Layout("mmrlvr", {f: (f,) for f in NATIVE_FIELDS if f != "meta"}, strict=True)
TRL = Layout("TRL", {"prompt": ("prompt",), **_COMMON})
SWIFT = Layout("ms-swift", {"messages": ("messages", "conversations"), **_COMMON})
EASYR1 = Layout("EasyR1", {"prompt": ("problem", "question"), **_COMMON})

LAYOUTS = {
    "geo3k": Layout("geo3k", {"prompt": ("problem",), "answer": ("answer",), "images": ("images",)},
                    meta={"source": "geometry3k"}, id_prefix="geo3k", media_files=True),
    "steps": Layout("steps", {"id": ("id",), "prompt": ("question", "problem"), "answer": ("answer",),
                              "steps": ("solution_steps", "steps"), "images": ("images", "image"),
                              "choices": ("choices",)},
                    meta={"source": "steps"}, reasoning_from_steps=True),
}
"""Named layouts for `layout:path` specs: Geometry3K (hiyouga/geometry3k parquet: `images` as
{bytes, path}, `problem`, `answer`; images written to `.STEM_media/` beside the file) and
step-labelled solutions (PRM800K/MathV-style: `question` or `problem`, `solution_steps` or
`steps` as a list or one string of lines, `answer`, optional `id`, `image(s)`, `choices`)."""

_KNOWN = ("known layouts: TRL (prompt, solution|answer, image|images), EasyR1 (problem, answer, "
          "images), ms-swift (messages, images, audios), mmrlvr (prompt, answer, images, ...)")


def detect_layout(names: Iterable[str], label: str, columns: dict[str, str] | None = None,
                  base: Layout | None = None, *, check_names: bool = True) -> Layout:
    """The layout of a dataset with these column names: `base` (a named layout) or the one
    detected, with `columns` ({field: column}, i.e. `data.columns`) laid over it.

    `check_names`: every column named in `columns` must be one of `names` (tables; a JSONL
    file's first row need not hold every column)."""
    names = list(names)
    if columns:
        _check_columns(columns, names if check_names else None, label)
    if base is None:
        base = _detected(set(names))
        if base is None and not columns:
            raise DataError(f"{label}: cannot tell which column holds the prompt (columns: "
                            f"{sorted(names)}); {_KNOWN}; or name them with data.columns, e.g. "
                            "data.columns={prompt: question, answer: label}")
    if not columns:
        return base
    mapped = dict(base.columns) if base is not None else dict(_COMMON)
    if "prompt" in columns:
        mapped.pop("messages", None)
    if "messages" in columns:
        mapped.pop("prompt", None)
    mapped.update({f: (c,) for f, c in columns.items()})
    name = f"{base.name} + data.columns" if base is not None else "data.columns"
    return dataclasses.replace(base or TRL, name=name, columns=mapped, strict=False)


def _detected(names: set[str]) -> Layout | None:
    if "prompt" in names:
        return NATIVE if names <= set(NATIVE_FIELDS) else TRL
    if names & {"messages", "conversations"}:
        return SWIFT
    if names & {"problem", "question"}:
        return EASYR1
    return None


def _check_columns(columns: dict[str, str], names: list[str] | None, label: str) -> None:
    for key, col in columns.items():
        if key not in MAPPABLE:
            raise DataError(f"data.columns: unknown field {key!r}; fields: {list(MAPPABLE)}")
        if not isinstance(col, str) or not col:
            raise DataError(f"data.columns.{key} must be a column name, got {col!r}")
        if names is not None and col not in names:
            raise DataError(f"{label}: data.columns maps {key} to column {col!r}, which the "
                            f"dataset lacks (columns: {sorted(names)})")


@dataclass(frozen=True)
class RowPlace:
    """Where a row comes from: what errors name, and what relative media paths resolve against."""

    file: str
    row: int
    base_dir: Path
    default_id: str


def build_example(row: Any, layout: Layout, place: RowPlace, *, allow_outside: bool = False,
                  media_dir: Path | None = None, read_media: bool = True) -> tuple[Example, bool]:
    """One row as an Example, and whether its gold answer was a number turned into a string.

    Raises `DataError` naming the file, row and id. `read_media=False` leaves media items as
    they are (a lazy split's scan passes placeholders; counts are still checked)."""
    if not isinstance(row, dict):
        raise row_error(place.file, place.row, f"expected a JSON object, got {type(row).__name__}")
    used: set[str] = set()

    def take(name: str) -> tuple[str | None, Any]:
        for col in layout.columns.get(name, ()):
            if col in row:
                used.add(col)
                if row[col] is not None:
                    return col, row[col]
        return None, None

    _, rid = take("id")
    rid = str(rid) if rid is not None else place.default_id

    def bad(reason: str) -> DataError:
        return row_error(place.file, place.row, reason, rid)

    prompt = _prompt(row, layout, take, bad)
    answer_col, gold = take("answer")
    if answer_col is not None and answer_col != "answer":
        used.discard(answer_col)                       # stays in meta by its own name
    answer, converted, reasoning = _answer(answer_col, gold, prompt, layout, bad, row)
    if layout.strict:
        unknown = set(row) - set(NATIVE_FIELDS)
        if unknown:
            raise bad(f"unknown fields {sorted(unknown)}; put extra data under 'meta'")
    steps_col, steps = take("steps")
    steps = _strings(steps_col, steps.splitlines() if isinstance(steps, str) else steps, bad)
    steps = [s.strip() for s in steps or [] if s.strip()] or None
    choices_col, choices = take("choices")
    choices = _strings(choices_col, choices, bad)
    reasoning_col, own_reasoning = take("reasoning")
    if own_reasoning is not None and not isinstance(own_reasoning, str):
        raise bad(f"'{reasoning_col}' must be a string, got {type(own_reasoning).__name__}")
    reasoning = own_reasoning or reasoning
    if layout.reasoning_from_steps and steps:
        reasoning = "\n".join(steps)
    media = {kind: _media(kind, take(kind + "s"), prompt, layout, place, bad, read_media=read_media,
                          allow_outside=allow_outside, media_dir=media_dir) for kind in TAGS}
    meta_col = row.get("meta")
    if meta_col is not None and not isinstance(meta_col, dict):
        raise bad(f"'meta' must be an object, got {type(meta_col).__name__}")
    used.add("meta")
    meta = {**layout.meta, **{k: v for k, v in row.items() if k not in used}, **(meta_col or {})}
    if prompt.system:
        meta.setdefault("system", prompt.system)
    return Example(id=rid, prompt=prompt.text, answer=answer, images=media["image"],
                   audios=media["audio"], videos=media["video"], choices=choices, steps=steps, reasoning=reasoning,
                   meta=meta, chat=prompt.chat), converted


def example_from_row(row: dict[str, Any], *, source: str, line: int, base_dir: Path,
                     allow_outside: bool = False, layout: Layout | None = None) -> Example:
    """Build an Example from one row (its layout told from its own keys unless given),
    resolving media paths against `base_dir`."""
    place = RowPlace(str(source), line, Path(base_dir), f"{Path(source).stem}-{line}")
    if layout is None:
        if not isinstance(row, dict):
            raise row_error(source, line, f"expected a JSON object, got {type(row).__name__}")
        try:
            layout = detect_layout(row, f"{source}, row {line}")
        except DataError:
            layout = NATIVE                            # its error names the missing prompt
    return build_example(row, layout, place, allow_outside=allow_outside)[0]


def _prompt(row: dict, layout: Layout, take, bad) -> Prompt:
    col, value = take("prompt")
    if col is None:
        col, value = take("messages")
    if col is None or (isinstance(value, str) and not value.strip()):
        tried = "|".join(layout.columns.get("prompt", ()) + layout.columns.get("messages", ()))
        hint = "" if tried == "prompt" else f"; columns tried: {tried}"
        raise bad(f"missing required field 'prompt' (have: {sorted(row)}{hint})")
    try:
        prompt = read_prompt(value, col)
    except ValueError as err:
        raise bad(str(err)) from None
    if not prompt.text:
        raise bad(f"the prompt in '{col}' holds no text")
    return prompt


def _answer(col: str | None, gold: Any, prompt: Prompt, layout: Layout, bad,
            row: dict) -> tuple[str, bool, str | None]:
    """(gold answer, converted from a number, reasoning from the assistant turn)."""
    if col is None:
        if prompt.assistant and prompt.assistant.strip():
            answer, reasoning = answer_and_reasoning(prompt.assistant)
            return answer, False, reasoning
        tried = layout.columns.get("answer", ())
        if any(c in row for c in tried):
            raise bad("missing required field 'answer' (null or empty)")
        hint = "" if tried == ("answer",) else f"; columns tried: {'|'.join(tried)}"
        raise bad(f"missing required field 'answer' (have: {sorted(row)}{hint})")
    try:
        answer, converted = gold_answer(gold)
    except ValueError as err:
        raise bad(str(err) + ("" if col == "answer" else f" (column '{col}')")) from None
    answer = unwrap_answer(answer)
    if not answer:
        raise bad(f"missing required field 'answer' (empty inside <answer> tags in '{col}')")
    return answer, converted, reasoning_of(prompt.assistant) if prompt.assistant else None


def _strings(col: str | None, value: Any, bad) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise bad(f"'{col}' must be a list of strings, got {value!r}")
    return list(value)


def _media(kind: str, taken: tuple[str | None, Any], prompt: Prompt, layout: Layout,
           place: RowPlace, bad, *, read_media: bool, allow_outside: bool,
           media_dir: Path | None) -> list[Any]:
    """A row's images, audios or videos, in order: the media column's or the prompt parts' own,
    matched against the prompt's placeholders."""
    col, value = taken
    if value is None:
        items = []
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif layout.strict:
        raise bad(f"'{col}' must be a list of strings (paths) or {kind} data, got {value!r}")
    else:
        items = [value]                                # TRL's one `image` per row
    inline = prompt.inline[kind]
    if inline and items:
        raise bad(f"{kind}s both inside the prompt's content parts and in column '{col}'")
    items = inline or items
    slots = prompt.slots[kind]
    if slots and slots != len(items):
        where = f" in '{col}'" if col else ""
        raise bad(f"the prompt holds {slots} {kind} placeholder(s) ({TAGS[kind]} or a {kind} "
                  f"part) for {len(items)} {kind}(s){where}; each placeholder stands for the "
                  f"next {kind}, in order")
    if not read_media:
        return items
    try:
        return [_item(kind, item, k, col or "prompt", place, allow_outside, media_dir)
                for k, item in enumerate(items)]
    except ValueError as err:
        raise bad(str(err)) from None


def _item(kind: str, item: Any, k: int, col: str, place: RowPlace, allow_outside: bool,
          media_dir: Path | None) -> Any:
    """One medium as the adapters take it: a checked path, a PIL image, an (array, rate) pair,
    a video (`_video_item`)."""
    import numpy as np
    from PIL import Image

    if kind == "video":
        return _video_item(item, k, col, place, allow_outside, media_dir)

    if isinstance(item, dict):
        if kind == "audio" and item.get("array") is not None:
            rate = item.get("sampling_rate")
            if not isinstance(rate, (int, float)) or rate <= 0:
                raise ValueError(f"audio {k} in '{col}' has an array but no sampling_rate")
            return np.asarray(item["array"], dtype=np.float32), int(rate)
        item = item.get("bytes") if item.get("bytes") is not None else item.get("path")
    if isinstance(item, (str, os.PathLike)):
        return _media_path(str(item), place.base_dir, kind, allow_outside)
    if isinstance(item, (bytes, bytearray, memoryview)):
        data = bytes(item)
        if kind == "image" and media_dir is not None:
            return _write_media(data, media_dir)
        return (image_from_bytes if kind == "image" else audio_from_bytes)(data, f"{kind} {k} in '{col}'")
    if kind == "image" and isinstance(item, Image.Image):
        return item
    if isinstance(item, np.ndarray):
        return Image.fromarray(item) if kind == "image" else item
    if kind == "audio" and isinstance(item, tuple) and len(item) == 2:
        return item
    raise ValueError(f"'{col}' must be a list of strings (paths) or {kind} data ({kind} {k} is "
                     f"{type(item).__name__}: expected a path, bytes, "
                     + ("a PIL image or an array)" if kind == "image"
                        else "an {array, sampling_rate} object or an (array, rate) pair)"))


def _video_item(item: Any, k: int, col: str, place: RowPlace, allow_outside: bool,
                media_dir: Path | None) -> Any:
    """A video: a checked path (file or frame folder), a frame list (paths checked, in-memory
    frames as PIL images), or encoded bytes (kept, or written to `media_dir`)."""
    import numpy as np
    from PIL import Image

    if isinstance(item, dict):
        item = item.get("bytes") if item.get("bytes") is not None else item.get("path")
    if isinstance(item, (str, os.PathLike)):
        return _media_path(str(item), place.base_dir, "video", allow_outside)
    if isinstance(item, (bytes, bytearray, memoryview)):
        data = bytes(item)
        if media_dir is None:
            return data
        from mmrlvr.data.video import container_suffix

        try:
            return _write_media(data, media_dir, container_suffix(data))
        except ValueError as err:                  # a predicate: "cannot be opened as a video"
            raise ValueError(f"video {k} in '{col}' ({len(data)} bytes) {err}") from None
    if isinstance(item, np.ndarray) and item.ndim == 4:
        item = list(item)
    if not isinstance(item, (list, tuple)) or not item:
        raise ValueError(f"video {k} in '{col}' is {type(item).__name__}: expected a path (a "
                         "video file or a folder of frames), a non-empty list of frames or the "
                         "encoded bytes of a video")
    frames = []
    for j, frame in enumerate(item):
        if isinstance(frame, dict):
            frame = frame.get("bytes") if frame.get("bytes") is not None else frame.get("path")
        if isinstance(frame, (str, os.PathLike)):
            frames.append(_media_path(str(frame), place.base_dir, "video frame", allow_outside))
        elif isinstance(frame, (bytes, bytearray, memoryview)):
            frames.append(image_from_bytes(bytes(frame), f"frame {j} of video {k} in '{col}'"))
        elif isinstance(frame, Image.Image):
            frames.append(frame)
        elif isinstance(frame, np.ndarray):
            frames.append(Image.fromarray(frame))
        else:
            raise ValueError(f"frame {j} of video {k} in '{col}' is {type(frame).__name__}: "
                             "expected an image path, image bytes, a PIL image or an array")
    return frames


def _write_media(data: bytes, media_dir: Path, suffix: str = ".png") -> str:
    # named by content, so a replaced dataset never reuses stale files
    out = media_dir / f"{hashlib.sha1(data).hexdigest()[:16]}{suffix}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    return str(out)
