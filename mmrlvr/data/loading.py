"""Loading datasets: JSONL (media paths relative to the file), parquet tables of known layouts,
`layout:path` specs and the config's splits; every row and media file checked up front
(`mmrlvr.data.media`), bad rows raised or skipped and recorded. And writing JSONL back."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmrlvr.data.media import MediaLimits, _media_checks
from mmrlvr.data.rows import (LAYOUTS, DataError, DataWarning, Example, LoadReport, SkippedRow,
                              example_from_row, row_error)

if TYPE_CHECKING:
    from mmrlvr.config import DataConfig


SKIP_HINT = "to drop bad rows instead, set data.on_error=skip (mmrlvr eval: --on-error skip)"


Row = tuple[int, Any]
"""(row number, the parsed row, or the DataError that reading it gave)."""


def _load_rows(source: Path, rows: Iterator[Row], build: Callable[[Any, int], Example], *,
               on_error: str, report: LoadReport | None, limits: MediaLimits) -> list[Example]:
    """Build, media-check and keep or drop rows; the one loop under every loader."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"data.on_error must be 'raise' or 'skip', got {on_error!r}")
    report = report if report is not None else LoadReport()
    built: list[tuple[int, Example | DataError]] = []
    numeric: set[int] = set()                 # rows whose answer was a number
    with contextlib.closing(rows):
        for line, row in rows:
            item = row
            if not isinstance(row, DataError):
                try:
                    item = build(row, line)
                    if not isinstance(row.get("answer"), str):
                        numeric.add(line)
                except DataError as err:
                    item = err
            built.append((line, item))
            if isinstance(item, DataError) and on_error == "raise":
                break                         # an earlier row's media may still be the first error
    examples = [item for _, item in built if isinstance(item, Example)]
    out: list[Example] = []
    skipped: list[SkippedRow] = []
    converted: list[int] = []
    with _media_checks(examples if limits.decode else [], limits) as problems:
        for line, item in built:
            if isinstance(item, Example):
                problem = next(problems) if limits.decode else None
                if problem is None:
                    out.append(item)
                    if line in numeric:
                        converted.append(line)
                    continue
                item = row_error(source, line, problem, item.id)
            if on_error == "raise":
                raise DataError(f"{item}; {SKIP_HINT}", file=item.file, row=item.row, id=item.id,
                                reason=item.reason) from None
            skipped.append(SkippedRow(item.file or str(source), item.row or line, item.id,
                                      item.reason or str(item)))
    report.kept += len(out)
    report.skipped += skipped
    report.converted_answers += len(converted)
    if converted:
        rows_named = ", ".join(map(str, converted[:5])) + (", ..." if len(converted) > 5 else "")
        warnings.warn(f"{source}: {len(converted)} gold answer(s) were numbers and were turned "
                      f"into strings (rows {rows_named}); write answers as JSON strings",
                      DataWarning, stacklevel=3)
    if skipped:
        warnings.warn(f"{source}: skipped {len(skipped)} bad row(s); first: {skipped[0]}",
                      DataWarning, stacklevel=3)
    return out


def _jsonl_rows(path: Path) -> Iterator[Row]:
    with path.open("rb") as fh:
        for line, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                yield line, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                yield line, row_error(path, line, "not valid UTF-8")
            except json.JSONDecodeError as err:
                yield line, row_error(path, line, f"invalid JSON ({err.msg})")


def _table_rows(path: Path) -> Iterator[Row]:
    """Rows of a JSONL, parquet or HF `datasets` arrow file (the last two through pyarrow)."""
    if path.suffix == ".jsonl":
        yield from _jsonl_rows(path)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        rows = pq.read_table(path).to_pylist()
    else:
        with pa.memory_map(str(path)) as source:
            try:
                rows = pa.ipc.open_stream(source).read_all().to_pylist()
            except pa.ArrowInvalid:
                rows = pa.ipc.open_file(source).read_all().to_pylist()
    yield from enumerate(rows, start=1)


def load_jsonl(path: str | Path, *, on_error: str = "raise", report: LoadReport | None = None,
               allow_outside: bool = False, max_image_pixels: int = 64_000_000,
               max_audio_seconds: float = 600.0, check_media: bool = True) -> list[Example]:
    """Read a JSONL dataset. `on_error` is "raise" (default) or "skip" (recorded in `report`);
    the other options are `load_dataset`'s."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    limits = MediaLimits(allow_outside, max_image_pixels, max_audio_seconds, check_media)
    base_dir = path.parent.absolute()

    def build(row: Any, line: int) -> Example:
        return example_from_row(row, source=str(path), line=line, base_dir=base_dir,
                                allow_outside=allow_outside)

    return _load_rows(path, _jsonl_rows(path), build, on_error=on_error, report=report,
                      limits=limits)


def load_table(path: str | Path, *, layout: str, on_error: str = "raise",
               report: LoadReport | None = None, allow_outside: bool = False,
               max_image_pixels: int = 64_000_000, max_audio_seconds: float = 600.0,
               check_media: bool = True) -> list[Example]:
    """Load a local parquet/arrow file in a known public layout (see `LAYOUTS`)."""
    path = Path(path)
    if layout not in LAYOUTS:
        raise DataError(f"unknown dataset layout {layout!r}; known: {sorted(LAYOUTS)}")
    if not path.exists():
        raise DataError(f"dataset file not found: {path}")
    limits = MediaLimits(allow_outside, max_image_pixels, max_audio_seconds, check_media)
    media_dir = path.parent.absolute() / f".{path.stem}_media"

    def build(row: Any, line: int) -> Example:
        if not isinstance(row, dict):
            raise row_error(path, line, f"expected an object, got {type(row).__name__}")
        return LAYOUTS[layout](row, source=str(path), line=line, media_dir=media_dir,
                               allow_outside=allow_outside)

    return _load_rows(path, _table_rows(path), build, on_error=on_error, report=report,
                      limits=limits)


def load_dataset(spec: str | Path, *, on_error: str = "raise", report: LoadReport | None = None,
                 allow_outside: bool = False, max_image_pixels: int = 64_000_000,
                 max_audio_seconds: float = 600.0, check_media: bool = True) -> list[Example]:
    """Load `path.jsonl`, or `layout:path.parquet` for a known public layout.

    Every row is checked now: answers, and each image/audio file (inside the data file's dir
    unless `allow_outside`; decodable; at most `max_image_pixels` / `max_audio_seconds`).
    `check_media=False` keeps only the path and existence checks. Bad rows raise `DataError`,
    or with `on_error="skip"` are dropped and recorded in `report`.
    """
    spec = str(spec)
    options = dict(on_error=on_error, report=report, allow_outside=allow_outside,
                   max_image_pixels=max_image_pixels, max_audio_seconds=max_audio_seconds,
                   check_media=check_media)
    layout, _, rest = spec.partition(":")
    if rest and layout in LAYOUTS:
        examples = load_table(rest, layout=layout, **options)
    else:
        examples = load_jsonl(spec, **options)
    if not examples:
        raise DataError(f"{spec}: the dataset is empty (no usable rows)")
    return examples


def load_split(data_cfg: DataConfig, which: str, report: LoadReport | None = None) -> list[Example]:
    """The `train` or `eval` split of a `data:` config, with all its load options.

    An empty `data.eval` gives []; eval keeps at most `data.eval_limit` rows (0: all).
    """
    if which not in ("train", "eval"):
        raise ValueError(f"which must be 'train' or 'eval', got {which!r}")
    spec = data_cfg.train if which == "train" else data_cfg.eval
    if not spec:
        if which == "eval":
            return []
        raise DataError("data.train is empty: give a JSONL file (see `mmrlvr data --help`)")
    examples = load_dataset(spec, on_error=data_cfg.on_error, report=report,
                            allow_outside=data_cfg.allow_outside,
                            max_image_pixels=data_cfg.max_image_pixels,
                            max_audio_seconds=data_cfg.max_audio_seconds)
    if which == "eval" and data_cfg.eval_limit:
        examples = examples[:data_cfg.eval_limit]
    return examples


def write_jsonl(examples: list[Example], path: str | Path, *,
                copy_media_to: str | None = None) -> None:
    """Write examples as JSONL, with media paths made relative to the file.

    A file outside the JSONL's dir stays an absolute path (loading it then needs
    `allow_outside`), unless `copy_media_to` names a sub-dir: such files are then linked or
    copied there, named by content, so the written dataset is self-contained.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = path.parent.resolve()
    with path.open("w", encoding="utf-8") as fh:
        for ex in examples:
            row = ex.to_json()
            for key in ("images", "audios"):
                if key in row:
                    row[key] = [_relative(Path(p), base, copy_media_to) for p in row[key]]
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _relative(src: Path, base: Path, copy_to: str | None) -> str:
    src = src.resolve()
    if src.is_relative_to(base):
        return str(src.relative_to(base))
    if copy_to is None:
        return str(src)
    digest = hashlib.sha1(src.read_bytes()).hexdigest()[:16]
    dest = base / copy_to / f"{digest}{src.suffix}"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)                # same file system: no second copy on disk
        except OSError:
            shutil.copyfile(src, dest)
    return str(dest.relative_to(base))
