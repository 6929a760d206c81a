"""Where a dataset's rows come from, resolved offline from a spec:

- `FILE.jsonl` (one JSON object per line; another suffix is read as JSONL too) or `FILE.json` (an
  array of rows, `{"data": [...]}`, or columns `{"col": [...]}`);
- `FILE.parquet`, `FILE.arrow` (Arrow stream, as `datasets` writes, or Arrow file format);
- `DIR`: a `datasets` `save_to_disk` dir (a saved DatasetDict needs `@split` unless it has one
  split), or a dir of `.parquet`, `.arrow` or `.jsonl` shards (shards named for several splits,
  such as a hub snapshot's `data/train-*.parquet` and `data/test-*.parquet`, need `@split`);
- `PATH@SPLIT`: the split of a saved DatasetDict, the sub-dir `PATH/SPLIT`, the file
  `PATH/SPLIT.{jsonl,json,parquet,arrow}`, or the shards under `PATH` (or `PATH/data`) named
  `SPLIT-*` / `SPLIT_*` / `SPLIT.*`.

Nothing is downloaded: a spec that names no local path (a hub id) is an error that says how to
download it first. Parquet of up to `LAZY_BYTES` is read into memory with pyarrow; a bigger one is
converted once into `datasets`' cache (`HF_DATASETS_CACHE`) and memory-mapped from there, as are
Arrow files and saved datasets of any size.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmrlvr.data.rows import DataError, row_error

LAZY_BYTES = 256 * 2**20
"""Data files bigger than this (on disk, all shards) are served lazily; see `mmrlvr.data.lazy`."""
SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json")
_SPLIT_NAMES = re.compile(r"^(train|test|validation|valid|val|dev|eval)(?=[-_.]|$)")


@dataclass
class JsonSource:
    """Rows of one or more JSON/JSONL files, each row numbered within its file."""

    label: str
    paths: list[Path]
    base_dir: Path

    def rows(self) -> Iterator[tuple[str, int, Any]]:
        """(file, row number, the parsed row or the DataError reading it gave)."""
        for path in self.paths:
            rows = _json_rows(path) if path.suffix == ".json" else _jsonl_rows(path)
            for line, row in rows:
                yield str(path), line, row


@dataclass
class TableSource:
    """An Arrow table (in memory, or memory-mapped from disk) and how to name its rows."""

    label: str
    base_dir: Path
    table: Any
    """A `pyarrow.Table`."""
    shards: list[tuple[str, int]]
    """(file, rows) per shard, in table order: errors name the shard and the row within it."""
    nbytes: int
    """Size of the data files on disk."""
    lazy: bool
    labels: dict[str, list[str]] = field(default_factory=dict)
    """Names of `datasets.ClassLabel` columns' values: rows carry the names, not the ints."""

    def __len__(self) -> int:
        return self.table.num_rows

    def where(self, pos: int) -> tuple[str, int]:
        """The file and 1-based row of table position `pos`."""
        for file, n in self.shards:
            if pos < n:
                return file, pos + 1
            pos -= n
        raise IndexError(pos)

    def row(self, pos: int) -> dict[str, Any]:
        return self._named(self.table.slice(pos, 1).to_pylist()[0])

    def batches(self, columns: list[str] | None = None, size: int = 2048
                ) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """(first position, rows) over the table, reading only `columns` when given."""
        table = self.table.select(columns) if columns is not None else self.table
        pos = 0
        for batch in table.to_batches(max_chunksize=size):
            yield pos, [self._named(r) for r in batch.to_pylist()]
            pos += batch.num_rows

    def counts(self, column: str) -> np.ndarray:
        """Items per row in a media column (a list column's lengths; 1 or 0 for one item),
        read from the offsets without touching the media bytes."""
        import pyarrow as pa
        import pyarrow.compute as pc

        col = self.table.column(column)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            return pc.fill_null(pc.list_value_length(col), 0).to_numpy().astype(np.int64)
        return col.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)

    def _named(self, row: dict[str, Any]) -> dict[str, Any]:
        for col, names in self.labels.items():
            value = row.get(col)
            if isinstance(value, int) and 0 <= value < len(names):
                row[col] = names[value]
        return row


def open_source(spec: str, lazy: bool | None = None) -> JsonSource | TableSource:
    """Resolve `spec` (no `layout:` prefix) to its rows; `lazy` None decides by size."""
    path, split = Path(spec), None
    if not path.exists() and "@" in spec:
        head, _, split = spec.rpartition("@")
        path = Path(head)
    if not path.exists():
        hub = re.fullmatch(r"[\w.-]+/[\w.-]+", str(path)) and not path.suffix
        hint = (f" (no such local path; mmrlvr loads datasets offline: if {str(path)!r} is a "
                f"Hugging Face hub dataset, download it first, e.g. `huggingface-cli download "
                f"{path} --repo-type dataset --local-dir data/{path.name}`, then use "
                f"data/{path.name}@train)") if hub else ""
        raise DataError(f"dataset file not found: {path}{hint}")
    if split is None:
        return _resolve(path, str(path), lazy)
    return _resolve_split(path, split, spec, lazy)


def _resolve(path: Path, label: str, lazy: bool | None) -> JsonSource | TableSource:
    if path.is_file():
        if path.suffix == ".parquet":
            return _parquet([path], label, path.parent, lazy)
        if path.suffix == ".arrow":
            return _arrow([path], label, path.parent, lazy)
        return JsonSource(label, [path], path.parent)
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        if len(splits) != 1:
            raise DataError(f"{label}: a saved DatasetDict with splits {splits}; name one: "
                            f"{label}@{splits[0] if splits else 'train'}")
        return _saved(path / splits[0], f"{label}@{splits[0]}", path, lazy)
    if (path / "state.json").is_file():
        return _saved(path, label, path, lazy)
    for suffix in SUFFIXES:
        files = sorted(path.glob(f"*{suffix}")) or sorted(path.glob(f"data/*{suffix}"))
        if files:
            splits = sorted({m.group(1) for f in files if (m := _SPLIT_NAMES.match(f.name))})
            if len(splits) > 1:
                raise DataError(f"{label}: holds the files of splits {splits}; name one: "
                                f"{label}@{splits[0]}")
            return _files(files, label, path, lazy)
    raise DataError(f"{label}: no dataset here: a dir needs .parquet, .arrow, .jsonl or .json "
                    "files, or to be saved with datasets' save_to_disk")


def _resolve_split(root: Path, split: str, label: str, lazy: bool | None
                   ) -> JsonSource | TableSource:
    if not root.is_dir():
        raise DataError(f"{label}: @SPLIT picks a split of a dataset dir, and {root} is a file")
    if (root / "dataset_dict.json").is_file():
        splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits:
            raise DataError(f"{label}: the saved DatasetDict has no split {split!r} (splits: "
                            f"{splits})")
        return _saved(root / split, label, root, lazy)
    if (root / split).is_dir():
        found = _resolve(root / split, label, lazy)
        found.base_dir = root / split
        return found
    for suffix in SUFFIXES:
        if (root / f"{split}{suffix}").is_file():
            found = _resolve(root / f"{split}{suffix}", label, lazy)
            found.label = str(root / f"{split}{suffix}")
            return found
    named = re.compile(rf"^{re.escape(split)}(?=[-_.])")
    for suffix in SUFFIXES:
        files = sorted(f for f in [*root.glob(f"*{suffix}"), *root.glob(f"data/*{suffix}")]
                       if named.match(f.name))
        if files:
            return _files(files, label, root, lazy)
    have = sorted(p.name for p in root.iterdir() if p.is_dir() or p.suffix in SUFFIXES)
    raise DataError(f"{label}: no split {split!r} in {root} (a sub-dir {split}/, a file "
                    f"{split}.parquet|jsonl|..., or shards {split}-*; found: {have})")


def _files(files: list[Path], label: str, base: Path, lazy: bool | None
           ) -> JsonSource | TableSource:
    suffix = files[0].suffix
    if suffix == ".parquet":
        return _parquet(files, label, base, lazy)
    if suffix == ".arrow":
        return _arrow(files, label, base, lazy)
    return JsonSource(label, files, base)


def _is_lazy(lazy: bool | None, nbytes: int) -> bool:
    return nbytes > LAZY_BYTES if lazy is None else lazy


def _parquet(files: list[Path], label: str, base: Path, lazy: bool | None) -> TableSource:
    import pyarrow as pa
    import pyarrow.parquet as pq

    nbytes = sum(f.stat().st_size for f in files)
    shards = []
    for f in files:
        try:
            shards.append((str(f), pq.ParquetFile(f).metadata.num_rows))
        except (pa.ArrowInvalid, OSError) as err:       # a .parquet name on something else
            raise DataError(f"{f}: not a readable parquet file ({err})") from None
    if _is_lazy(lazy, nbytes):
        import datasets

        ds = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
        return TableSource(label, base, _flat(ds), shards, nbytes, True, _class_labels(ds.features))
    try:
        table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(f"{label}: cannot read parquet ({err})") from None
    return TableSource(label, base, table, shards, nbytes, False, _labels_of(table.schema))


def _arrow(files: list[Path], label: str, base: Path, lazy: bool | None) -> TableSource:
    import pyarrow as pa

    tables = []
    for f in files:
        try:                                   # the stream format datasets writes
            tables.append(pa.ipc.open_stream(pa.memory_map(str(f))).read_all())
        except pa.ArrowInvalid:
            try:
                tables.append(pa.ipc.open_file(pa.memory_map(str(f))).read_all())
            except pa.ArrowInvalid as err:
                raise DataError(f"{f}: not an Arrow file ({err})") from None
    table = pa.concat_tables(tables, promote_options="default")
    nbytes = sum(f.stat().st_size for f in files)
    shards = [(str(f), t.num_rows) for f, t in zip(files, tables, strict=True)]
    return TableSource(label, base, table, shards, nbytes, _is_lazy(lazy, nbytes),
                       _labels_of(table.schema))


def _saved(path: Path, label: str, base: Path, lazy: bool | None) -> TableSource:
    import datasets

    ds = datasets.load_from_disk(str(path))
    nbytes = sum(Path(f["filename"]).stat().st_size for f in ds.cache_files)
    return TableSource(label, base, _flat(ds), [(label, len(ds))], nbytes,
                       _is_lazy(lazy, nbytes), _class_labels(ds.features))


def _flat(ds: Any) -> Any:
    """The dataset's Arrow table, memory-mapped, with any row selection applied."""
    if ds.data.num_rows != len(ds):
        ds = ds.flatten_indices()
    return ds.data.table


def _labels_of(schema: Any) -> dict[str, list[str]]:
    meta = (schema.metadata or {}).get(b"huggingface", b"")
    if b"ClassLabel" not in meta:
        return {}
    import datasets

    return _class_labels(datasets.Features.from_arrow_schema(schema))


def _class_labels(features: Any) -> dict[str, list[str]]:
    import datasets

    return {name: list(f.names) for name, f in features.items()
            if isinstance(f, datasets.ClassLabel)}


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as fh:
        for line, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                yield line, json.loads(raw.decode("utf-8-sig"))   # a BOM (Excel, Notepad)
            except UnicodeDecodeError:
                yield line, row_error(path, line, "not valid UTF-8")
            except json.JSONDecodeError as err:
                yield line, row_error(path, line, f"invalid JSON ({err.msg})")


def _json_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """A JSON file: an array of rows, {"data": [...]}, or columns {"col": [...], ...};
    JSON Lines under a .json name read as such."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))   # a BOM is dropped
    except json.JSONDecodeError as err:
        if "Extra data" in err.msg:            # JSON Lines under a .json name
            yield from _jsonl_rows(path)
            return
        raise DataError(f"{path}: invalid JSON ({err.msg}, line {err.lineno})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not valid UTF-8") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    elif isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        n = {len(v) for v in data.values()}
        if len(n) != 1:
            raise DataError(f"{path}: columns of different lengths {sorted(n)}")
        data = [dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of rows (or JSON Lines), got "
                        f"{type(data).__name__}")
    yield from enumerate(data, start=1)
