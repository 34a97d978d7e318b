"""Futures bars: ``load_bars`` reads, validates and reduces a file to one front-contract series.

Pipeline: read (``bars_io``) -> canonical columns, UTC ns timestamps -> drop calendar spreads
(symbols with '-' or a ``UD:`` prefix) -> checks (``validation``) -> sort -> front contract per bar ->
rolls, gaps and outliers as warnings -> :class:`Bars`.

Front contract: in each minute the highest-volume outright is the front, except that the front
never goes back to a contract that expires earlier than one already chosen (contracts are ordered by
their last timestamp in the file, i.e. by expiry). A minute whose front did not trade has no bar.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import validation as V
from .bars_io import canonical_frame, read_table
from .markets import MarketSpec, load_market, match_market


@dataclass
class Bars:
    """A validated front-contract bar series.

    ``frame`` is indexed by a UTC ``DatetimeIndex`` named ``ts`` and holds float64 ``open, high, low,
    close, volume`` (``buy_volume``, ``sell_volume`` where the source had order flow), ``instrument_id``,
    ``symbol`` and ``_row`` (row number in the source). ``roll_mask[t]`` is true on the first bar of a
    new contract.
    """

    frame: pd.DataFrame
    rolls: pd.DataFrame
    report: V.ValidationReport
    market: MarketSpec
    source: str = ""

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def ts(self) -> np.ndarray:
        """int64 UTC nanoseconds."""
        return self.frame.index.as_unit("ns").asi8

    @property
    def has_order_flow(self) -> bool:
        return "buy_volume" in self.frame.columns and "sell_volume" in self.frame.columns

    @property
    def roll_mask(self) -> np.ndarray:
        ids = self.frame["instrument_id"].to_numpy()
        mask = np.zeros(len(ids), dtype=bool)
        mask[1:] = ids[1:] != ids[:-1]
        return mask

    def column(self, name: str) -> np.ndarray:
        return self.frame[name].to_numpy(dtype=np.float64)

    def slice(self, start: int, stop: int) -> "Bars":
        """Bars ``[start, stop)`` (positions), sharing market and report."""
        sub = self.frame.iloc[start:stop]
        first, last = (sub.index[0], sub.index[-1]) if len(sub) else (None, None)
        rolls = self.rolls[(self.rolls["ts"] >= first) & (self.rolls["ts"] <= last)] if len(sub) and len(self.rolls) else self.rolls.iloc[:0]
        return Bars(sub, rolls, self.report, self.market, self.source)


def _is_spread(symbols: pd.Series) -> np.ndarray:
    s = symbols.astype(str)
    return (s.str.contains("-", regex=False) | s.str.upper().str.startswith("UD:")).to_numpy()


def select_front(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Keep one row per timestamp: the monotone highest-volume contract. Returns (rows, dropped)."""
    if df["instrument_id"].nunique() <= 1:
        return df, 0
    last_seen = df.groupby("instrument_id")["ts"].agg(["max", "min"]).sort_values(["max", "min"])
    rank_of = pd.Series(np.arange(len(last_seen)), index=last_seen.index)
    rank = rank_of.loc[df["instrument_id"]].to_numpy()
    order = np.lexsort((-df["volume"].to_numpy(), df["ts"].to_numpy()))
    ts_sorted = df["ts"].to_numpy()[order]
    first_of_ts = np.ones(len(order), dtype=bool)
    first_of_ts[1:] = ts_sorted[1:] != ts_sorted[:-1]
    top = order[first_of_ts]  # highest-volume row of each timestamp, in time order
    chosen_rank = np.maximum.accumulate(rank[top])
    unique_ts = ts_sorted[first_of_ts]
    want = pd.Series(chosen_rank, index=unique_ts)
    keep = rank == want.loc[df["ts"].to_numpy()].to_numpy()
    out = df[keep]
    return out, int((~keep).sum())


def find_rolls(df: pd.DataFrame) -> pd.DataFrame:
    """One row per change of contract: when, from, to, and the price gap (new open - old close)."""
    ids = df["instrument_id"].to_numpy()
    at = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    return pd.DataFrame({
        "ts": pd.to_datetime(df["ts"].to_numpy()[at], utc=True),
        "from_symbol": df["symbol"].to_numpy()[at - 1], "to_symbol": df["symbol"].to_numpy()[at],
        "from_id": ids[at - 1], "to_id": ids[at],
        "old_close": df["close"].to_numpy()[at - 1], "new_open": df["open"].to_numpy()[at],
        "price_gap": df["open"].to_numpy()[at] - df["close"].to_numpy()[at - 1],
        "_row": df["_row"].to_numpy()[at],
    })


def validate_bars(path_or_frame, market: str = "auto", naive_tz: str = "UTC", unsorted: str = "sort") -> tuple[V.ValidationReport, Bars | None]:
    """Run every check; return the report and the bars (``None`` when there are errors)."""
    if unsorted not in ("sort", "refuse"):
        from .errors import ConfigError

        raise ConfigError(f"data.unsorted must be 'sort' or 'refuse', got {unsorted!r}")
    source = str(path_or_frame) if not isinstance(path_or_frame, pd.DataFrame) else "<DataFrame>"
    raw = read_table(path_or_frame) if not isinstance(path_or_frame, pd.DataFrame) else path_or_frame
    report = V.ValidationReport(source=source, rows_read=len(raw))
    df, report.layout = canonical_frame(raw, naive_tz)
    if len(df) == 0:
        report.add("empty", "error", "the file has no rows")
        return report, None
    df = V.check_numeric(df, report, ("open", "high", "low", "close", "volume", "buy_volume", "sell_volume"))
    spread = _is_spread(df["symbol"])
    report.spreads_dropped = int(spread.sum())
    df = df[~spread].reset_index(drop=True)
    if len(df) == 0:
        report.add("empty", "error", "no outright rows left after dropping calendar spreads")
        return report, None
    if report.errors:
        return report, None
    V.check_values(df, report)
    V.check_duplicates(df, report)
    df = V.check_sorted(df, report, unsorted)
    if report.errors:
        return report, None
    df, report.non_front_dropped = select_front(df)
    spec = load_market(market) if market != "auto" else match_market(sorted(set(df["symbol"]) - {""}))
    if spec.name == "GENERIC" and market == "auto":
        report.add("generic_market", "warning", "no market spec matched the symbols: using the generic spec",
                   count=0)
    rolls = find_rolls(df)
    report.rolls = rolls
    if len(rolls):
        gaps = ", ".join(f"{r.from_symbol}->{r.to_symbol} {r.price_gap:+.2f}" for r in rolls.itertuples())
        report.add("rolls", "warning", f"{len(rolls)} contract rolls, price gap not booked as PnL: {gaps}", rolls)
    roll_mask = np.zeros(len(df), dtype=bool)
    roll_mask[1:] = df["instrument_id"].to_numpy()[1:] != df["instrument_id"].to_numpy()[:-1]
    V.report_gaps(df["ts"].to_numpy(), spec, report)
    V.report_outliers(df, roll_mask, report)
    report.bars = len(df)
    frame = df.set_index(pd.DatetimeIndex(pd.to_datetime(df["ts"].to_numpy(), utc=True), name="ts")).drop(columns="ts")
    if frame["buy_volume"].isna().all() if "buy_volume" in frame.columns else False:
        frame = frame.drop(columns=["buy_volume", "sell_volume"], errors="ignore")
    return report, Bars(frame, rolls, report, spec, source)


def load_bars(path: str | Path | pd.DataFrame, market: str = "auto", naive_tz: str = "UTC",
              unsorted: str = "sort") -> Bars:
    """Read, validate and reduce bars to the front contract.

    Parameters
    ----------
    path : parquet file, parquet directory, CSV file, or a DataFrame already in memory.
    market : market spec name (``config/markets``) or ``'auto'`` to match the symbols.
    naive_tz : time zone of timestamps that carry none.
    unsorted : ``'sort'`` (default; stable sort with a warning) or ``'refuse'``.

    Raises
    ------
    MissingInputError : the path does not exist.
    DataError : unreadable file, missing columns, or any validation error
        (:class:`~workbench.validation.BarsValidationError`, whose ``report`` has every finding).
    """
    report, bars = validate_bars(path, market, naive_tz, unsorted)
    report.raise_if_errors()
    assert bars is not None
    return bars
