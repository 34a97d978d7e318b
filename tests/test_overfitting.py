"""PBO by CSCV: cases with known answers, and an independent brute-force implementation (#12)."""
from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from workbench.overfitting import pbo_cscv


def _pbo_brute_force(m: np.ndarray, S: int) -> float:
    """The paper's steps written out directly: rows of each split concatenated, Sharpe by pandas, ranks by
    pandas (ties averaged)."""
    parts = np.array_split(np.arange(len(m)), S)
    df = pd.DataFrame(m)
    below = []
    for c in combinations(range(S), S // 2):
        ins = np.concatenate([parts[i] for i in c])
        oos = np.concatenate([parts[i] for i in range(S) if i not in c])
        sr_is = df.iloc[ins].mean() / df.iloc[ins].std(ddof=1)
        sr_oos = df.iloc[oos].mean() / df.iloc[oos].std(ddof=1)
        best = int(np.argmax(sr_is.to_numpy()))
        w = sr_oos.rank(method="average").iloc[best] / (m.shape[1] + 1)
        below.append(np.log(w / (1 - w)) <= 0)
    return float(np.mean(below))


def test_known_answers():
    # one trial better than every other in every block: the selection always carries over
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 1, (400, 6))
    noise[:, 2] += 3.0
    assert pbo_cscv(noise, blocks=8).pbo == 0.0
    # two trials that take turns, block by block: whatever wins in sample loses out of sample
    a = np.r_[np.full(50, 1.0), np.full(50, -1.0)] + rng.normal(0, 0.01, 100)
    res = pbo_cscv(np.column_stack([a, -a]), blocks=2)
    assert res.pbo == 1.0 and res.splits == 2 and res.blocks == 2


@pytest.mark.parametrize("seed", [int(x) for x in np.random.SeedSequence().generate_state(3)])
def test_agrees_with_a_brute_force_implementation(seed):
    rng = np.random.default_rng(seed)
    T, N, S = int(rng.integers(60, 200)), int(rng.integers(3, 9)), int(rng.choice([4, 6, 8]))
    m = rng.standard_t(4, (T, N)) + rng.normal(0, 0.05, N)
    assert pbo_cscv(m, blocks=S).pbo == pytest.approx(_pbo_brute_force(m, S), abs=1e-12), f"seed {seed}"
    m[:, 1] = m[:, 0]  # two identical trials: tied in and out of sample (the first wins, ranks averaged)
    assert pbo_cscv(m, blocks=S).pbo == pytest.approx(_pbo_brute_force(m, S), abs=1e-12), f"seed {seed}, ties"


def test_a_search_of_many_trials_is_evaluated_in_chunks_with_the_same_result(monkeypatch):
    """The splits are evaluated a chunk at a time (memory bounded whatever the trials): any chunk size gives
    the same logits."""
    import workbench.overfitting as O

    m = np.random.default_rng(3).normal(0, 1, (300, 12))
    whole = O.pbo_cscv(m, blocks=10)
    monkeypatch.setattr(O, "_CHUNK_CELLS", 12 * 7)  # 7 splits at a time
    cut = O.pbo_cscv(m, blocks=10)
    assert np.array_equal(whole.logits, cut.logits) and whole.splits == cut.splits == 252


def test_pure_noise_is_a_coin_toss_on_average():
    # one matrix's PBO varies a lot (its splits share blocks); over independent matrices it averages 1/2
    got = [pbo_cscv(np.random.default_rng(seed).normal(0, 1, (1000, 20)), blocks=10).pbo for seed in range(12)]
    assert 0.38 < np.mean(got) < 0.62
    res = pbo_cscv(np.random.default_rng(0).normal(0, 1, (1000, 20)), blocks=10)
    assert res.splits == 252 and res.trials == 20 and res.rows == 1000 and len(res.logits) == 252
