"""Futures accounting: ``simulate(target, bars, spec)`` turns target positions into fills, PnL and trades.

Rules (one implementation, ``cuda_kernels.env.fill_bar``, serves this module, the GPU env step and
the CPU backend's env step, so the three cannot drift apart):

- A decision at bar t (made with data up to bar t's close) executes at bar t+1.
  Market orders fill at bar t+1's open plus slippage (``slippage_ticks`` against the trade).
  Passive limit orders fill at their limit only if bar t+1 trades through it (buy: low < limit;
  sell: high > limit); if bar t+1 opens beyond the limit they fill at the open. An unfilled limit
  expires and the position stays as it was. Limits pay no slippage.
- Commissions: ``commission_per_side`` USD per contract per side plus ``commission_bps`` of notional.
- PnL is marked to each bar's close, in USD: ``point_value x position x price change``.
- Rolls: the position is rolled, not flattened. On the first bar of a new contract the carried
  position is marked from that bar's open (the gap between contracts is never booked as PnL) and the
  contracts carried into the new contract are charged two trades each (a commission on each side and
  one slippage per leg); contracts that an order filled on that bar closes trade once, like any fill.
- The position left at the end is liquidated at the last bar's close with slippage and commission,
  so every reported result has paid its exit.
- Ruin: with ``ruin_level`` set, an account whose equity (``capital`` + cumulative PnL, marked at a
  bar's close) falls to that level or below stops trading: the decision at that bar is to go flat
  (filled at the next bar's open like any order) and it stays flat to the end of the range;
  ``SimResult.ruined_bar`` says where.

Results are per bar: ``position`` (held over the bar, after its fill), ``pnl`` (net USD),
``commission``, ``slippage`` (USD, already inside ``pnl`` through the fill prices) and ``trades``; a
trade held across a roll names both contracts and carries the roll gaps its booked PnL leaves out.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from cuda_kernels.env import fill_bar_cpu, liquidation_cost_cpu
from cuda_kernels.nb import cached_njit

from .data import Bars
from .markets import MarketSpec

MARKET, PASSIVE = 0, 1
TRADE_FIELDS = ("entry_bar", "exit_bar", "side", "max_qty", "entry_price", "exit_price", "pnl", "costs")


@cached_njit  # cached per hash of cuda_kernels/ (fill_bar lives there): see cuda_kernels/nb.py
def _simulate_core(open_, high, low, close, roll, target, order, limit, pv, slip, comm, bps):  # pragma: no cover - jitted
    T = close.shape[0]
    position = np.zeros(T, np.int64)
    pnl = np.zeros(T)
    commission = np.zeros(T)
    slippage = np.zeros(T)
    trades = np.zeros((T + 1, 8))
    n_tr = 0
    pos = 0
    t_entry, t_price, t_pnl, t_cost, t_max = 0, 0.0, 0.0, 0.0, 0
    for t in range(T):
        bar_pnl, bar_comm, bar_slip = 0.0, 0.0, 0.0
        if t > 0:
            want = target[t - 1]
            pos_before = pos
            pos, bar_pnl, roll_c, roll_s, filled, fill, old_part, new_part, c, s = fill_bar_cpu(
                open_, high, low, close, roll, t, pos, want, order[t - 1] != 0, limit[t - 1], pv, slip, comm, bps)
            bar_comm = roll_c + c
            bar_slip = roll_s + s
            t_pnl -= roll_c + roll_s
            t_cost += roll_c + roll_s
            # trade bookkeeping: a fill closes, opens, reverses or resizes the open trade
            if filled:
                q = abs(want - pos_before)
                closes = pos_before != 0 and (want == 0 or (want > 0) != (pos_before > 0))
                opens = want != 0 and (pos_before == 0 or (want > 0) != (pos_before > 0))
                if closes:
                    c_close = c * abs(pos_before) / q
                    t_pnl += old_part - c_close
                    t_cost += c_close + (s * abs(pos_before) / q)
                    trades[n_tr, 0] = t_entry
                    trades[n_tr, 1] = t
                    trades[n_tr, 2] = 1.0 if pos_before > 0 else -1.0
                    trades[n_tr, 3] = t_max
                    trades[n_tr, 4] = t_price
                    trades[n_tr, 5] = fill
                    trades[n_tr, 6] = t_pnl
                    trades[n_tr, 7] = t_cost
                    n_tr += 1
                if opens:
                    c_open = c * abs(want) / q if closes else c
                    t_entry, t_price, t_max = t, fill, abs(want)
                    t_pnl = new_part - c_open
                    t_cost = c_open + (s * abs(want) / q if closes else s)
                elif not closes:  # resized in the same direction
                    t_pnl += old_part + new_part - c
                    t_cost += c + s
                    t_max = max(t_max, abs(want))
            else:
                t_pnl += bar_pnl + roll_c + roll_s  # the mark of the held position
        position[t] = pos
        pnl[t] = bar_pnl
        commission[t] = bar_comm
        slippage[t] = bar_slip
    if pos != 0 and T > 0:  # liquidate at the last close
        c, s = liquidation_cost_cpu(pos, close[T - 1], pv, slip, comm, bps)
        pnl[T - 1] -= c + s
        commission[T - 1] += c
        slippage[T - 1] += s
        t_pnl -= c + s
        t_cost += c + s
        trades[n_tr, 0] = t_entry
        trades[n_tr, 1] = T - 1
        trades[n_tr, 2] = 1.0 if pos > 0 else -1.0
        trades[n_tr, 3] = t_max
        trades[n_tr, 4] = t_price
        trades[n_tr, 5] = close[T - 1] - slip if pos > 0 else close[T - 1] + slip
        trades[n_tr, 6] = t_pnl
        trades[n_tr, 7] = t_cost
        n_tr += 1
    return position, pnl, commission, slippage, trades[:n_tr]


def _roll_fields(trades: pd.DataFrame, bars: Bars) -> None:
    """Trades held across a roll: the contracts at entry and exit, how many rolls, and the sum of the roll
    gaps (new contract's open - old contract's close, points) that the booked PnL leaves out, so that
    ``side x (exit_price - entry_price - roll_gap_points)`` is the price move the trade was paid for."""
    roll = bars.roll_mask
    gap = np.zeros(len(roll))
    if roll.any():
        o, c = bars.column("open"), bars.column("close")
        at = np.flatnonzero(roll)
        gap[at] = o[at] - c[at - 1]
    n_roll = np.concatenate([[0], np.cumsum(roll)])
    s_gap = np.concatenate([[0.0], np.cumsum(gap)])
    a, b = trades["entry_bar"].to_numpy(), trades["exit_bar"].to_numpy()
    sym = bars.frame["symbol"].to_numpy()
    trades["entry_symbol"] = sym[a] if len(trades) else np.array([], dtype=object)
    trades["exit_symbol"] = sym[b] if len(trades) else np.array([], dtype=object)
    trades["rolls"] = (n_roll[b + 1] - n_roll[a + 1]).astype(np.int64)  # roll bars in (entry, exit]
    trades["roll_gap_points"] = s_gap[b + 1] - s_gap[a + 1]


@dataclass
class SimResult:
    """Per-bar accounting of one range; money in USD."""

    index: pd.DatetimeIndex
    position: np.ndarray
    pnl: np.ndarray
    commission: np.ndarray
    slippage: np.ndarray
    trades: pd.DataFrame
    capital: float
    ruined_bar: int | None = None  # the bar whose close took the equity to the ruin level

    @property
    def equity(self) -> pd.Series:
        return pd.Series(self.capital + np.cumsum(self.pnl), index=self.index, name="equity_usd")

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"position": self.position, "pnl_usd": self.pnl, "commission_usd": self.commission,
                             "slippage_usd": self.slippage, "equity_usd": self.equity.to_numpy()}, index=self.index)


def simulate(target: np.ndarray, bars: Bars, spec: MarketSpec | None = None, order: np.ndarray | None = None,
             limit: np.ndarray | None = None, capital: float = 100_000.0, ruin_level: float | None = None) -> SimResult:
    """Account for integer target positions decided at each bar of ``bars``.

    Parameters
    ----------
    target : int [T], the position wanted after the decision at bar t (executes at bar t+1).
    bars : the bars of the range (:meth:`Bars.slice`).
    spec : contract terms; ``bars.market`` by default.
    order : int [T], 0 = market (default), 1 = passive limit.
    limit : float [T], limit prices of passive orders (NaN where unused).
    capital : starting equity in USD.
    ruin_level : equity (USD) at or below which the account stops trading (``None``: never).
    """
    spec = spec or bars.market
    T = len(bars)
    target = np.asarray(target)
    if target.shape != (T,):
        raise ValueError(f"target has shape {target.shape}, bars have {T}")
    if not np.all(np.isfinite(target)) or np.any(target != np.round(target)):
        raise ValueError("target positions must be finite integers (contracts)")
    order = np.zeros(T, np.int8) if order is None else np.asarray(order, np.int8)
    limit = np.full(T, np.nan) if limit is None else np.asarray(limit, np.float64)
    if np.any((order == PASSIVE) & ~np.isfinite(limit)):
        raise ValueError("passive orders need a finite limit price")
    prices = (bars.column("open"), bars.column("high"), bars.column("low"), bars.column("close"), bars.roll_mask)
    terms = (spec.point_value, spec.slippage_points, spec.commission_per_side, spec.commission_bps)
    target = target.astype(np.int64)
    pos, pnl, comm, slip, tr = _simulate_core(*prices, target, order, limit, *terms)
    ruined = None
    if ruin_level is not None:
        hit = np.flatnonzero(capital + np.cumsum(pnl) <= ruin_level)
        if len(hit):
            ruined = int(hit[0])
            target, order = target.copy(), order.copy()
            target[ruined:], order[ruined:] = 0, 0  # flat from the next bar's open, market order
            pos, pnl, comm, slip, tr = _simulate_core(*prices, target, order, limit, *terms)
    trades = pd.DataFrame(tr, columns=list(TRADE_FIELDS))
    for c in ("entry_bar", "exit_bar", "side", "max_qty"):
        trades[c] = trades[c].astype(np.int64)
    idx = bars.frame.index
    trades.insert(0, "entry_ts", idx[trades["entry_bar"].to_numpy()] if len(trades) else pd.DatetimeIndex([], tz="UTC"))
    trades.insert(1, "exit_ts", idx[trades["exit_bar"].to_numpy()] if len(trades) else pd.DatetimeIndex([], tz="UTC"))
    _roll_fields(trades, bars)
    return SimResult(idx, pos, pnl, comm, slip, trades, capital, ruined)
