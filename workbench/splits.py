"""Walk-forward folds: train / validation / test ranges with purge and embargo gaps.

Per fold (positions into the bar array, ``stop`` exclusive)::

    [train] purge [val] purge [test] embargo | next fold's test starts here

- ``rolling``: every fold's train range has the same length and moves forward by ``step``.
- ``anchored``: train always starts at the first usable bar and grows by ``step``.
- ``purge`` bars are dropped between train and val and between val and test, so that no feature
  window or return horizon of one range reaches into the next; ``auto`` = the features' longest
  look-back + the decision horizon, which is the least that is safe.
- ``embargo`` bars are skipped after each test range: the default ``step`` is test + embargo, so
  test ranges never touch and do not overlap.
- The first usable bar is the features' warm-up (bars with incomplete windows are in no fold).

Sizes are bars (``"20000"``) or durations (``"14D"``, ``"36h"``, ``"90min"``), measured on the bars'
timestamps, so a duration spans the bars that fall inside it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .config import SplitConfig
from .errors import ConfigError, DataError


def _size(spec: str, key: str):
    text = str(spec).strip()
    if text.isdigit():
        n = int(text)
        if n <= 0:
            raise ConfigError(f"splits.{key} must be positive, got {text}")
        return n
    try:
        td = pd.Timedelta(text)
    except ValueError:
        raise ConfigError(f"splits.{key} must be a bar count or a duration like '14D', got {text!r}") from None
    if td <= pd.Timedelta(0):
        raise ConfigError(f"splits.{key} must be positive, got {text!r}")
    return td


def _advance(ts: np.ndarray, start: int, size) -> int:
    if isinstance(size, int):
        return start + size
    if start >= len(ts):
        return len(ts) + 1
    return int(np.searchsorted(ts, ts[start] + size.value, side="left"))


def _retreat(ts: np.ndarray, stop: int, size) -> int:
    """Start of the range of ``size`` that ends just before ``stop``."""
    if isinstance(size, int):
        return stop - size
    return int(np.searchsorted(ts, ts[stop - 1] - size.value, side="right"))


def resolve_purge(cfg: SplitConfig, max_lookback: int) -> int:
    if str(cfg.purge).strip() == "auto":
        return max_lookback + cfg.horizon
    text = str(cfg.purge).strip()
    if not text.isdigit():
        raise ConfigError(f"splits.purge must be 'auto' or a bar count, got {cfg.purge!r}")
    purge = int(text)
    if purge < max_lookback + cfg.horizon:
        raise ConfigError(f"splits.purge={purge} is shorter than the feature look-back + horizon "
                          f"({max_lookback} + {cfg.horizon})", "use 'auto' or a larger value")
    return purge


def walk_forward_splits(ts: np.ndarray, cfg: SplitConfig, max_lookback: int, warmup: int) -> pd.DataFrame:
    """Folds as a DataFrame: ``fold, {train,val,test}_{start,stop}`` positions and their first/last times."""
    if cfg.scheme not in ("rolling", "anchored"):
        raise ConfigError(f"splits.scheme must be 'rolling' or 'anchored', got {cfg.scheme!r}")
    if cfg.embargo < 0 or cfg.horizon < 1:
        raise ConfigError("splits.embargo must be >= 0 and splits.horizon >= 1")
    train, val, test = _size(cfg.train, "train"), _size(cfg.val, "val"), _size(cfg.test, "test")
    step = _size(cfg.step, "step") if str(cfg.step).strip() else None
    purge = resolve_purge(cfg, max_lookback)
    n = len(ts)
    rows = []
    test_start = None
    k = 0
    while True:
        if test_start is None:  # first fold: lay it out forward from the warm-up
            train_start = warmup
            train_stop = _advance(ts, train_start, train)
            val_start = train_stop + purge
            val_stop = _advance(ts, val_start, val)
            test_start = val_stop + purge
        else:  # later folds: the test range moves on; val and train are measured back from it
            prev = rows[-1]
            test_start = (prev["test_stop"] + cfg.embargo if step is None
                          else _advance(ts, prev["test_start"], step))
            val_stop = test_start - purge
            val_start = _retreat(ts, val_stop, val)
            train_stop = val_start - purge
            train_start = warmup if cfg.scheme == "anchored" else max(_retreat(ts, train_stop, train), warmup)
        if test_start >= n:
            break
        test_stop = _advance(ts, test_start, test)
        if test_stop > n:
            break
        rows.append(dict(fold=k, train_start=train_start, train_stop=train_stop, val_start=val_start,
                         val_stop=val_stop, test_start=test_start, test_stop=test_stop, purge=purge))
        k += 1
        if cfg.max_folds and k >= cfg.max_folds:
            break
    if not rows:
        need = f"train {cfg.train} + purge {purge} + val {cfg.val} + purge {purge} + test {cfg.test} after a warm-up of {warmup} bars"
        raise DataError(f"data too short for one fold: {n} bars, need {need}",
                        "use shorter ranges (--set splits.train=...) or more data")
    folds = pd.DataFrame(rows)
    for part in ("train", "val", "test"):
        folds[f"{part}_first"] = pd.to_datetime(ts[folds[f"{part}_start"]], utc=True)
        folds[f"{part}_last"] = pd.to_datetime(ts[folds[f"{part}_stop"] - 1], utc=True)
    # Test ranges never overlap and keep the embargo between them.
    if len(folds) > 1:
        gaps = folds["test_start"].to_numpy()[1:] - folds["test_stop"].to_numpy()[:-1]
        if (gaps < 0).any():
            raise ConfigError("splits.step is shorter than the test range: test ranges would overlap")
    return folds
