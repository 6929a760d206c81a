"""Difficulty-aware prompt sampling: a graph difficulty estimator shares rollout feedback between
similar prompts and draws the prompts whose groups are likely to have reward spread.

Seed: the graph difficulty estimator (prompts linked by similarity share rollout feedback through a
Potts prior over latent difficulty states, updated online by mean-field). Mechanism as built here:

- Latent state z_i ∈ {0..K−1} per prompt (K = `states`, 5 by default: pass-rate levels, our
  choice). State k has a Beta(a_k, b_k) over the pass rate, mean μ_k = (k + ½)/K and
  concentration `strength` (4, our choice): a_k = μ_k·strength, b_k = (1 − μ_k)·strength.
- Outcomes: prompt i has s_i successes in n_i rollouts, summed over every observation of it; in
  state k they have the Beta-Binomial likelihood
  BB(s | n, a, b) = C(n, s)·B(s + a, n − s + b) / B(a, b). Fractional successes (the accuracy
  component of a reward may lie between 0 and 1) enter as soft counts: C and B are taken through
  lgamma, which is the same formula extended to real s; C(n, s) does not depend on the state and
  cancels from the posterior.
- Potts prior on a similarity graph: p(z) ∝ Π_i π_k · exp(J·Σ_{i~j} w_ij [z_i = z_j]), J =
  `coupling` (1.0), π uniform (our choice). Mean-field, synchronous over all prompts, `sweeps` (3)
  sweeps after every `observe`, starting from the current beliefs (so evidence keeps spreading):
  q_i(k) ∝ π_k · exp(J·Σ_j w_ij q_j(k)) · BB(s_i | n_i, a_k, b_k).
  Weights are normalised per prompt (Σ_j w_ij = 1, our choice), so J is the strength of the
  neighbourhood's vote in nats whatever a prompt's degree.
- Graph: each prompt's `neighbours` (8) nearest by TF-IDF cosine over word 1–2-grams of the prompt
  text (tf 1 + log count, smooth idf, our choice), plus `family_weight` (0.5, our choice) for
  prompts sharing `meta.family` when families are given; edges with zero similarity are dropped,
  the kNN relation is symmetrised. Built once, deterministically (numpy; no model, no network).
- Sampling weight: the expected reward variance under the posterior,
  v_i = Σ_k q_i(k)·E[p(1 − p) | Beta(a_k + s_i, b_k + n_i − s_i)], scaled by 4 into (0, 1];
  P(i) = (1 − floor)·v_i^(1/T) / Σ_j v_j^(1/T) + floor/N, T = `temperature` (0.5, our choice:
  in the simulation of bench/difficulty_sampler.py it cut the zero-spread share from 0.385 at
  T = 1 to 0.273), `floor` (0.05): a fraction of every draw is uniform, so each prompt keeps
  probability ≥ floor/N.
  Before any observation all v_i are equal: the first draw is uniform.
- `decay` (1.0 = keep all evidence, our choice): every `observe` first multiplies all counts by
  it, so a policy that improves can leave old verdicts behind (e.g. 0.99 per step).

Draws are seeded by (seed, cursor) and are without replacement within one call (Gumbel top-k;
a call asking for more than N prompts takes whole rounds of N). `state_dict()` holds the counts,
the beliefs and the cursor as JSON; with it a resumed run draws what an uninterrupted one would.
With several processes every rank must `observe` the whole step's outcomes (gathered), so that all
ranks hold the same state and draw the same indices.
Cost: the graph O(nnz·N) once; a step O(N·K) for the draw and O(sweeps·(E + N)·K) for an update
(`python bench/difficulty_sampler.py` prints both).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from mmrlvr.train.options import declared

_WORD = re.compile(r"\w+")
_BLOCK = 128          # graph columns per block: memory O(nnz·_BLOCK), not O(N²)


def _lgamma(x: np.ndarray) -> np.ndarray:
    # math.lgamma per element: ~0.2 µs each, and free of torch's thread pool, which on a busy
    # machine made a 10k-element torch.lgamma cost ~15 ms
    return np.asarray(np.frompyfunc(math.lgamma, 1, 1)(x), dtype=np.float64)


def log_beta(a: Any, b: Any) -> np.ndarray:
    """log B(a, b) = lgamma(a) + lgamma(b) − lgamma(a + b), elementwise, float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return _lgamma(a) + _lgamma(b) - _lgamma(a + b)


def beta_binomial_logpmf(s: Any, n: Any, a: Any, b: Any) -> np.ndarray:
    """log BB(s | n, a, b) = log C(n, s) + log B(s + a, n − s + b) − log B(a, b); real s allowed."""
    s, n = np.asarray(s, dtype=np.float64), np.asarray(n, dtype=np.float64)
    log_choose = -np.log(n + 1) - log_beta(s + 1, n - s + 1)      # C(n, s) = 1 / ((n+1)·B(s+1, n−s+1))
    return log_choose + log_beta(s + a, n - s + b) - log_beta(a, b)


def _grams(text: str) -> list[str]:
    words = _WORD.findall(text.lower())
    return words + [f"{u} {v}" for u, v in pairwise(words)]


def similarity_graph(texts: Sequence[str], neighbours: int, families: Sequence[Any] | None = None,
                     family_weight: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetrised kNN graph of the texts: (src [E], dst [E], weight [E]), both directions listed.

    Similarity = TF-IDF cosine over word 1–2-grams (+ `family_weight` when both families are equal
    and not None). Only n-grams found in two or more texts can link texts; the rest still count in
    each text's norm.
    """
    n = len(texts)
    counts = [Counter(_grams(t)) for t in texts]
    df = Counter(g for c in counts for g in c)
    idf = {g: math.log((1 + n) / (1 + d)) + 1.0 for g, d in df.items()}
    shared = {g: j for j, g in enumerate(sorted(g for g, d in df.items() if d >= 2))}
    rows, cols, vals = [], [], []
    for i, c in enumerate(counts):
        weights = {g: (1.0 + math.log(k)) * idf[g] for g, k in c.items()}
        norm = math.sqrt(sum(w * w for w in weights.values())) or 1.0
        for g in sorted(weights):
            if g in shared:
                rows.append(i), cols.append(shared[g]), vals.append(weights[g] / norm)
    rows_a, cols_a, vals_a = np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64), np.array(vals)
    vocab = len(shared)
    row_ids, row_starts = np.unique(rows_a, return_index=True)           # texts with a shared n-gram
    fam = None
    if families is not None:
        codes = {f: c for c, f in enumerate(sorted({str(f) for f in families if f is not None}))}
        fam = np.array([-1 if f is None else codes[str(f)] for f in families])

    k = min(neighbours, n - 1)
    src, dst, wts = [], [], []
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        dense = np.zeros((stop - start, vocab))                         # [b, V] the block's rows
        sel = (rows_a >= start) & (rows_a < stop)
        dense[rows_a[sel] - start, cols_a[sel]] = vals_a[sel]
        sims = np.zeros((n, stop - start))                               # [N, b] cosine to the block
        if len(vals_a):                                                  # rows_a is sorted
            contrib = vals_a[:, None] * dense[:, cols_a].T                # [nnz, b]
            sims[row_ids] = np.add.reduceat(contrib, row_starts, axis=0)
        if fam is not None and family_weight:
            same = (fam[:, None] == fam[None, start:stop]) & (fam[:, None] >= 0)
            sims += family_weight * same
        sims[np.arange(start, stop), np.arange(stop - start)] = -np.inf  # no self loops
        if k <= 0:
            continue
        top = np.argpartition(-sims, k - 1, axis=0)[:k]                  # [k, b]
        col = np.broadcast_to(np.arange(stop - start), top.shape)
        sim = sims[top, col]
        keep = sim > 0
        src.append(start + col[keep]), dst.append(top[keep]), wts.append(sim[keep])
    none = [np.zeros(0, dtype=np.int64)]
    src_a, dst_a = np.concatenate(src or none), np.concatenate(dst or none)
    w_a = np.concatenate(wts or [np.zeros(0)])
    both_src, both_dst = np.concatenate([src_a, dst_a]), np.concatenate([dst_a, src_a])
    keys, first = np.unique(both_src * n + both_dst, return_index=True)   # each edge once per direction
    return keys // n, keys % n, np.concatenate([w_a, w_a])[first]


class DifficultySampler:
    """Draws prompt indices by estimated reward spread; `observe` feeds back each step's outcomes.

    Same interface as `PromptSampler` (`next(k)`, `cursor`) plus `observe`, `state_dict`,
    `load_state_dict` and `probabilities`. Options and defaults: the module docstring.
    """

    def __init__(self, texts: Sequence[str], seed: int, states: int = 5, coupling: float = 1.0,
                 neighbours: int = 8, sweeps: int = 3, floor: float = 0.05, temperature: float = 0.5,
                 strength: float = 4.0, decay: float = 1.0, families: Sequence[Any] | None = None,
                 family_weight: float = 0.5, cursor: int = 0):
        problems = []
        if len(texts) == 0:
            problems.append("cannot sample prompts from an empty dataset")
        if families is not None and len(families) != len(texts):
            problems.append(f"families has {len(families)} entries for {len(texts)} texts")
        for name, value, ok, need in (
                ("states", states, states >= 2, ">= 2"), ("coupling", coupling, coupling >= 0, ">= 0"),
                ("neighbours", neighbours, neighbours >= 0, ">= 0"), ("sweeps", sweeps, sweeps >= 1, ">= 1"),
                ("floor", floor, 0 <= floor <= 1, "in [0, 1]"),
                ("temperature", temperature, temperature > 0, "> 0"),
                ("strength", strength, strength > 0, "> 0"), ("decay", decay, 0 < decay <= 1, "in (0, 1]"),
                ("family_weight", family_weight, family_weight >= 0, ">= 0")):
            if not ok:
                problems.append(f"sampler option {name}={value!r}: must be {need}")
        if problems:
            raise ValueError("difficulty sampler: " + "; ".join(problems))
        self.n, self.seed, self.cursor = len(texts), int(seed), int(cursor)
        self.states, self.coupling, self.sweeps = int(states), float(coupling), int(sweeps)
        self.floor, self.temperature, self.decay = float(floor), float(temperature), float(decay)
        means = (np.arange(states) + 0.5) / states                          # [K]
        self.alpha, self.beta = means * strength, (1 - means) * strength    # [K] state Betas
        self.log_prior = np.full(states, -math.log(states))                 # [K] uniform
        self.src, self.dst, w = similarity_graph(texts, neighbours, families, family_weight)
        self.weight = w / np.bincount(self.src, weights=w, minlength=self.n)[self.src]   # [E] rows sum to 1
        self.fingerprint = hashlib.sha256(json.dumps(
            [list(texts), None if families is None else [None if f is None else str(f) for f in families],
             neighbours, family_weight, states, strength]).encode()).hexdigest()[:16]
        self.successes = np.zeros(self.n)                                   # [N] soft counts
        self.trials = np.zeros(self.n)                                      # [N]
        self.beliefs = np.full((self.n, states), 1.0 / states)              # [N, K] q_i(k)
        self._loglik = np.zeros((self.n, states))                           # [N, K]

    # --- estimation -------------------------------------------------------------------------
    def _field(self, q: np.ndarray) -> np.ndarray:
        """Σ_j w_ij q_j(k) for every prompt and state: [N, K]."""
        out = np.empty_like(q)
        for k in range(self.states):
            out[:, k] = np.bincount(self.src, weights=self.weight * q[self.dst, k], minlength=self.n)
        return out

    def _refresh_likelihood(self, rows: np.ndarray | None = None) -> None:
        """log BB(s_i | n_i, state k) up to C(n, s), which is the same in every state and cancels
        from q_i; for `rows` only (all prompts when None)."""
        rows = np.arange(self.n) if rows is None else rows
        s, n = self.successes[rows, None], self.trials[rows, None]          # [R, 1]
        self._loglik[rows] = log_beta(self.alpha + s, self.beta + n - s) - log_beta(self.alpha, self.beta)

    def _sweep(self) -> None:
        logits = self.log_prior + self.coupling * self._field(self.beliefs) + self._loglik   # [N, K]
        logits -= logits.max(axis=1, keepdims=True)
        q = np.exp(logits)
        self.beliefs = q / q.sum(axis=1, keepdims=True)

    def observe(self, indices: Sequence[int], successes: Sequence[float], trials: int) -> None:
        """Record one step's outcomes: prompt `indices[b]` had `successes[b]` (a sum of accuracy
        values in [0, trials], fractions allowed) in `trials` rollouts; then run the sweeps."""
        idx = np.asarray(indices, dtype=np.int64)
        s = np.asarray(successes, dtype=np.float64)
        if idx.shape != s.shape or idx.ndim != 1:
            raise ValueError(f"difficulty sampler observe: {len(idx)} indices but {len(s)} successes; "
                             "give one summed accuracy per drawn prompt")
        if not (isinstance(trials, (int, np.integer)) and trials > 0):
            raise ValueError(f"difficulty sampler observe: trials={trials!r} must be a positive int "
                             "(the group size)")
        bad = (idx < 0) | (idx >= self.n)
        if bad.any():
            raise ValueError(f"difficulty sampler observe: index {int(idx[bad][0])} is outside the "
                             f"{self.n} prompts")
        bad = ~np.isfinite(s) | (s < 0) | (s > trials)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise ValueError(f"difficulty sampler observe: prompt {int(idx[b])} has successes "
                             f"{float(s[b])!r} outside [0, {trials}]")
        if self.decay < 1:
            self.successes *= self.decay
            self.trials *= self.decay
        np.add.at(self.successes, idx, s)
        np.add.at(self.trials, idx, float(trials))
        self._refresh_likelihood(None if self.decay < 1 else np.unique(idx))
        for _ in range(self.sweeps):
            self._sweep()

    # --- sampling ---------------------------------------------------------------------------
    def expected_variance(self) -> np.ndarray:
        """E[p(1 − p)] under each prompt's posterior, ×4 so that it lies in (0, 1]: [N]."""
        a = self.alpha + self.successes[:, None]                            # [N, K]
        b = self.beta + self.trials[:, None] - self.successes[:, None]      # [N, K]
        per_state = a * b / ((a + b) * (a + b + 1))                         # E[p(1−p)] of Beta(a, b)
        return 4.0 * (self.beliefs * per_state).sum(axis=1)

    def probabilities(self) -> np.ndarray:
        """P(draw prompt i) for one draw: [N], sums to 1, each ≥ floor/N."""
        v = self.expected_variance() ** (1.0 / self.temperature)
        return (1.0 - self.floor) * v / v.sum() + self.floor / self.n

    def next(self, k: int) -> list[int]:
        """The next `k` dataset indices, distinct within a call (rounds of N when k > N)."""
        rng = np.random.default_rng([self.seed % 2**63, self.cursor])
        log_p = np.log(self.probabilities())
        out: list[int] = []
        while len(out) < k:
            take = min(k - len(out), self.n)
            keys = log_p + rng.gumbel(size=self.n)                          # Gumbel top-k
            out.extend(np.argsort(-keys, kind="stable")[:take].tolist())
        self.cursor += k
        return out

    # --- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, JSON-serialisable (floats round-trip exactly)."""
        return {"kind": "difficulty", "fingerprint": self.fingerprint, "cursor": self.cursor,
                "successes": self.successes.tolist(), "trials": self.trials.tolist(),
                "beliefs": self.beliefs.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "difficulty":
            raise ValueError(f"difficulty sampler: the checkpoint holds sampler state of kind "
                             f"{state.get('kind')!r}, not 'difficulty' (was train.sampler changed?)")
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError("difficulty sampler: the checkpoint's sampler was built on other prompts "
                             "or graph options (data.train, neighbours, family_weight, states, strength "
                             "differ from the run that saved it)")
        successes = np.array(state["successes"], dtype=np.float64)
        trials = np.array(state["trials"], dtype=np.float64)
        beliefs = np.array(state["beliefs"], dtype=np.float64)
        if (successes.shape, trials.shape, beliefs.shape) != ((self.n,), (self.n,), (self.n, self.states)):
            raise ValueError(f"difficulty sampler: the checkpoint's sampler state has shapes "
                             f"{successes.shape}, {trials.shape}, {beliefs.shape}; this run needs "
                             f"({self.n},), ({self.n},), ({self.n}, {self.states})")
        self.cursor = int(state["cursor"])
        self.successes, self.trials, self.beliefs = successes, trials, beliefs
        self._refresh_likelihood()


def build(train_data: Sequence[Any], seed: int, **options: Any) -> DifficultySampler:
    """`train.sampler: difficulty` over the prompts' texts and task families, with
    `train.sampler_options` (an unknown option is refused by name)."""
    known = set(declared(build)[0])       # the options mmrlvr.train.options checks at load
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"train.sampler_options: unknown option(s) {unknown}; the difficulty "
                         f"sampler takes {sorted(known)}")
    rows = [(ex.prompt, ex.meta.get("family")) for ex in train_data]     # one pass (lazy splits too)
    return DifficultySampler([p for p, _ in rows], seed, families=[f for _, f in rows], **options)


build.options = DifficultySampler
"""`train.sampler_options` are the sampler's keyword parameters (checked before the model loads,
`mmrlvr.train.options`) ..."""
build.options_filled = ("texts", "seed", "families", "cursor")
"""... but for those `build` fills from the data and the run."""
