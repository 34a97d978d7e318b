"""Metrics against empyrical-reloaded on random return series, and the Sharpe-inference formulas."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import empyrical as ep
from workbench import metrics as M
from workbench.markets import load_market


@pytest.mark.parametrize("seed", range(6))
def test_agrees_with_empyrical(seed):
    rng = np.random.default_rng(seed)
    r = rng.standard_t(4, int(rng.integers(30, 800))) * rng.uniform(0.002, 0.03) + rng.normal(0, 0.001)
    assert M.sharpe_ratio(r) == pytest.approx(ep.sharpe_ratio(r), abs=1e-9)
    assert M.sortino_ratio(r) == pytest.approx(ep.sortino_ratio(r), abs=1e-9)
    assert M.annual_return(r) == pytest.approx(ep.annual_return(r), abs=1e-9)
    assert M.annual_volatility(r) == pytest.approx(ep.annual_volatility(r), abs=1e-9)
    assert M.max_drawdown(r) == pytest.approx(ep.max_drawdown(r), abs=1e-9)
    assert M.calmar_ratio(r) == pytest.approx(ep.calmar_ratio(r), abs=1e-9)
    assert M.downside_risk(r) == pytest.approx(ep.downside_risk(r), abs=1e-9)


def test_probabilistic_sharpe_matches_the_formula():
    rng = np.random.default_rng(11)
    r = rng.normal(0.001, 0.01, 500)
    sr = r.mean() / r.std(ddof=1)
    z = (r - r.mean()) / r.std()
    g3, g4 = np.mean(z**3), np.mean(z**4)
    want = 0.5 * (1 + math.erf((sr * math.sqrt(499) / math.sqrt(1 - g3 * sr + (g4 - 1) / 4 * sr**2)) / math.sqrt(2)))
    assert M.probabilistic_sharpe(r) == pytest.approx(want, rel=1e-12)
    assert M.deflated_sharpe(r, n_trials=1) == M.probabilistic_sharpe(r)
    # more trials raise the bar: deflated Sharpe falls
    assert M.deflated_sharpe(r, n_trials=100, sr_variance=0.002) < M.deflated_sharpe(r, n_trials=5, sr_variance=0.002)
    # Bailey & Lopez de Prado's expected maximum for N=100, V=1: about 2.53 standard deviations
    assert M.expected_max_sharpe(100, 1.0) == pytest.approx(2.5306, abs=2e-3)


def test_daily_returns_follow_the_cme_trading_day():
    spec = load_market("es")
    idx = pd.DatetimeIndex(["2024-03-05 21:59", "2024-03-05 23:00", "2024-03-06 15:00"], tz="UTC")
    # 21:59 UTC = 15:59 CT (Tuesday's session); 23:00 UTC = 17:00 CT opens Wednesday's trading day
    d = M.daily_pnl(np.array([10.0, 20.0, 30.0]), idx, spec)
    assert list(d.index.strftime("%Y-%m-%d")) == ["2024-03-05", "2024-03-06"]
    assert list(d) == [10.0, 50.0]
    r = M.daily_returns(np.array([10.0, 20.0, 30.0]), idx, spec, 1000.0)
    assert list(r) == pytest.approx([0.01, 0.05])  # daily PnL on the fixed capital base: no compounding


def test_daily_pnl_groups_as_one_date_per_bar_would(rng):
    """The day grouping on local midnights gives what grouping on each bar's Python date gives, across the
    March and November clock changes, for a market with a trading-day offset and one without."""
    idx = pd.date_range("2024-03-08 20:00", "2024-03-12 03:00", freq="7min", tz="UTC").append(
        pd.date_range("2024-11-01 20:00", "2024-11-05 03:00", freq="7min", tz="UTC"))
    pnl = rng.normal(0, 50, len(idx))
    for spec in (load_market("ES"), load_market("generic")):
        local = idx.tz_convert(spec.session_tz) + spec.day_end_offset()
        want = pd.Series(pnl, index=pd.DatetimeIndex(local.date, name="trading_day")).groupby(level=0).sum()
        got = M.daily_pnl(pnl, idx, spec)
        pd.testing.assert_series_equal(got, want, check_exact=True)


def test_trade_stats():
    trades = pd.DataFrame({"pnl": [100.0, -50.0, 25.0, -25.0]})
    s = M.trade_stats(trades, np.array([0, 1, 1, 0, -1, -1, 0, 0]), n_days=2)
    assert s["trades"] == 4 and s["win_rate"] == 0.5
    assert s["profit_factor"] == pytest.approx(125.0 / 75.0)
    assert s["exposure"] == 0.5 and s["turnover_contracts_per_day"] == 2.0
