"""Held-out evaluation: greedy accuracy, pass@k, format rate, parse rate, mean length.

Accuracy goes through `rewards.verify` (via the `accuracy` reward), so eval and training agree.
Per-family accuracy is reported where rows carry `meta.family`, and closed vs open accuracy
(kept apart, as medical VQA reports them) where rows carry `meta.answer_type`. Given a `reward`
(any object with the `Reward.score` interface, e.g. the run's configured rewards), the greedy
completions are also scored with it: `reward` is their mean total and `reward/<part>` each
part's mean — how tasks whose answers are graded, not matched (TransAnyText patches), are
evaluated.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import rewards
from mmrlvr.core.prompting import Prompting
from mmrlvr.core.trajectory import trajectory_of
from mmrlvr.data import Example
from mmrlvr.rollout.base import SamplingParams
from mmrlvr.train.writes import write_atomic


def evaluate(policy, engine, examples: list[Example], *, max_new_tokens: int,
             batch_size: int = 32, samples: int = 0, temperature: float = 1.0,
             prompting: Prompting = Prompting(), progress: bool = False,
             keep_predictions: bool = False, reward=None) -> dict[str, Any]:
    """Evaluate on `examples`; `samples` > 0 adds pass@k with k = samples sampled completions;
    `reward` adds the mean reward of the greedy completions (total and per part); `prompting`:
    the system turn and format instruction the questions are asked with (no transform is
    applied here: pass `Prompting.plain()`'s kind)."""
    records = score_examples(policy, engine, examples, max_new_tokens=max_new_tokens,
                             batch_size=batch_size, samples=samples, temperature=temperature,
                             prompting=prompting, progress=progress, reward=reward)
    return aggregate(records, samples=samples, keep_predictions=keep_predictions)


def score_examples(policy, engine, examples: list[Example], *, max_new_tokens: int,
                   batch_size: int = 32, samples: int = 0, temperature: float = 1.0,
                   prompting: Prompting = Prompting(), progress: bool = False,
                   reward=None) -> list[dict[str, Any]]:
    """One record per example (its verdicts, length, graded reward parts and prediction), so a
    multi-process eval can score its share and gather the records before `aggregate`."""
    acc_reward, fmt_reward = rewards.get("accuracy"), rewards.get("format")
    records = []
    bar = tqdm(total=len(examples), desc="eval", disable=not progress, leave=False)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        prompts = prompting.encode(policy, chunk)
        greedy = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
        lengths = greedy.completion_mask.sum(dim=1).tolist()
        sampled = None
        if samples > 0:
            sampled = engine.generate(prompts, SamplingParams(
                n=samples, max_new_tokens=max_new_tokens, temperature=temperature))
        for i, ex in enumerate(chunk):
            text = greedy.texts[i]
            acc = acc_reward.score(ex, [text])[0]
            record = {"id": ex.id, "prompt": ex.prompt, "gold": ex.answer, "completion": str(text),
                      "correct": acc["overall"], "parsed": acc["parsed"],
                      "formatted": fmt_reward.score(ex, [text])[0]["overall"],
                      "length": lengths[i], "family": str(ex.meta.get("family", "all")),
                      "answer_type": str(ex.meta["answer_type"]) if "answer_type" in ex.meta
                      else None, "graded": {}}
            if (traj := trajectory_of(text)) is not None:    # with tools: every turn, not the last
                record["trajectory"] = traj.as_dict()
            if reward is not None:
                record["graded"] = {"reward" if key == "overall" else f"reward/{key}": float(value)
                                    for key, value in reward.score(ex, [text])[0].items()}
            if sampled is not None:
                group = sampled.texts[i * samples:(i + 1) * samples]
                record["passed"] = float(any(s["overall"] for s in acc_reward.score(ex, group)))
                record["k"] = samples
            records.append(record)
        bar.update(len(chunk))
    bar.close()
    return records


def aggregate(records: list[dict[str, Any]], samples: int = 0,
              keep_predictions: bool = False) -> dict[str, Any]:
    """The eval figures over `records` (`score_examples`, possibly gathered from several ranks)."""
    n = max(len(records), 1)
    mean = lambda key: sum(r[key] for r in records) / n  # noqa: E731
    result: dict[str, Any] = {
        "n": len(records),
        "accuracy": mean("correct"),
        "format_rate": mean("formatted"),
        "parse_rate": mean("parsed"),
        "mean_length": mean("length"),
    }
    if samples > 0:
        result[f"pass@{samples}"] = mean("passed")
    graded: dict[str, list[float]] = defaultdict(list)
    family_hits: dict[str, list[float]] = defaultdict(list)
    type_hits: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for key, value in r["graded"].items():
            graded[key].append(value)
        family_hits[r["family"]].append(r["correct"])
        if r["answer_type"] is not None:
            type_hits[r["answer_type"]].append(r["correct"])
    for key, values in graded.items():
        result[key] = sum(values) / len(values)
    if len(family_hits) > 1:
        for fam, hits in sorted(family_hits.items()):
            result[f"family/{fam}"] = sum(hits) / len(hits)
    for kind, hits in sorted(type_hits.items()):
        result[f"answer_type/{kind}"] = sum(hits) / len(hits)
    if keep_predictions:
        result["predictions"] = [question_record(r) for r in records]
    return result


def question_record(r: dict[str, Any]) -> dict[str, Any]:
    """One question's eval outcome as written to disk (what `mmrlvr compare` pairs by id)."""
    out = {"id": r["id"], "prompt": r["prompt"], "gold": r["gold"], "completion": r["completion"],
           "correct": bool(r["correct"]), "family": r["family"]}
    if "passed" in r:                              # pass@k: any of k samples correct
        out["passed"], out["k"] = bool(r["passed"]), r.get("k")
    out.update(r["graded"])                        # `reward` and `reward/<part>`, where scored
    if "trajectory" in r:                          # multi-turn: the turns, calls and results
        out["trajectory"] = r["trajectory"]
    return out


def evaluate_ranks(dist, policy, engine, examples: list[Example], **options: Any
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`evaluate` spread over the processes: each rank scores its share of `examples`, rank 0
    gets (figures, per-question records in example order); other ranks get ({}, [])."""
    records = score_examples(policy, engine, examples[dist.rank::dist.world], **options)
    parts = dist.gather(records)
    if not dist.main:
        return {}, []
    ordered = [r for i in range(len(examples)) for r in [parts[i % dist.world][i // dist.world]]]
    return aggregate(ordered, samples=options.get("samples", 0)), ordered


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    write_atomic(path, "".join(json.dumps(question_record(r), ensure_ascii=False) + "\n"
                               for r in records))   # whole or not at all; a full disk: one line


def cmd_eval(args) -> int:
    """`mmrlvr eval`: load the model, evaluate, print the figures, write them to --out."""
    import modalities
    from mmrlvr.config import ModelConfig, model_defaults
    from mmrlvr.data import load_dataset
    from mmrlvr.rollout import make_engine
    from mmrlvr.train.lengths import eval_budget
    from mmrlvr.train.policy import Policy, pick_device

    own = model_defaults(args.model)            # the model's bounds and budget where flags are 0
    mcfg = ModelConfig(path=args.model, modality=args.modality,
                       min_pixels=args.min_pixels or own.min_pixels,
                       max_pixels=args.max_pixels or own.max_pixels)
    adapter = modalities.get(mcfg.modality, min_pixels=mcfg.min_pixels, max_pixels=mcfg.max_pixels)
    max_new_tokens = args.max_new_tokens or own.max_new_tokens
    prompting = Prompting(system=args.system_prompt or "", format=args.format_prompt or "")
    budget = eval_budget(mcfg, max_new_tokens, prompting)
    data = load_dataset(args.data, on_error=args.on_error, budget=budget)    # before the weights
    policy = Policy.load(mcfg, adapter, pick_device(args.device))
    if args.limit:
        data = data[:args.limit]
    reward = None
    if args.reward:
        from rewards import build_combined
        reward = build_combined([{"name": name, "weight": 1.0} for name in args.reward])
    result = evaluate(policy, make_engine(args.backend, policy), data,
                      max_new_tokens=max_new_tokens, batch_size=args.batch_size,
                      samples=args.samples, temperature=args.temperature,
                      prompting=prompting, progress=True, keep_predictions=bool(args.out), reward=reward)
    preds = result.pop("predictions", None)
    width = max(len(k) for k in result)
    print(f"{'metric':<{width}}  value")
    for k, v in result.items():
        print(f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"metrics": result, "predictions": preds}, indent=2) + "\n")
        print(f"wrote {out}")
    return 0
