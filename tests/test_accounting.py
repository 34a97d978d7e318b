"""Accounting against hand-computed trades: fills, slippage, commissions, a roll, limits, liquidation."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.accounting import simulate
from workbench.data import load_bars

OHLC = [  # open, high, low, close; bar 3 is the first bar of the next contract
    (100.00, 101.00, 99.00, 100.50),
    (100.75, 102.00, 100.50, 101.50),
    (101.50, 103.00, 101.00, 102.75),
    (110.00, 111.00, 109.50, 110.50),
    (110.50, 111.50, 110.00, 111.25),
    (111.25, 112.00, 110.75, 111.50),
]


@pytest.fixture()
def es_bars():
    o, h, l, c = map(np.array, zip(*OHLC))
    df = pd.DataFrame({"ts_event": pd.date_range("2024-03-07 15:00", periods=6, freq="min", tz="UTC"),
                       "open": o, "high": h, "low": l, "close": c, "volume": 10.0,
                       "symbol": ["ESH4"] * 3 + ["ESM4"] * 3, "instrument_id": [1] * 3 + [2] * 3})
    return load_bars(df, market="es")


def test_long_through_a_roll_by_hand(es_bars):
    r = simulate(np.array([1, 1, 1, 1, 0, 0]), es_bars)
    # buy at bar 1: open 100.75 + 1 tick = 101.00; roll at bar 3 marked from the new open;
    # sell at bar 5: open 111.25 - 1 tick = 111.00.  $50/point, $2.15/side, roll = 2 sides + 2 ticks.
    expected = [0.0, 50 * 0.5 - 2.15, 50 * 1.25, 50 * 0.5 - (2 * 2.15 + 2 * 12.5), 50 * 0.75, 50 * -0.25 - 2.15]
    assert np.allclose(r.pnl, expected)
    assert list(r.position) == [0, 1, 1, 1, 1, 0]
    assert r.commission.sum() == pytest.approx(4 * 2.15)
    assert r.slippage.sum() == pytest.approx(4 * 12.5)
    (t,) = r.trades.itertuples()
    assert (t.entry_bar, t.exit_bar, t.side, t.max_qty) == (1, 5, 1, 1)
    assert (t.entry_price, t.exit_price) == (101.0, 111.0)
    assert t.pnl == pytest.approx(sum(expected)) == pytest.approx(103.9)
    assert t.costs == pytest.approx(4 * 2.15 + 4 * 12.5)
    # the 7.25-point gap between contracts is never PnL
    assert r.pnl.sum() < 50 * (111.0 - 101.0)
    # the trade spans the roll: flagged, both contracts named, the gap it was not paid for carried
    assert (t.entry_symbol, t.exit_symbol, t.rolls, t.roll_gap_points) == ("ESH4", "ESM4", 1, 110.0 - 102.75)
    moved = t.side * (t.exit_price - t.entry_price - t.roll_gap_points)  # points earned, fill slippage inside
    assert 50 * moved - 4 * 2.15 - 2 * 12.5 == pytest.approx(t.pnl)  # less commissions and the roll's two ticks


def test_flip_and_resize(es_bars):
    r = simulate(np.array([2, -1, -1, -1, -1, -1]), es_bars)
    assert list(r.position) == [0, 2, -1, -1, -1, -1]
    # bar 2 sells 3 at 101.50 - 0.25: the long pair closes, a short of 1 opens
    assert r.pnl[2] == pytest.approx(50 * (2 * (101.25 - 101.5) + (-1) * (102.75 - 101.25)) - 3 * 2.15)
    assert len(r.trades) == 2
    long_, short = r.trades.itertuples()
    assert (long_.side, long_.max_qty, long_.exit_price) == (1, 2, 101.25)
    assert (short.side, short.entry_price) == (-1, 101.25)
    assert short.exit_bar == 5 and short.exit_price == 111.5 + 0.25  # liquidated at the last close
    assert r.trades["pnl"].sum() == pytest.approx(r.pnl.sum())


def test_passive_limit_fills_only_when_traded_through(es_bars):
    order = np.ones(6, np.int8)
    hit = simulate(np.array([1, 1, 1, 1, 1, 1]), es_bars, order=order, limit=np.full(6, 100.6))
    assert hit.position[1] == 1 and hit.trades.iloc[0]["entry_price"] == 100.6  # low 100.50 < 100.60
    assert hit.slippage[1] == 0.0 and hit.commission[1] == pytest.approx(2.15)
    miss = simulate(np.array([1, 0, 0, 0, 0, 0]), es_bars, order=order, limit=np.full(6, 100.5))
    assert list(miss.position) == [0] * 6 and miss.pnl.sum() == 0.0  # low == limit: not through


def test_end_liquidation_charges_costs(es_bars):
    r = simulate(np.ones(6, dtype=int), es_bars)
    assert r.position[-1] == 1
    assert r.pnl[-1] == pytest.approx(50 * (111.5 - 111.25) - 2.15 - 12.5)
    assert r.trades.iloc[0]["exit_price"] == 111.25


def test_rejects_bad_targets(es_bars):
    with pytest.raises(ValueError, match="integers"):
        simulate(np.array([0.5, 1, 1, 1, 1, 1]), es_bars)
    with pytest.raises(ValueError, match="shape"):
        simulate(np.ones(3), es_bars)
    with pytest.raises(ValueError, match="limit"):
        simulate(np.ones(6, int), es_bars, order=np.ones(6, np.int8))


def test_random_targets_trades_sum_to_pnl(bars):
    rng = np.random.default_rng(5)
    target = rng.integers(-3, 4, len(bars))
    target = np.repeat(target[::40], 40)[: len(bars)]
    order = rng.integers(0, 2, len(bars)).astype(np.int8)
    limit = bars.column("close") + rng.normal(0, 0.5, len(bars))
    r = simulate(target, bars, order=order, limit=limit)
    assert r.trades["pnl"].sum() == pytest.approx(r.pnl.sum(), abs=1e-6)
    assert (r.commission >= 0).all() and r.commission.sum() > 0


def test_closing_on_the_roll_bar_costs_one_trade_not_three(es_bars):
    # decided at bar 2's close, the exit fills at bar 3, the first bar of the new contract
    r = simulate(np.array([1, 1, 0, 0, 0, 0]), es_bars)
    assert list(r.position) == [0, 1, 1, 0, 0, 0]
    assert r.commission[3] == pytest.approx(2.15) and r.slippage[3] == pytest.approx(12.5)  # one side, one tick
    # reducing 2 -> 1 across the roll: one contract rolled (2 sides, 2 ticks), one closed (1 side, 1 tick)
    r = simulate(np.array([2, 2, 1, 1, 0, 0]), es_bars)
    assert r.commission[3] == pytest.approx(3 * 2.15) and r.slippage[3] == pytest.approx(3 * 12.5)
    # reversing 1 -> -1 across the roll: nothing carried, two contracts trade once
    r = simulate(np.array([1, 1, -1, -1, 0, 0]), es_bars)
    assert r.commission[3] == pytest.approx(2 * 2.15) and r.slippage[3] == pytest.approx(2 * 12.5)


def test_the_baselines_load_the_types_the_agents_backtests_use(bars):
    """The GPU path computes the rule baselines on a background thread while it trains
    (engine.WalkForward.run); their simulate() (market orders, the run's capital and ruin level) must load
    the very specialisation a fold's backtest then calls (market orders) and the agent's (passive orders
    with limits), so the one-off load is paid there: no new one appears after it."""
    from workbench.accounting import _simulate_core

    part = bars.slice(0, 64)
    simulate(np.zeros(len(part), np.int64), part, capital=100_000.0, ruin_level=0.0)
    before = list(_simulate_core.signatures)
    assert before
    part = bars.slice(100, 400)
    simulate(np.ones(len(part)), part)
    order = np.zeros(len(part), np.int8)
    order[::7] = 1
    simulate(np.ones(len(part)), part, order=order, limit=part.column("close").copy(), ruin_level=50_000.0)
    assert list(_simulate_core.signatures) == before
