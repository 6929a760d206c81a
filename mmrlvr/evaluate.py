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

from collections import defaultdict
from typing import Any

from tqdm.auto import tqdm

import rewards
from mmrlvr.data import Example
from mmrlvr.rollout.base import SamplingParams


def evaluate(policy, engine, examples: list[Example], *, max_new_tokens: int,
             batch_size: int = 32, samples: int = 0, temperature: float = 1.0,
             system_prompt: str = "", format_prompt: str = "", progress: bool = False,
             keep_predictions: bool = False, reward=None) -> dict[str, Any]:
    """Evaluate on `examples`; `samples` > 0 adds pass@k with k = samples sampled completions;
    `reward` adds the mean reward of the greedy completions (total and per part)."""
    acc_reward, fmt_reward = rewards.get("accuracy"), rewards.get("format")
    correct, formatted, parsed, lengths, passed = [], [], [], [], []
    family_hits: dict[str, list[float]] = defaultdict(list)
    type_hits: dict[str, list[float]] = defaultdict(list)
    predictions = []
    graded: dict[str, list[float]] = defaultdict(list)
    bar = tqdm(total=len(examples), desc="eval", disable=not progress, leave=False)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        prompts = policy.adapter.encode(chunk, policy.processor, system_prompt=system_prompt,
                                        format_prompt=format_prompt)
        greedy = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
        lengths.extend(greedy.completion_mask.sum(dim=1).tolist())
        sampled = None
        if samples > 0:
            sampled = engine.generate(prompts, SamplingParams(
                n=samples, max_new_tokens=max_new_tokens, temperature=temperature))
        for i, ex in enumerate(chunk):
            text = greedy.texts[i]
            acc = acc_reward.score(ex, [text])[0]
            correct.append(acc["overall"])
            parsed.append(acc["parsed"])
            formatted.append(fmt_reward.score(ex, [text])[0]["overall"])
            family_hits[str(ex.meta.get("family", "all"))].append(acc["overall"])
            if "answer_type" in ex.meta:
                type_hits[str(ex.meta["answer_type"])].append(acc["overall"])
            if reward is not None:
                for key, value in reward.score(ex, [text])[0].items():
                    graded["reward" if key == "overall" else f"reward/{key}"].append(float(value))
            if sampled is not None:
                group = sampled.texts[i * samples:(i + 1) * samples]
                passed.append(float(any(s["overall"] for s in acc_reward.score(ex, group))))
            if keep_predictions:
                predictions.append({"id": ex.id, "prompt": ex.prompt, "gold": ex.answer,
                                    "completion": text, "correct": bool(acc["overall"])})
        bar.update(len(chunk))
    bar.close()
    n = max(len(correct), 1)
    result: dict[str, Any] = {
        "n": len(correct),
        "accuracy": sum(correct) / n,
        "format_rate": sum(formatted) / n,
        "parse_rate": sum(parsed) / n,
        "mean_length": sum(lengths) / max(len(lengths), 1),
    }
    if samples > 0:
        result[f"pass@{samples}"] = sum(passed) / n
    for key, values in graded.items():
        result[key] = sum(values) / len(values)
    if len(family_hits) > 1:
        for fam, hits in sorted(family_hits.items()):
            result[f"family/{fam}"] = sum(hits) / len(hits)
    for kind, hits in sorted(type_hits.items()):
        result[f"answer_type/{kind}"] = sum(hits) / len(hits)
    if keep_predictions:
        result["predictions"] = predictions
    return result
