"""Who writes and who judges: the `writer` / `judge` specs, and the judge that hears the audio.

A writer or judge spec is one of

    rules | rule                    the offline path: templated rubrics from the librosa
                                    evidence (writer), the rule checks (judge); the default
    policy                          the model being trained, frozen as it was at the start:
                                    `model.path` of the run's config.yaml, loaded once more
    DIR  or {kind: local, model: DIR, device?, max_new_tokens?, batch_size?, dtype?}
                                    a local audio-language model dir (Qwen2-Audio, Qwen2.5-Omni,
                                    Qwen3-Omni), in process, batched (`hearing.LocalHearer`)
    {kind: http, url, model?, timeout_s?, max_tokens?, audio?, concurrency?, api_key_env?}
                                    an OpenAI-compatible endpoint; with `audio: true` (default)
                                    each request carries the clip (`hearing.HTTPHearer`)
    {kind: hf, model, ...}          a local text-only LM reading the measured evidence (the
                                    former LLM path; hears nothing)

each with `retries?` (default 2 over HTTP, 0 in process, where greedy decoding would answer the
same again). `policy` and a local dir loaded by both roles share one copy of the weights.

`HeardJudge` scores every criterion on every rollout, one request per rollout: the clip(s), the
question and options, the gold, the numbered criteria and that rollout's reasoning; the reply
must be exactly `{"verdicts": [v_1, ..., v_K]}` with one of yes/no/true/false/1/0 per criterion
(`parse_verdicts`). Anything else is malformed: after the retries that rollout's verdicts are
None, which the reward scores 0 on every criterion (fail closed) and counts.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mmrlvr.methods.audio_rubrics.checks import JudgeError
from mmrlvr.methods.audio_rubrics.hearing import HTTPHearer, LocalHearer, TextHearer
from mmrlvr.methods.audio_rubrics.judges import GroupContext, Rubric, describe_evidence
from mmrlvr.methods.audio_rubrics.llm import hf_completion, parse_json

RULES = ("rules", "rule")
LOCAL_OPTIONS = ("device", "max_new_tokens", "batch_size", "dtype")
HTTP_OPTIONS = ("url", "model", "timeout_s", "max_tokens", "api_key_env", "audio", "concurrency")
HF_OPTIONS = ("model", "timeout_s", "max_new_tokens", "device")


def is_rules(spec: Any) -> bool:
    return spec is None or spec in RULES or (isinstance(spec, dict) and spec.get("kind") in RULES)


def hears(spec: Any) -> bool:
    """Whether a spec names a model that is sent the audio (policy, a local dir, HTTP with audio)."""
    if is_rules(spec):
        return False
    if isinstance(spec, str):
        return True
    return spec.get("kind") in ("local", "policy") or (spec.get("kind") == "http"
                                                        and spec.get("audio", True))


def run_config(run_dir: str | Path | None) -> dict[str, Any]:
    """The run's saved config.yaml ({} when there is none): where `policy` finds `model.path`."""
    import yaml

    path = Path(run_dir) / "config.yaml" if run_dir else None
    if path is None or not path.is_file():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def make_hearer(spec: Any, who: str, policy_path: str | None,
                shared: dict[str, dict[str, Any]] | None = None) -> tuple[Any, int, dict[str, Any]]:
    """`(hearer, retries, the spec's other options)` for a non-rules spec; `shared`: local models
    already loaded, by path (one copy when writer and judge name the same one)."""
    spec = {"kind": "policy"} if spec == "policy" else (
        {"kind": "local", "model": spec} if isinstance(spec, str) else dict(spec))
    if not isinstance(spec, dict):
        raise TypeError(f"{who} must be rules, policy, a model dir or a mapping with kind "
                        f"local|http|hf, got {spec!r}")
    kind = spec.pop("kind", None)
    retries = spec.pop("retries", None)
    if kind in ("local", "policy"):
        if kind == "policy":
            if not policy_path:
                raise ValueError(f"{who}: policy is the model.path of the run's config.yaml, and "
                                 "none was found: set the reward's run_dir (or log_path) to the "
                                 "run's train.out_dir, or name the model dir itself")
            path, name = policy_path, f"policy:{Path(policy_path).resolve()}"
        else:
            path = spec.pop("model", None)
            if not path:
                raise ValueError(f"{who} kind local needs a 'model' (a local audio-model dir)")
            if not Path(path).is_dir():
                raise ValueError(f"{who}: {path!r} is not rules, policy or a model dir (no such "
                                 "directory); build a tiny one with `mmrlvr tiny qwen2-audio DIR`")
            name = f"local:{Path(path).resolve()}"
        options = {k: spec.pop(k) for k in LOCAL_OPTIONS if k in spec}
        state = {} if shared is None else shared.setdefault(str(Path(path).resolve()), {})
        return (LocalHearer(path, name=name, state=state, **options),
                int(0 if retries is None else retries), spec)
    if kind == "http":
        if not spec.get("url"):
            raise ValueError(f"{who} kind http needs a 'url' (an OpenAI-compatible endpoint)")
        options = {k: spec.pop(k) for k in HTTP_OPTIONS if k in spec}
        return HTTPHearer(**options), int(2 if retries is None else retries), spec
    if kind == "hf":
        if not spec.get("model"):
            raise ValueError(f"{who} kind hf needs a 'model' (a local dir or hub id)")
        options = {k: spec.pop(k) for k in HF_OPTIONS if k in spec}
        return (TextHearer(hf_completion(**options), f"hf:{options['model']}"),
                int(2 if retries is None else retries), spec)
    raise ValueError(f"unknown {who} kind {kind!r}; choose rules, policy, local (a model dir), "
                     "http or hf")


# -- the judge that hears ---------------------------------------------------------------------
JUDGE_SYSTEM = ("You grade the reasoning of an audio question-answering model. Listen to the audio "
                "clip, then decide for each criterion whether the reasoning meets it. Reply with "
                "one JSON object and nothing else.")


def judge_prompt(ctx: GroupContext, criteria: list[Rubric], reasoning: str,
                 show_evidence: bool) -> str:
    options = "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(ctx.choices or []))
    listed = "\n".join(f"{k + 1}. {r.criterion}" for k, r in enumerate(criteria))
    evidence = (f"Measured from the waveform:\n{describe_evidence(ctx.evidence)}\n\n"
                if show_evidence and ctx.evidence else "")
    return (evidence + f"Question: {ctx.question}\n" + (f"Options:\n{options}\n" if options else "")
            + f"Gold answer: {ctx.gold}\n\nCriteria:\n{listed}\n\n"
            f"Reasoning to grade:\n{reasoning[:1500]}\n\n"
            f"Task: for each of the {len(criteria)} criteria, in order, say whether the reasoning "
            "meets it, judged against what you hear.\n"
            'Reply as: {"verdicts": ["yes" or "no", one per criterion]}')


_YES, _NO = ("yes", "true", "1"), ("no", "false", "0")


def parse_verdicts(reply: dict[str, Any], n: int) -> list[bool]:
    """Exactly `{"verdicts": [n of yes/no/true/false/1/0]}`; JudgeError for anything else."""
    if set(reply) != {"verdicts"}:
        raise JudgeError(f"expected exactly the key 'verdicts', got {sorted(reply)}")
    rows = reply["verdicts"]
    if not isinstance(rows, list) or len(rows) != n:
        raise JudgeError(f"expected {n} verdicts, got {json.dumps(rows)[:200]}")
    out = []
    for k, v in enumerate(rows):
        if isinstance(v, bool):
            out.append(v)
        elif isinstance(v, int) and v in (0, 1):
            out.append(bool(v))
        elif isinstance(v, str) and v.strip().lower() in _YES + _NO:
            out.append(v.strip().lower() in _YES)
        else:
            raise JudgeError(f"verdict {k + 1} is {v!r}, not yes/no")
    return out


def ask_all(hearer: Any, requests: list[tuple[str, str, list[Any]]], parse: Any, retries: int,
            backoff_s: float = 0.0) -> tuple[list[Any], list[str | None]]:
    """`(parse(i, first JSON object of reply i) or None, error or None)` per request: the batch in
    one go, then the failed ones again, up to `retries` times."""
    results: list[Any] = [None] * len(requests)
    errors: list[str | None] = ["not asked"] * len(requests)
    todo = list(range(len(requests)))
    for attempt in range(retries + 1):
        if not todo:
            break
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        replies = hearer.generate([requests[i] for i in todo])
        failed = []
        for i, reply in zip(todo, replies):
            try:
                if isinstance(reply, Exception):
                    raise reply
                results[i], errors[i] = parse(i, parse_json(reply)), None
            except (JudgeError, ValueError, KeyError, TypeError) as err:
                errors[i] = f"{type(err).__name__}: {err}"
                failed.append(i)
        todo = failed
    return results, errors


class HeardJudge:
    """Scores each criterion on each rollout with the audio (module doc)."""

    name = "heard"

    def __init__(self, hearer: Any, retries: int = 0, show_evidence: bool = True,
                 backoff_s: float = 0.5):
        self.hearer, self.retries = hearer, int(retries)
        self.show_evidence, self.backoff_s = bool(show_evidence), float(backoff_s)
        self.name = hearer.name

    def judge_groups(self, contexts: list[GroupContext], criteria: list[list[Rubric]],
                     audios: list[list[Any]]) -> tuple[list[list[list[bool] | None]], list[str]]:
        """verdicts[b][g]: rollout g of group b's yes/no per criterion (None: malformed), and
        the first errors. Every rollout of every group goes to the hearer in one batch."""
        requests, where = [], []
        for b, (ctx, crit) in enumerate(zip(contexts, criteria)):
            if not crit:
                continue
            for g, reasoning in enumerate(ctx.reasonings):
                requests.append((JUDGE_SYSTEM, judge_prompt(ctx, crit, reasoning,
                                                            self.show_evidence), audios[b]))
                where.append((b, g, len(crit)))
        results, errors = ask_all(self.hearer, requests,
                                  lambda i, reply: parse_verdicts(reply, where[i][2]),
                                  self.retries, self.backoff_s)
        out: list[list[list[bool] | None]] = [[None] * len(c.reasonings) for c in contexts]
        first_errors = []
        for (b, g, _), verdicts, err in zip(where, results, errors):
            if err is None:
                out[b][g] = verdicts
            else:
                first_errors.append(f"group {b + 1} rollout {g + 1}: {err}")
        return out, first_errors[:5]


__all__ = ["HeardJudge", "JUDGE_SYSTEM", "ask_all", "hears", "is_rules", "judge_prompt",
           "make_hearer", "parse_verdicts", "run_config"]
