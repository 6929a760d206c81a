"""Loaders for public medical VQA layouts (VQA-RAD, SLAKE, PathVQA) and generic JSONL.

Each maps its rows onto `mmrlvr.data.Example` with `meta.answer_type` set to `closed` or `open`
(the dataset's own label where it has one, else closed for yes/no golds), so every metric can
keep the two apart; `meta.family` repeats it, so `mmrlvr eval` and in-run eval (which report
accuracy per family) split closed from open too. Specs are `layout:path` (or a plain JSONL path):

    vqarad:DIR    the original release: `VQA_RAD Dataset Public.json` + `VQA_RAD Image Folder/`
                  (test rows are those whose `phrase_type` starts with "test"); or HF parquet
                  files (columns image, question, answer) in DIR or given directly
    slake:DIR     SLAKE: `train.json`, `validate.json`, `test.json` and `imgs/`; English
                  questions only unless `lang` says otherwise
    pathvqa:DIR   HF parquet files (image, question, answer); or the original pickles
                  (`*_qa.pkl`, lists of {image, question, answer}) with `images/<split>/<image>.jpg`

`convert(spec, out_dir)` writes one JSONL per split, which a training config then reads
(`mmrlvr data medvqa --from vqarad:DIR --out data/vqarad`).
"""
from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

from mmrlvr.data import DataError, Example, load_dataset, write_jsonl
from rewards.verify import detect_kind


def answer_type_of(answer: str, given: Any = None, choices: list[str] | None = None) -> str:
    """`closed`/`open` from a dataset label (CLOSED/OPEN, any case), else from the gold."""
    label = str(given or "").strip().lower()
    if label in ("closed", "open"):
        return label
    return "closed" if choices or detect_kind(answer) == "yesno" else "open"


def with_answer_types(examples: list[Example]) -> list[Example]:
    """Fill `meta.answer_type` where a row lacks it (generic JSONL)."""
    for ex in examples:
        ex.meta["answer_type"] = answer_type_of(ex.answer, ex.meta.get("answer_type"), ex.choices)
    return examples


def _example(source: str, key: Any, question: Any, answer: Any, image: Path, where: str,
             **meta: Any) -> Example:
    q, a = str(question or "").strip(), str(answer if answer is not None else "").strip()
    if not q or not a:
        raise DataError(f"{where}: empty question or answer")
    if not image.is_file():
        raise DataError(f"{where}: image not found: {image}")
    meta["answer_type"] = answer_type_of(a, meta.get("answer_type"))
    meta["family"] = meta["answer_type"]      # `mmrlvr eval` reports accuracy per family
    return Example(id=f"{source}-{key}", prompt=q, answer=a, images=[str(image)],
                   meta={"source": source, **{k: v for k, v in meta.items() if v is not None}})


def _split_of(name: str) -> str:
    n = name.lower()
    for split in ("train", "validation", "validate", "val", "test"):
        if split in n:
            return split
    return "all"


def _parquet(path: Path, source: str, split: str | None) -> list[Example]:
    """HF-style parquet (image {bytes, path}, question, answer); images cached beside the file."""
    import pyarrow.parquet as pq

    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    out = []
    for file in files:
        if split and _split_of(file.name) != split:
            continue
        media = file.parent / f".{file.stem}_media"
        for i, row in enumerate(pq.read_table(file).to_pylist()):
            img = row.get("image")
            data = img.get("bytes") if isinstance(img, dict) else img
            where = f"{file}, row {i + 1}"
            if not isinstance(data, (bytes, bytearray)):
                raise DataError(f"{where}: column 'image' holds no image bytes")
            image = media / f"{hashlib.sha1(data).hexdigest()[:16]}.png"
            if not image.exists():
                media.mkdir(parents=True, exist_ok=True)
                image.write_bytes(bytes(data))
            out.append(_example(source, f"{_split_of(file.name)}-{i}", row.get("question"),
                                row.get("answer"), image, where, split=_split_of(file.name)))
    return out


def load_vqarad(path: str | Path, split: str | None = None) -> list[Example]:
    path = Path(path)
    if path.suffix == ".parquet" or (path.is_dir() and any(path.rglob("*.parquet"))):
        return _parquet(path, "vqarad", split)
    file = path if path.is_file() else next(iter(sorted(path.glob("*.json"))), None)
    if file is None:
        raise DataError(f"vqarad: no 'VQA_RAD Dataset Public.json' (or parquet files) in {path}")
    folder = next((d for d in file.parent.iterdir() if d.is_dir() and "image" in d.name.lower()),
                  file.parent)
    out = []
    for i, row in enumerate(json.loads(file.read_text(encoding="utf-8"))):
        row_split = "test" if str(row.get("phrase_type", "")).startswith("test") else "train"
        if split and row_split != split:
            continue
        out.append(_example("vqarad", row.get("qid", i), row.get("question"), row.get("answer"),
                            folder / str(row.get("image_name")), f"{file}, row {i + 1}",
                            answer_type=row.get("answer_type"), question_type=row.get("question_type"),
                            organ=row.get("image_organ"), phrase_type=row.get("phrase_type"),
                            split=row_split))
    return out


def load_slake(path: str | Path, split: str | None = None, lang: str = "en") -> list[Example]:
    path = Path(path)
    files = [path] if path.is_file() else [path / f"{s}.json" for s in ("train", "validate", "test")
                                          if (path / f"{s}.json").is_file()]
    if not files:
        raise DataError(f"slake: no train/validate/test .json files in {path}")
    out = []
    for file in files:
        if split and file.stem != split:
            continue
        for i, row in enumerate(json.loads(file.read_text(encoding="utf-8"))):
            if lang and row.get("q_lang", lang) != lang:
                continue
            out.append(_example("slake", row.get("qid", f"{file.stem}-{i}"), row.get("question"),
                                row.get("answer"), file.parent / "imgs" / str(row.get("img_name")),
                                f"{file}, row {i + 1}", answer_type=row.get("answer_type"),
                                question_type=row.get("content_type"), modality=row.get("modality"),
                                organ=row.get("location"), split=file.stem))
    return out


class _PlainUnpickler(pickle.Unpickler):
    """Lists, dicts and strings only: a pickle that names any class is refused."""

    def find_class(self, module, name):
        raise DataError(f"pathvqa: refusing to unpickle {module}.{name} (plain data only)")


def load_pathvqa(path: str | Path, split: str | None = None) -> list[Example]:
    path = Path(path)
    if path.suffix == ".parquet" or (path.is_dir() and any(path.rglob("*.parquet"))):
        return _parquet(path, "pathvqa", split)
    files = [path] if path.is_file() else sorted(path.rglob("*_qa.pkl"))
    if not files:
        raise DataError(f"pathvqa: no parquet files or *_qa.pkl pickles under {path}")
    out = []
    for file in files:
        name = _split_of(file.stem)
        if split and name != split:
            continue
        root = next((p for p in file.parents if (p / "images").is_dir()), file.parent)
        with file.open("rb") as fh:
            rows = _PlainUnpickler(fh).load()
        for i, row in enumerate(rows):
            image = root / "images" / name / f"{row.get('image')}.jpg"
            out.append(_example("pathvqa", f"{name}-{i}", row.get("question"), row.get("answer"),
                                image, f"{file}, row {i + 1}", split=name))
    return out


LOADERS = {"vqarad": load_vqarad, "slake": load_slake, "pathvqa": load_pathvqa}


def load_any(spec: str, split: str | None = None) -> list[Example]:
    """`layout:path` for a medical layout, else anything `mmrlvr.data.load_dataset` reads."""
    layout, _, rest = str(spec).partition(":")
    if rest and layout in LOADERS:
        examples = LOADERS[layout](rest, split=split)
        if not examples:
            raise DataError(f"{spec}: no rows{f' in split {split!r}' if split else ''}")
        return examples
    return with_answer_types(load_dataset(spec))


def convert(spec: str, out_dir: str | Path) -> dict[str, Any]:
    """Write `spec`'s rows as one JSONL per split under `out_dir`; returns counts per split."""
    examples = load_any(spec)
    by_split: dict[str, list[Example]] = {}
    for ex in examples:
        by_split.setdefault(str(ex.meta.get("split", "all")), []).append(ex)
    out_dir = Path(out_dir)
    counts = {}
    for name, rows in sorted(by_split.items()):
        write_jsonl(rows, out_dir / f"{name}.jsonl", copy_media_to="media")   # self-contained
        counts[name] = {"rows": len(rows), "closed": sum(r.meta["answer_type"] == "closed" for r in rows)}
    info = {"source": spec, "splits": counts}
    (out_dir / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
