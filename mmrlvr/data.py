"""Examples and datasets: the rows every modality, reward and trainer agree on.

A dataset on disk is JSONL, one `Example` per line, with media paths relative to the file.
Local HF datasets (parquet/arrow) load too, and known public layouts (Geometry3K) map their
fields onto `Example`.

Everything a row needs is checked when the split loads, not when the row is drawn hours into a
run: the gold answer is a non-empty string; every image and audio file lies inside the data
file's dir, opens, decodes and is within the size limits (a decompression bomb is refused by
its header, before it is decoded). Bad rows raise `DataError` naming the file, row, sample id
and reason; with `on_error="skip"` they are dropped and recorded in the `LoadReport`, whose
`write(run_dir)` saves them as `skipped_rows.jsonl`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmrlvr.config import DataConfig


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


@dataclass(frozen=True)
class MediaLimits:
    """What every media file of a split must satisfy at load (the `data.*` keys of these names)."""

    allow_outside: bool = False
    """Accept absolute paths and paths leading outside the data file's dir."""
    max_image_pixels: int = 64_000_000
    """Largest image, width × height, read from the header before decoding."""
    max_audio_seconds: float = 600.0
    """Longest audio clip."""
    decode: bool = True
    """Open and decode every file (False: only the path and existence checks)."""


# --- rows -------------------------------------------------------------------------------------

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


# --- media ------------------------------------------------------------------------------------

def _mp(pixels: int) -> str:
    return f"{pixels / 1e6:.3g} MP"


def _check_image_file(path: str, max_pixels: int) -> str | None:
    from PIL import Image

    try:
        with Image.open(path) as im:          # parses the header; nothing is decoded yet
            w, h = im.size
            if w * h > max_pixels:
                return (f"image {path} is {w}×{h} = {_mp(w * h)}, over data.max_image_pixels = "
                        f"{_mp(max_pixels)} (refused before decoding; downscale it or raise the limit)")
            im.load()                         # truncated or corrupt data fails here, not mid-run
    except Image.DecompressionBombError as err:
        return f"image {path} is refused by PIL as a decompression bomb: {err}"
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad files; all mean "cannot decode"
        return f"image {path} cannot be decoded ({type(err).__name__}: {err})"
    return None


def _check_audio_file(path: str, max_seconds: float) -> str | None:
    import numpy as np
    import soundfile as sf

    try:
        info = sf.info(path)                  # the header: length before any decoding
    except Exception as first:  # noqa: BLE001 - a format libsndfile lacks: ask librosa/audioread
        try:
            import librosa

            seconds = float(librosa.get_duration(path=path))
        except Exception:  # noqa: BLE001 - audioread backends raise their own types
            return f"audio {path} cannot be decoded ({first})"
        return _audio_length_problem(path, seconds, max_seconds)
    problem = _audio_length_problem(path, info.frames / info.samplerate if info.samplerate > 0
                                    else 0.0, max_seconds)
    if problem:
        return problem
    try:                                      # decode in blocks, as the run will, with bounded memory
        for block in sf.blocks(path, blocksize=1 << 16, dtype="float32"):
            if not np.isfinite(block).all():
                return f"audio {path} holds NaN or infinite samples (corrupt file?)"
    except Exception as err:  # noqa: BLE001 - libsndfile reports corrupt data in several types
        return f"audio {path} cannot be decoded ({type(err).__name__}: {err})"
    return None


def _audio_length_problem(where: str, seconds: float, max_seconds: float) -> str | None:
    if seconds <= 0:
        return f"audio {where} holds no samples"
    if seconds > max_seconds:
        return (f"audio {where} lasts {seconds:.1f} s, over data.max_audio_seconds = "
                f"{max_seconds:g} s (cut it or raise the limit)")
    return None


def _check_file(kind: str, path: str, limits: MediaLimits) -> str | None:
    """The problem with one media file, or None when it is usable."""
    try:
        size = os.path.getsize(path)
    except OSError as err:
        return f"{kind} {path} cannot be read ({err.strerror or err})"
    if size == 0:
        return f"{kind} {path} is an empty file (0 bytes)"
    if kind == "image":
        return _check_image_file(path, limits.max_image_pixels)
    return _check_audio_file(path, limits.max_audio_seconds)


def _check_in_memory(kind: str, item: Any, limits: MediaLimits) -> str | None:
    """Size checks for media already in memory: PIL images, arrays, (array, rate) pairs."""
    import numpy as np

    if kind == "image":
        from PIL import Image

        if isinstance(item, Image.Image):
            w, h = item.size
        else:
            shape = sorted(np.shape(item))
            if len(shape) < 2:
                return f"in-memory image has shape {np.shape(item)}, not an image"
            w, h = shape[-2:]                 # the two largest dims; channels are the small one
        if w * h > limits.max_image_pixels:
            return (f"in-memory image is {w}×{h} = {_mp(w * h)}, over data.max_image_pixels = "
                    f"{_mp(limits.max_image_pixels)}")
        return None
    if isinstance(item, (tuple, list)) and len(item) == 2 and np.isscalar(item[1]) and item[1] > 0:
        return _audio_length_problem("(in memory)", max(np.shape(item[0]) or (0,)) / item[1],
                                     limits.max_audio_seconds)
    return None                               # a bare array: its rate, so its length, is unknown


def _media_items(ex: Example) -> Iterator[tuple[str, Any]]:
    yield from (("image", item) for item in ex.images)
    yield from (("audio", item) for item in ex.audios)


def _is_file_ref(item: Any) -> bool:
    return isinstance(item, (str, os.PathLike))


@contextlib.contextmanager
def _media_checks(examples: list[Example], limits: MediaLimits
                  ) -> Iterator[Iterator[str | None]]:
    """Yields an iterator over `examples` in order giving each one's first media problem (None
    when all is well). Files are checked once each, in parallel threads (PIL and libsndfile
    release the GIL while they read and decode); leaving early cancels the checks not started."""
    from tqdm.auto import tqdm

    files = list(dict.fromkeys((kind, str(item)) for ex in examples
                               for kind, item in _media_items(ex) if _is_file_ref(item)))
    # no bar for small splits; tqdm's None turns it off when stderr is not a terminal
    bar = tqdm(total=len(files), desc="checking media", unit="file", leave=False,
               disable=True if len(files) < 1000 else None)
    pool = ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) + 4),
                              thread_name_prefix="media-check")
    futures: dict[tuple[str, str], Future] = {}
    for key in files:
        futures[key] = pool.submit(_check_file, *key, limits)
        futures[key].add_done_callback(lambda _: bar.update())

    def first_problem(ex: Example) -> str | None:
        for kind, item in _media_items(ex):
            problem = (futures[kind, str(item)].result() if _is_file_ref(item)
                       else _check_in_memory(kind, item, limits))
            if problem:
                return problem
        return None

    try:
        yield (first_problem(ex) for ex in examples)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()


# --- loading ----------------------------------------------------------------------------------

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
