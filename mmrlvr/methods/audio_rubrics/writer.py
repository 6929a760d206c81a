"""The rubric writer: query-specific rubrics written by a language model, once per sample.

The AudioRubrics paper writes each sample's rubrics with a model, from the question and the
audio; the templated rubrics of `mmrlvr.methods.audio_rubrics.evidence.static_rubrics` only fill the same five
slots for every clip. `LLMWriter.write(sample)` asks a local HF model or an OpenAI-compatible
endpoint (the judges' `{kind: http | hf, ...}` specs, `mmrlvr.methods.audio_rubrics.llm`) with a prompt holding:

    the acoustic evidence measured with librosa (durations, levels, pitches, onsets, tempo)
    the question and its options
    the gold answer (`show_gold`, default on)

The gold is shown, as the paper shows it to the judge: rubrics are written for training samples
whose answer is known and are never shown to the policy, so nothing leaks; with the gold the
writer knows which measured facts decide the question and writes rubrics that agree with the
answer key. The prompt forbids rubrics on the letter itself (the accuracy term rewards that).
`show_gold: false` writes rubrics from the evidence alone (e.g. for a held-out set).

The reply is parsed strictly (`parse_rubrics`): one JSON object `{"rubrics": [...]}` with 1 to
`max_rubrics` items, each exactly `criterion` (non-empty text), `category` (perception,
reasoning, grounding or style), `weight` (a finite number > 0) and `polarity` (positive,
negative, 1 or -1), and optionally `check` (a machine check, `mmrlvr.methods.audio_rubrics.checks`; when absent
one is read off the criterion where it names one count or one comparison). A check that
contradicts the measured evidence for its polarity is dropped (the rubric stays, for LLM
judges). Weights are normalised to sum 1. Any other shape is a `JudgeError`, retried `retries`
times, then the caller falls back to the templated rubrics.

`RubricBook` caches each sample's outcome (written rubrics, or the fallback and why) for the run,
and the written ones in `cache_path` (JSONL) across runs; `write_rubrics(examples, writer)`
stores written rubrics with a dataset (`meta.rubrics`, `meta.rubric_source`) so training needs
no writer calls.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrlvr.methods.audio_rubrics.evidence import evidence_for, static_rubrics
from mmrlvr.methods.audio_rubrics.checks import JudgeError, check_is_true, infer_check, valid_check
from mmrlvr.methods.audio_rubrics.judges import describe_evidence
from mmrlvr.methods.audio_rubrics.llm import Complete, ask_json, make_completion

CATEGORIES = ("perception", "reasoning", "grounding", "style")
FIELDS = {"criterion", "category", "weight", "polarity"}
"""The fields every written rubric must have (`check` is the one optional field)."""

SYSTEM = ("You write grading rubrics for the reasoning of an audio question-answering model. You "
          "cannot hear the audio; the acoustic evidence below was measured from the waveform "
          "and is reliable. Reply with one JSON object and nothing else.")


@dataclass
class Sample:
    """What the writer sees of one sample."""

    id: str
    question: str
    choices: list[str] | None
    gold: str
    evidence: list[dict[str, Any]]


def writer_prompt(sample: Sample, max_rubrics: int, show_gold: bool = True) -> str:
    options = "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(sample.choices or []))
    gold = ""
    if show_gold:
        letter = sample.gold.strip().upper()
        text = (sample.choices[ord(letter) - 65] if sample.choices and len(letter) == 1
                and 0 <= ord(letter) - 65 < len(sample.choices) else "")
        gold = f"Gold answer: {sample.gold}" + (f" ({text})" if text else "") + "\n"
    return (
        f"Acoustic evidence:\n{describe_evidence(sample.evidence)}\n\nQuestion: {sample.question}\n"
        + (f"Options:\n{options}\n" if options else "") + gold + "\n"
        f"Task: write 1 to {max_rubrics} rubrics specific to this question and this clip for "
        "grading a model's reasoning: what a correct reasoning must perceive and state about the "
        "sound (positive), or mistakes a wrong one would make (negative). Ground each in the "
        "evidence above (counts, which part is higher, louder, faster or longer, pitches, times). "
        "Never write a rubric about the answer letter or option itself. Give each a weight > 0 "
        "for how much it matters (they are normalised to sum 1).\n"
        'Reply as: {"rubrics": [{"criterion": "...", "category": "perception|reasoning|'
        'grounding|style", "weight": 0.5, "polarity": "positive|negative", "check": null}]}\n'
        '"check" may be {"kind": "count", "value": N} for "states that there are N sounds", or '
        '{"kind": "order", "attribute": "pitch|loudness|tempo|duration", "winner": "first|second"} '
        'for "says the first/second part is higher/louder/faster/longer"; else null.')


def _polarity(value: Any, where: str) -> int:
    if isinstance(value, str) and value.strip().lower() in ("positive", "negative"):
        return 1 if value.strip().lower() == "positive" else -1
    if not isinstance(value, bool) and value in (1, -1):
        return int(value)
    raise JudgeError(f"{where}: polarity must be positive, negative, 1 or -1, got {value!r}")


def parse_rubrics(reply: dict[str, Any], max_rubrics: int,
                  evidence: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The written rubrics as rubric dicts (ids w1.., origin `written`, weights summing to 1);
    JudgeError naming the item and field for anything but the shape in the module doc."""
    rows = reply.get("rubrics")
    if not isinstance(rows, list) or not 1 <= len(rows) <= max_rubrics:
        raise JudgeError(f"expected 'rubrics': a list of 1 to {max_rubrics} items, got "
                         f"{json.dumps(rows)[:200] if rows is not None else 'none'}")
    ev = (evidence or [{}])[0] or {}
    out = []
    for k, row in enumerate(rows):
        where = f"rubric {k + 1}"
        if not isinstance(row, dict):
            raise JudgeError(f"{where}: expected an object, got {row!r}")
        missing, extra = FIELDS - set(row), set(row) - FIELDS - {"check"}
        if missing or extra:
            raise JudgeError(f"{where}: missing {sorted(missing)}, unexpected {sorted(extra)}")
        criterion, category, weight = row["criterion"], row["category"], row["weight"]
        if not isinstance(criterion, str) or not criterion.strip() or len(criterion) > 400:
            raise JudgeError(f"{where}: criterion must be non-empty text (at most 400 characters)")
        if not isinstance(category, str) or category.strip().lower() not in CATEGORIES:
            raise JudgeError(f"{where}: category must be one of {CATEGORIES}, got {category!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not math.isfinite(weight) or weight <= 0:
            raise JudgeError(f"{where}: weight must be a finite number > 0, got {weight!r}")
        polarity = _polarity(row["polarity"], where)
        check = row.get("check")
        check = valid_check(check) if check is not None else infer_check(criterion)
        truth = check_is_true(check, ev) if check is not None else None
        if truth is not None and truth != (polarity > 0):
            check = None                   # it would reward a claim the measured audio refutes
        out.append({"id": f"w{k + 1}", "category": category.strip().lower(),
                    "criterion": criterion.strip(), "weight": float(weight),
                    "polarity": polarity, "check": check, "origin": "written"})
    total = sum(r["weight"] for r in out)
    for r in out:
        r["weight"] /= total
    return out


class LLMWriter:
    """A rubric writer backed by `complete(messages) -> reply text`."""

    def __init__(self, complete: Complete, name: str = "llm", retries: int = 2,
                 backoff_s: float = 0.5, max_rubrics: int = 5, show_gold: bool = True):
        self.complete, self.name, self.retries, self.backoff_s = complete, name, retries, backoff_s
        self.max_rubrics, self.show_gold = int(max_rubrics), bool(show_gold)

    def write(self, sample: Sample) -> list[dict[str, Any]]:
        """The sample's rubrics; JudgeError when every try failed."""
        return ask_json(self.complete, SYSTEM, writer_prompt(sample, self.max_rubrics, self.show_gold),
                        lambda reply: parse_rubrics(reply, self.max_rubrics, sample.evidence),
                        retries=self.retries, backoff_s=self.backoff_s, who=f"rubric writer {self.name}")


def make_writer(spec: dict[str, Any]) -> LLMWriter:
    """`{kind: http, url, model?, timeout_s?, max_tokens?, retries?, max_rubrics?, show_gold?}`
    or `{kind: hf, model, timeout_s?, max_new_tokens?, device?, ...}` (no `cache_path`)."""
    if not isinstance(spec, dict):
        raise TypeError(f"audio_rubrics writer must be a mapping with kind http|hf, got {spec!r}")
    spec = dict(spec)
    own = {k: spec.pop(k) for k in ("max_rubrics", "show_gold", "backoff_s") if k in spec}
    complete, retries = make_completion(spec, "audio_rubrics writer")
    name = f"{spec['kind']}:{spec.get('model') or spec.get('url')}"
    return LLMWriter(complete, name=name, retries=retries, **own)


class RubricBook:
    """Each sample's rubrics from the writer, asked at most once per sample and run.

    `rubrics(key, sample, template)` returns `{"rubrics", "source", "error"}`: source `written`
    (this run or `cache_path`) or `writer_fallback` (`template()`, with the writer's error). Only
    written rubrics go to `cache_path`, so a later run asks again where this one fell back.
    `counts` holds how many samples were written, read from the cache file, or fell back.
    """

    def __init__(self, writer: LLMWriter, cache_path: str | Path | None = None):
        self.writer = writer
        self.path = Path(cache_path) if cache_path else None
        self.counts = {"written": 0, "cached": 0, "fallback": 0}
        self._book: dict[str, dict[str, Any]] = {}
        self._on_file: dict[str, list[dict[str, Any]]] = {}
        if self.path is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    self._on_file[row["key"]] = row["rubrics"]

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> RubricBook:
        spec = dict(spec)
        cache_path = spec.pop("cache_path", None)
        return cls(make_writer(spec), cache_path)

    def rubrics(self, key: str, sample: Sample,
                template: Callable[[], list[dict[str, Any]]]) -> dict[str, Any]:
        if key in self._book:
            return self._book[key]
        if key in self._on_file:
            entry = {"rubrics": self._on_file[key], "source": "written", "error": None}
            self.counts["cached"] += 1
        else:
            try:
                entry = {"rubrics": self.writer.write(sample), "source": "written", "error": None}
                self.counts["written"] += 1
                if self.path is not None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    with self.path.open("a", encoding="utf-8") as fh:
                        fh.write(json.dumps({"key": key, "writer": self.writer.name,
                                             "rubrics": entry["rubrics"]}) + "\n")
            except JudgeError as err:
                entry = {"rubrics": template(), "source": "writer_fallback", "error": str(err)}
                self.counts["fallback"] += 1
        self._book[key] = entry
        return entry


def sample_of(example: Any, evidence: list[dict[str, Any]]) -> Sample:
    return Sample(example.id, example.prompt, example.choices, example.answer, evidence)


def write_rubrics(examples: list[Any], writer: LLMWriter | RubricBook) -> dict[str, Any]:
    """Write every example's rubrics into its `meta` (in place), for storing with the dataset.

    `meta.rubrics` becomes the written rubrics and `meta.rubric_source` `written`; where the
    writer fails, the rubrics already stored (else the templated ones) stay, with
    `rubric_source` `template_fallback` and `rubric_error`. Evidence comes from `meta.evidence`,
    else is measured from the audio files (and stored). Returns the counts and the first errors.
    """
    book = writer if isinstance(writer, RubricBook) else RubricBook(writer)
    errors = []
    for ex in examples:
        evidence = ex.meta.get("evidence") or [evidence_for(a) for a in ex.audios]
        ex.meta["evidence"] = evidence if isinstance(evidence, list) else [evidence]
        stored = ex.meta.get("rubrics")
        entry = book.rubrics(f"{ex.id}|{ex.prompt}", sample_of(ex, ex.meta["evidence"]),
                             lambda: stored if stored is not None
                             else static_rubrics(ex.meta["evidence"], ex.prompt))
        ex.meta["rubrics"] = entry["rubrics"]
        if entry["source"] == "written":
            ex.meta["rubric_source"] = "written"
            ex.meta.pop("rubric_error", None)
        else:
            ex.meta.update(rubric_source="template_fallback", rubric_error=entry["error"])
            errors.append(f"{ex.id}: {entry['error']}")
    return {**book.counts, "errors": errors[:5]}


__all__ = ["CATEGORIES", "LLMWriter", "RubricBook", "Sample", "make_writer", "parse_rubrics",
           "sample_of", "write_rubrics", "writer_prompt"]
