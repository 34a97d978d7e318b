"""Causal features from bars: float32 ``[T, F]`` with names, look-backs and masks.

Every feature at bar t uses bars ``<= t`` only (a test perturbs later bars and checks earlier
features are unchanged). One-bar log returns never cross a roll: on the first bar of a new contract
the return is ``log(close / open)`` of that bar, so the calendar spread is not a price move.

Features (windows from :class:`~workbench.config.FeatureConfig`):
``ret_h`` sum of one-bar log returns over h bars; ``vol_w`` their standard deviation over w bars;
``range_w`` mean of log(high / low) over w bars; ``volz_w`` z-score of log(1 + volume) over w bars
(left out when the file has no volume);
``ofi_w`` (buy - sell) / (buy + sell) volume over w bars, where the source had order flow;
``tod_sin/tod_cos`` time of day and ``dow_sin/dow_cos`` day of week, in exchange time;
``session_age`` minutes since the session opened (first bar after a gap of 30 minutes or more) / 1380.

Normalisation (:class:`Normalizer`) is fitted on a fold's training range only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .config import FeatureConfig
from .data import Bars

SESSION_GAP_NS = 30 * 60 * 1_000_000_000
SESSION_MINUTES = 1380.0
CLIP_SIGMAS = 10.0


@dataclass
class Features:
    """Feature matrix and the price/mask arrays every later stage needs (all length T)."""

    values: np.ndarray          # float32 [T, F]
    names: list[str]
    lookbacks: np.ndarray       # int64 [F]: bars before t each feature reads
    warmup: int                 # first bar at which every feature is defined
    log_return: np.ndarray      # float64 [T]: roll-safe one-bar log return (NaN at 0)
    roll_mask: np.ndarray       # bool [T]: first bar of a new contract
    session_start: np.ndarray   # bool [T]: first bar after a halt, weekend or holiday
    close: np.ndarray           # float64 [T]: the bars' closes (for rules that read prices directly)

    @property
    def max_lookback(self) -> int:
        return int(self.lookbacks.max())

    def __len__(self) -> int:
        return self.values.shape[0]


def roll_safe_log_return(bars: Bars) -> np.ndarray:
    close, open_ = bars.column("close"), bars.column("open")
    r = np.full(len(close), np.nan)
    r[1:] = np.log(close[1:] / close[:-1])
    roll = bars.roll_mask
    r[roll] = np.log(close[roll] / open_[roll])
    return r


def build_features(bars: Bars, cfg: FeatureConfig = FeatureConfig()) -> Features:
    """Compute every causal feature for ``bars``."""
    r = pd.Series(roll_safe_log_return(bars))
    cols: dict[str, tuple[np.ndarray, int]] = {}
    for h in cfg.return_horizons:
        cols[f"ret_{h}"] = (r.rolling(h, min_periods=h).sum().to_numpy(), h)
    for w in cfg.vol_windows:
        cols[f"vol_{w}"] = (r.rolling(w, min_periods=w).std().to_numpy(), w)
    hl = pd.Series(np.log(bars.column("high") / bars.column("low")))
    cols[f"range_{cfg.range_window}"] = (hl.rolling(cfg.range_window).mean().to_numpy(), cfg.range_window - 1)
    if bars.has_volume:  # quotes without volume (FX) have no volume feature
        lv = pd.Series(np.log1p(bars.column("volume")))
        w = cfg.volume_window
        sd = lv.rolling(w).std().to_numpy()
        cols[f"volz_{w}"] = ((lv.to_numpy() - lv.rolling(w).mean().to_numpy()) / np.where(sd > 0, sd, 1.0), w - 1)
    if bars.has_order_flow:
        buy, sell = pd.Series(bars.column("buy_volume")), pd.Series(bars.column("sell_volume"))
        for w in cfg.ofi_windows:
            b, s = buy.rolling(w).sum().to_numpy(), sell.rolling(w).sum().to_numpy()
            tot = b + s
            cols[f"ofi_{w}"] = (np.where(tot > 0, (b - s) / np.where(tot > 0, tot, 1.0), 0.0), w - 1)
    local = bars.frame.index.tz_convert(bars.market.session_tz)
    minute = (local.hour * 60 + local.minute).to_numpy().astype(np.float64)
    trade_day = (local + bars.market.day_end_offset()).day_of_week.to_numpy().astype(np.float64)
    cols["tod_sin"] = (np.sin(2 * np.pi * minute / 1440.0), 0)
    cols["tod_cos"] = (np.cos(2 * np.pi * minute / 1440.0), 0)
    cols["dow_sin"] = (np.sin(2 * np.pi * trade_day / 7.0), 0)
    cols["dow_cos"] = (np.cos(2 * np.pi * trade_day / 7.0), 0)
    ts = bars.ts
    session_start = np.ones(len(ts), dtype=bool)
    session_start[1:] = np.diff(ts) >= SESSION_GAP_NS
    start_idx = np.maximum.accumulate(np.where(session_start, np.arange(len(ts)), 0))
    age = (ts - ts[start_idx]) / 60e9 / SESSION_MINUTES
    cols["session_age"] = (np.minimum(age, 1.0), 0)

    names = list(cols)
    values = np.column_stack([cols[n][0] for n in names]).astype(np.float32)
    lookbacks = np.array([cols[n][1] for n in names], dtype=np.int64)
    finite = np.isfinite(values).all(axis=1)
    bad = np.flatnonzero(~finite)
    warmup = int(bad.max() + 1) if len(bad) else 0
    if warmup > int(lookbacks.max()) + 1:
        raise AssertionError(f"feature NaN after the warm-up at bar {warmup - 1}")  # a bug, not bad data
    return Features(values, names, lookbacks, warmup, r.to_numpy(), bars.roll_mask, session_start, bars.column("close"))


@dataclass(frozen=True)
class Normalizer:
    """Per-feature mean and standard deviation from a training range; ``apply`` clips to +-10 sigma."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, values: np.ndarray, start: int, stop: int) -> "Normalizer":
        train = values[start:stop].astype(np.float64)
        if not np.isfinite(train).all():
            raise ValueError("training range includes warm-up bars (NaN features)")
        std = train.std(axis=0)
        return cls(train.mean(axis=0).astype(np.float32), np.where(std > 1e-12, std, 1.0).astype(np.float32))

    def apply(self, values: np.ndarray) -> np.ndarray:
        out = (values - self.mean) / self.std
        return np.clip(np.nan_to_num(out, nan=0.0), -CLIP_SIGMAS, CLIP_SIGMAS).astype(np.float32)
