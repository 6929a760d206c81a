"""Rows: the `Example` every modality, reward and trainer agree on, how a JSON row or a known
public layout becomes one, and the record of rows that could not be used."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
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
    choices: list[str] | None = None
    """Option texts for multiple choice, in letter order (A, B, ...)."""
    steps: list[str] | None = None
    """Process-labelled reference steps, where the dataset has them."""
    reasoning: str | None = None
    """A short reference reasoning, used as the `<think>` part of supervised warm starts."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else (task family, source row, ...); logged, never interpreted by the core."""

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        row["images"] = [str(p) for p in self.images]
        row["audios"] = [str(p) for p in self.audios if isinstance(p, (str, Path))]
        return {k: v for k, v in row.items() if v not in (None, [], {})}


_FIELDS = {f.name for f in fields(Example)}


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
    """`item` resolved against `base_dir`; ValueError if it leads outside it or is missing."""
    raw = Path(item)
    how = "set data.allow_outside=true to accept it"
    if raw.is_absolute() and not allow_outside:
        raise ValueError(f"{kind} path {item!r} is absolute; media paths must be relative to the "
                         f"data file's dir {base_dir} ({how})")
    path = raw if raw.is_absolute() else base_dir / raw
    if not allow_outside and not path.resolve().is_relative_to(base_dir.resolve()):
        raise ValueError(f"{kind} path {item!r} leads outside the data file's dir {base_dir} "
                         f"(to {path.resolve()}; {how})")
    if not path.is_file():
        raise ValueError(f"{kind} not found: {path}")
    return str(path)


def example_from_row(row: dict[str, Any], *, source: str, line: int, base_dir: Path,
                     allow_outside: bool = False) -> Example:
    """Build an Example from a JSON row, resolving media paths against `base_dir`."""
    if not isinstance(row, dict):
        raise row_error(source, line, f"expected a JSON object, got {type(row).__name__}")
    rid = str(row["id"]) if row.get("id") is not None else f"{Path(source).stem}-{line}"

    def bad(reason: str) -> DataError:
        return row_error(source, line, reason, rid)

    if "prompt" not in row or row["prompt"] is None or str(row["prompt"]).strip() == "":
        raise bad(f"missing required field 'prompt' (have: {sorted(row)})")
    if "answer" not in row:
        raise bad(f"missing required field 'answer' (have: {sorted(row)})")
    try:
        answer, _ = gold_answer(row["answer"])
    except ValueError as err:
        raise bad(str(err)) from None
    unknown = set(row) - _FIELDS
    if unknown:
        raise bad(f"unknown fields {sorted(unknown)}; put extra data under 'meta'")
    row = {**row, "id": rid, "answer": answer, "prompt": str(row["prompt"])}
    for key in ("images", "audios", "choices", "steps"):
        value = row.get(key)
        if value is not None and (not isinstance(value, list)
                                  or not all(isinstance(v, str) for v in value)):
            raise bad(f"'{key}' must be a list of strings, got {value!r}")
    try:
        for key, kind in (("images", "image"), ("audios", "audio")):
            row[key] = [_media_path(item, base_dir, kind, allow_outside)
                        for item in row.get(key) or []]
    except ValueError as err:
        raise bad(str(err)) from None
    return Example(**row)


def _geo3k_row(row: dict[str, Any], *, source: str, line: int, media_dir: Path,
               allow_outside: bool) -> Example:
    """Geometry3K (hiyouga/geometry3k parquet): `images` (list of {bytes, path}), `problem`, `answer`."""
    rid = f"geo3k-{line}"
    prompt = str(row.get("problem") or "").replace("<image>", "").strip()
    if not prompt:
        raise row_error(source, line, f"missing or empty field 'problem' (have: {sorted(row)})", rid)
    try:
        answer, _ = gold_answer(row.get("answer"))
    except ValueError as err:
        raise row_error(source, line, str(err), rid) from None
    images = []
    for k, img in enumerate(row.get("images") or []):
        data = img.get("bytes") if isinstance(img, dict) else img
        if not isinstance(data, (bytes, bytearray)):
            raise row_error(source, line, f"image {k} has no bytes", rid)
        # named by content, so a replaced parquet never reuses stale files
        out = media_dir / f"{hashlib.sha1(data).hexdigest()[:16]}.png"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(bytes(data))
        images.append(str(out))
    return Example(id=rid, prompt=prompt, answer=answer, images=images,
                   meta={"source": "geometry3k"})


def _steps_row(row: dict[str, Any], *, source: str, line: int, media_dir: Path,
               allow_outside: bool) -> Example:
    """Step-labelled solutions (PRM800K/MathV-style): `question` or `problem`, `solution_steps`
    or `steps` (a list of strings, or one string of lines), `answer`; optional `id`, `image` or
    `images` (paths relative to the file) and `choices`. The steps also serve as `reasoning`."""
    rid = str(row.get("id") or f"{Path(source).stem}-{line}")

    def bad(reason: str) -> DataError:
        return row_error(source, line, reason, rid)

    prompt = next((str(row[k]) for k in ("question", "problem") if row.get(k)), "")
    prompt = prompt.replace("<image>", "").strip()
    if not prompt:
        raise bad(f"missing or empty field 'question' (have: {sorted(row)})")
    try:
        answer = gold_answer(row.get("answer"))[0].strip()
    except ValueError as err:
        raise bad(str(err)) from None
    steps = row.get("solution_steps", row.get("steps"))
    if isinstance(steps, str):
        steps = steps.splitlines()
    if steps is not None and (not isinstance(steps, list)
                              or not all(isinstance(s, str) for s in steps)):
        raise bad(f"'solution_steps' must be a list of strings, got {steps!r}")
    steps = [s.strip() for s in steps or [] if s.strip()] or None
    try:
        images = [_media_path(img, Path(source).parent, "image", allow_outside)
                  for img in row.get("images") or ([row["image"]] if row.get("image") else [])]
    except ValueError as err:
        raise bad(str(err)) from None
    return Example(id=rid, prompt=prompt, answer=answer, images=images,
                   choices=row.get("choices") or None, steps=steps,
                   reasoning="\n".join(steps) if steps else None, meta={"source": "steps"})


LAYOUTS = {"geo3k": _geo3k_row, "steps": _steps_row}
"""Row mappers for known public layouts (parquet/arrow; `steps` also JSONL), by name."""


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
