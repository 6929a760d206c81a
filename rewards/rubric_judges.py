"""Rubric judges for AudioRubrics: one interface, a rule-based judge and an LLM judge.

A judge does two things for one GRPO group (METHODS.md, "AudioRubrics"):

    evaluate(ctx, rubrics, max_new) -> (new rubrics, verdicts)
        sees the acoustic evidence, question, gold, the current rubrics and every rollout's
        reasoning tagged correct or wrong; proposes up to `max_new` new rubrics (each with a
        polarity: +1 rewards the behaviour, -1 penalises it) and says yes/no for every rubric
        (current ones first, then the new ones) on every rollout: verdicts[k][g].
    weigh(ctx, rubrics) -> weights
        one non-negative weight per rubric (the caller normalises; uniform if this fails).

`RuleJudge` (default: offline, deterministic) grounds both in the computed evidence: a rubric's
`check` is evaluated on the reasoning (`<think>` part) by reading its claims — numbers, and
comparisons such as "the second tone is higher" — and new rubrics come from claims that separate
correct from wrong rollouts and agree (positive) or disagree (negative) with the evidence.

`LLMJudge` asks a language model, either a local HF causal LM or an OpenAI-compatible HTTP
endpoint (`POST {url}/chat/completions`), with a timeout and retries; a reply that is not the
JSON asked for counts as a failure. Every failure raises `JudgeError`, on which the reward falls
back to the static rubrics.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from rewards.audio_evidence import AUDIO_WORDS, order_facts


class JudgeError(RuntimeError):
    """A judge call that failed or answered something unusable."""


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
    """`static` (stored with the dataset) or `proposed` (written this step)."""

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


# -- reading claims out of a reasoning -------------------------------------------------------
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_NUMBER_WORDS = {w: i for i, w in enumerate(["zero", "one", "two", "three", "four", "five", "six",
                                              "seven", "eight", "nine", "ten", "eleven", "twelve"])}
_RELATIONS = {"higher": ("pitch", 1), "lower": ("pitch", -1), "louder": ("loudness", 1),
              "quieter": ("loudness", -1), "softer": ("loudness", -1), "faster": ("tempo", 1),
              "quicker": ("tempo", 1), "slower": ("tempo", -1), "longer": ("duration", 1),
              "shorter": ("duration", -1)}
_POSITIONS = {"first": "first", "1st": "first", "earlier": "first", "second": "second",
              "2nd": "second", "last": "second", "later": "second"}
_OTHER = {"first": "second", "second": "first"}
_WORD = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")


def reasoning_of(text: str) -> str:
    """The `<think>` part of a completion, else the text before `<answer>`, else all of it."""
    m = _THINK.search(text or "")
    if m:
        return m.group(1).strip()
    return re.split(r"<answer>", text or "", flags=re.IGNORECASE)[0].strip()


def numbers_in(text: str) -> set[int]:
    out = set()
    for w in _WORD.findall(text.lower()):
        if w.isdigit():
            out.add(int(w))
        elif w in _NUMBER_WORDS:
            out.add(_NUMBER_WORDS[w])
    return out


def order_claims(text: str) -> set[tuple[str, str]]:
    """Comparisons a text makes, as (attribute, which part has more of it).

    Per clause: the first position word and the first relation word; "the second tone is
    higher" and "the first is lower than the second" both give ("pitch", "second"). A position
    after "than" names the part with less.
    """
    claims = set()
    for clause in re.split(r"[.;!?\n]|\bbut\b|\bwhile\b|\bwhereas\b", text.lower()):
        words = _WORD.findall(clause)
        pos = rel = None
        for i, w in enumerate(words):
            if pos is None and w in _POSITIONS:
                pos = _POSITIONS[w]
                if i > 0 and words[i - 1] == "than" or i > 1 and words[i - 2] == "than":
                    pos = _OTHER[pos]
            if rel is None and w in _RELATIONS:
                rel = _RELATIONS[w]
        if pos and rel:
            attribute, sign = rel
            claims.add((attribute, pos if sign > 0 else _OTHER[pos]))
    return claims


def check_satisfied(check: dict[str, Any] | None, reasoning: str) -> bool:
    """Whether `reasoning` passes a rubric's machine check."""
    if not check:
        raise JudgeError("this rubric has no machine check; only an LLM judge can judge it")
    kind = check.get("kind")
    if kind == "count":
        return int(check["value"]) in numbers_in(reasoning)
    if kind == "order":
        return (check["attribute"], check["winner"]) in order_claims(reasoning)
    if kind == "mentions":
        words = set(_WORD.findall(reasoning.lower()))
        return any(w.lower() in words for w in check["words"])
    if kind == "max_words":
        n = len(reasoning.split())
        return 0 < n <= int(check["value"])
    raise JudgeError(f"unknown rubric check kind {kind!r}")


# -- the rule-based judge ----------------------------------------------------------------------
CATEGORY_WEIGHT = {"perception": 2.0, "reasoning": 1.5, "grounding": 1.0, "style": 0.5}


class RuleJudge:
    """Deterministic, offline judge grounded in the computed acoustic evidence."""

    name = "rule"

    def evaluate(self, ctx: GroupContext, rubrics: list[Rubric], max_new: int
                 ) -> tuple[list[Rubric], list[list[bool]]]:
        new = self.propose(ctx, rubrics, max_new)
        verdicts = [[check_satisfied(r.check, t) for t in ctx.reasonings] for r in rubrics + new]
        return new, verdicts

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
        claims = [({("count", n) for n in numbers_in(t) if n <= 12} | order_claims(t))
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
        return [CATEGORY_WEIGHT.get(r.category, 1.0) for r in rubrics]


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


def parse_json(text: str) -> dict[str, Any]:
    """The first JSON object in a reply (code fences and surrounding prose allowed)."""
    text = re.sub(r"```(?:json)?", "", text or "")
    start = text.find("{")
    while start != -1:
        depth = 0
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                try:
                    out = json.loads(text[start:i + 1])
                    if isinstance(out, dict):
                        return out
                except json.JSONDecodeError:
                    pass
                break
        start = text.find("{", start + 1)
    raise JudgeError(f"the judge's reply holds no JSON object: {text[:200]!r}")


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
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                return parse(parse_json(self.complete(messages)))
            except (JudgeError, OSError, ValueError, KeyError, TypeError) as err:
                last = err
                if attempt < self.retries:
                    time.sleep(self.backoff_s * 2 ** attempt)
        raise JudgeError(f"LLM judge failed after {self.retries + 1} tries: {last}")

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


def http_completion(url: str, model: str = "", timeout_s: float = 30.0, max_tokens: int = 1024,
                    api_key_env: str = "OPENAI_API_KEY") -> Callable[[list[dict[str, str]]], str]:
    """`complete(messages)` against an OpenAI-compatible chat endpoint (`.../v1` or the full path)."""
    endpoint = url.rstrip("/")
    if not endpoint.endswith("/chat/completions"):
        endpoint += "/chat/completions"

    def complete(messages: list[dict[str, str]]) -> str:
        body = json.dumps({"model": model, "messages": messages, "temperature": 0,
                           "max_tokens": max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if os.environ.get(api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[api_key_env]}"
        request = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                reply = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as err:
            raise JudgeError(f"judge endpoint {endpoint}: {err}") from None
        try:
            return reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"judge endpoint {endpoint}: unexpected reply {str(reply)[:200]}") from None

    return complete


def hf_completion(model: str, timeout_s: float = 60.0, max_new_tokens: int = 1024,
                  device: str = "auto") -> Callable[[list[dict[str, str]]], str]:
    """`complete(messages)` with a local transformers causal LM (loaded on first use, greedy)."""
    state: dict[str, Any] = {}

    def complete(messages: list[dict[str, str]]) -> str:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not state:
            dev = "cuda" if device == "auto" and torch.cuda.is_available() else \
                ("cpu" if device == "auto" else device)
            state["tok"] = AutoTokenizer.from_pretrained(model)
            state["model"] = AutoModelForCausalLM.from_pretrained(
                model, dtype=torch.bfloat16 if dev == "cuda" else torch.float32).to(dev).eval()
        tok, lm = state["tok"], state["model"]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True).to(lm.device)
        with torch.no_grad():
            out = lm.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                              max_time=timeout_s)
        return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    return complete


def make_judge(spec: str | dict[str, Any] | None) -> Judge:
    """`rule` (default), or `{kind: http, url, model, timeout_s, retries}` /
    `{kind: hf, model, timeout_s, retries}` for an LLM judge."""
    if spec in (None, "rule") or (isinstance(spec, dict) and spec.get("kind", "rule") == "rule"):
        return RuleJudge()
    if not isinstance(spec, dict):
        raise TypeError(f"audio_rubrics judge must be 'rule' or a mapping with kind http|hf, got {spec!r}")
    spec = dict(spec)
    kind = spec.pop("kind")
    retries = int(spec.pop("retries", 2))
    if kind == "http":
        if not spec.get("url"):
            raise ValueError("audio_rubrics judge kind http needs a 'url' (an OpenAI-compatible endpoint)")
        return LLMJudge(http_completion(**spec), retries=retries)
    if kind == "hf":
        if not spec.get("model"):
            raise ValueError("audio_rubrics judge kind hf needs a 'model' (a local dir or hub id)")
        return LLMJudge(hf_completion(**spec), retries=retries)
    raise ValueError(f"unknown audio_rubrics judge kind {kind!r}; choose rule, http or hf")


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
    "finite_weights",
    "hf_completion",
    "http_completion",
    "make_judge",
    "numbers_in",
    "order_claims",
    "parse_json",
    "reasoning_of",
]
