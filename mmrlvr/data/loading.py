"""Loading datasets: a spec (see `mmrlvr.data.sources`: JSONL/JSON, parquet, Arrow, a
`save_to_disk` dir, parquet shards, `PATH@SPLIT`, with an optional `layout:` prefix) read through
a layout (`mmrlvr.data.formats`: detected TRL/EasyR1/ms-swift/mmrlvr columns, `data.columns`, or
a named layout), every row and medium checked up front (`mmrlvr.data.media`) and, given a
budget, every prompt's length (`mmrlvr.data.lengths`), bad rows raised or skipped and recorded.
Datasets over `LAZY_BYTES` come back as a `LazySplit` (`mmrlvr.data.lazy`: what it checks up
front and what when a row is drawn); the rest as a list of Examples. And writing JSONL back."""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mmrlvr.data.formats import LAYOUTS, Layout, RowPlace, build_example, detect_layout
from mmrlvr.data.lazy import LazySplit, sample_positions
from mmrlvr.data.lengths import PromptBudget
from mmrlvr.data.media import MediaLimits, _media_checks
from mmrlvr.data.rows import DataError, DataWarning, Example, LoadReport, SkippedRow, row_error
from mmrlvr.data.sources import LAZY_BYTES, JsonSource, TableSource, open_source

if TYPE_CHECKING:
    from mmrlvr.config import DataConfig

__all__ = ["LAZY_BYTES", "LazySplit", "head_examples", "load_dataset", "load_jsonl", "load_split",
           "load_table", "write_jsonl"]

SKIP_HINT = "to drop bad rows instead, set data.on_error=skip (mmrlvr eval: --on-error skip)"

Build = Callable[[Any, str, int], tuple[Example, bool]]
"""(row, file, row number) -> (Example, gold answer converted from a number)."""


def _check_rows(rows: Iterable[tuple[Any, str, int, Any]], build: Build, *, on_error: str,
                limits: MediaLimits, budget: PromptBudget | None = None, exact: bool = True
                ) -> tuple[list[tuple[Any, Example]], list[SkippedRow], list[int]]:
    """Build and media-check rows given as (key, file, row number, row or DataError), and
    measure each prompt against `budget` (`exact=False`: no media read, `PromptBudget.problem`):
    the kept (key, Example) pairs, the skipped rows, and the row numbers whose answers were
    numbers. With `on_error="raise"` the first bad row raises."""
    built: list[tuple[Any, str, int, Example | DataError, bool]] = []
    for key, file, line, row in rows:
        item, converted = row, False
        if not isinstance(row, DataError):
            try:
                item, converted = build(row, file, line)
            except DataError as err:
                item = err
        built.append((key, file, line, item, converted))
        if isinstance(item, DataError) and on_error == "raise":
            break                             # an earlier row's media may still be the first error
    examples = [item for *_, item, _ in built if isinstance(item, Example)]
    kept: list[tuple[Any, Example]] = []
    skipped: list[SkippedRow] = []
    converted_rows: list[int] = []
    with _media_checks(examples if limits.decode else [], limits) as problems:
        for key, file, line, item, converted in built:
            if isinstance(item, Example):
                problem = next(problems) if limits.decode else None
                if problem is None and budget is not None:
                    problem = budget.problem(item, exact)
                if problem is None:
                    kept.append((key, item))
                    if converted:
                        converted_rows.append(line)
                    continue
                item = row_error(file, line, problem, item.id)
            if on_error == "raise":
                raise DataError(f"{item}; {SKIP_HINT}", file=item.file, row=item.row, id=item.id,
                                reason=item.reason) from None
            skipped.append(SkippedRow(item.file or file, item.row or line, item.id,
                                      item.reason or str(item)))
    return kept, skipped, converted_rows


def _record(report: LoadReport, label: str, kept: int, skipped: list[SkippedRow],
            converted: list[int]) -> None:
    report.kept += kept
    report.skipped += skipped
    report.converted_answers += len(converted)
    if converted:
        rows_named = ", ".join(map(str, converted[:5])) + (", ..." if len(converted) > 5 else "")
        warnings.warn(f"{label}: {len(converted)} gold answer(s) were numbers and were turned "
                      f"into strings (rows {rows_named}); write answers as JSON strings",
                      DataWarning, stacklevel=4)
    if skipped:
        warnings.warn(f"{label}: skipped {len(skipped)} bad row(s); first: {skipped[0]}",
                      DataWarning, stacklevel=4)


def _builder(source: JsonSource | TableSource, layout: Layout, allow_outside: bool,
             read_media: bool = True) -> Callable[[Any, str, int], tuple[Example, bool]]:
    base_dir = Path(source.base_dir).absolute()
    media_dir = (base_dir / f".{Path(source.label).stem}_media") if layout.media_files else None

    def build(row: Any, file: str, line: int) -> tuple[Example, bool]:
        place = RowPlace(file, line, base_dir, f"{layout.id_prefix or Path(file).stem}-{line}")
        return build_example(row, layout, place, allow_outside=allow_outside,
                             media_dir=media_dir, read_media=read_media)
    return build


def _load_json(source: JsonSource, base: Layout | None, columns: dict[str, str] | None,
               allow_outside: bool, on_error: str, report: LoadReport,
               limits: MediaLimits, budget: PromptBudget | None = None) -> list[Example]:
    """JSON rows: the layout is told from the first row that is an object."""
    layout: Layout | None = None
    build: Build | None = None

    def build_row(row: Any, file: str, line: int) -> tuple[Example, bool]:
        nonlocal layout, build
        if build is None:
            if not isinstance(row, dict):
                raise row_error(file, line, f"expected a JSON object, got {type(row).__name__}")
            layout = detect_layout(row, source.label, columns, base, check_names=False)
            build = _builder(source, layout, allow_outside)
        return build(row, file, line)

    rows = ((None, file, line, row) for file, line, row in source.rows())
    kept, skipped, converted = _check_rows(rows, build_row, on_error=on_error, limits=limits,
                                           budget=budget)
    _record(report, source.label, len(kept), skipped, converted)
    return [ex for _, ex in kept]


def _table_rows(source: TableSource, columns: list[str] | None = None,
                fill: Callable[[int, dict], None] | None = None, size: int = 2048):
    for start, rows in source.batches(columns, size):
        for k, row in enumerate(rows):
            if fill is not None:
                fill(start + k, row)
            yield (start + k, *source.where(start + k), row)


def _load_table(source: TableSource, layout: Layout, allow_outside: bool, on_error: str,
                report: LoadReport, limits: MediaLimits, budget: PromptBudget | None = None
                ) -> list[Example] | LazySplit:
    build = _builder(source, layout, allow_outside)
    if not source.lazy:
        kept, skipped, converted = _check_rows(_table_rows(source), build, on_error=on_error,
                                               limits=limits, budget=budget)
        _record(report, source.label, len(kept), skipped, converted)
        return [ex for _, ex in kept]
    names = source.table.column_names
    media = [c for f in ("images", "audios", "videos") for c in layout.columns.get(f, ())
             if c in names]
    counts = {c: source.counts(c) for c in media}

    def fill(pos: int, row: dict) -> None:
        for c in media:                         # placeholders: the count, never the bytes
            row[c] = [None] * int(counts[c][pos]) if counts[c][pos] else None

    text = [c for c in names if c not in media]
    scan = _builder(source, layout, allow_outside, read_media=False)
    positions, skipped, converted = [], [], []
    rows = _table_rows(source, text, fill)
    while batch := list(itertools.islice(rows, 4096)):
        kept, bad, numeric = _check_rows(batch, scan, on_error=on_error,
                                         limits=MediaLimits(decode=False), budget=budget,
                                         exact=False)
        positions += [pos for pos, _ in kept]
        skipped += bad
        converted += numeric
    sample = [positions[i] for i in sample_positions(len(positions))]
    drawn = ((pos, *source.where(pos), source.row(pos)) for pos in sample)
    kept, bad, _ = _check_rows(drawn, build, on_error=on_error, limits=limits, budget=budget)
    dropped = set(sample) - {pos for pos, _ in kept}
    split = LazySplit(source, layout, np.array([p for p in positions if p not in dropped],
                                               dtype=np.int64),
                      lambda row, file, line: build(row, file, line)[0], limits, on_error, report,
                      budget)
    _record(report, source.label, len(split), skipped + bad, converted)
    return split


def load_dataset(spec: str | Path, *, on_error: str = "raise", report: LoadReport | None = None,
                 allow_outside: bool = False, max_image_pixels: int = 64_000_000,
                 max_audio_seconds: float = 600.0, check_media: bool = True,
                 columns: dict[str, str] | None = None, lazy: bool | None = None,
                 max_video_seconds: float = 600.0, budget: PromptBudget | None = None
                 ) -> list[Example] | LazySplit:
    """Load a dataset spec: a file, a dir or `PATH@SPLIT` (`mmrlvr.data.sources`), optionally
    prefixed `layout:` for a named layout (`LAYOUTS`); `columns` is `data.columns`.

    Every row is checked now: answers, and each image/audio/video (files inside the data's dir
    unless `allow_outside`; decodable; at most `max_image_pixels` / `max_audio_seconds` /
    `max_video_seconds`).
    `check_media=False` keeps only the path and existence checks. With a `budget`
    (`mmrlvr.data.lengths`), a prompt longer than it is a bad row. Bad rows raise `DataError`,
    or with `on_error="skip"` are dropped and recorded in `report`. `lazy` serves an Arrow or
    parquet dataset as a `LazySplit` (None: when its files pass `LAZY_BYTES`).
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"data.on_error must be 'raise' or 'skip', got {on_error!r}")
    spec = str(spec)
    name, _, rest = spec.partition(":")
    base = LAYOUTS.get(name) if rest else None
    if base is None and rest and not Path(spec).exists() and Path(rest).exists():
        raise DataError(f"unknown dataset layout {name!r} in {spec!r}; known: {sorted(LAYOUTS)}")
    source = open_source(rest if base is not None else spec, lazy)
    report = report if report is not None else LoadReport()
    limits = MediaLimits(allow_outside, max_image_pixels, max_audio_seconds, check_media,
                         max_video_seconds)
    if isinstance(source, JsonSource):
        examples = _load_json(source, base, columns, allow_outside, on_error, report, limits,
                              budget)
    else:
        layout = detect_layout(source.table.column_names, source.label, columns, base)
        examples = _load_table(source, layout, allow_outside, on_error, report, limits, budget)
    if not examples:
        raise DataError(f"{spec}: the dataset is empty (no usable rows)")
    return examples


def head_examples(spec: str | Path, rows: int = 2000, *, columns: dict[str, str] | None = None,
                  allow_outside: bool = False) -> list[Example]:
    """The usable Examples among the first `rows` rows of a dataset spec (every form
    `load_dataset` reads, a `layout:` prefix and `data.columns` included), built as training
    builds them (embedded media written beside the data as there), without reading or checking
    the rest; a bad row is left out. What a demo shows as a run's examples."""
    spec = str(spec)
    name, _, rest = spec.partition(":")
    base = LAYOUTS.get(name) if rest else None
    source = open_source(rest if base is not None else spec)
    if isinstance(source, JsonSource):
        head = [(file, line, row) for file, line, row in itertools.islice(source.rows(), rows)]
        first = next((row for *_, row in head if isinstance(row, dict)), None)
        if first is None:
            return []
        layout = detect_layout(first, source.label, columns, base, check_names=False)
    else:
        layout = detect_layout(source.table.column_names, source.label, columns, base)
        head = [(*source.where(pos), row) for pos, row in
                itertools.islice(((p, r) for start, batch in source.batches(size=min(rows, 2048))
                                  for p, r in enumerate(batch, start)), rows)]
    build = _builder(source, layout, allow_outside)
    out = []
    for file, line, row in head:
        if isinstance(row, DataError):
            continue
        try:
            out.append(build(row, file, line)[0])
        except DataError:
            continue                       # training reports bad rows; a demo shows the others
    return out


def load_jsonl(path: str | Path, *, on_error: str = "raise", report: LoadReport | None = None,
               allow_outside: bool = False, max_image_pixels: int = 64_000_000,
               max_audio_seconds: float = 600.0, check_media: bool = True,
               columns: dict[str, str] | None = None,
               max_video_seconds: float = 600.0) -> list[Example]:
    """Read a JSONL (or JSON) file; unlike `load_dataset`, an empty file gives []. The options
    are `load_dataset`'s."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"data.on_error must be 'raise' or 'skip', got {on_error!r}")
    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    limits = MediaLimits(allow_outside, max_image_pixels, max_audio_seconds, check_media,
                         max_video_seconds)
    return _load_json(JsonSource(str(path), [path], path.parent), None, columns, allow_outside,
                      on_error, report if report is not None else LoadReport(), limits)


def load_table(path: str | Path, *, layout: str, **options: Any) -> list[Example] | LazySplit:
    """Load a dataset in a named layout (see `LAYOUTS`); the options are `load_dataset`'s."""
    if layout not in LAYOUTS:
        raise DataError(f"unknown dataset layout {layout!r}; known: {sorted(LAYOUTS)}")
    return load_dataset(f"{layout}:{path}", **options)


def load_split(data_cfg: DataConfig, which: str, report: LoadReport | None = None,
               budget: PromptBudget | None = None) -> Sequence[Example]:
    """The `train` or `eval` split of a `data:` config, with all its load options: a list of
    Examples, or a `LazySplit` for a big Arrow/parquet dataset (index it the same way). With
    a `budget` (`mmrlvr.train.lengths.prompt_budget`), prompts longer than it are bad rows.

    An empty `data.eval` gives []; eval keeps at most `data.eval_limit` rows (0: all).
    """
    if which not in ("train", "eval"):
        raise ValueError(f"which must be 'train' or 'eval', got {which!r}")
    spec = data_cfg.train if which == "train" else data_cfg.eval
    if not spec:
        if which == "eval":
            return []
        raise DataError("data.train is empty: give a dataset (a JSONL/JSON/parquet/arrow file, a "
                        "dataset dir or PATH@SPLIT; see `mmrlvr data --help` to make one)")
    examples = load_dataset(spec, on_error=data_cfg.on_error, report=report,
                            allow_outside=data_cfg.allow_outside,
                            max_image_pixels=data_cfg.max_image_pixels,
                            max_audio_seconds=data_cfg.max_audio_seconds,
                            max_video_seconds=data_cfg.max_video_seconds,
                            columns=dict(data_cfg.columns or {}), budget=budget)
    if which == "eval" and data_cfg.eval_limit:
        examples = examples[:data_cfg.eval_limit]
    return examples


def write_jsonl(examples: Iterable[Example], path: str | Path, *,
                copy_media_to: str | None = None) -> None:
    """Write examples as JSONL, with media paths made relative to the file.

    A file outside the JSONL's dir stays an absolute path (loading it then needs
    `allow_outside`), unless `copy_media_to` names a sub-dir: such files are then linked or
    copied there, named by content, so the written dataset is self-contained (a frame folder:
    its frames, into a folder of their own). In-memory media (PIL images, (array, rate) clips,
    a video's frames or bytes) are saved there as PNG / WAV files / the video's own file; without
    `copy_media_to` they are an error.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = path.parent.resolve()
    with path.open("w", encoding="utf-8") as fh:
        for ex in examples:
            row = ex.to_json()
            for key in ("images", "audios"):
                items = getattr(ex, key)
                if items:
                    row[key] = [_written(item, base, copy_media_to, ex.id) for item in items]
            if ex.videos:
                row["videos"] = [_written_video(v, base, copy_media_to, ex.id) for v in ex.videos]
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _written(item: Any, base: Path, copy_to: str | None, sample: str) -> str:
    if isinstance(item, (str, os.PathLike)):
        return _relative(Path(item), base, copy_to)
    if copy_to is None:
        raise DataError(f"sample {sample}: an in-memory {type(item).__name__} has no path to "
                        "write; pass copy_media_to (a sub-dir to save media in)")
    buf = io.BytesIO()
    if isinstance(item, tuple) and len(item) == 2:
        import soundfile as sf

        sf.write(buf, np.asarray(item[0], dtype=np.float32), int(item[1]), format="WAV")
        suffix = ".wav"
    elif hasattr(item, "save"):
        item.save(buf, format="PNG")
        suffix = ".png"
    else:
        raise DataError(f"sample {sample}: cannot write a bare {type(item).__name__} (an audio "
                        "array needs its sample rate: give (array, rate))")
    data = buf.getvalue()
    dest = base / copy_to / f"{hashlib.sha1(data).hexdigest()[:16]}{suffix}"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    return str(dest.relative_to(base))


def _written_video(item: Any, base: Path, copy_to: str | None, sample: str) -> str | list[str]:
    """A video as a written row holds it: a path (file or frame folder) or a list of frame
    paths; encoded bytes are saved under `copy_to` as the file they are."""
    if isinstance(item, (str, os.PathLike)) and Path(item).is_dir():
        return _relative_folder(Path(item), base, copy_to)
    if isinstance(item, (str, os.PathLike)):
        return _relative(Path(item), base, copy_to)
    if isinstance(item, (list, tuple)):
        return [_written(frame, base, copy_to, sample) for frame in item]
    if isinstance(item, (bytes, bytearray)) and copy_to is not None:
        from mmrlvr.data.video import container_suffix

        data = bytes(item)
        dest = base / copy_to / f"{hashlib.sha1(data).hexdigest()[:16]}{container_suffix(data)}"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        return str(dest.relative_to(base))
    raise DataError(f"sample {sample}: an in-memory video ({type(item).__name__}) has no path to "
                    "write; pass copy_media_to (a sub-dir to save media in)")


def _relative_folder(src: Path, base: Path, copy_to: str | None) -> str:
    """A frame folder's path relative to `base`, or its frames copied under `copy_to`."""
    from mmrlvr.data.video import folder_frames

    src = src.resolve()
    if src.is_relative_to(base) or copy_to is None:
        return str(src.relative_to(base)) if src.is_relative_to(base) else str(src)
    frames = [Path(f) for f in folder_frames(src)]
    digest = hashlib.sha1(b"".join(hashlib.sha1(f.read_bytes()).digest() for f in frames))
    dest = base / copy_to / digest.hexdigest()[:16]
    if not dest.exists():
        dest.mkdir(parents=True)
        for f in frames:
            shutil.copyfile(f, dest / f.name)
    return str(dest.relative_to(base))


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
