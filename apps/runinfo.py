"""What the demo reads from a run dir: its config, summary, starting model, checkpoints, examples.

A run dir is what `mmrlvr train` or `mmrlvr sft` wrote (`config.yaml`, `metrics.jsonl`,
`summary.json`, `checkpoints/step-N/`, `final/`). The starting model of a GRPO run is its
`model.path`; of an SFT run, `sft.init` (else `model.path`). Paths in a config are as the run was
started (usually relative to the repo root), so each is tried as given, then from the dir that
holds `runs/`. Examples are the first rows of the run's eval data (else its training data),
spread over the task's question families, read through the data layer as training read them: any
layout a run trains from (mmrlvr, TRL, EasyR1, ms-swift JSONL or parquet/Arrow/`save_to_disk`,
`PATH@SPLIT`, a `layout:` prefix, `data.columns`).
"""
from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmrlvr.data import DataError, Example
from mmrlvr.data.formats import LAYOUTS
from mmrlvr.data.loading import head_examples

MAX_EXAMPLES = 8
SCAN_ROWS = 2000
"""Rows read from the data file to pick examples from (a big file is never read whole)."""
MEDICAL_TASKS = {"medvqa", "vqa_rad", "vqarad", "slake", "pathvqa"}
MEDICAL_WORDS = ("scan", "x-ray", "xray", "ct ", "mri", "lesion", "lung", "brain", "organ",
                 "fracture", "nodule", "patient", "radiograph", "tumor", "tumour", "chest",
                 "abnormal", "pathology", "liver", "kidney", "heart")


@dataclass
class RunInfo:
    """One run dir, read once when the demo starts (empty when there is none)."""

    run_dir: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    kind: str = ""
    """`grpo`, `sft`, or empty when there is no run dir."""
    start_model: str = ""
    """The model the run started from, resolved to an existing dir where one is found."""
    data_file: Path | None = None
    """The file or dir the examples come from (the path of `data_spec`)."""
    data_spec: str = ""
    """The dataset spec as the run's config gives it, its path resolved (`layout:`, `@split` kept)."""
    examples_note: str = ""
    """Why a run has no examples (its data is not on this machine, or has no rows to show)."""
    task: str = ""
    """The data set's task name (`info.json` beside the data file), e.g. `shapes`."""
    examples: list[Example] = field(default_factory=list)
    examples_for: str = ""
    """The modality the examples were picked for (their media fit its adapter)."""

    def checkpoints(self) -> list[tuple[str, str]]:
        """(label, model dir) for `final` and every complete `checkpoints/step-N`, newest first."""
        if self.run_dir is None:
            return []
        from mmrlvr.train.checkpoint import complete_checkpoints

        found = [(f"{d.name}", str(d)) for d in reversed(complete_checkpoints(self.run_dir))]
        final = self.run_dir / "final"
        return ([("final", str(final))] if (final / "config.json").is_file() else []) + found

    @property
    def domain(self) -> str:
        """`medical` for medical VQA data, else `general` (prompt templates must fit it)."""
        return "medical" if self.task.lower() in MEDICAL_TASKS else "general"


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def load_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def resolve(path: str | None, run_dir: Path | None) -> Path | None:
    """A config path as given, else from the dir above `runs/` (the repo the run started in)."""
    if not path:
        return None
    raw = Path(path).expanduser()
    tries = [raw]
    if run_dir is not None and not raw.is_absolute():
        tries += [parent / raw for parent in list(run_dir.resolve().parents)[:3]]
    return next((p for p in tries if p.exists()), None)


def resolve_spec(spec: Any, run_dir: Path | None) -> tuple[str, Path] | None:
    """(spec, its path) for a data spec `[layout:]PATH[@SPLIT]` whose path `resolve` finds (a
    `{name: path}` eval gives its first set), else None."""
    if isinstance(spec, dict):
        spec = next(iter(spec.values()), None)
    if not spec or not isinstance(spec, str):
        return None
    name, colon, text = spec.partition(":")
    prefix = f"{name}:" if colon and name in LAYOUTS else ""
    text = text if prefix else spec
    found = resolve(text, run_dir)
    if found is not None:
        return prefix + str(found), found
    path, at, split = text.rpartition("@")
    found = resolve(path, run_dir) if at and path else None
    return (f"{prefix}{found}@{split}", found) if found is not None else None


def run_kind(run_dir: Path, cfg: dict[str, Any]) -> str:
    """`sft` when the dir is the config's `sft.out_dir` or logs `sft/loss`, else `grpo`."""
    sft_out = (cfg.get("sft") or {}).get("out_dir")
    train_out = (cfg.get("train") or {}).get("out_dir")
    if sft_out and Path(sft_out).name == run_dir.name and Path(str(train_out)).name != run_dir.name:
        return "sft"
    try:
        with (run_dir / "metrics.jsonl").open() as fh:
            head = "".join(itertools.islice(fh, 3))
    except OSError:
        head = ""
    return "sft" if '"sft/loss"' in head else "grpo"


def read_run(run_dir: str | Path | None, model_path: str | Path | None = None,
             modality: str = "vision") -> RunInfo:
    """The run dir's RunInfo; without one, the run above `model_path` (a run's `final/` or
    checkpoint) if there is one, so a model's own training data gives the examples."""
    path = Path(run_dir).expanduser() if run_dir else None
    if path is None and model_path and Path(model_path).exists():
        path = next((p for p in list(Path(model_path).resolve().parents)[:3]
                     if (p / "config.yaml").is_file()), None)
    if path is None or not path.is_dir():
        return RunInfo()
    cfg = load_yaml(path / "config.yaml")
    info = RunInfo(run_dir=path, config=cfg, summary=load_json(path / "summary.json"))
    if not cfg:
        return info
    info.kind = run_kind(path, cfg)
    model, sft = cfg.get("model") or {}, cfg.get("sft") or {}
    start = (sft.get("init") or model.get("path")) if info.kind == "sft" else model.get("path")
    found = resolve(start, path)
    info.start_model = str(found) if found else str(start or "")
    data = cfg.get("data") or {}
    found = next((f for f in (resolve_spec(data.get(k), path) for k in ("eval", "train")) if f),
                 None)
    if found is None:
        given = [str(data.get(k)) for k in ("eval", "train") if data.get(k)]
        info.examples_note = (f"the run's data ({', '.join(f'`{g}`' for g in given)}) is not on "
                              "this machine" if given else "the run's config names no data")
        return info
    info.data_spec, info.data_file = found
    home = info.data_file if info.data_file.is_dir() else info.data_file.parent
    info.task = str(load_json(home / "info.json").get("task", ""))
    columns = data.get("columns") if isinstance(data.get("columns"), dict) else None
    try:
        info.examples = load_examples(info.data_spec, modality, columns=columns,
                                      allow_outside=bool(data.get("allow_outside")))
    except (DataError, OSError) as err:
        info.examples_note = f"the run's data `{info.data_spec}` could not be read: {err}"
    else:
        if not info.examples:
            info.examples_note = (f"the first {SCAN_ROWS} rows of `{info.data_spec}` have no "
                                  f"{'audio' if modality == 'audio' else 'image'} to show")
    info.examples_for = modality
    return info


def load_examples(data: str | Path, modality: str, limit: int = MAX_EXAMPLES, *,
                  columns: dict[str, str] | None = None,
                  allow_outside: bool = False) -> list[Example]:
    """Up to `limit` of the first `SCAN_ROWS` rows of the dataset spec `data` whose media fit
    `modality`, one question family after another. Raises DataError for data that cannot be
    read (an unknown layout, columns it lacks)."""
    media = "audios" if modality == "audio" else "images"
    by_family: dict[str, list[Example]] = {}
    for ex in head_examples(data, SCAN_ROWS, columns=columns, allow_outside=allow_outside):
        if getattr(ex, media):
            by_family.setdefault(str(ex.meta.get("family", "")), []).append(ex)
    spread = [ex for group in itertools.zip_longest(*by_family.values()) for ex in group if ex]
    return [with_media_files(ex, str(data)) for ex in spread[:limit]]


def with_media_files(ex: Example, data: str) -> Example:
    """`ex` with in-memory media (a TRL or parquet dataset's PIL images, `(array, rate)` audio)
    written to files under the demo's cache, as the inputs and the server take files; a file
    is named by its content, so a restart writes nothing new."""
    import dataclasses
    import hashlib
    import io
    import tempfile

    import numpy as np

    cache = Path(tempfile.gettempdir()) / "mmrlvr-demo-media" / hashlib.sha1(
        data.encode()).hexdigest()[:12]

    def stored(item: Any, kind: str) -> Any:
        if isinstance(item, str):
            return item
        buf = io.BytesIO()
        if kind == "image" and hasattr(item, "save"):             # a PIL image
            item.convert("RGB").save(buf, format="PNG")
            suffix = ".png"
        elif kind == "audio" and isinstance(item, tuple) and len(item) == 2:
            import soundfile

            soundfile.write(buf, np.asarray(item[0], dtype=np.float32), int(item[1]), format="WAV")
            suffix = ".wav"
        else:
            return item                  # a medium the demo's inputs do not take as a file
        path = cache / f"{hashlib.sha1(buf.getvalue()).hexdigest()[:16]}{suffix}"
        if not path.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(buf.getvalue())
            tmp.replace(path)
        return str(path)

    return dataclasses.replace(ex, images=[stored(i, "image") for i in ex.images],
                               audios=[stored(a, "audio") for a in ex.audios])


def question_domain(info: RunInfo, question: str) -> str:
    """The run's domain, or for a typed question without a run, `medical` if it sounds so."""
    if info.task:
        return info.domain
    q = f" {question.lower()} "
    return "medical" if any(w in q for w in MEDICAL_WORDS) else "general"


def task_line(info: RunInfo) -> str:
    """One line on the task: its registered description and the data it came from."""
    if info.data_file is None:
        return ""
    described = ""
    if info.task:
        from mmrlvr.tasks import TASKS

        try:
            described = f"**{info.task}** — {TASKS.get(info.task).description}"
        except KeyError:
            described = f"**{info.task}**"
    families = sorted({str(ex.meta.get("family")) for ex in info.examples
                       if ex.meta.get("family")})
    fam = f"; question families: {', '.join(families)}" if families else ""
    return f"Task: {described or f'`{info.data_file.name}`'}{fam} (examples from " \
           f"`{info.data_file}`)."


def run_line(info: RunInfo) -> str:
    """One line on how the model was trained and how far the run's held-out figures moved."""
    if info.run_dir is None:
        return ""
    cfg, s = info.config, info.summary
    if info.kind == "sft":
        steps = s.get("steps") or (cfg.get("sft") or {}).get("steps")
        how = f"SFT warm start ({steps} steps)"
    else:
        rewards = ", ".join(f"{r.get('name')} {r.get('weight', 1)}" for r in
                            cfg.get("rewards") or [] if isinstance(r, dict))
        steps = s.get("steps") or (cfg.get("train") or {}).get("steps")
        how = f"GRPO ({steps} steps" + (f"; rewards: {rewards}" if rewards else "") + ")"
    start = f" from `{info.start_model}`" if info.start_model else ""
    figures = ""
    if "accuracy_start" in s and "accuracy_end" in s:
        figures = (f" Held-out accuracy {s['accuracy_start']:.3f} → **{s['accuracy_end']:.3f}**"
                   f" ({100 * (s['accuracy_end'] - s['accuracy_start']):+.1f} points).")
    elif not s:
        figures = " No `summary.json` yet (still training, or stopped early)."
    return f"Run `{info.run_dir}`: {how}{start}.{figures}"
