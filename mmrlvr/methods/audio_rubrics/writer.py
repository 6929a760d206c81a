"""The rubric writer: query-specific rubrics written by a model, once per sample, and again
from a group's rollouts when its criteria stop separating them.

The AudioRubrics paper writes each sample's rubrics with a model, from the question and the
audio; the templated rubrics of `evidence.static_rubrics` only fill the same five slots for every
clip. `LLMWriter` asks a hearer (`hearing.py`: an audio-language model in process, `policy`, or an
endpoint that takes audio; or a text-only model, `roles.py` lists the specs) with a prompt
holding:

    the clip itself (a model that hears)
    the acoustic evidence measured with librosa (`show_evidence`, default on; all a text-only
    model has)
    the question and its options
    the gold answer (`show_gold`, default on)

The gold is shown, as the paper shows it to the judge: rubrics are written for training samples
whose answer is known and are never shown to the policy, so nothing leaks; with the gold the
writer knows which facts decide the question and writes rubrics that agree with the answer key.
The prompt forbids rubrics on the letter itself (the accuracy term rewards that).
`show_gold: false` writes rubrics without it (e.g. for a held-out set).

The reply is parsed strictly (`parse_rubrics`): one JSON object `{"rubrics": [...]}` with 1 to
`max_rubrics` items, each exactly `criterion` (non-empty text), `category` (perception,
reasoning, grounding or style), `weight` (a finite number > 0) and `polarity` (positive,
negative, 1 or -1), and optionally `check` (a machine check, `checks.py`; when absent one is read
off the criterion where it names one count or one comparison). A check that contradicts the
measured evidence for its polarity is dropped (the rubric stays, for model judges). Weights are
normalised to sum 1. Any other shape is a `JudgeError`, asked again `retries` times, then the
caller falls back to the templated rubrics (counted).

`regenerate_many` asks for replacements of a group's criteria that every rollout met or none did,
showing the rollouts' reasoning tagged correct or wrong (same reply shape).

`RubricBook` caches each sample's outcome for the run, and the written rubrics in `cache_path`
(JSONL, one row per sample and writer: `key` = sample id and question, `writer` = the writer's
identity), read back by a later run or a resumed one (rows of another writer are ignored);
`write_rubrics(examples, writer)` stores written rubrics with a dataset (`meta.rubrics`,
`meta.rubric_source`) so training needs no writer calls.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrlvr.methods.audio_rubrics.checks import JudgeError, check_is_true, infer_check, valid_check
from mmrlvr.methods.audio_rubrics.evidence import evidence_for, static_rubrics
from mmrlvr.methods.audio_rubrics.hearing import HTTPHearer, LocalHearer, TextHearer
from mmrlvr.methods.audio_rubrics.judges import GroupContext, Rubric, describe_evidence
from mmrlvr.methods.audio_rubrics.roles import ask_all, is_rules, make_hearer
from mmrlvr.train.writes import append_line

CATEGORIES = ("perception", "reasoning", "grounding", "style")
FIELDS = {"criterion", "category", "weight", "polarity"}
"""The fields every written rubric must have (`check` is the one optional field)."""

SYSTEM = ("You write grading rubrics for the reasoning of an audio question-answering model. You "
          "cannot hear the audio; the acoustic evidence below was measured from the waveform "
          "and is reliable. Reply with one JSON object and nothing else.")
HEARING_SYSTEM = ("You write grading rubrics for the reasoning of an audio question-answering "
                  "model. Listen to the audio clip. Reply with one JSON object and nothing else.")
_SHAPE = ('Reply as: {"rubrics": [{"criterion": "...", "category": "perception|reasoning|'
          'grounding|style", "weight": 0.5, "polarity": "positive|negative", "check": null}]}\n'
          '"check" may be {"kind": "count", "value": N} for "states that there are N sounds", or '
          '{"kind": "order", "attribute": "pitch|loudness|tempo|duration", "winner": "first|second"} '
          'for "says the first/second part is higher/louder/faster/longer"; else null.')


@dataclass
class Sample:
    """What the writer sees of one sample."""

    id: str
    question: str
    choices: list[str] | None
    gold: str
    evidence: list[dict[str, Any]]
    audios: list[Any] = field(default_factory=list)
    """The clips (paths or (array, rate) pairs), sent to a writer that hears."""


def _header(sample: Sample, show_gold: bool, show_evidence: bool) -> str:
    options = "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(sample.choices or []))
    gold = ""
    if show_gold:
        letter = sample.gold.strip().upper()
        text = (sample.choices[ord(letter) - 65] if sample.choices and len(letter) == 1
                and 0 <= ord(letter) - 65 < len(sample.choices) else "")
        gold = f"Gold answer: {sample.gold}" + (f" ({text})" if text else "") + "\n"
    evidence = f"Acoustic evidence:\n{describe_evidence(sample.evidence)}\n\n" if show_evidence else ""
    return (evidence + f"Question: {sample.question}\n"
            + (f"Options:\n{options}\n" if options else "") + gold + "\n")


def writer_prompt(sample: Sample, max_rubrics: int, show_gold: bool = True,
                  show_evidence: bool = True, hears: bool = False) -> str:
    ground = "what you hear and the evidence above" if hears and show_evidence else \
        ("what you hear" if hears else "the evidence above")
    return (_header(sample, show_gold, show_evidence or not hears)
            + f"Task: write 1 to {max_rubrics} rubrics specific to this question and this clip for "
            "grading a model's reasoning: what a correct reasoning must perceive and state about the "
            "sound (positive), or mistakes a wrong one would make (negative). Ground each in "
            f"{ground} (counts, which part is higher, louder, faster or longer, pitches, times). "
            "Never write a rubric about the answer letter or option itself. Give each a weight > 0 "
            "for how much it matters (they are normalised to sum 1).\n" + _SHAPE)


def regenerate_prompt(sample: Sample, ctx: GroupContext, kept: list[Rubric],
                      replaced: list[tuple[Rubric, int]], n_new: int, show_gold: bool = True,
                      show_evidence: bool = True, hears: bool = False) -> str:
    """The replacements' prompt: the criteria kept, those to replace with how many of the G
    rollouts met each, and every rollout's reasoning tagged correct or wrong."""
    G = len(ctx.reasonings)
    keep = "\n".join(f"- {r.criterion}" for r in kept) or "(none)"
    drop = "\n".join(f"- {r.criterion} (met by {met} of {G})" for r, met in replaced)
    rollouts = "\n".join(f"R{g + 1} ({'correct' if ok else 'wrong'}): {t[:600]}"
                          for g, (t, ok) in enumerate(zip(ctx.reasonings, ctx.correct)))
    return (_header(sample, show_gold, show_evidence or not hears)
            + f"Criteria that separate this group's rollouts (kept):\n{keep}\n"
            f"Criteria every rollout met, or none did (to replace):\n{drop}\n\n"
            f"The group's rollouts (reasoning only):\n{rollouts}\n\n"
            f"Task: write 1 to {n_new} new rubrics to replace those, each one some of these "
            "rollouts meet and others do not, about what the audio holds and how the reasoning "
            "uses it. Never a rubric about the answer letter itself. Give each a weight > 0.\n"
            + _SHAPE)


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
    """A rubric writer backed by a hearer (`hearing.py`) or `complete(messages) -> reply text`."""

    def __init__(self, complete: Any, name: str | None = None, retries: int = 2,
                 backoff_s: float = 0.5, max_rubrics: int = 5, show_gold: bool = True,
                 show_evidence: bool = True):
        hearer = complete if isinstance(complete, (LocalHearer, HTTPHearer, TextHearer)) \
            else TextHearer(complete, name or "llm")
        self.hearer, self.name = hearer, name or hearer.name
        self.hears = isinstance(hearer, LocalHearer) or (isinstance(hearer, HTTPHearer)
                                                         and hearer.audio)
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        self.max_rubrics, self.show_gold = int(max_rubrics), bool(show_gold)
        self.show_evidence = bool(show_evidence)
        self.malformed = 0
        """Replies (after their retries) that were not the rubrics asked for, over the run."""

    @property
    def system(self) -> str:
        return HEARING_SYSTEM if self.hears else SYSTEM

    def write_many(self, samples: list[Sample]) -> list[list[dict[str, Any]] | JudgeError]:
        """Each sample's rubrics, or the JudgeError of its last try; one batch to the hearer."""
        requests = [(self.system, writer_prompt(s, self.max_rubrics, self.show_gold,
                                                self.show_evidence, self.hears), s.audios)
                    for s in samples]
        return self._ask(requests, [(self.max_rubrics, s.evidence) for s in samples])

    def write(self, sample: Sample) -> list[dict[str, Any]]:
        """The sample's rubrics; JudgeError when every try failed."""
        [out] = self.write_many([sample])
        if isinstance(out, JudgeError):
            raise out
        return out

    def regenerate_many(self, items: list[tuple[Sample, GroupContext, list[Rubric],
                                                list[tuple[Rubric, int]], int]]
                        ) -> list[list[dict[str, Any]] | JudgeError]:
        """Replacements per group: items are (sample, its group, kept, replaced with how many
        rollouts met each, how many to write)."""
        requests = [(self.system, regenerate_prompt(s, ctx, kept, replaced, n, self.show_gold,
                                                    self.show_evidence, self.hears), s.audios)
                    for s, ctx, kept, replaced, n in items]
        return self._ask(requests, [(n, s.evidence) for s, _, _, _, n in items])

    def _ask(self, requests: list, shapes: list[tuple[int, list]]) -> list:
        results, errors = ask_all(self.hearer, requests,
                                  lambda i, reply: parse_rubrics(reply, *shapes[i]),
                                  self.retries, self.backoff_s)
        self.malformed += sum(e is not None for e in errors)
        return [r if e is None else JudgeError(f"rubric writer {self.name} failed after "
                                                f"{self.retries + 1} tries: {e}")
                for r, e in zip(results, errors)]


def make_writer(spec: Any, policy_path: str | None = None,
                shared: dict[str, Any] | None = None) -> LLMWriter:
    """A writer from a spec (`roles.py`) with `max_rubrics?`, `show_gold?`, `show_evidence?`,
    `backoff_s?` (no `cache_path`); `rules` is no LLM writer (the caller keeps templates)."""
    if isinstance(spec, dict):
        spec = dict(spec)
        own = {k: spec.pop(k) for k in ("max_rubrics", "show_gold", "show_evidence", "backoff_s")
               if k in spec}
    else:
        own = {}
    if is_rules(spec):
        raise ValueError("audio_rubrics writer rules writes the templated rubrics; it needs no writer")
    hearer, retries, rest = make_hearer(spec, "audio_rubrics writer", policy_path, shared)
    if rest:
        raise ValueError(f"audio_rubrics writer: unknown option(s) {sorted(rest)}")
    return LLMWriter(hearer, retries=retries, **own)


def _rows(path: Path | None) -> list[dict[str, Any]]:
    """The cache file's rows; a line cut short by a kill is skipped."""
    out = []
    if path is not None and path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class RubricBook:
    """Each sample's rubrics from the writer, asked at most once per sample and run.

    `rubrics(key, sample, template)` returns `{"rubrics", "source", "error"}`: source `written`
    (this run or `cache_path`) or `writer_fallback` (`template()`, with the writer's error). Only
    written rubrics go to `cache_path`, so a later run asks again where this one fell back.
    `prefetch` writes a batch of samples in one call to the writer. `counts` holds how many
    samples were written, read from the cache file, or fell back.
    """

    def __init__(self, writer: LLMWriter, cache_path: str | Path | None = None):
        self.writer = writer
        self.path = Path(cache_path) if cache_path else None
        self.counts = {"written": 0, "cached": 0, "fallback": 0}
        self._book: dict[str, dict[str, Any]] = {}
        self._on_file = {row["key"]: row["rubrics"] for row in _rows(self.path)
                         if row.get("kind", "written") == "written"
                         and row.get("writer") == writer.name}

    @classmethod
    def from_spec(cls, spec: Any, policy_path: str | None = None,
                  shared: dict[str, Any] | None = None) -> RubricBook:
        cache_path = None
        if isinstance(spec, dict):
            spec = dict(spec)
            cache_path = spec.pop("cache_path", None)
        return cls(make_writer(spec, policy_path, shared), cache_path)

    def prefetch(self, entries: list[tuple[str, Sample, Callable[[], list[dict[str, Any]]]]]) -> None:
        """Write every entry not yet known, in one batch to the writer."""
        todo, seen = [], set()
        for key, sample, template in entries:
            if key not in self._book and key not in self._on_file and key not in seen:
                todo.append((key, sample, template))
                seen.add(key)
        if todo:
            for (key, _, template), out in zip(todo, self.writer.write_many([s for _, s, _ in todo])):
                self._enter(key, out, template)

    def rubrics(self, key: str, sample: Sample,
                template: Callable[[], list[dict[str, Any]]]) -> dict[str, Any]:
        if key in self._book:
            return self._book[key]
        if key in self._on_file:
            self.counts["cached"] += 1
            self._book[key] = {"rubrics": self._on_file[key], "source": "written", "error": None}
            return self._book[key]
        [out] = self.writer.write_many([sample])
        return self._enter(key, out, template)

    def _enter(self, key: str, out: Any, template: Callable[[], list[dict[str, Any]]]) -> dict[str, Any]:
        if isinstance(out, JudgeError):
            entry = {"rubrics": template(), "source": "writer_fallback", "error": str(out)}
            self.counts["fallback"] += 1
        else:
            entry = {"rubrics": out, "source": "written", "error": None}
            self.counts["written"] += 1
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                append_line(self.path, json.dumps({"key": key, "writer": self.writer.name,
                                                   "kind": "written", "rubrics": out}) + "\n")
        self._book[key] = entry
        return entry


class Regenerated:
    """The criteria each sample's groups regenerated, by step, in the same JSONL as the written
    rubrics (`kind: regenerated`, with `step` and `writer`). `latest(key, step)` is the newest
    set made before `step`: rows a killed run wrote past its last checkpoint are not read by the
    run that resumes from it, which makes them again."""

    def __init__(self, path: str | Path | None, writer: str):
        self.path, self.writer = (Path(path) if path else None), writer
        self._sets: dict[str, list[tuple[int, list[dict[str, Any]]]]] = {}
        for row in _rows(self.path):
            if row.get("kind") == "regenerated" and row.get("writer") == writer:
                self._sets.setdefault(row["key"], []).append((int(row["step"]), row["rubrics"]))

    def latest(self, key: str, step: int) -> list[dict[str, Any]] | None:
        made = [(s, r) for s, r in self._sets.get(key, []) if s < step]
        return max(made, key=lambda m: m[0])[1] if made else None

    def record(self, key: str, step: int, rubrics: list[dict[str, Any]]) -> None:
        self._sets[key] = [(s, r) for s, r in self._sets.get(key, []) if s < step] + [(step, rubrics)]
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            append_line(self.path, json.dumps({"key": key, "writer": self.writer, "kind": "regenerated",
                                               "step": step, "rubrics": rubrics}) + "\n")


def sample_of(example: Any, evidence: list[dict[str, Any]]) -> Sample:
    return Sample(example.id, example.prompt, example.choices, example.answer, evidence,
                  list(example.audios))


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


__all__ = ["CATEGORIES", "LLMWriter", "Regenerated", "RubricBook", "Sample", "make_writer",
           "parse_rubrics", "regenerate_prompt", "sample_of", "write_rubrics", "writer_prompt"]
