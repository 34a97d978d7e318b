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
    combos = np.array(list(combinations(range(S), S // 2)), dtype=np.intp)  # [splits, S/2]: the in-sample blocks
    logits = np.empty(len(combos))
    chunk = max(1, _CHUNK_CELLS // max(N, S))  # splits at a time: memory bounded whatever the trials
    for a in range(0, len(combos), chunk):
        c = combos[a:a + chunk]
        ins = np.zeros((len(c), S))
        ins[np.arange(len(c))[:, None], c] = 1.0
        out = 1.0 - ins
        is_perf = _sharpe(ins @ n, ins @ s1, ins @ s2)        # [splits, N]
        oos_perf = _sharpe(out @ n, out @ s1, out @ s2)
        best = np.argmax(is_perf, axis=1)  # ties: the first trial
        v = oos_perf[np.arange(len(c)), best][:, None]
        # its rank among the trials out of sample, 1 = worst, ties averaged: the equal ones hold ranks
        # below + 1 .. below + equal
        rank = (oos_perf < v).sum(axis=1) + ((oos_perf == v).sum(axis=1) + 1) / 2.0
        w = rank / (N + 1)
        logits[a:a + len(c)] = np.log(w / (1.0 - w))
    return PBOResult(float(np.mean(logits <= 0)), logits, S, comb(S, S // 2), T, N)


_CHUNK_CELLS = 1 << 21  # splits x trials evaluated at once (a few arrays of this many float64)


def _sharpe(k: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """Per split (row) and trial (column): the Sharpe of the rows whose count, sum and sum of squares are
    ``k`` [splits], ``s1``, ``s2`` [splits, trials] (sample standard deviation; 0 where it is 0)."""
    k = k[:, None]
    mean = s1 / k
    var = np.where(k > 1, (s2 - k * mean ** 2) / np.maximum(k - 1, 1.0), 0.0)
    sd = np.sqrt(np.maximum(var, 0.0))
    return np.where(sd > 0, mean / np.where(sd > 0, sd, 1.0), 0.0)
