"""The account model: ratios independent of the capital base, ruin, and every Sharpe with its sample
and uncertainty (issue #12)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from workbench import metrics as M
from workbench.accounting import simulate
from workbench.config import load_config
from workbench.data import load_bars
from workbench.engine import WalkForward

from conftest import SAMPLE


@pytest.fixture(scope="module")
def sample():
    return load_bars(SAMPLE)


def _run(bars, *sets):
    return WalkForward(load_config(None, ['strategy.name="momentum"', *sets])).run(bars, progress=None)


def test_a_losing_run_never_shows_a_positive_sharpe_and_a_blown_account_stops(sample):
    # momentum on the sample loses more than a $10k account: the case that printed Sharpe +3.37
    res = _run(sample, "backtest.capital=10000")
    m = res.metrics
    assert m["net_pnl_usd"] < -10_000 and m["sharpe"] < 0 and m["sortino"] < 0 and m["psr"] < 0.5
    assert m["ruined"] and m["max_drawdown"] <= -1.0 and m["cagr"] == -1.0
    for f in res.fold_results:
        fm = f.metrics
        assert np.sign(fm["sharpe"]) == np.sign(fm["net_pnl_usd"]) or fm["net_pnl_usd"] == 0
        if fm["ruined"]:
            eq = f.bars["equity_usd"].to_numpy()
            first = int(np.flatnonzero(eq <= 0)[0])
            assert (f.bars["position"].to_numpy()[first + 1:] == 0).all()  # flat from the next bar on
            assert fm["ruined_at"] == str(f.bars.index[first])
    assert m["ruined_folds"] >= 1 and any(f.metrics["ruined"] for f in res.fold_results)


def test_ratios_do_not_move_with_the_capital_base(sample):
    a, b = _run(sample, "backtest.capital=100000", "splits.max_folds=2"), _run(sample, "backtest.capital=1e9",
                                                                              "splits.max_folds=2")
    for key in ("sharpe", "sharpe_se", "sortino", "psr", "net_pnl_usd", "days"):
        assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-9), key
    assert a.metrics["annual_volatility"] == pytest.approx(b.metrics["annual_volatility"] * 1e4, rel=1e-9)
    assert a.metrics["max_drawdown_usd"] == pytest.approx(b.metrics["max_drawdown_usd"], rel=1e-9)
    # the default base is stated: the unlevered notional of one contract at the first test bar
    auto = _run(sample, "splits.max_folds=1")
    first = sample.frame["close"].iloc[int(auto.folds["test_start"].iloc[0])]
    assert auto.capital == pytest.approx(50.0 * first) and "unlevered notional of 1 ES contracts" in auto.account.basis


def test_every_sharpe_carries_days_and_an_interval(sample):
    res = _run(sample, "splits.max_folds=2")
    for f in res.fold_results:
        m = f.metrics
        assert m["days"] == len(M.daily_pnl(f.bars["pnl_usd"].to_numpy(), f.bars.index, sample.market))
        assert m["few_days"] == (m["days"] < 20)
        assert m["sharpe_ci95_low"] < m["sharpe"] < m["sharpe_ci95_high"]
        assert m["sharpe_ci95_high"] - m["sharpe"] == pytest.approx(1.959964 * m["sharpe_se"], rel=1e-6)
        assert m["annualization"] == M.ANNUALIZATION_NOTE
    assert "psr" in res.metrics and res.metrics["days"] > max(f.metrics["days"] for f in res.fold_results)


def test_sharpe_standard_error_formula():
    rng = np.random.default_rng(4)
    r = rng.normal(0.002, 0.01, 400)
    sr = r.mean() / r.std(ddof=1)
    z = (r - r.mean()) / r.std()
    g3, g4 = np.mean(z**3), np.mean(z**4)
    want = math.sqrt((1 - g3 * sr + (g4 - 1) / 4 * sr**2) / 399) * math.sqrt(252)
    assert M.sharpe_standard_error(r) == pytest.approx(want, rel=1e-12)
    # normal returns: close to Lo (2002), sqrt((1 + SR^2 / 2) / n)
    assert M.sharpe_standard_error(r) == pytest.approx(math.sqrt((1 + sr**2 / 2) / 400) * math.sqrt(252), rel=0.05)
    assert math.isnan(M.sharpe_standard_error(r[:2]))


def test_simulate_stops_a_ruined_account():
    idx = pd.date_range("2024-03-05 15:00", periods=8, freq="min", tz="UTC")
    close = np.array([100.0, 99.0, 97.0, 94.0, 90.0, 91.0, 95.0, 99.0])
    df = pd.DataFrame({"ts_event": idx, "open": close, "high": close + 0.5, "low": close - 0.5, "close": close,
                       "volume": 10.0, "symbol": "ESM4"})
    bars = load_bars(df, market="es")
    target = np.ones(8, np.int64)  # long 1 ES throughout: -$50 per point
    free = simulate(target, bars, capital=400.0)
    stopped = simulate(target, bars, capital=400.0, ruin_level=0.0)
    eq = 400.0 + np.cumsum(free.pnl)
    first = int(np.flatnonzero(eq <= 0)[0])
    assert free.ruined_bar is None and stopped.ruined_bar == first
    assert np.array_equal(stopped.pnl[:first + 1], free.pnl[:first + 1])
    assert (stopped.position[first + 1:] == 0).all() and stopped.position[first] == 1
    assert stopped.pnl.sum() < free.pnl.sum()  # the rebound after ruin is not earned by a blown account
