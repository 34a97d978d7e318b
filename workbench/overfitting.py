"""The probability of backtest overfitting (PBO) by combinatorially symmetric cross-validation (CSCV;
Bailey, Borwein, Lopez de Prado & Zhu, "The Probability of Backtest Overfitting", 2015).

Input: a performance matrix ``[T observations x N trials]`` (here: each search trial's hourly
validation PnL, the chosen epoch of every scored fold, in time order). The rows are cut into ``S``
contiguous blocks of (nearly) equal size. For each of the C(S, S/2) ways to pick half the blocks as
"in sample" (the rest "out of sample"), the trial with the best in-sample Sharpe is found and its
out-of-sample Sharpe ranked among all trials: relative rank w = rank / (N + 1) (rank 1 = worst, ties
averaged), logit = ln(w / (1 - w)). PBO = the share of splits whose logit is <= 0, i.e. where the
in-sample winner lands at or below the out-of-sample median. Near 0: the selection carries over; about
0.5: it is a coin toss; near 1: what wins in sample loses out of sample.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb

import numpy as np

DEFAULT_BLOCKS = 16  # as in the paper's examples; fewer when the matrix has fewer rows


@dataclass(frozen=True)
class PBOResult:
    pbo: float
    logits: np.ndarray     # one per split
    blocks: int
    splits: int
    rows: int
    trials: int

    def to_dict(self) -> dict:
        return {"pbo": self.pbo, "blocks": self.blocks, "splits": self.splits, "rows": self.rows, "trials": self.trials,
                "logit_median": float(np.median(self.logits)) if len(self.logits) else float("nan"),
                "method": "CSCV (Bailey, Borwein, Lopez de Prado & Zhu 2015), performance = Sharpe of the rows"}


def _ranks_ascending(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n along the last axis, ties averaged."""
    order = np.argsort(x, axis=-1, kind="stable")
    ranks = np.empty_like(x, dtype=np.float64)
    np.put_along_axis(ranks, order, np.arange(1, x.shape[-1] + 1, dtype=np.float64)[None, :].repeat(x.shape[0], 0),
                      axis=-1)
    # average the ranks of ties
    for i in range(x.shape[0]):
        vals, inv, counts = np.unique(x[i], return_inverse=True, return_counts=True)
        if len(vals) < x.shape[1]:
            sums = np.bincount(inv, weights=ranks[i])
            ranks[i] = (sums / counts)[inv]
    return ranks


def pbo_cscv(perf: np.ndarray, blocks: int = DEFAULT_BLOCKS) -> PBOResult:
    """PBO of selecting the best of ``perf``'s columns by Sharpe (see the module docstring)."""
    m = np.asarray(perf, dtype=np.float64)
    if m.ndim != 2 or m.shape[1] < 2:
        raise ValueError("CSCV needs a [observations x trials] matrix with at least two trials")
    if not np.isfinite(m).all():
        raise ValueError("CSCV needs finite performance values")
    T, N = m.shape
    S = min(blocks, T - T % 2 if T % 2 else T)
    S -= S % 2
    if S < 2:
        raise ValueError(f"CSCV needs at least 2 observations per trial, got {T}")
    parts = np.array_split(np.arange(T), S)
    n = np.array([len(p) for p in parts], dtype=np.float64)
    s1 = np.array([m[p].sum(axis=0) for p in parts])          # [S, N]
    s2 = np.array([(m[p] ** 2).sum(axis=0) for p in parts])

    def sharpe(sel):
        k = n[sel].sum()
        mean = s1[sel].sum(axis=0) / k
        var = (s2[sel].sum(axis=0) - k * mean**2) / (k - 1) if k > 1 else np.zeros(N)
        sd = np.sqrt(np.maximum(var, 0.0))
        return np.where(sd > 0, mean / np.where(sd > 0, sd, 1.0), 0.0)

    idx = np.arange(S)
    is_perf, oos_perf = [], []
    for c in combinations(range(S), S // 2):
        ins = np.zeros(S, bool)
        ins[list(c)] = True
        is_perf.append(sharpe(idx[ins]))
        oos_perf.append(sharpe(idx[~ins]))
    is_perf, oos_perf = np.array(is_perf), np.array(oos_perf)
    best = np.argmax(is_perf, axis=1)  # ties: the first trial
    w = _ranks_ascending(oos_perf)[np.arange(len(best)), best] / (N + 1)
    logits = np.log(w / (1.0 - w))
    return PBOResult(float(np.mean(logits <= 0)), logits, S, comb(S, S // 2), T, N)
