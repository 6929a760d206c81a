"""Rubric judges for AudioRubrics: one interface, a rule-based judge and an LLM judge.

A judge does two things for one GRPO group (docs/methods.md, "AudioRubrics"):

    evaluate(ctx, rubrics, max_new) -> (new rubrics, verdicts)
        sees the acoustic evidence, question, gold, the current rubrics and every rollout's
        reasoning tagged correct or wrong; proposes up to `max_new` new rubrics (each with a
        polarity: +1 rewards the behaviour, -1 penalises it) and says yes/no for every rubric
        (current ones first, then the new ones) on every rollout: verdicts[k][g].
    weigh(ctx, rubrics) -> weights
        one non-negative weight per rubric (the caller normalises; uniform if this fails).

`RuleJudge` (default: offline, deterministic) grounds both in the computed evidence: a rubric's
`check` is evaluated on the reasoning (`<think>` part) by reading its claims
(`mmrlvr.methods.audio_rubrics.checks`: counts stated as counts, comparisons such as "the second tone is
higher"), and new rubrics come from claims that separate correct from wrong rollouts and agree
(positive) or disagree (negative) with the evidence. A rubric with no check (free text from an
LLM writer) cannot be judged by rules: it gets "no" on every rollout, so its zero spread drops it.

The rule judge weighs the kept rubrics by how much they separate the group's rollouts: with
s_kg ∈ {0, 1} rubric k's verdict on rollout g after the polarity flip,

    σ_k = sqrt( (1/G) Σ_g (s_kg − s̄_k)² ),        w_k = σ_k / Σ_j σ_j

the standard deviation the paper ranks rubrics by (top 5 kept), used as the weight. For a yes/no
rubric σ = sqrt(p(1 − p)) with p the share of rollouts satisfying it: an even split (σ 0.5)
weighs most, a rubric one rollout in eight satisfies 0.33. Not the point-biserial correlation
with correctness: the rule checks are already verified against the measured audio (a rubric is
true whatever the letter), the correlation is undefined in all-right or all-wrong groups
(exactly where the rubric term is the group's only signal), and where correctness varies the
accuracy term already rewards it. Before, the weights were fixed per category (perception 2,
reasoning 1.5, grounding 1, style 0.5), blind to the group.

`LLMJudge` asks a language model, either a local HF model or an OpenAI-compatible HTTP endpoint
(`POST {url}/chat/completions`, `mmrlvr.methods.audio_rubrics.llm`), with a timeout and retries; a reply that
is not the JSON asked for counts as a failure, and it weighs with a second call. Every failure
raises `JudgeError`, on which the reward falls back to the static rubrics.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from mmrlvr.methods.audio_rubrics.evidence import AUDIO_WORDS, order_facts
from mmrlvr.methods.audio_rubrics.checks import (
    JudgeError,
    check_satisfied,
    count_claims,
    numbers_in,
    order_claims,
    reasoning_of,
)
from mmrlvr.methods.audio_rubrics.llm import ask_json, hf_completion, http_completion, make_completion, parse_json


@dataclass
class Rubric:
    id: str
    category: str
    criterion: str
    weight: float = 0.0
    polarity: int = 1
    """+1: satisfying it is good; -1: satisfying it is bad (flipped before scoring)."""
    check: dict[str, Any] | None = None
    """A machine check the rule-based judge evaluates (None: only an LLM judge can judge it)."""
    origin: str = "static"
    """`static` (templated from the evidence), `written` (by a rubric writer, per sample) or
    `proposed` (by the judge, this step)."""

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Rubric:
        return cls(id=str(row["id"]), category=str(row.get("category", "")),
                   criterion=str(row["criterion"]), weight=float(row.get("weight", 0.0)),
                   polarity=-1 if int(row.get("polarity", 1)) < 0 else 1, check=row.get("check"),
                   origin=str(row.get("origin", "static")))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GroupContext:
    """What a judge sees for one group."""

    question: str
    gold: str
    choices: list[str] | None
    evidence: list[dict[str, Any]]
    reasonings: list[str]
    """The `<think>` part of every rollout (the whole text where there is none)."""
    correct: list[bool]
    extra: dict[str, Any] = field(default_factory=dict)


class Judge(Protocol):
    name: str

    def evaluate(self, ctx: GroupContext, rubrics: list[Rubric], max_new: int
                 ) -> tuple[list[Rubric], list[list[bool]]]: ...

    def weigh(self, ctx: GroupContext, rubrics: list[Rubric]) -> list[float]: ...


# -- the rule-based judge ----------------------------------------------------------------------
def rule_verdicts(rubric: Rubric, reasonings: list[str]) -> list[bool]:
    """The rule checks' yes/no on every reasoning; "no" throughout for a rubric with no check."""
    return [check_satisfied(rubric.check, t) if rubric.check else False for t in reasonings]


def separation_weights(satisfied: list[list[float]]) -> list[float]:
    """w_k = σ_k / Σ_j σ_j over the flipped verdicts s[k][g] (the module doc); uniform when no
    rubric varies over the group."""
    sigma = [spread(row) for row in satisfied]
    total = sum(sigma)
    return [s / total for s in sigma] if total > 0 else [1.0 / len(sigma)] * len(sigma)


def spread(values: list[float]) -> float:
    """The population standard deviation σ of one rubric's satisfied values over a group."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


class RuleJudge:
    """Deterministic, offline judge grounded in the computed acoustic evidence."""

    name = "rule"

    def evaluate(self, ctx: GroupContext, rubrics: list[Rubric], max_new: int
                 ) -> tuple[list[Rubric], list[list[bool]]]:
        new = self.propose(ctx, rubrics, max_new)
        return new, [rule_verdicts(r, ctx.reasonings) for r in rubrics + new]

    def propose(self, ctx: GroupContext, rubrics: list[Rubric], max_new: int) -> list[Rubric]:
        """Claims that separate correct from wrong rollouts, checked against the evidence."""
        if max_new <= 0 or not ctx.reasonings:
            return []
        ev = ctx.evidence[0] if ctx.evidence else {}
        facts, n_true = order_facts(ev) if ev else {}, ev.get("onset_count")
        seen = [json.dumps(r.check, sort_keys=True) for r in rubrics if r.check]
        scored: list[tuple[float, Rubric]] = []
        right = [k for k, ok in enumerate(ctx.correct) if ok]
        wrong = [k for k, ok in enumerate(ctx.correct) if not ok]
        claims = [({("count", n) for n in count_claims(t) if n <= 12} | order_claims(t))
                  for t in ctx.reasonings]
        for claim in sorted(set().union(*claims)):
            share_right = sum(claim in claims[k] for k in right) / max(len(right), 1)
            share_wrong = sum(claim in claims[k] for k in wrong) / max(len(wrong), 1)
            if claim[0] == "count":
                check = {"kind": "count", "value": claim[1]}
                true = None if n_true is None else claim[1] == n_true
                text = f"{claim[1]} distinct sound{'s' if claim[1] != 1 else ''}"
            else:
                check = {"kind": "order", "attribute": claim[0], "winner": claim[1]}
                true = facts.get(claim[0]) == claim[1] if claim[0] in facts else None
                text = f"the {claim[1]} part is the {_more(claim[0])} one"
            if true is None or json.dumps(check, sort_keys=True) in seen:
                continue
            if true and share_right > share_wrong:
                scored.append((share_right - share_wrong, Rubric(
                    "", "perception", f"States, as the audio shows, that {text}.", polarity=1,
                    check=check, origin="proposed")))
            elif not true and share_wrong > share_right:
                scored.append((share_wrong - share_right, Rubric(
                    "", "perception", f"Claims, against the audio, that {text}.", polarity=-1,
                    check=check, origin="proposed")))
        scored.sort(key=lambda s: -s[0])
        out = [r for _, r in scored[:max_new]]
        for k, r in enumerate(out):
            r.id = f"p{k + 1}"
        return out

    def weigh(self, ctx: GroupContext, rubrics: list[Rubric]) -> list[float]:
        """Separation weights σ_k / Σ σ (the module doc), from the rule verdicts on the group."""
        return separation_weights([[float(v) if r.polarity > 0 else 1.0 - float(v)
                                    for v in rule_verdicts(r, ctx.reasonings)] for r in rubrics])


def _more(attribute: str) -> str:
    return {"pitch": "higher", "loudness": "louder", "tempo": "faster", "duration": "longer"}[attribute]


# -- the LLM judge -----------------------------------------------------------------------------
SYSTEM = ("You grade the reasoning of an audio question-answering model. You cannot hear the "
          "audio; the acoustic evidence below was measured from the waveform and is reliable. "
          "Reply with one JSON object and nothing else.")


def describe_evidence(evidence: list[dict[str, Any]]) -> str:
    lines = []
    for k, ev in enumerate(evidence):
        events = "; ".join(f"{e['start_s']:.2f}-{e['end_s']:.2f} s"
                           + (f" {e['pitch_hz']:.0f} Hz" if e.get("pitch_hz") else "")
                           + f" {e['loudness_db']:.0f} dB" for e in ev.get("events", [])[:12])
        loud, tempo = ev.get("loudness", {}), ev.get("tempo", {})
        lines.append(
            f"Clip {k + 1}: duration {ev.get('duration_s')} s; loudness mean {loud.get('mean_db')} dB, "
            f"first half {loud.get('first_half_db')} dB, second half {loud.get('second_half_db')} dB; "
            f"median pitch {ev.get('pitch', {}).get('median_hz')} Hz; {ev.get('onset_count')} onsets; "
            f"tempo {tempo.get('bpm')} per minute (rates {tempo.get('first_half_rate')} / "
            f"{tempo.get('second_half_rate')} per second by half); spectral centroid "
            f"{ev.get('spectral_centroid_hz')} Hz; events: {events or 'none'}.")
    return "\n".join(lines) or "No evidence."


def _context_text(ctx: GroupContext, rubrics: list[Rubric]) -> str:
    options = "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(ctx.choices or []))
    listed = "\n".join(f"{k + 1}. [{r.category}] {r.criterion}"
                       + (" (negative: satisfying it is bad)" if r.polarity < 0 else "")
                       for k, r in enumerate(rubrics)) or "(none)"
    rollouts = "\n".join(f"R{g + 1} ({'correct' if ok else 'wrong'}): {t[:800]}"
                         for g, (t, ok) in enumerate(zip(ctx.reasonings, ctx.correct)))
    return (f"Acoustic evidence:\n{describe_evidence(ctx.evidence)}\n\nQuestion: {ctx.question}\n"
            + (f"Options:\n{options}\n" if options else "") + f"Gold answer: {ctx.gold}\n\n"
            f"Rubrics:\n{listed}\n\nRollouts (reasoning only):\n{rollouts}")


def evaluate_prompt(ctx: GroupContext, rubrics: list[Rubric], max_new: int) -> str:
    n_g = len(ctx.reasonings)
    return (_context_text(ctx, rubrics) + "\n\n"
            f"Task: propose up to {max_new} NEW rubrics that separate the correct rollouts from the "
            "wrong ones and are checkable against the acoustic evidence; each is positive (good "
            "behaviour) or negative (bad behaviour). Then, for every rubric (the listed ones first, in "
            f"order, then your new ones), say for each of the {n_g} rollouts whether its reasoning "
            "satisfies the rubric (1) or not (0).\n"
            'Reply as: {"new_rubrics": [{"category": "perception|reasoning|grounding|style", '
            '"criterion": "...", "polarity": "positive|negative"}], "verdicts": [[0 or 1 per '
            "rollout] per rubric]}")


def weigh_prompt(ctx: GroupContext, rubrics: list[Rubric]) -> str:
    return (_context_text(ctx, rubrics) + "\n\n"
            "Task: give each rubric a weight in [0, 1] for how much it matters to answering this "
            f'question well from the audio. Reply as: {{"weights": [{len(rubrics)} numbers]}}')


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("yes", "no", "true", "false", "1", "0"):
        return value.strip().lower() in ("yes", "true", "1")
    raise JudgeError(f"verdict {value!r} is not yes/no")


class LLMJudge:
    """A judge backed by `complete(messages) -> reply text` (an HTTP endpoint or a local model)."""

    name = "llm"

    def __init__(self, complete: Callable[[list[dict[str, str]]], str], retries: int = 2,
                 backoff_s: float = 0.5):
        self.complete, self.retries, self.backoff_s = complete, retries, backoff_s

    def _ask(self, prompt: str, parse: Callable[[dict[str, Any]], Any]) -> Any:
        return ask_json(self.complete, SYSTEM, prompt, parse, retries=self.retries,
                        backoff_s=self.backoff_s, who="LLM judge")

    def evaluate(self, ctx: GroupContext, rubrics: list[Rubric], max_new: int
                 ) -> tuple[list[Rubric], list[list[bool]]]:
        G = len(ctx.reasonings)

        def parse(reply: dict[str, Any]):
            new = []
            for k, row in enumerate((reply.get("new_rubrics") or [])[:max_new]):
                polarity = str(row.get("polarity", "positive")).lower()
                new.append(Rubric(f"p{k + 1}", str(row.get("category", "reasoning")),
                                  str(row["criterion"]), origin="proposed",
                                  polarity=-1 if polarity.startswith(("neg", "-")) else 1))
            verdicts = reply["verdicts"]
            if len(verdicts) != len(rubrics) + len(new) or any(len(v) != G for v in verdicts):
                raise JudgeError(f"expected {len(rubrics) + len(new)} verdict rows of {G}, got "
                                 f"{[len(v) for v in verdicts]}")
            return new, [[_flag(x) for x in row] for row in verdicts]

        return self._ask(evaluate_prompt(ctx, rubrics, max_new), parse)

    def weigh(self, ctx: GroupContext, rubrics: list[Rubric]) -> list[float]:
        def parse(reply: dict[str, Any]) -> list[float]:
            weights = [float(w) for w in reply["weights"]]
            if len(weights) != len(rubrics):
                raise JudgeError(f"expected {len(rubrics)} weights, got {len(weights)}")
            return weights

        return self._ask(weigh_prompt(ctx, rubrics), parse)


def make_judge(spec: str | dict[str, Any] | None) -> Judge:
    """`rule` (default), or `{kind: http, url, model, timeout_s, retries}` /
    `{kind: hf, model, timeout_s, retries}` for an LLM judge."""
    if spec in (None, "rule") or (isinstance(spec, dict) and spec.get("kind", "rule") == "rule"):
        return RuleJudge()
    if not isinstance(spec, dict):
        raise TypeError(f"audio_rubrics judge must be 'rule' or a mapping with kind http|hf, got {spec!r}")
    if spec.get("kind") not in ("http", "hf"):
        raise ValueError(f"unknown audio_rubrics judge kind {spec.get('kind')!r}; choose rule, http or hf")
    complete, retries = make_completion(spec, "audio_rubrics judge")
    return LLMJudge(complete, retries=retries)


def finite_weights(weights: list[float], n: int) -> list[float] | None:
    """`weights` normalised to sum 1, or None when unusable (wrong length, negative, all zero)."""
    if len(weights) != n or any(not math.isfinite(w) or w < 0 for w in weights):
        return None
    total = sum(weights)
    return [w / total for w in weights] if total > 0 else None


__all__ = [
    "AUDIO_WORDS",
    "GroupContext",
    "Judge",
    "JudgeError",
    "LLMJudge",
    "Rubric",
    "RuleJudge",
    "check_satisfied",
    "count_claims",
    "describe_evidence",
    "finite_weights",
    "hf_completion",
    "http_completion",
    "make_judge",
    "numbers_in",
    "order_claims",
    "parse_json",
    "reasoning_of",
    "rule_verdicts",
    "separation_weights",
    "spread",
]
