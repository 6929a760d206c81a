"""Examples and datasets: the rows every modality, reward and trainer agree on.

A dataset on disk is JSONL, one `Example` per line, with media paths relative to the file.
Local HF datasets (parquet/arrow) load too, and known public layouts (Geometry3K) map their
fields onto `Example`. Bad rows raise `DataError` naming the file and row; with
`on_error="skip"` they are skipped and counted instead.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A dataset row or file that cannot be used; the message names the file and row."""


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


def example_from_row(row: dict[str, Any], *, source: str, line: int, base_dir: Path) -> Example:
    """Build an Example from a JSON row, resolving media paths against `base_dir`."""
    where = f"{source}, row {line}"
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in ("prompt", "answer"):
        if key not in row or row[key] is None or str(row[key]).strip() == "":
            raise DataError(f"{where}: missing required field '{key}' (have: {sorted(row)})")
    unknown = set(row) - _FIELDS
    if unknown:
        raise DataError(f"{where}: unknown fields {sorted(unknown)}; put extra data under 'meta'")
    row = dict(row)
    if row.get("id") is None:
        row["id"] = f"{Path(source).stem}-{line}"
    row["id"] = str(row["id"])
    row["answer"] = str(row["answer"])
    row["prompt"] = str(row["prompt"])
    for key in ("images", "audios", "choices", "steps"):
        value = row.get(key)
        if value is not None and (not isinstance(value, list)
                                  or not all(isinstance(v, str) for v in value)):
            raise DataError(f"{where} (id {row['id']}): '{key}' must be a list of strings, "
                            f"got {value!r}")
    for key, kind in (("images", "image"), ("audios", "audio")):
        resolved = []
        for item in row.get(key) or []:
            path = Path(item) if Path(item).is_absolute() else base_dir / item
            if not path.is_file():
                raise DataError(f"{where} (id {row['id']}): {kind} not found: {path}")
            resolved.append(str(path))
        row[key] = resolved
    return Example(**row)


@dataclass
class LoadReport:
    """How a load went: rows kept and rows skipped with their reasons."""

    kept: int = 0
    skipped: list[str] = field(default_factory=list)


def load_jsonl(path: str | Path, *, on_error: str = "raise",
               report: LoadReport | None = None) -> list[Example]:
    """Read a JSONL dataset. `on_error` is "raise" (default) or "skip" (count in `report`)."""
    path = Path(path)
    if on_error not in ("raise", "skip"):
        raise ValueError(f"data.on_error must be 'raise' or 'skip', got {on_error!r}")
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    report = report if report is not None else LoadReport()
    out: list[Example] = []
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                try:
                    row = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    raise DataError(f"{path}, row {line_no}: not valid UTF-8") from None
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}, row {line_no}: invalid JSON ({err.msg})") from None
                out.append(example_from_row(row, source=str(path), line=line_no,
                                            base_dir=path.parent))
            except DataError as err:
                if on_error == "raise":
                    raise
                report.skipped.append(str(err))
    report.kept += len(out)
    return out


def _geo3k_row(row: dict[str, Any], *, source: str, line: int, media_dir: Path) -> Example:
    """Geometry3K (hiyouga/geometry3k parquet): `images` (list of {bytes, path}), `problem`, `answer`."""
    where = f"{source}, row {line}"
    prompt = str(row.get("problem") or "").replace("<image>", "").strip()
    for key, value in (("problem", prompt), ("answer", str(row.get("answer") or "").strip())):
        if not value:
            raise DataError(f"{where}: missing or empty field '{key}' (have: {sorted(row)})")
    images = []
    for k, img in enumerate(row.get("images") or []):
        data = img.get("bytes") if isinstance(img, dict) else img
        if not isinstance(data, (bytes, bytearray)):
            raise DataError(f"{where}: image {k} has no bytes")
        # named by content, so a replaced parquet never reuses stale files
        out = media_dir / f"{hashlib.sha1(data).hexdigest()[:16]}.png"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(bytes(data))
        images.append(str(out))
    return Example(id=f"geo3k-{line}", prompt=prompt, answer=str(row["answer"]), images=images,
                   meta={"source": "geometry3k"})


def _steps_row(row: dict[str, Any], *, source: str, line: int, media_dir: Path) -> Example:
    """Step-labelled solutions (PRM800K/MathV-style): `question` or `problem`, `solution_steps`
    or `steps` (a list of strings, or one string of lines), `answer`; optional `id`, `image` or
    `images` (paths relative to the file) and `choices`. The steps also serve as `reasoning`."""
    where = f"{source}, row {line}"
    prompt = next((str(row[k]) for k in ("question", "problem") if row.get(k)), "")
    prompt = prompt.replace("<image>", "").strip()
    answer = "" if row.get("answer") is None else str(row["answer"]).strip()
    for key, value in (("question", prompt), ("answer", answer)):
        if not value:
            raise DataError(f"{where}: missing or empty field '{key}' (have: {sorted(row)})")
    steps = row.get("solution_steps", row.get("steps"))
    if isinstance(steps, str):
        steps = steps.splitlines()
    if steps is not None and (not isinstance(steps, list)
                              or not all(isinstance(s, str) for s in steps)):
        raise DataError(f"{where}: 'solution_steps' must be a list of strings, got {steps!r}")
    steps = [s.strip() for s in steps or [] if s.strip()] or None
    images = []
    for img in row.get("images") or ([row["image"]] if row.get("image") else []):
        path = Path(img) if Path(img).is_absolute() else Path(source).parent / img
        if not path.is_file():
            raise DataError(f"{where}: image not found: {path}")
        images.append(str(path))
    return Example(id=str(row.get("id") or f"{Path(source).stem}-{line}"), prompt=prompt,
                   answer=answer, images=images, choices=row.get("choices") or None, steps=steps,
                   reasoning="\n".join(steps) if steps else None, meta={"source": "steps"})


LAYOUTS = {"geo3k": _geo3k_row, "steps": _steps_row}
"""Row mappers for known public layouts (parquet/arrow; `steps` also JSONL), by name."""


def _read_table(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL, parquet or HF `datasets` arrow file (the last two through pyarrow)."""
    if path.suffix == ".jsonl":
        rows = []
        for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                rows.append(json.loads(raw))
            except json.JSONDecodeError as err:
                raise DataError(f"{path}, row {n}: invalid JSON ({err.msg})") from None
        return rows
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).read_all().to_pylist()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(source).read_all().to_pylist()


def load_table(path: str | Path, *, layout: str, on_error: str = "raise",
               report: LoadReport | None = None) -> list[Example]:
    """Load a local parquet/arrow file in a known public layout (see `LAYOUTS`)."""
    path = Path(path)
    if layout not in LAYOUTS:
        raise DataError(f"unknown dataset layout {layout!r}; known: {sorted(LAYOUTS)}")
    if not path.exists():
        raise DataError(f"dataset file not found: {path}")
    report = report if report is not None else LoadReport()
    media_dir = path.parent / f".{path.stem}_media"
    out = []
    for i, row in enumerate(_read_table(path)):
        try:
            out.append(LAYOUTS[layout](row, source=str(path), line=i + 1, media_dir=media_dir))
        except DataError as err:
            if on_error == "raise":
                raise
            report.skipped.append(str(err))
    report.kept += len(out)
    return out


def load_dataset(spec: str | Path, *, on_error: str = "raise",
                 report: LoadReport | None = None) -> list[Example]:
    """Load `path.jsonl`, or `layout:path.parquet` for a known public layout."""
    spec = str(spec)
    layout, _, rest = spec.partition(":")
    if rest and layout in LAYOUTS:
        examples = load_table(rest, layout=layout, on_error=on_error, report=report)
    else:
        examples = load_jsonl(spec, on_error=on_error, report=report)
    if not examples:
        raise DataError(f"{spec}: the dataset is empty (no usable rows)")
    return examples


def write_jsonl(examples: list[Example], path: str | Path) -> None:
    """Write examples as JSONL, with image paths made relative to the file where possible."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for ex in examples:
            row = ex.to_json()
            row["images"] = [_relative(p, path.parent) for p in row.get("images", [])]
            if not row["images"]:
                del row["images"]
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _relative(p: str, base: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(p)
