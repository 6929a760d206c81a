"""The arithmetic of a group judged by a model that hears: scores, spreads, what to replace.

A group of G rollouts and K criteria, the judge's verdicts v[g] (K yes/no, or None: its reply
was malformed). With p_k the polarity,

    s_kg = v_gk if p_k > 0 else 1 − v_gk        for a well-formed reply
    s_kg = 0                                    for a malformed one (fail closed: no credit,
                                                and a negative criterion is not credited either)
    σ_k  = population std of s_k· over the group
    kept = the `top_k` criteria with σ_k > 0 (ties keep the earlier one)
    w_k  = the criterion's stored weight, renormalised over `kept` (uniform if they sum to 0)
    R_g  = Σ_{k ∈ kept} w_k·s_kg                (0.5 when nothing is kept: no rubric signal)

Regeneration (every `regenerate_every` steps, our schedule): over the well-formed replies only
(at least two), a criterion every one meets or none does (σ = 0) is replaced; the others stay,
reweighted w_k ∝ σ_k (how much they separate this group, as `judges.separation_weights`); the
replacements come in at the kept ones' mean weight (1 each when none is kept), and the set is
renormalised to sum 1.
"""
from __future__ import annotations

from typing import Any

from mmrlvr.methods.audio_rubrics.judges import Rubric, spread


def satisfied(criteria: list[Rubric], verdicts: list[list[bool] | None]) -> list[list[float]]:
    """s[k][g] (the module doc)."""
    return [[0.0 if v is None else (float(v[k]) if r.polarity > 0 else 1.0 - float(v[k]))
             for v in verdicts] for k, r in enumerate(criteria)]


def score_group(criteria: list[Rubric], verdicts: list[list[bool] | None], top_k: int
                ) -> tuple[list[float], list[dict[str, Any]]]:
    """R_g per rollout and the table of criteria (for the log)."""
    G = len(verdicts)
    s = satisfied(criteria, verdicts)                                     # [K][G]
    sigma = [spread(row) for row in s] if criteria else []
    alive = [k for k in range(len(criteria)) if sigma[k] > 0]
    kept = sorted(sorted(alive, key=lambda k: -sigma[k])[:top_k])
    raw = [max(criteria[k].weight, 0.0) for k in kept]
    total = sum(raw)
    weights = [w / total for w in raw] if total > 0 else [1.0 / max(len(kept), 1)] * len(kept)
    w_of = dict(zip(kept, weights))
    rubric = [sum(w_of[k] * s[k][g] for k in kept) if kept else 0.5 for g in range(G)]
    table = [{**r.to_dict(), "weight": w_of.get(k), "std": sigma[k], "kept": k in w_of,
              "verdicts": [None if v is None else bool(v[k]) for v in verdicts], "satisfied": s[k]}
             for k, r in enumerate(criteria)]
    return rubric, table


def replacement_plan(criteria: list[Rubric], verdicts: list[list[bool] | None]
                     ) -> tuple[list[tuple[Rubric, float]], list[tuple[Rubric, int]]] | None:
    """(kept with σ over the well-formed replies, replaced with how many met each), or None when
    fewer than two replies were well formed (no spread to read)."""
    ok = [v for v in verdicts if v is not None]
    if len(ok) < 2 or not criteria:
        return None
    kept, replaced = [], []
    for k, r in enumerate(criteria):
        met = [float(v[k]) for v in ok]
        sigma = spread([m if r.polarity > 0 else 1.0 - m for m in met])
        if sigma > 0:
            kept.append((r, sigma))
        else:
            replaced.append((r, int(sum(met))))
    return kept, replaced


def new_set(kept: list[tuple[Rubric, float]], new: list[dict[str, Any]], step: int
            ) -> list[dict[str, Any]]:
    """The regenerated criteria as rubric dicts: kept ones reweighted ∝ σ, the new ones at the
    kept mean, all summing to 1 (the module doc); ids `r<step>.<k>` for the new."""
    total_sigma = sum(s for _, s in kept)
    rows = [{**r.to_dict(), "weight": s / total_sigma} for r, s in kept] if total_sigma else []
    mean = sum(row["weight"] for row in rows) / len(rows) if rows else 1.0
    for k, row in enumerate(new):
        rows.append({**row, "id": f"r{step}.{k + 1}", "weight": mean, "origin": "regenerated"})
    total = sum(row["weight"] for row in rows)
    return [{**row, "weight": row["weight"] / total} for row in rows] if total > 0 else []


__all__ = ["new_set", "replacement_plan", "satisfied", "score_group"]
