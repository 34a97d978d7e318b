"""Rule baselines that every agent result is compared with.

``buy-and-hold``: long ``contracts`` on every bar of the test range.
``momentum``: long (short) ``contracts`` when the roll-safe log return over the last
``momentum_lookback`` bars is above ``+threshold`` (below ``-threshold``), flat otherwise: an unchanged
price (a change of exactly zero) is flat. The signal at
bar t uses closes up to bar t only and executes at bar t+1 like every decision.
"""
from __future__ import annotations

import numpy as np

from .config import StrategyConfig
from .errors import ConfigError
from .features import Features

STRATEGIES = ("buy-and-hold", "momentum")


def lookback_log_return(feats: Features, t: np.ndarray, lb: int) -> np.ndarray:
    """Roll-safe log return over the ``lb`` bars ending at each bar ``t``: ``log(close_t / close_{t-lb})``
    computed directly where no roll falls inside the window (so an unchanged price is exactly 0, not a
    rounding residue of a cumulative sum), the sum of one-bar roll-safe returns where one does."""
    r = np.nan_to_num(feats.log_return, nan=0.0)
    csum = np.concatenate([[0.0], np.cumsum(r)])
    rolls = np.concatenate([[0], np.cumsum(feats.roll_mask)])
    mom = csum[t + 1] - csum[t + 1 - lb]
    clean = rolls[t + 1] == rolls[t + 1 - lb]
    close = feats.close
    mom[clean] = np.log(close[t[clean]] / close[t[clean] - lb])
    return mom


def baseline_targets(name: str, feats: Features, start: int, stop: int, contracts: int,
                     cfg: StrategyConfig = StrategyConfig()) -> np.ndarray:
    """Integer target positions for bars ``[start, stop)``."""
    if contracts < 1:
        raise ConfigError(f"backtest.contracts must be >= 1, got {contracts}")
    n = stop - start
    if name == "buy-and-hold":
        return np.full(n, contracts, dtype=np.int64)
    if name == "momentum":
        lb = cfg.momentum_lookback
        if lb < 1:
            raise ConfigError(f"strategy.momentum_lookback must be >= 1, got {lb}")
        if start - lb + 1 < 1:
            raise ConfigError(f"strategy.momentum_lookback={lb} reaches before the first bar of the data")
        t = np.arange(start, stop)
        mom = lookback_log_return(feats, t, lb)
        th = cfg.momentum_threshold
        return (contracts * (np.where(mom > th, 1, 0) - np.where(mom < -th, 1, 0))).astype(np.int64)
    raise ConfigError(f"unknown strategy '{name}'", f"choose one of: {', '.join(STRATEGIES)}")
