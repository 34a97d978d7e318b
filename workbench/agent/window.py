"""One fold's window of data, prepared on the host for upload: normalised features, prices, masks."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..data import Bars
from ..features import Features, Normalizer

MAX_POS = 3
N_POS = 2 * MAX_POS + 1


@dataclass
class Window:
    """Bars ``[lo, hi)`` of the full series; ranges are positions inside the window."""

    lo: int
    features: np.ndarray  # float32 [T, F], normalised with the train range's statistics
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    roll: np.ndarray      # int8 [T]
    day: np.ndarray       # int32 [T], trading-day id (exchange time, the market's day_end)
    train: tuple[int, int]
    val: tuple[int, int]
    test: tuple[int, int]
    index: pd.DatetimeIndex

    @property
    def n_bars(self) -> int:
        return len(self.close)

    @property
    def n_features(self) -> int:
        return self.features.shape[1]

    def episode_len(self, requested: int) -> int:
        """Bars per training episode: ``requested``, or the training range less one bar where that is
        shorter (short folds of hourly or daily bars), so every episode starts and ends inside it."""
        return max(2, min(int(requested), self.train[1] - self.train[0] - 1))


def make_window(bars: Bars, feats: Features, fold: dict) -> Window:
    lo, hi = int(fold["train_start"]), int(fold["test_stop"])
    norm = Normalizer.fit(feats.values, int(fold["train_start"]), int(fold["train_stop"]))
    sub = bars.slice(lo, hi)
    rel = lambda a, b: (int(fold[a]) - lo, int(fold[b]) - lo)  # noqa: E731
    return Window(lo=lo, features=np.ascontiguousarray(norm.apply(feats.values[lo:hi])),
                  open=sub.column("open"), high=sub.column("high"), low=sub.column("low"), close=sub.column("close"),
                  roll=sub.roll_mask.astype(np.int8), day=bars.day_ids[lo:hi] - bars.day_ids[lo],
                  train=rel("train_start", "train_stop"), val=rel("val_start", "val_stop"),
                  test=rel("test_start", "test_stop"), index=sub.frame.index)
