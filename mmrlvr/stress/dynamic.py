"""`mmrlvr stress --dynamic K`: each question asked K times, each time in a freshly drawn wording.

PIRL's dynamic evaluation, in our reading: where the fixed operators ask one rewrite per
operator, a dynamic draw composes the meaning-preserving text operators (`mmrlvr.stress.ops`)
anew for every draw k of every question, from a generator seeded by (seed, k, question id):

    paraphrase (p 1/2, where a reviewed rule applies) -> option shuffle (p 1/2, multiple choice)
    -> option relabel (p 1/2) -> irrelevant context (p 1/2) -> a held-out template (always)
    -> another format instruction (p 1/2)

The gold is checked to survive every draw (`gold_preserved`). Per question: the share of its K
draws answered right (`mean`) and whether all K were (`worst`, the worst case). Overall, for all
rows and for closed and open questions apart: mean and worst-case accuracy, their drops from
the clean accuracy in points with 95 % paired bootstrap intervals over questions, and how many
distinct prompts the K draws gave on average (a template pool or paraphrase list that cannot
vary a question shows here).
"""
from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np

from mmrlvr.data import Example
from mmrlvr.stress.ops import TEXT_AND_IMAGE, Variant, gold_preserved
from mmrlvr.stress.answers import SUBSETS, answer, record

CHAIN = (("paraphrase", 0.5), ("option_shuffle", 0.5), ("option_relabel", 0.5),
         ("irrelevant_context", 0.5), ("template_swap", 1.0), ("format_instruction", 0.5))
"""The text operators a draw composes, in order, each applied with its probability (our choice)."""


def draw(ex: Example, format_prompt: str, seed: int, k: int) -> Variant:
    """Draw `k` of question `ex`: the composed rewrite above, seeded by (seed, k, id)."""
    rng = random.Random(hashlib.sha1(f"{seed}|dynamic|{k}|{ex.id}".encode()).hexdigest())
    v = Variant(ex, format_prompt)
    for name, p in CHAIN:
        if rng.random() < p:
            nv = TEXT_AND_IMAGE[name].fn(v.example, v.format_prompt, rng)
            v = nv if nv is not None else v
    if not gold_preserved(ex, v.example):
        raise AssertionError(f"dynamic draw {k} broke the gold of sample {ex.id}")
    return v


def run_dynamic(policy, engine, examples: list[Example], k: int, *, format_prompt: str = "",
                system_prompt: str = "", batch_size: int = 32, max_new_tokens: int = 64,
                seed: int = 0, progress: bool = True) -> list[dict[str, Any]]:
    """K draws of every question answered greedily; one record per answer (`draw` = k)."""
    if k < 1:
        raise ValueError(f"--dynamic K needs K >= 1, got {k}")
    jobs = []
    for row, ex in enumerate(examples):
        for j in range(k):
            v = draw(ex, format_prompt, seed, j)
            jobs.append(("dynamic", row, v.example, v.format_prompt, j))
    out = []
    for (name, row, ex, fmt, j), text in answer(policy, engine, jobs, system_prompt=system_prompt,
                                                batch_size=batch_size, max_new_tokens=max_new_tokens,
                                                progress=progress, desc="dynamic"):
        out.append({**record(name, "text", row, ex, examples[row], fmt, text), "draw": j})
    out.sort(key=lambda r: (r["row"], r["draw"]))
    return out


def per_question(records: list[dict[str, Any]], clean: dict[int, dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """Each question's draws: its clean answer, mean and worst case over the draws."""
    rows: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        rows.setdefault(r["row"], []).append(r)
    out = []
    for row, mine in sorted(rows.items()):
        right = [bool(r["correct"]) for r in mine]
        out.append({"row": row, "id": mine[0]["id"], "answer_type": mine[0]["answer_type"],
                    "clean": bool(clean[row]["correct"]), "draws": len(mine),
                    "mean": float(np.mean(right)), "worst": float(all(right)),
                    "distinct_prompts": len({(r["prompt"], r["format_prompt"]) for r in mine})})
    return out


def summarize_dynamic(records: list[dict[str, Any]], clean: dict[int, dict[str, Any]],
                      n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Per question and overall (all / closed / open) figures, from the raw records alone."""
    questions = per_question(records, clean)
    overall = {}
    for subset in SUBSETS:
        qs = [q for q in questions if subset == "all" or q["answer_type"] == subset]
        overall[subset] = _figures(qs, n_boot, seed)
    k = max((q["draws"] for q in questions), default=0)
    return {"k": k, "overall": overall, "questions": questions}


def _figures(qs: list[dict[str, Any]], n_boot: int, seed: int) -> dict[str, Any]:
    if not qs:
        return {"n": 0}
    c = np.array([q["clean"] for q in qs], dtype=float)                        # [n]
    m = np.array([q["mean"] for q in qs])                                       # [n]
    w = np.array([q["worst"] for q in qs])                                      # [n]
    idx = np.random.default_rng(seed).integers(0, len(qs), size=(n_boot, len(qs)))   # [B, n]
    ci = lambda d: [float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))]
    return {"n": len(qs), "clean_accuracy": float(c.mean()), "mean_accuracy": float(m.mean()),
            "worst_accuracy": float(w.mean()),
            "mean_drop": float(100 * (c.mean() - m.mean())),
            "mean_drop_ci95": ci(100 * (c[idx].mean(1) - m[idx].mean(1))),
            "worst_drop": float(100 * (c.mean() - w.mean())),
            "worst_drop_ci95": ci(100 * (c[idx].mean(1) - w[idx].mean(1))),
            "distinct_prompts_mean": float(np.mean([q["distinct_prompts"] for q in qs]))}


def report_lines(dyn: dict[str, Any]) -> list[str]:
    """The report.md section of a dynamic evaluation."""
    lines = [f"## Dynamic evaluation ({dyn['k']} fresh draws per question)", "",
             "Each draw composes the text operators anew (mmrlvr/stress/dynamic.py); mean = share "
             "of a question's draws answered right, worst = all of them right; drops in points "
             "from the clean accuracy, 95% paired bootstrap intervals over questions.", "",
             "| subset | n | clean | mean | mean drop [95% CI] | worst case | worst drop [95% CI] "
             "| distinct prompts |", "|---|---|---|---|---|---|---|---|"]
    for s in SUBSETS:
        f = dyn["overall"][s]
        if not f["n"]:
            continue
        (ml, mh), (wl, wh) = f["mean_drop_ci95"], f["worst_drop_ci95"]
        lines.append(f"| {s} | {f['n']} | {f['clean_accuracy']:.3f} | {f['mean_accuracy']:.3f} | "
                     f"{f['mean_drop']:+.1f} [{ml:+.1f}, {mh:+.1f}] | {f['worst_accuracy']:.3f} | "
                     f"{f['worst_drop']:+.1f} [{wl:+.1f}, {wh:+.1f}] | "
                     f"{f['distinct_prompts_mean']:.1f} |")
    return lines + [""]
