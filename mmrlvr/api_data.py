"""In-memory datasets of the Python API written into the run dir as data files the loader reads.

`GRPOTrainer(train_dataset=...)` takes what a TRL script holds: a `datasets.Dataset`, a
`DatasetDict` (its `train` split; as `eval_dataset`, every split an eval set by name), an
`IterableDataset` (read up to a row limit), a pandas DataFrame, a list of dicts or a dict of
columns; a path
(str/Path) is used as it is. Each is written once as `RUN/data/<split>.jsonl` with its rows as
they were (the same columns, so the layout is told from them as from any file: TRL, EasyR1,
ms-swift or mmrlvr's own; `data.columns` still applies) and every image, clip and video saved
under `RUN/data/media/` (named by content) with its path relative to the file: PIL images,
bytes, `{"bytes", "path"}` dicts, arrays, `{"array", "sampling_rate"}` clips and files named by
path (relative to the current dir, as the script meant them) all become files there. The run's
config then names that file, so `--resume`, `mmrlvr eval` and the demo read the same rows.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mmrlvr.data import DataError
from mmrlvr.data.formats import detect_layout

MEDIA_DIR = "media"
KINDS = ("image", "audio", "video")


def is_path(dataset: Any) -> bool:
    return isinstance(dataset, (str, os.PathLike))


def splits(dataset: Any, what: str) -> dict[str, Any] | None:
    """A DatasetDict's splits ({name: dataset}), or None for a single dataset."""
    if isinstance(dataset, dict) and dataset and all(
            hasattr(v, "column_names") or hasattr(v, "__iter__") for v in dataset.values()) \
            and type(dataset) is not dict:
        return dict(dataset)
    return None


def train_split(dataset: Any, what: str) -> Any:
    """A DatasetDict given as the training set: its `train` split (or its only one)."""
    parts = splits(dataset, what)
    if parts is None:
        return dataset
    if "train" in parts:
        return parts["train"]
    if len(parts) == 1:
        return next(iter(parts.values()))
    raise DataError(f"{what} is a DatasetDict with the splits {sorted(parts)} and no 'train': "
                    f"pass one split, e.g. {what}=ds[{sorted(parts)[0]!r}]")


def rows_of(dataset: Any, what: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The dataset's rows as dicts (a dict of columns too); an IterableDataset (no length) is
    read up to `limit`."""
    if hasattr(dataset, "to_dict") and hasattr(dataset, "columns") and hasattr(dataset, "iloc"):
        rows = dataset.to_dict("records")                     # a pandas DataFrame
    elif isinstance(dataset, dict):                           # columns: {name: [values]}
        sizes = {len(v) if isinstance(v, (list, tuple)) else -1 for v in dataset.values()}
        if len(sizes) != 1 or -1 in sizes:
            raise DataError(f"{what} is a dict: give columns of equal length ({{'prompt': [...], "
                            "'solution': [...]}}), a list of row dicts or a datasets.Dataset")
        rows = [dict(zip(dataset, values)) for values in zip(*dataset.values())]
    elif isinstance(dataset, (list, tuple)) or hasattr(dataset, "__len__"):
        rows = list(dataset)                                  # all of a sized dataset
    elif isinstance(dataset, Iterable):
        if limit is None:
            raise DataError(f"{what} is an iterable dataset with no length: say how many rows to "
                            "read (max_rows=N)")
        rows = list(_take(dataset, limit))
    else:
        raise DataError(f"{what} is {type(dataset).__name__}: give a datasets.Dataset, "
                        "DatasetDict, IterableDataset, pandas DataFrame, a list of row dicts or "
                        "a data file path")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DataError(f"{what}, row {bad}: expected a dict of columns, got "
                        f"{type(rows[bad]).__name__}")
    if not rows:
        raise DataError(f"{what} is empty: no rows to train or evaluate on")
    return rows


def _take(items: Iterable, limit: int):
    for i, item in enumerate(items):
        if i >= limit:
            return
        yield item


def write_rows(rows: list[dict[str, Any]], path: Path, what: str,
               columns: dict[str, str] | None = None, base_dir: Path | None = None) -> str:
    """Write `rows` to the JSONL `path` with their media saved beside it (module docstring);
    relative media paths in the rows resolve against `base_dir` (default: the current dir)."""
    names = list(dict.fromkeys(k for r in rows[:1000] for k in r))
    layout = detect_layout(names, what, dict(columns or {}))
    media = {kind: layout.columns.get(kind + "s", ()) for kind in KINDS}
    prompts = layout.columns.get("prompt", ()) + layout.columns.get("messages", ())
    store = _Store(path.parent, Path(base_dir or Path.cwd()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for i, row in enumerate(rows):
            where = f"{what}, row {i}"
            out = {}
            for key, value in row.items():
                kind = next((k for k, cols in media.items() if key in cols), None)
                if kind is not None:
                    out[key] = store.items(value, kind, f"{where}, column '{key}'")
                elif key in prompts and isinstance(value, (list, tuple)):
                    out[key] = [store.message(m, f"{where}, column '{key}'") for m in value]
                else:
                    out[key] = plain(value, f"{where}, column '{key}'")
            fh.write(json.dumps(out, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return str(path)


def plain(value: Any, where: str) -> Any:
    """`value` as JSON: numpy and pandas scalars as numbers, arrays as lists, NaN as null."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {str(k): plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, where) for v in value]
    if hasattr(value, "tolist"):                        # numpy arrays and scalars
        return plain(value.tolist(), where)
    if hasattr(value, "isoformat"):                     # dates and times
        return value.isoformat()
    raise DataError(f"{where}: a {type(value).__name__} cannot be stored in a data file; media "
                    "belong in an images/audios/videos (or image/audio/video) column, other "
                    "columns hold text, numbers and lists of them")


class _Store:
    """Media written under `root/media/`, named by content, as paths relative to `root`."""

    def __init__(self, root: Path, base_dir: Path):
        self.root, self.base_dir = root, base_dir

    def items(self, value: Any, kind: str, where: str) -> Any:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return [self.item(v, kind, f"{where}, item {k}") for k, v in enumerate(value)]
        return self.item(value, kind, where)

    def message(self, message: Any, where: str) -> Any:
        """A chat message whose content parts may carry media (`{"type": "image", "image": X}`)."""
        if not isinstance(message, dict) or not isinstance(message.get("content"), (list, tuple)):
            return plain(message, where)
        parts = []
        for part in message["content"]:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in KINDS and part.get(kind) is not None:
                part = {**part, kind: self.item(part[kind], kind, f"{where}, {kind} part")}
            parts.append(plain(part, where))
        return {**{k: plain(v, where) for k, v in message.items() if k != "content"},
                "content": parts}

    def item(self, item: Any, kind: str, where: str) -> Any:
        import numpy as np
        from PIL import Image

        if isinstance(item, dict):
            if kind == "audio" and item.get("array") is not None:
                return self._wave(item["array"], item.get("sampling_rate"), where)
            data, name = item.get("bytes"), item.get("path")
            if data is not None:
                return self._bytes(bytes(data), kind, Path(str(name or "")).suffix)
            item = name
        if isinstance(item, (str, os.PathLike)):
            return self._file(Path(item), where)
        if isinstance(item, (bytes, bytearray, memoryview)):
            return self._bytes(bytes(item), kind)
        if isinstance(item, Image.Image):
            buf = io.BytesIO()
            item.save(buf, format="PNG")
            return self._write(buf.getvalue(), ".png")
        if kind == "audio" and isinstance(item, tuple) and len(item) == 2:
            return self._wave(item[0], item[1], where)
        if isinstance(item, np.ndarray):
            if kind == "image":
                return self.item(Image.fromarray(item), kind, where)
            if kind == "video" and item.ndim == 4:
                return [self.item(Image.fromarray(f), "image", where) for f in item]
            raise DataError(f"{where}: a bare audio array has no sample rate; give "
                            "{'array': ..., 'sampling_rate': 16000} or (array, rate)")
        if kind == "video" and isinstance(item, (list, tuple)):
            return [self.item(f, "image", f"{where}, frame {j}") for j, f in enumerate(item)]
        raise DataError(f"{where}: a {type(item).__name__} is no {kind} (give a path, bytes, "
                        + ("a PIL image or an array)" if kind == "image" else
                           "an {array, sampling_rate} dict or (array, rate))" if kind == "audio"
                           else "a list of frames or the video file's bytes)"))

    def _wave(self, array: Any, rate: Any, where: str) -> str:
        import numpy as np
        import soundfile as sf

        if not isinstance(rate, (int, float)) or rate <= 0:
            raise DataError(f"{where}: an audio array needs its sampling_rate (got {rate!r})")
        buf = io.BytesIO()
        sf.write(buf, np.asarray(array, dtype=np.float32), int(rate), format="WAV")
        return self._write(buf.getvalue(), ".wav")

    def _bytes(self, data: bytes, kind: str, suffix: str = "") -> str:
        if not suffix:
            suffix = _suffix(data, kind)
        return self._write(data, suffix)

    def _write(self, data: bytes, suffix: str) -> str:
        rel = Path(MEDIA_DIR) / f"{hashlib.sha1(data).hexdigest()[:16]}{suffix}"
        dest = self.root / rel
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        return str(rel)

    def _file(self, src: Path, where: str) -> Any:
        src = src if src.is_absolute() else self.base_dir / src
        if src.is_dir():                                     # a video as a folder of frames
            frames = sorted(p for p in src.iterdir() if p.is_file())
            return [self._file(f, where) for f in frames]
        if not src.is_file():
            raise DataError(f"{where}: file not found: {src} (relative paths are read from the "
                            f"current dir, {self.base_dir})")
        data = src.read_bytes()
        rel = Path(MEDIA_DIR) / f"{hashlib.sha1(data).hexdigest()[:16]}{src.suffix}"
        dest = self.root / rel
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dest)                  # same file system: no second copy on disk
            except OSError:
                shutil.copyfile(src, dest)
        return str(rel)


def _suffix(data: bytes, kind: str) -> str:
    """A file suffix for encoded media bytes, from their header."""
    if kind == "video":
        from mmrlvr.data.video import container_suffix

        return container_suffix(data)
    if kind == "audio":
        heads = {b"RIFF": ".wav", b"fLaC": ".flac", b"OggS": ".ogg", b"ID3": ".mp3"}
        return next((s for h, s in heads.items() if data.startswith(h)), ".wav")
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            return f".{(im.format or 'png').lower()}"
    except Exception:   # noqa: BLE001 -- undecodable: the loader names the row when it reads it
        return ".png"


def write_dataset(dataset: Any, path: Path, what: str, columns: dict[str, str] | None = None,
                  limit: int | None = None) -> str:
    """A dataset object as the JSONL file `path` (a path is returned as it is)."""
    if is_path(dataset):
        return str(dataset)
    return write_rows(rows_of(train_split(dataset, what), what, limit), path, what, columns)


def write_eval(dataset: Any, data_dir: Path, columns: dict[str, str] | None = None,
               limit: int | None = None) -> str | dict[str, str]:
    """An eval dataset as `data.eval`: one file, or a DatasetDict as {split: file}."""
    if is_path(dataset):
        return str(dataset)
    parts = splits(dataset, "eval_dataset")
    if parts is None:
        return write_rows(rows_of(dataset, "eval_dataset", limit), data_dir / "eval.jsonl",
                          "eval_dataset", columns)
    return {name: write_rows(rows_of(part, f"eval_dataset[{name!r}]", limit),
                             data_dir / f"eval-{name}.jsonl", f"eval_dataset[{name!r}]", columns)
            for name, part in parts.items()}
