from __future__ import annotations

import numpy as np
import pytest

from workbench.config import SplitConfig
from workbench.errors import ConfigError, DataError
from workbench.splits import walk_forward_splits

TS = np.arange(50_000, dtype=np.int64) * 60_000_000_000 + 1_700_000_000_000_000_000


def _check(folds, purge, embargo):
    for r in folds.itertuples():
        assert r.train_start < r.train_stop <= r.val_start - purge
        assert r.val_start < r.val_stop <= r.test_start - purge
        assert r.test_start < r.test_stop <= len(TS)
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
