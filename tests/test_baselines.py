"""Rule baselines: momentum's decision on an unchanged price, and across a roll."""
from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.baselines import baseline_targets, lookback_log_return
from workbench.config import StrategyConfig
from workbench.data import load_bars
from workbench.features import build_features


def _bars(close, roll_at=None):
    n = len(close)
    idx = pd.date_range("2024-03-05 15:00", periods=n, freq="min", tz="UTC")
    sym = np.array(["ESM4"] * n, dtype=object)
    if roll_at is not None:
        sym[roll_at:] = "ESU4"
    df = pd.DataFrame({"ts_event": idx, "open": close, "high": close + 0.25, "low": close - 0.25, "close": close,
                       "volume": 10.0, "symbol": sym})
    return load_bars(df, market="es")


def test_momentum_is_flat_on_an_exactly_unchanged_price():
    rng = np.random.default_rng(8)
    close = 4000 + 0.25 * np.round(np.cumsum(rng.normal(0, 3, 400)))  # a random walk on the tick grid
    bars = _bars(close)
    f = build_features(bars)
    lb, t = 5, np.arange(5, 400)
    target = baseline_targets("momentum", f, 5, 400, 1, StrategyConfig(momentum_lookback=lb))
    unchanged = close[t] == close[t - lb]
    assert unchanged.sum() > 10
    assert (target[unchanged] == 0).all()
    # the one-bar sums of logs leave a rounding residue on most of these bars: the old shortcut's error
    csum = np.concatenate([[0.0], np.cumsum(np.nan_to_num(f.log_return))])
    assert (csum[t + 1] - csum[t + 1 - lb])[unchanged].any()
    moved = ~unchanged
    assert (np.sign(target[moved]) == np.sign(close[t][moved] - close[t - lb][moved])).all()


def test_momentum_across_a_roll_ignores_the_calendar_spread():
    close = np.r_[np.full(20, 4000.0), np.full(20, 4060.0)]  # a flat market, rolled into a contract 60 above
    bars = _bars(close, roll_at=20)
    f = build_features(bars)
    mom = lookback_log_return(f, np.arange(10, 40), 10)
    assert np.allclose(mom, 0.0, atol=1e-15)  # the 60-point spread is not a move
    assert (baseline_targets("momentum", f, 10, 40, 1, StrategyConfig(momentum_lookback=10)) == 0).all()
