"""AudioRubrics: self-evolving, audio-grounded rubric rewards (docs/methods.md, "AudioRubrics").

For each group of G rollouts of one prompt, every step:

  1. the sample's rubrics. With a `writer` (`{kind: http | hf, ...}`, `mmrlvr.methods.audio_rubrics.writer`):
     query-specific rubrics a model wrote from the question, options, gold and the measured
     acoustic evidence, once per sample (cached; `cache_path` keeps them across runs), or stored
     with the dataset by `write_rubrics` (`meta.rubric_source: written`); when the writer fails,
     the templated rubrics below, counted and logged. Without one (the default, offline): the
     templated rubrics stored with the sample (`meta.rubrics`, written from the waveform's
     acoustic evidence by `mmrlvr.methods.audio_rubrics.evidence.static_rubrics`), else templated here from
     `meta.evidence` or from the audio file itself (cached by path);
  2. the judge sees evidence, question, gold, the rubrics and every rollout's reasoning tagged
     correct/wrong; it proposes up to `max_proposals` new rubrics (each with a polarity) and says
     yes/no for every rubric on every rollout -> satisfied s_kg;
  3. negative rubrics are flipped (s <- 1 - s); rubrics with zero spread over the group are
     dropped; the `top_k` with the largest standard deviation stay;
  4. weights w_k from the judge, normalised to sum 1 (uniform if it fails): an LLM judge's second
     call, or the rule judge's separation weights w_k ∝ σ_k, the rubric's standard deviation
     over the group (`mmrlvr.methods.audio_rubrics.judges`);
  5. R_rubric_g = Σ_k w_k · s_kg ∈ [0, 1] (0.5 when no rubric is left);

    overall = w_acc·acc + w_fmt·format + λ_r·R_rubric + λ_o·(1 − min(think, budget)/budget)

with acc/format from `rewards.verify` and `rewards.format`, `think` the reasoning's token count
(words and punctuation marks) and the defaults w_acc 0.9, w_fmt 0.1, λ_r 0.5, λ_o 0.1 (options
`acc_weight`, `format_weight`, `lambda_rubric`, `lambda_brevity`), budget 256, so
overall ∈ [0, 1.6]. Any judge failure in steps 2-4 falls back to the static rubrics with their
stored weights, judged by the rule-based judge (still deterministic and offline).

Audit: with `log_path` set, every group appends one JSON line: the rubrics (static or written,
and proposed, with polarity, weight, standard deviation, kept or not, and the verdict on every
rollout), the correctness, R_rubric and the total of every rollout, which judge answered, where
the rubrics came from (`rubric_source`: template, written, stored_written, writer_fallback) and
with a writer its running counts and error, and any failure. With a writer each completion also
carries the component `writer_fallback` (1 where its sample's rubrics fell back to templates).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mmrlvr.data import Example
from mmrlvr.methods.audio_rubrics.evidence import evidence_for, static_rubrics
from rewards.format import is_well_formatted
from mmrlvr.methods.audio_rubrics.judges import (
    GroupContext,
    JudgeError,
    Rubric,
    check_satisfied,
    finite_weights,
    make_judge,
    reasoning_of,
    spread,
)
from mmrlvr.methods.audio_rubrics.writer import RubricBook, sample_of
from rewards.verify import extract_answer, match

_TOKEN = re.compile(r"\w+|[^\w\s]")


def think_tokens(reasoning: str) -> int:
    """Token count of a reasoning, approximated as words plus punctuation marks."""
    return len(_TOKEN.findall(reasoning))


class AudioRubricsReward:
    """The AudioRubrics total reward; components logged: accuracy, format, rubric, brevity, ..."""

    def __init__(self, judge: str | dict[str, Any] = "rule", lambda_rubric: float = 0.5,
                 lambda_brevity: float = 0.1, think_budget: int = 256, acc_weight: float = 0.9,
                 format_weight: float = 0.1, max_proposals: int = 3, top_k: int = 5,
                 log_path: str = "", writer: dict[str, Any] | None = None):
        self.name = "audio_rubrics"
        self.judge = make_judge(judge)
        self.lambda_rubric, self.lambda_brevity = float(lambda_rubric), float(lambda_brevity)
        self.think_budget = int(think_budget)
        self.acc_weight, self.format_weight = float(acc_weight), float(format_weight)
        self.max_proposals, self.top_k = int(max_proposals), int(top_k)
        self.log_path = Path(log_path) if log_path else None
        self._static: dict[str, list[dict[str, Any]]] = {}
        self.book = RubricBook.from_spec(writer) if writer else None
        """The writer's per-sample rubrics (None: templated rubrics only)."""

    @property
    def max_total(self) -> float:
        return self.acc_weight + self.format_weight + self.lambda_rubric + self.lambda_brevity

    # -- evidence and static rubrics ---------------------------------------------------------
    def evidence_of(self, example: Example) -> list[dict[str, Any]]:
        stored = example.meta.get("evidence")
        if stored:
            return stored if isinstance(stored, list) else [stored]
        return [evidence_for(audio) for audio in example.audios]

    def static_of(self, example: Example, evidence: list[dict[str, Any]]) -> list[Rubric]:
        rows = example.meta.get("rubrics")
        if rows is None:
            key = f"{example.id}|{example.prompt}"
            if key not in self._static:
                self._static[key] = static_rubrics(evidence, example.prompt) if evidence else []
            rows = self._static[key]
        return [Rubric.from_dict(r) for r in rows]

    def rubrics_of(self, example: Example, evidence: list[dict[str, Any]]
                   ) -> tuple[list[Rubric], dict[str, Any]]:
        """The sample's rubrics (step 1) and where they came from, for the log."""
        if example.meta.get("rubric_source") == "written":
            return [Rubric.from_dict(r) for r in example.meta["rubrics"]], {
                "rubric_source": "stored_written"}
        if self.book is None:
            return self.static_of(example, evidence), {"rubric_source": "template"}
        entry = self.book.rubrics(f"{example.id}|{example.prompt}", sample_of(example, evidence),
                                  lambda: [r.to_dict() for r in self.static_of(example, evidence)])
        info = {"rubric_source": entry["source"],
                "writer": {"name": self.book.writer.name, **self.book.counts}}
        if entry["error"]:
            info["writer"]["error"] = entry["error"]
        return [Rubric.from_dict(r) for r in entry["rubrics"]], info

    # -- scoring -------------------------------------------------------------------------------
    def judge_context(self, example: Example, completions: list[str]) -> GroupContext:
        """What the judge sees: evidence, question, gold, each reasoning and its correctness."""
        answers = [extract_answer(c) for c in completions]
        correct = [a is not None and match(a, example.answer, example.choices) for a in answers]
        return GroupContext(example.prompt, example.answer, example.choices,
                            self.evidence_of(example), [reasoning_of(c) for c in completions],
                            correct)

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        ctx = self.judge_context(example, completions)
        correct, reasonings = ctx.correct, ctx.reasonings
        formatted = [is_well_formatted(c) for c in completions]
        static, origin = self.rubrics_of(example, ctx.evidence)
        record: dict[str, Any] = {"progress": round(progress, 4),
                                  "example": example.id, "gold": example.answer,
                                  "judge": self.judge.name, **origin}
        try:
            rubric, table = self.evolve(ctx, static)
            record["source"] = "evolved"
        except (JudgeError, OSError, ValueError, KeyError, TypeError) as err:
            rubric, table = self.static_score(ctx, static)
            record.update(source="static_fallback", error=f"{type(err).__name__}: {err}")
        out = []
        for g, text in enumerate(completions):
            brevity = 1.0 - min(think_tokens(reasonings[g]), self.think_budget) / self.think_budget
            total = (self.acc_weight * correct[g] + self.format_weight * formatted[g]
                     + self.lambda_rubric * rubric[g] + self.lambda_brevity * brevity)
            out.append({"overall": total, "accuracy": float(correct[g]),
                        "format": float(formatted[g]), "rubric": rubric[g], "brevity": brevity,
                        "rubrics_kept": float(sum(r["kept"] for r in table)),
                        "fallback": float(record["source"] == "static_fallback")})
            if self.book is not None:
                out[-1]["writer_fallback"] = float(origin["rubric_source"] == "writer_fallback")
        if self.log_path is not None:
            record.update(rubrics=table, correct=correct, rubric_reward=rubric,
                          overall=[s["overall"] for s in out],
                          completions=[c[:400] for c in completions])
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        return out

    def evolve(self, ctx: GroupContext, static: list[Rubric]
               ) -> tuple[list[float], list[dict[str, Any]]]:
        """Steps 2-5 with the configured judge; raises JudgeError (or a parse error) on failure."""
        G = len(ctx.reasonings)
        proposed, verdicts = self.judge.evaluate(ctx, static, self.max_proposals)
        proposed = proposed[:self.max_proposals]
        pool = static + proposed
        if len(verdicts) != len(pool) or any(len(v) != G for v in verdicts):
            raise JudgeError(f"judge gave {len(verdicts)} verdict rows for {len(pool)} rubrics")
        satisfied = [[float(v) if r.polarity > 0 else 1.0 - float(v) for v in row]
                     for r, row in zip(pool, verdicts)]                       # [K][G], flipped
        sigma = [spread(row) for row in satisfied]                            # σ_k
        alive = [k for k in range(len(pool)) if sigma[k] > 0]
        kept = sorted(alive, key=lambda k: -sigma[k])[:self.top_k]         # stable on ties
        kept.sort()
        weights: list[float] = []
        weight_source = "none"
        if kept:
            try:
                weights = finite_weights(self.judge.weigh(ctx, [pool[k] for k in kept]), len(kept))
                weight_source = "judge" if weights is not None else "uniform"
            except (JudgeError, OSError, ValueError, KeyError, TypeError):
                weights, weight_source = None, "uniform"
            weights = weights or [1.0 / len(kept)] * len(kept)
        w_of = dict(zip(kept, weights))
        rubric = [sum(w_of[k] * satisfied[k][g] for k in kept) if kept else 0.5 for g in range(G)]
        table = [{**r.to_dict(), "weight": w_of.get(k), "std": sigma[k], "kept": k in w_of,
                  "verdicts": [bool(v) for v in verdicts[k]], "satisfied": satisfied[k],
                  "weight_source": weight_source if k in w_of else None}
                 for k, r in enumerate(pool)]
        return rubric, table

    def static_score(self, ctx: GroupContext, static: list[Rubric]
                     ) -> tuple[list[float], list[dict[str, Any]]]:
        """The fallback: stored rubrics and weights, judged by the rule-based judge."""
        G = len(ctx.reasonings)
        usable = [r for r in static if r.check]
        weights = finite_weights([r.weight for r in usable], len(usable)) if usable else None
        if not weights:
            return [0.5] * G, [{**r.to_dict(), "kept": False} for r in static]
        table, rubric = [], [0.0] * G
        for r, w in zip(usable, weights):
            verdicts = [check_satisfied(r.check, t) for t in ctx.reasonings]
            sat = [float(v) if r.polarity > 0 else 1.0 - float(v) for v in verdicts]
            rubric = [acc + w * s for acc, s in zip(rubric, sat)]
            table.append({**r.to_dict(), "weight": w, "kept": True, "verdicts": verdicts,
                          "satisfied": sat, "std": spread(sat)})
        return rubric, table
