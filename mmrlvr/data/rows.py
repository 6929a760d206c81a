"""Rows: the `Example` every modality, reward and trainer agree on, the gold-answer and media-path
rules every layout shares (`mmrlvr.data.formats` reads rows), and the record of rows that could
not be used."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A dataset row or file that cannot be used; the message names the file and row.

    Row errors also carry their parts (`file`, `row`, `id`, `reason`) for the skipped-rows log.
    """

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None,
                 id: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.file, self.row, self.id, self.reason = file, row, id, reason


class DataWarning(UserWarning):
    """Rows that loaded only after a repair (numeric answers) or were skipped."""


def row_error(file: str | Path, row: int, reason: str, id: str | None = None) -> DataError:
    """A `DataError` for one row: "FILE, row N (id X): reason"."""
    where = f"{file}, row {row}" + (f" (id {id})" if id is not None else "")
    return DataError(f"{where}: {reason}", file=str(file), row=row, id=id, reason=reason)


@dataclass
class Example:
    """One prompt with its verifiable answer. Only `id`, `prompt` and `answer` are required."""

    id: str
    prompt: str
    answer: str
    images: list[Any] = field(default_factory=list)
    """Image paths (absolute once loaded) or PIL images, in prompt order."""
    audios: list[Any] = field(default_factory=list)
    """Audio paths or (array, sample_rate) pairs."""
    videos: list[Any] = field(default_factory=list)
    """Video paths (files or frame folders), frame lists, or encoded bytes, in prompt order."""
    choices: list[str] | None = None
    """Option texts for multiple choice, in letter order (A, B, ...)."""
    steps: list[str] | None = None
    """Process-labelled reference steps, where the dataset has them."""
    reasoning: str | None = None
    """A short reference reasoning, used as the `<think>` part of supervised warm starts."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else (task family, source row, ...); logged, never interpreted by the core."""
    chat: bool = False
    """The dataset gave the prompt as chat messages. A TRL-style reward then gets prompts and
    completions as messages, as TRL passes them for conversational datasets."""

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        row["images"] = [str(p) for p in self.images]
        row["audios"] = [str(p) for p in self.audios if isinstance(p, (str, Path))]
        row["videos"] = [_video_json(v) for v in self.videos if _video_json(v) is not None]
        if row.pop("chat"):                       # written back as the chat it was read from
            row["prompt"] = [{"role": "user", "content": self.prompt}]
        return {k: v for k, v in row.items() if v not in (None, [], {})}


def _video_json(video: Any) -> str | list[str] | None:
    """A video as JSON: its path, or its frames' paths; None for one held in memory."""
    if isinstance(video, (str, Path)):
        return str(video)
    if isinstance(video, (list, tuple)) and video and all(isinstance(f, (str, Path)) for f in video):
        return [str(f) for f in video]
    return None


def gold_answer(value: Any) -> tuple[str, bool]:
    """The gold answer as a string, and whether it was converted from a number.

    Raises ValueError for null, empty, bool, list and dict answers: `["3"]` would become the
    string "['3']", which no completion can ever match.
    """
    if isinstance(value, str) and value.strip():
        return value, False
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value), True
    if value is None or isinstance(value, str):
        raise ValueError("missing required field 'answer' (null or empty)")
    raise ValueError(f"'answer' must be a string, got {json.dumps(value)} ({type(value).__name__}); "
                     "write the gold answer as one JSON string")


def _media_path(item: str, base_dir: Path, kind: str, allow_outside: bool) -> str:
    """`item` resolved against `base_dir`; ValueError if it leads outside it or is missing (a
    video may be a folder of frames)."""
    raw = Path(item)
    how = "set data.allow_outside=true to accept it"
    if raw.is_absolute() and not allow_outside:
        raise ValueError(f"{kind} path {item!r} is absolute; media paths must be relative to the "
                         f"data file's dir {base_dir} ({how})")
    path = raw if raw.is_absolute() else base_dir / raw
    if not allow_outside and not path.resolve().is_relative_to(base_dir.resolve()):
        raise ValueError(f"{kind} path {item!r} leads outside the data file's dir {base_dir} "
                         f"(to {path.resolve()}; {how})")
    if not path.is_file() and not (kind == "video" and path.is_dir()):
        raise ValueError(f"{kind} not found: {path}")
    return str(path)


@dataclass
class SkippedRow:
    """One row left out of a split, and why."""

    file: str
    row: int
    id: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.file}, row {self.row}" + (f" (id {self.id})" if self.id else "") + \
            f": {self.reason}"


@dataclass
class LoadReport:
    """How a load went: rows kept, rows skipped with their reasons, answers repaired.

    One report may gather several loads (train and eval); `write` saves what it holds.
    """

    kept: int = 0
    skipped: list[SkippedRow] = field(default_factory=list)
    converted_answers: int = 0
    """Rows whose numeric gold answer was turned into a string."""

    def write(self, run_dir: str | Path) -> Path:
        """Write `run_dir/skipped_rows.jsonl`: one JSON object (file, row, id, reason) per
        skipped row; an empty file says that none were."""
        path = Path(run_dir) / "skipped_rows.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as fh:
            for skipped in self.skipped:
                fh.write(json.dumps(asdict(skipped), ensure_ascii=False) + "\n")
        return path
