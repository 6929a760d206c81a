"""AudioRubrics: self-evolving, audio-grounded rubric rewards (docs/audio.md, "AudioRubrics").

`writer` and `judge` are each `rules` (the offline default), `policy`, a local audio-model dir,
an endpoint that takes audio, or a text-only model (`roles.py` lists the specs). For each group
of G rollouts of one prompt, every step:

  1. the sample's rubrics. With a model writer: written from the clip, the question, options,
     gold and the measured evidence once per sample (all of a step's missing samples in one
     batch), cached in `RUN/rubric_cache.jsonl` (keyed by sample and writer; a resumed run reads
     them back), or stored with the dataset by `write_rubrics` (`meta.rubric_source: written`);
     when the writer fails, the templated rubrics below, counted. With `writer: rules`: the
     templated rubrics stored with the sample (`meta.rubrics`, from the waveform's acoustic
     evidence by `evidence.static_rubrics`), else templated here from `meta.evidence` or the file;
  2. the judge.
     A judge that hears (`policy`, a dir, an endpoint with audio): every criterion on every
     rollout, with the clip, one request per rollout, all of the step's in one batch; the group
     score is `heard.score_group` (malformed replies score 0 and are counted). Every
     `regenerate_every` steps (default 1; 0: never) the criteria every well-formed reply met or
     none did are replaced by the writer from the group's rollouts (the rule proposals with
     `writer: rules`) and the rest reweighted ∝ their spread (`heard.py`); the new set is used
     from the sample's next visit and recorded in the cache file with its step.
     The rule judge or a text LLM judge (`judges.py`): it sees evidence, question, gold, the
     rubrics and every rollout's reasoning tagged correct/wrong, proposes up to `max_proposals`
     new rubrics and says yes/no for every rubric on every rollout -> s_kg; negative rubrics are
     flipped (s <- 1 - s), rubrics with zero spread dropped, the `top_k` with the largest
     standard deviation kept, weighted by the judge (uniform if it fails; the rule judge:
     w_k ∝ σ_k);
  3. R_rubric_g = Σ_k w_k · s_kg ∈ [0, 1] (0.5 when no rubric is left);

    overall = w_acc·acc + w_fmt·format + λ_r·R_rubric + λ_o·(1 − min(think, budget)/budget)

with acc/format from `rewards.verify` and `rewards.format`, `think` the reasoning's token count
(words and punctuation marks) and the defaults w_acc 0.9, w_fmt 0.1, λ_r 0.5, λ_o 0.1 (options
`acc_weight`, `format_weight`, `lambda_rubric`, `lambda_brevity`), budget 256, so
overall ∈ [0, 1.6]. A judge failure (the text judges' call, or every reply of a group malformed)
falls back to the static rubrics with their stored weights, judged by the rule-based judge.

Per completion the components accuracy, format, rubric, brevity, rubrics_kept, fallback; with a
model writer writer_fallback (1 where its sample's rubrics fell back to templates) and
writer_malformed (the step's malformed writer replies); with a judge that hears the step's
regenerated_frac (criteria replaced / criteria judged), criterion_spread (mean σ_k over the
well-formed replies), judge_s (seconds in the judge) and judge_malformed (malformed replies).
They are the same on every completion of a step, so the trainer's mean, logged as
`reward/audio_rubrics/<name>`, is the step's figure.

Audit: with `log_path` set, every group appends one JSON line: the rubrics (with polarity,
weight, standard deviation, kept or not, and the verdict on every rollout), the correctness,
R_rubric and the total of every rollout, which judge answered, where the rubrics came from
(`rubric_source`: template, written, stored_written, writer_fallback, regenerated), what was
replaced and its replacements, the first judge errors and any failure. `run_dir` (default: the
folder of `log_path`) is where the cache goes and whose `config.yaml` gives `policy` its
`model.path` and the step its number (progress × train.steps).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from mmrlvr.data import Example
from mmrlvr.methods.audio_rubrics.evidence import evidence_for, static_rubrics
from mmrlvr.methods.audio_rubrics.heard import new_set, replacement_plan, score_group
from mmrlvr.methods.audio_rubrics.judges import (
    GroupContext,
    JudgeError,
    Rubric,
    RuleJudge,
    check_satisfied,
    finite_weights,
    make_judge,
    reasoning_of,
    spread,
)
from mmrlvr.methods.audio_rubrics.roles import HeardJudge, hears, is_rules, make_hearer, run_config
from mmrlvr.methods.audio_rubrics.writer import Regenerated, RubricBook, sample_of
from mmrlvr.train.writes import append_line
from rewards.format import is_well_formatted
from rewards.isolation import ScoresGroups
from rewards.verify import extract_answer, match

_TOKEN = re.compile(r"\w+|[^\w\s]")


def think_tokens(reasoning: str) -> int:
    """Token count of a reasoning, approximated as words plus punctuation marks."""
    return len(_TOKEN.findall(reasoning))


class AudioRubricsReward(ScoresGroups):
    """The AudioRubrics total reward; components logged: accuracy, format, rubric, brevity, ..."""

    def __init__(self, judge: Any = "rule", lambda_rubric: float = 0.5,
                 lambda_brevity: float = 0.1, think_budget: int = 256, acc_weight: float = 0.9,
                 format_weight: float = 0.1, max_proposals: int = 3, top_k: int = 5,
                 log_path: str = "", writer: Any = "rules", run_dir: str = "",
                 regenerate_every: int = 1, show_evidence: bool = True):
        self.name = "audio_rubrics"
        self.lambda_rubric, self.lambda_brevity = float(lambda_rubric), float(lambda_brevity)
        self.think_budget = int(think_budget)
        self.acc_weight, self.format_weight = float(acc_weight), float(format_weight)
        self.max_proposals, self.top_k = int(max_proposals), int(top_k)
        self.regenerate_every = int(regenerate_every)
        self.log_path = Path(log_path) if log_path else None
        self.run_dir = Path(run_dir) if run_dir else (self.log_path.parent if self.log_path else None)
        """Where the rubric cache goes and whose config.yaml names `policy` (model.path)."""
        saved = run_config(self.run_dir)
        policy_path = (saved.get("model") or {}).get("path")
        self.total_steps = int((saved.get("train") or {}).get("steps") or 0)
        """train.steps of the run (0: unknown; then each score_groups call is one step)."""
        self._calls = 0
        self._static: dict[str, list[dict[str, Any]]] = {}
        shared: dict[str, Any] = {}                 # one copy of a model both roles name
        cache = self.run_dir / "rubric_cache.jsonl" if self.run_dir else None
        self.book = None
        """The writer's per-sample rubrics (None: `writer: rules`, templated rubrics only)."""
        if not is_rules(writer):
            if isinstance(writer, str):
                writer = {"kind": "policy"} if writer == "policy" else {"kind": "local", "model": writer}
            if isinstance(writer, dict) and "cache_path" not in writer and cache is not None:
                writer = {**writer, "cache_path": str(cache)}
            self.book = RubricBook.from_spec(writer, policy_path, shared)
            cache = self.book.path or cache
        self.heard = None
        """The judge that hears the audio (None: the rule judge or a text LLM judge)."""
        if hears(judge):
            hearer, retries, rest = make_hearer(judge, "audio_rubrics judge", policy_path, shared)
            if rest:
                raise ValueError(f"audio_rubrics judge: unknown option(s) {sorted(rest)}")
            self.heard = HeardJudge(hearer, retries, show_evidence)
            self.judge = RuleJudge()                # the static fallback's judge
        else:
            self.judge = make_judge("rule" if is_rules(judge) else
                                    {k: v for k, v in judge.items() if k != "audio"})
        self.regenerated = Regenerated(cache, self.book.writer.name if self.book else "rules") \
            if self.heard is not None else None

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

    def key_of(self, example: Example) -> str:
        return f"{example.id}|{example.prompt}"

    def step_of(self, progress: float) -> int:
        """The training step being scored: progress × train.steps, else a count of calls."""
        self._calls += 1
        return int(round(progress * self.total_steps)) if self.total_steps else self._calls

    def score_groups(self, examples: list[Example], groups: list[list[str]], progress: float = 0.0,
                     completion_ids: Any = None) -> list[list[dict[str, float]]]:
        """Every group of a step: the writer's missing rubrics first, in one batch; then the
        rule / text-LLM judge group by group, or the judge that hears, every rollout in one batch."""
        step = self.step_of(progress)
        malformed_before = self.book.writer.malformed if self.book else 0
        contexts = [self.judge_context(ex, g) for ex, g in zip(examples, groups)]
        if self.book is not None:
            self.book.prefetch([(self.key_of(ex), sample_of(ex, ctx.evidence),
                                 lambda ex=ex, ctx=ctx: [r.to_dict() for r in self.static_of(ex, ctx.evidence)])
                                for ex, ctx in zip(examples, contexts)
                                if ex.meta.get("rubric_source") != "written"])
        if self.heard is None:
            out = [self._score_rules(ex, g, ctx, progress)
                   for ex, g, ctx in zip(examples, groups, contexts)]
        else:
            out = self._score_heard(examples, groups, contexts, progress, step)
        if self.book is not None:
            bad = float(self.book.writer.malformed - malformed_before)
            for group in out:
                for s in group:
                    s["writer_malformed"] = bad
        return out

    def _totals(self, completions: list[str], ctx: GroupContext, rubric: list[float],
                kept: int, fallback: bool) -> list[dict[str, float]]:
        out = []
        for g, text in enumerate(completions):
            brevity = 1.0 - min(think_tokens(ctx.reasonings[g]), self.think_budget) / self.think_budget
            formatted = is_well_formatted(text)
            total = (self.acc_weight * ctx.correct[g] + self.format_weight * formatted
                     + self.lambda_rubric * rubric[g] + self.lambda_brevity * brevity)
            out.append({"overall": total, "accuracy": float(ctx.correct[g]),
                        "format": float(formatted), "rubric": rubric[g], "brevity": brevity,
                        "rubrics_kept": float(kept), "fallback": float(fallback)})
        return out

    def _log(self, record: dict[str, Any], out: list[dict[str, float]], completions: list[str],
             ctx: GroupContext, rubric: list[float], table: list[dict[str, Any]]) -> None:
        if self.log_path is not None:
            record.update(rubrics=table, correct=ctx.correct, rubric_reward=rubric,
                          overall=[s["overall"] for s in out],
                          completions=[c[:400] for c in completions])
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            append_line(self.log_path, json.dumps(record) + "\n")

    def _score_rules(self, example: Example, completions: list[str], ctx: GroupContext,
                     progress: float) -> list[dict[str, float]]:
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
        out = self._totals(completions, ctx, rubric, sum(r["kept"] for r in table),
                           record["source"] == "static_fallback")
        if self.book is not None:
            for s in out:
                s["writer_fallback"] = float(origin["rubric_source"] == "writer_fallback")
        self._log(record, out, completions, ctx, rubric, table)
        return out

    def _score_heard(self, examples: list[Example], groups: list[list[str]],
                     contexts: list[GroupContext], progress: float, step: int
                     ) -> list[list[dict[str, float]]]:
        """The judge that hears: every criterion on every rollout (one batch for the step), the
        group's score (`heard.score_group`), then, every `regenerate_every` steps, the criteria
        no rollout or every rollout met replaced by the writer from the group's rollouts."""
        statics, criteria, origins = [], [], []
        for ex, ctx in zip(examples, contexts):
            static, origin = self.rubrics_of(ex, ctx.evidence)
            regenerated = self.regenerated.latest(self.key_of(ex), step)
            if regenerated is not None:
                origin = {**origin, "rubric_source": "regenerated"}
            statics.append(static)
            criteria.append(static if regenerated is None else [Rubric.from_dict(r) for r in regenerated])
            origins.append(origin)
        t0 = time.perf_counter()
        verdicts, errors = self.heard.judge_groups(contexts, criteria, [ex.audios for ex in examples])
        judge_s = time.perf_counter() - t0
        asked = [v for crit, vs in zip(criteria, verdicts) if crit for v in vs]
        regen = self._regenerate(examples, contexts, criteria, verdicts, step) \
            if self.regenerate_every > 0 and step % self.regenerate_every == 0 else {}
        n_criteria = sum(len(c) for c in criteria)
        spreads = [s for b in range(len(examples)) if (p := replacement_plan(criteria[b], verdicts[b]))
                   for s in [sig for _, sig in p[0]] + [0.0] * len(p[1])]
        step_stats = {"regenerated_frac": sum(len(r[0]) for r in regen.values()) / n_criteria
                      if n_criteria else 0.0,
                      "criterion_spread": sum(spreads) / len(spreads) if spreads else 0.0,
                      "judge_s": judge_s, "judge_malformed": float(sum(v is None for v in asked))}
        out = []
        for b, (ex, completions, ctx) in enumerate(zip(examples, groups, contexts)):
            record: dict[str, Any] = {"progress": round(progress, 4), "step": step,
                                      "example": ex.id, "gold": ex.answer,
                                      "judge": self.heard.name, **origins[b]}
            if criteria[b] and any(v is not None for v in verdicts[b]):
                rubric, table = score_group(criteria[b], verdicts[b], self.top_k)
                record["source"] = "judged"
            else:
                rubric, table = self.static_score(ctx, statics[b])
                record.update(source="static_fallback",
                              error="no criteria" if not criteria[b] else "every judge reply malformed")
            if b in regen:
                record["replaced"] = [r.id for r in regen[b][0]]
                record["regenerated"] = regen[b][1]
            if errors:
                record["judge_errors"] = errors
            scores = self._totals(completions, ctx, rubric, sum(bool(r["kept"]) for r in table),
                                  record["source"] == "static_fallback")
            for s in scores:
                s.update(step_stats)
                if self.book is not None:
                    s["writer_fallback"] = float(origins[b]["rubric_source"] == "writer_fallback")
            self._log(record, scores, completions, ctx, rubric, table)
            out.append(scores)
        return out

    def _regenerate(self, examples: list[Example], contexts: list[GroupContext],
                    criteria: list[list[Rubric]], verdicts: list[list[Any]], step: int
                    ) -> dict[int, tuple[list[Rubric], list[dict[str, Any]] | str]]:
        """{group: (replaced criteria, the new set or the writer's error)}; new sets recorded."""
        plans = {b: p for b in range(len(examples))
                 if (p := replacement_plan(criteria[b], verdicts[b])) is not None and p[1]}
        if not plans:
            return {}
        items = [(b, sample_of(examples[b], contexts[b].evidence), contexts[b],
                  [r for r, _ in plans[b][0]], plans[b][1]) for b in plans]
        if self.book is not None:
            written = self.book.writer.regenerate_many(
                [(s, ctx, kept, replaced, len(replaced)) for _, s, ctx, kept, replaced in items])
        else:                                          # writer: rules, the rule proposals
            written = [[r.to_dict() for r in RuleJudge().propose(ctx, kept, len(replaced))]
                       for _, _, ctx, kept, replaced in items]
        out = {}
        for (b, _, _, _, replaced), new in zip(items, written):
            if isinstance(new, JudgeError):
                new = []
            rows = new_set(plans[b][0], new, step)
            if rows:
                self.regenerated.record(self.key_of(examples[b]), step, rows)
            out[b] = ([r for r, _ in replaced], rows or "nothing left: the written rubrics return")
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
