from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.config import SplitConfig
from workbench.errors import ConfigError, DataError
from workbench.splits import walk_forward_splits

TS = np.arange(50_000, dtype=np.int64) * 60_000_000_000 + 1_700_000_000_000_000_000


def _check(folds, purge, embargo, ts=TS):
    for r in folds.itertuples():
        assert r.train_start < r.train_stop <= r.val_start - purge
        assert r.val_start < r.val_stop <= r.test_start - purge
        assert r.test_start < r.test_stop <= len(ts)
    ts, te = folds["test_start"].to_numpy(), folds["test_stop"].to_numpy()
    assert (ts[1:] - te[:-1] >= embargo).all()


def test_rolling_purge_is_lookback_plus_horizon():
    folds = walk_forward_splits(TS, SplitConfig(train="10000", val="3000", test="3000", horizon=5), 120, 120)
    assert (folds["purge"] == 125).all() and len(folds) > 3
    _check(folds, 125, 60)
    assert (folds["train_stop"] - folds["train_start"] == 10000).all()
    assert folds["train_start"].iloc[0] == 120


def test_anchored_train_grows_from_first_usable_bar():
    folds = walk_forward_splits(TS, SplitConfig(scheme="anchored", train="10000", val="3000", test="3000"), 60, 60)
    assert (folds["train_start"] == 60).all()
    assert (np.diff(folds["train_stop"]) > 0).all()
    _check(folds, 61, 60)


def test_duration_sizes_and_max_folds():
    folds = walk_forward_splits(TS, SplitConfig(train="5D", val="36h", test="1D", embargo=0, max_folds=3), 30, 30)
    assert len(folds) == 3
    assert (folds["test_stop"] - folds["test_start"] == 1440).all()  # one bar per minute in TS
    assert (folds["train_stop"] - folds["train_start"] == 5 * 1440).all()
    _check(folds, 31, 0)


def test_too_short_data_is_a_clear_error():
    with pytest.raises(DataError, match="data too short for one fold"):
        walk_forward_splits(TS[:5000], SplitConfig(train="4000", val="1000", test="1000"), 60, 60)


@pytest.mark.parametrize("kwargs,match", [
    (dict(scheme="sideways"), "scheme"),
    (dict(train="ten"), "splits.train"),
    (dict(train="0"), "positive"),
    (dict(purge="10"), "shorter than the feature look-back"),
    (dict(step="100"), "overlap"),
])
def test_bad_split_settings(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        walk_forward_splits(TS, SplitConfig(**{**dict(train="10000", val="3000", test="3000"), **kwargs}), 60, 60)


def _ts(n: int, step: str) -> np.ndarray:
    return pd.date_range("2015-01-05", periods=n, freq=step, tz="UTC").as_unit("ns").asi8


@pytest.mark.parametrize("n,step,folds,train", [
    (60_000, "min", 5, 20_000),      # the shipped sample's size: the preferred 20,000 / 6,000 / 6,000
    (400_000, "min", 61, 20_000),    # long data: more folds, not longer ones
    (17_658, "min", 5, 6_090),       # the real ES file: shrunk to fit five folds
    (6_000, "h", 5, 1_920),          # hourly bars
    (2_520, "D", 5, 680),            # ten years of daily bars
    (1_300, "D", 1, 580),            # five years of daily bars: one fold fits the minimums
])
def test_auto_sizes_fit_the_data(n, step, folds, train):
    ts = _ts(n, step)
    got = walk_forward_splits(ts, SplitConfig(), 120, 120)
    assert len(got) == folds
    tr = (got["train_stop"] - got["train_start"]).to_numpy()
    va = (got["val_stop"] - got["val_start"]).to_numpy()
    te = (got["test_stop"] - got["test_start"]).to_numpy()
    assert (tr == train).all() and (va * 10 == tr * 3).all() and (te == va).all()
    assert va[0] >= 100 and tr[0] >= 500
    _check(got, 121, 60, ts)
    assert "auto" in got.attrs["sizing"] and f"{folds} rolling folds" in got.attrs["sizing"]


def test_auto_sizes_in_proportion_to_a_given_one():
    got = walk_forward_splits(TS, SplitConfig(train="10000"), 60, 60)
    assert ((got["val_stop"] - got["val_start"]) == 3000).all() and ((got["test_stop"] - got["test_start"]) == 3000).all()
    got = walk_forward_splits(TS, SplitConfig(train="5D", embargo=0), 30, 30)
    assert ((got["test_stop"] - got["test_start"]) == 1.5 * 1440).all()  # 5 days x 0.3 of minute bars
    assert "proportion" in got.attrs["sizing"]


def test_auto_too_short_states_the_minimum():
    with pytest.raises(DataError, match=r"data too short for one fold: 900 bars; the minimum with these features is "
                                        r"1,062 bars \(warm-up 120, train >= 500, purge 121"):
        walk_forward_splits(TS[:900], SplitConfig(), 120, 120)
