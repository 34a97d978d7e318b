"""Features are causal, defined after the warm-up, and normalised on the training range only."""
from __future__ import annotations

import numpy as np
import pytest

from workbench.config import SplitConfig
from workbench.data import Bars
from workbench.features import Normalizer, build_features
from workbench.splits import walk_forward_splits


def _perturbed(bars: Bars, t: int, seed: int) -> Bars:
    rng = np.random.default_rng(seed)
    f = bars.frame.copy()
    n = len(f) - t - 1
    scale = np.exp(rng.normal(0, 0.01, n))
    for c in ("open", "high", "low", "close"):
        f.iloc[t + 1:, f.columns.get_loc(c)] = f[c].to_numpy()[t + 1:] * scale
    for c in ("volume", "buy_volume", "sell_volume"):
        f.iloc[t + 1:, f.columns.get_loc(c)] = f[c].to_numpy()[t + 1:] * rng.uniform(0.1, 5.0, n)
    return Bars(f, bars.rolls, bars.report, bars.market, bars.source)


@pytest.mark.parametrize("t", [150, 2_345, 9_000])
def test_changing_later_bars_leaves_earlier_features_unchanged(bars, t):
    a = build_features(bars)
    b = build_features(_perturbed(bars, t, seed=t))
    assert np.array_equal(a.values[: t + 1], b.values[: t + 1], equal_nan=True)
    assert not np.array_equal(a.values[t + 1:], b.values[t + 1:], equal_nan=True)  # the perturbation bites


def test_no_nan_after_warmup_and_warmup_matches_lookback(bars):
    f = build_features(bars)
    assert f.values.dtype == np.float32 and f.values.shape == (len(bars), len(f.names))
    assert np.isfinite(f.values[f.warmup:]).all()
    assert not np.isfinite(f.values[f.warmup - 1]).all()
    assert f.warmup == f.max_lookback  # the longest window needs exactly that many earlier bars
    assert {"ret_1", "ret_60", "vol_120", "ofi_1", "tod_sin", "dow_cos", "session_age"} <= set(f.names)


def test_roll_return_excludes_the_calendar_spread(bars):
    f = build_features(bars)
    k = np.flatnonzero(f.roll_mask)[0]
    c, o = bars.column("close"), bars.column("open")
    assert f.log_return[k] == pytest.approx(np.log(c[k] / o[k]))
    assert abs(f.log_return[k]) < 0.005 < abs(np.log(c[k] / c[k - 1]))


def test_warmup_bars_excluded_from_folds(bars):
    f = build_features(bars)
    folds = walk_forward_splits(bars.ts, SplitConfig(train="6000", val="2000", test="2000"), f.max_lookback, f.warmup)
    assert (folds["train_start"] >= f.warmup).all()


def test_normaliser_uses_training_rows_only(bars):
    f = build_features(bars)
    a, b = f.warmup, f.warmup + 3000
    norm = Normalizer.fit(f.values, a, b)
    z = norm.apply(f.values)
    assert np.allclose(z[a:b].mean(axis=0), 0, atol=1e-3)
    later = f.values.copy()
    later[b:] *= 7.0  # what comes after training must not move the statistics
    assert np.array_equal(Normalizer.fit(later, a, b).mean, norm.mean)
    with pytest.raises(ValueError, match="warm-up"):
        Normalizer.fit(f.values, 0, 100)
