"""Paired statistics for comparing two models on the same questions (pure numpy).

    paired_bootstrap(a, b)   mean(b − a) over questions with a 95 % percentile interval from
                             resampling the questions (the same resample for both sides)
    mcnemar_exact(b, c)      two-sided exact McNemar p: a binomial test of the discordant pairs
                             (b: right before, wrong after; c: wrong before, right after) at 1/2
"""
from __future__ import annotations

import math

import numpy as np


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of b vs c discordant pairs at 1/2."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int = 2000, seed: int = 0
                     ) -> tuple[float, tuple[float, float]]:
    """mean(b − a) and its 95 % percentile interval over `n_boot` resamples of the questions.

    a, b [n] per-question values (correctness 0/1, or a graded reward) of the same questions.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired values need two equal non-empty vectors, got {a.shape}, {b.shape}")
    diff = b - a                                                            # [n]
    idx = np.random.default_rng(seed).integers(0, len(diff), size=(n_boot, len(diff)))   # [B, n]
    means = diff[idx].mean(axis=1)                                          # [B]
    return float(diff.mean()), (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def mean_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval (0 for a single value)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), 0.0
    from scipy.stats import t

    return float(x.mean()), float(t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
