"""Difficulty-aware sampling (mmrlvr.methods.difficulty.sampler) against uniform order: a simulation and a
timing, printed as tables.

Simulation (fixed): 200 synthetic prompts in 10 families of 20; 3 families are never solved
(pass rate 0), 3 always (1), 4 in between (family rates 0.2, 0.4, 0.6, 0.8, each prompt ±0.1).
A family's prompts share a topic vocabulary (8 of its 12 topic words) plus 4 words from a common
pool, so TF-IDF links a family's members. A simulated policy draws G = 8 Bernoulli outcomes per
prompt; 100 steps of 8 prompts. Figure: the fraction of drawn groups with zero reward spread
(all 8 outcomes equal), by `mmrlvr.algo.zero_spread_fraction`, per seed, for uniform order
(PromptSampler), the difficulty sampler on text only, with `meta.family` edges, and with the
graph off (coupling 0: each prompt learns from its own rollouts only).

Timing: 2,000 prompts of 40 words from a 3,000-word vocabulary (a harder graph than real
templated prompts): graph build once, then the mean per-step cost of `next(8)` + `observe` over
50 steps, with decay 1 (the default) and 0.99 (every count changes each step).

    .venv/bin/python bench/difficulty_sampler.py [--seeds 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from mmrlvr.algo import zero_spread_fraction
from mmrlvr.methods.difficulty.sampler import DifficultySampler
from mmrlvr.train.sampler import PromptSampler

FAMILY_RATES = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.2, 0.4, 0.6, 0.8]


def synthetic_task(seed: int, per_family: int = 20) -> tuple[list[str], list[str], np.ndarray]:
    """texts, families and true pass rates of len(FAMILY_RATES)·per_family prompts, shuffled."""
    rng = np.random.default_rng(seed)
    common = [f"word{i}" for i in range(40)]
    texts, families, rates = [], [], []
    for f, rate in enumerate(FAMILY_RATES):
        topic = [f"topic{f}x{i}" for i in range(12)]
        for _ in range(per_family):
            words = list(rng.choice(topic, 8, replace=False)) + list(rng.choice(common, 4))
            rng.shuffle(words)
            texts.append(" ".join(words))
            families.append(f"family{f}")
            jitter = 0.0 if rate in (0.0, 1.0) else rng.uniform(-0.1, 0.1)
            rates.append(rate + jitter)
    order = rng.permutation(len(texts))
    return [texts[i] for i in order], [families[i] for i in order], np.array(rates)[order]


def simulate(sampler, rates: np.ndarray, seed: int, steps: int = 100, batch: int = 8,
             group: int = 8) -> tuple[float, set[int]]:
    """Zero-spread fraction over all drawn groups, and the set of prompts drawn."""
    rng = np.random.default_rng(10_000 + seed)
    groups, drawn = [], set()
    for _ in range(steps):
        idx = sampler.next(batch)
        outcomes = rng.random((batch, group)) < rates[idx][:, None]      # [B, G] Bernoulli
        groups.append(outcomes)
        drawn.update(idx)
        if hasattr(sampler, "observe"):
            sampler.observe(idx, outcomes.sum(axis=1).tolist(), group)
    rewards = torch.tensor(np.concatenate(groups), dtype=torch.float32)  # [steps·B, G]
    return zero_spread_fraction(rewards), drawn


def compare(seed: int) -> dict[str, float]:
    texts, families, rates = synthetic_task(seed)
    return {
        "uniform": simulate(PromptSampler(len(texts), seed), rates, seed)[0],
        "difficulty": simulate(DifficultySampler(texts, seed), rates, seed)[0],
        "+family": simulate(DifficultySampler(texts, seed, families=families), rates, seed)[0],
        "no graph": simulate(DifficultySampler(texts, seed, coupling=0.0), rates, seed)[0],
    }


def timing(n: int = 2000, steps: int = 50) -> None:
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(3000)]
    texts = [" ".join(rng.choice(vocab, 40)) for _ in range(n)]
    for decay in (1.0, 0.99):
        t = time.perf_counter()
        sampler = DifficultySampler(texts, 0, decay=decay)
        built = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(steps):
            idx = sampler.next(8)
            sampler.observe(idx, rng.binomial(8, 0.5, 8).tolist(), 8)
        per_step = (time.perf_counter() - t) / steps
        print(f"N={n} decay={decay}: graph {built:.2f} s ({len(sampler.src)} directed edges), "
              f"next(8)+observe {1000 * per_step:.1f} ms/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    rows = [compare(seed) for seed in range(args.seeds)]
    names = list(rows[0])
    print("zero-spread fraction of drawn groups (200 prompts, 100 steps x 8 prompts, G=8)")
    print("seed  " + "  ".join(f"{k:>10}" for k in names))
    for seed, row in enumerate(rows):
        print(f"{seed:>4}  " + "  ".join(f"{row[k]:>10.3f}" for k in names))
    print("mean  " + "  ".join(f"{np.mean([r[k] for r in rows]):>10.3f}" for k in names))
    timing()


if __name__ == "__main__":
    main()
