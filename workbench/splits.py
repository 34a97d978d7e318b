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
timestamps, so a duration spans the bars that fall inside it, or ``"auto"`` (the default):

- all three ``auto``: train / val / test in the proportions 10 : 3 : 3, as large as lets
  :data:`AUTO_FOLDS` rolling folds fit in the data (purge and embargo included) and at most
  20,000 / 6,000 / 6,000 bars (the agent's preferred training length: longer data gets more folds);
  where five folds do not fit with train >= :data:`AUTO_MIN_TRAIN` and val, test >= :data:`AUTO_MIN_EVAL`
  bars, four, then three, two, one. Bars, so the rule is the same for minute, hourly or daily bars.
- some ``auto``: derived from the first given size in the same proportions (``train = "14D"`` makes
  val and test ``"4.2D"``).

The sizes chosen are stated in ``folds.attrs["sizing"]`` (printed by the CLIs); data too short for
one fold is a :class:`DataError` that states the minimum.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .config import SplitConfig
from .errors import ConfigError, DataError

AUTO_RATIO = (10, 3, 3)
AUTO_FOLDS = 5
AUTO_MAX_UNIT = 2_000  # train / val / test at most 20,000 / 6,000 / 6,000 bars
AUTO_MIN_TRAIN = 500
AUTO_MIN_EVAL = 100


def _size(spec: str, key: str):
    text = str(spec).strip()
    if text == "auto":
        return None
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
    """End (exclusive) of the range of ``size`` from ``start``; past the data (``len(ts) + 1``) when the
    data stops before the range is complete, so a last fold is never silently short."""
    if isinstance(size, int):
        return start + size
    if start >= len(ts):
        return len(ts) + 1
    end = ts[start] + size.value
    last_step = int(np.median(np.diff(ts[-1000:]))) if len(ts) > 1 else 0
    if end > ts[-1] + last_step:
        return len(ts) + 1
    return int(np.searchsorted(ts, end, side="left"))


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


def _scaled(size, factor: float):
    if isinstance(size, int):
        return max(1, int(round(size * factor)))
    return pd.Timedelta(seconds=round(size.total_seconds() * factor))


def _text(size) -> str:
    return f"{size:,} bars" if isinstance(size, int) else str(size)


def bar_interval(ts: np.ndarray) -> str:
    """The bars' typical spacing in words ('1-minute', '1-hour', '1-day')."""
    if len(ts) < 2:
        return "unknown-interval"
    step = pd.Timedelta(int(np.median(np.diff(ts))), "ns")
    for unit, name in ((pd.Timedelta("1D"), "day"), (pd.Timedelta("1h"), "hour"), (pd.Timedelta("1min"), "minute"),
                       (pd.Timedelta("1s"), "second")):
        if step >= unit:
            n = step / unit
            return f"{n:.3g}-{name}"
    return f"{step}"


def auto_sizes(n: int, warmup: int, purge: int, embargo: int) -> tuple[int, int, int]:
    """(train, val, test) bars by the ``auto`` rule; DataError when not one fold fits."""
    a, b, c = AUTO_RATIO
    avail = n - warmup - 2 * purge
    for k in range(AUTO_FOLDS, 0, -1):
        unit = min(AUTO_MAX_UNIT, (avail - (k - 1) * embargo) // (a + b + c + c * (k - 1)))
        if unit * a >= AUTO_MIN_TRAIN and unit * min(b, c) >= AUTO_MIN_EVAL:
            return unit * a, unit * b, unit * c
    need = warmup + AUTO_MIN_TRAIN + 2 * purge + 2 * AUTO_MIN_EVAL
    raise DataError(f"data too short for one fold: {n:,} bars; the minimum with these features is {need:,} bars "
                    f"(warm-up {warmup}, train >= {AUTO_MIN_TRAIN}, purge {purge}, val >= {AUTO_MIN_EVAL}, purge {purge}, "
                    f"test >= {AUTO_MIN_EVAL})", "use a longer file, or shorter feature windows (features.*)")


def resolve_sizes(ts: np.ndarray, cfg: SplitConfig, purge: int, warmup: int, max_lookback: int) -> tuple[object, object, object, str]:
    """(train, val, test, how they were chosen): bar counts (int) or durations (Timedelta)."""
    sizes = [_size(cfg.train, "train"), _size(cfg.val, "val"), _size(cfg.test, "test")]
    if all(s is not None for s in sizes):
        return (*sizes, "as set")
    given = next(((i, s) for i, s in enumerate(sizes) if s is not None), None)
    if given is None:
        train, val, test = auto_sizes(len(ts), max(warmup, max_lookback), purge, cfg.embargo)
        return train, val, test, f"auto: {len(ts):,} {bar_interval(ts)} bars, up to {AUTO_FOLDS} folds at 10:3:3"
    i, s = given
    out = [sz if sz is not None else _scaled(s, AUTO_RATIO[j] / AUTO_RATIO[i]) for j, sz in enumerate(sizes)]
    return (*out, f"the missing sizes in proportion 10:3:3 to splits.{('train', 'val', 'test')[i]}")


def walk_forward_splits(ts: np.ndarray, cfg: SplitConfig, max_lookback: int, warmup: int) -> pd.DataFrame:
    """Folds as a DataFrame (row k = the k-th fold, numbered ``fold`` = k + 1 wherever a user sees it):
    ``{train,val,test}_{start,stop}`` positions and their first/last times;
    ``attrs["sizing"]`` says which sizes were used and how they were chosen."""
    if cfg.scheme not in ("rolling", "anchored"):
        raise ConfigError(f"splits.scheme must be 'rolling' or 'anchored', got {cfg.scheme!r}")
    if cfg.embargo < 0 or cfg.horizon < 1:
        raise ConfigError("splits.embargo must be >= 0 and splits.horizon >= 1")
    step = _size(cfg.step, "step") if str(cfg.step).strip() else None
    if str(cfg.step).strip() == "auto":
        raise ConfigError("splits.step cannot be 'auto'", "leave it empty for test length + embargo")
    purge = resolve_purge(cfg, max_lookback)
    train, val, test, how = resolve_sizes(ts, cfg, purge, warmup, max_lookback)
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
        rows.append(dict(fold=k + 1, train_start=train_start, train_stop=train_stop, val_start=val_start,
                         val_stop=val_stop, test_start=test_start, test_stop=test_stop, purge=purge))
        k += 1
        if cfg.max_folds and k >= cfg.max_folds:
            break
    if not rows:
        need = (f"train {_text(train)} + purge {purge} + val {_text(val)} + purge {purge} + test {_text(test)} "
                f"after a warm-up of {warmup} bars")
        raise DataError(f"data too short for one fold: {n:,} bars, need {need}",
                        "use shorter ranges (--set splits.train=..., or 'auto') or more data")
    folds = pd.DataFrame(rows)
    folds.attrs["sizing"] = (f"{len(folds)} {cfg.scheme} folds, train {_text(train)} / val {_text(val)} / test "
                             f"{_text(test)}, purge {purge} and embargo {cfg.embargo} bars ({how})")
    for part in ("train", "val", "test"):
        folds[f"{part}_first"] = pd.to_datetime(ts[folds[f"{part}_start"]], utc=True)
        folds[f"{part}_last"] = pd.to_datetime(ts[folds[f"{part}_stop"] - 1], utc=True)
    # Test ranges never overlap and keep the embargo between them.
    if len(folds) > 1:
        gaps = folds["test_start"].to_numpy()[1:] - folds["test_stop"].to_numpy()[:-1]
        if (gaps < 0).any():
            raise ConfigError("splits.step is shorter than the test range: test ranges would overlap")
    return folds
