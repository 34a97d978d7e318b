"""Futures bars: ``load_bars`` reads, validates and reduces a file to one front-contract series.

Pipeline: read (``bars_io``) -> canonical columns, UTC ns timestamps -> drop calendar spreads
(:func:`workbench.contracts.is_spread`) -> one product (:func:`choose_product`) -> checks
(``validation``) -> sort -> market spec (by the product's root, else generic from the prices) -> front
contract per trading session (:mod:`workbench.front`) -> rolls, gaps, outliers, tick grid -> :class:`Bars`.

One product per series: a file holding several roots (ES and NQ) is refused with the list of them
unless ``symbol`` names one; a file without symbols takes its product from ``symbol`` or from a
contract named in the file name (``6EH4.XCME_1min.csv``).
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import validation as V
from .bars_io import canonical_frame, read_table, utc_index
from .contracts import is_spread, parse_symbol, roots_in_name
from .front import select_front, session_ids
from .markets import (MarketSpec, apply_overrides, futures_specs, generic_spec, load_market, match_root, number,
                      off_grid_share)

OFF_GRID_WARN = 0.01


@dataclass
class Bars:
    """A validated front-contract bar series.

    ``frame`` is indexed by a UTC ``DatetimeIndex`` named ``ts`` and holds float64 ``open, high, low,
    close, volume`` (NaN volume where the source had none; ``buy_volume``, ``sell_volume`` where the
    source had order flow), ``instrument_id``, ``symbol`` and ``_row`` (row number in the source).
    ``roll_mask[t]`` is true on the first bar of a new contract.
    """

    frame: pd.DataFrame
    rolls: pd.DataFrame
    report: V.ValidationReport
    market: MarketSpec
    source: str = ""

    def __len__(self) -> int:
        return len(self.frame)

    def __repr__(self) -> str:
        first, last = (self.frame.index[0], self.frame.index[-1]) if len(self.frame) else ("", "")
        return (f"<Bars {self.report.product or '?'} ({self.market.name}): {len(self)} bars {first} .. {last}, "
                f"{len(self.rolls)} rolls>")

    @property
    def ts(self) -> np.ndarray:
        """int64 UTC nanoseconds."""
        return self.frame.index.as_unit("ns").asi8

    @property
    def has_order_flow(self) -> bool:
        return "buy_volume" in self.frame.columns and "sell_volume" in self.frame.columns

    @property
    def has_volume(self) -> bool:
        return bool(self.frame["volume"].notna().any())

    @functools.cached_property
    def day_ids(self) -> np.ndarray:
        """int32 [T]: each bar's trading day, numbered from 0 in order (days end at the market's ``day_end``
        in exchange time); computed once per series, a range's ids are its slice less its first."""
        local = self.frame.index.tz_convert(self.market.session_tz) + self.market.day_end_offset()
        day = local.normalize().asi8
        return np.concatenate([[0], np.cumsum(day[1:] != day[:-1])]).astype(np.int32)

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


def _spread_mask(symbols: pd.Series) -> np.ndarray:
    codes, uniques = pd.factorize(symbols.astype(str))
    return np.array([is_spread(u) for u in uniques], dtype=bool)[codes] if len(uniques) else np.zeros(0, bool)


def choose_product(df: pd.DataFrame, symbol: str, source: str) -> tuple[pd.DataFrame, str, str]:
    """(rows of one product, its root, how it was chosen). Raises DataError for several products."""
    from .errors import DataError

    symbols = df["symbol"].astype(str)
    if (symbols == "").all():
        if symbol:
            return df, parse_symbol(symbol).root, f"from data.symbol {symbol!r}; the file has no symbol column"
        named = roots_in_name(Path(source).name, set(futures_specs())) if source else []
        if len(named) == 1:
            root, token = named[0]
            df = df.assign(symbol=token.upper())
            return df, root, f"from the file name ('{token}'); the file has no symbol column"
        return df, "", "the file has no symbol column"
    codes, uniq = pd.factorize(symbols.to_numpy())  # hashing, not a sort of every row's string
    root_of = np.array([parse_symbol(u).root for u in uniq])
    roots = root_of[codes]
    counts = pd.Series(roots).value_counts()
    if symbol:
        want = parse_symbol(symbol)
        exact = symbols.str.upper() == symbol.strip().upper()
        if want.dated and exact.any():
            return df[exact.to_numpy()], want.root, f"from data.symbol {symbol!r}: that contract only"
        if want.root in counts.index:
            rows = roots == want.root
            return df[rows], want.root, (f"from data.symbol {symbol!r}" +
                                         (f"; {int((~rows).sum()):,} rows of other products dropped" if (~rows).any() else ""))
        raise DataError(f"{source}: no product '{symbol}' in the file; it holds "
                        + ", ".join(f"{r} ({n} rows)" for r, n in counts.items()),
                        "set --symbol (config data.symbol) to one of them")
    if len(counts) > 1:
        listed = ", ".join(f"{r} ({n} rows)" for r, n in counts.items())
        raise DataError(f"{source}: {len(counts)} products in one file: {listed}; a series is one product",
                        f"choose one with --symbol {counts.index[0]} (config data.symbol)")
    return df, str(counts.index[0]), "from the symbols' root"


def _expiry_keys(df: pd.DataFrame) -> tuple[dict[int, int], str]:
    """instrument_id -> expiry order: from the contract months where every symbol names one, else by the
    instruments' last (then first) timestamps in the file."""
    g = df.groupby("instrument_id").agg(symbol=("symbol", "first"), first=("ts", "min"), last=("ts", "max"))
    parsed = [parse_symbol(s) for s in g["symbol"]]
    if all(c.dated for c in parsed):
        years = pd.to_datetime(g["first"].to_numpy(), utc=True).year
        return {int(i): c.expiry_key(int(y)) for i, c, y in zip(g.index, parsed, years)}, "contract months"
    order = g.sort_values(["last", "first"]).index
    return {int(i): k for k, i in enumerate(order)}, "last timestamps (symbols name no contract month)"


def _market(df: pd.DataFrame, root: str, how: str, market: str, terms: dict | None) -> tuple[MarketSpec, str]:
    prices = lambda: df[["open", "high", "low", "close"]].to_numpy().ravel()  # noqa: E731 (generic spec only)
    label = f"({root})" if root else ""
    if market == "auto":
        spec = match_root(root) if root else None
        if spec is not None:
            why = f"{spec.name} ({spec.description}) for product {root} ({how})"
        else:
            spec, note = generic_spec(prices(), label)
            what = f"no futures spec for product '{root}' ({how})" if root else f"no product known ({how})"
            why = f"GENERIC, {what}: {note}"
    elif market.lower() == "generic":
        spec, note = generic_spec(prices(), label)
        why = f"GENERIC, from data.market 'generic': {note}"
    else:
        spec = load_market(market)
        why = f"{spec.name} ({spec.description}), from data.market {market!r}"
    if terms:
        spec = apply_overrides(spec, terms)
        why += "; overridden: " + ", ".join(f"{k}={v:g}" for k, v in terms.items())
    return spec, why


def start_labelled(df: pd.DataFrame, spec: MarketSpec, report: V.ValidationReport) -> pd.DataFrame:
    """Bars stamped with their end time (NinjaTrader's exports) moved to their start time, the convention
    of exchanges and Databento. Told apart at the market's daily halt: end-stamped bars sit at the halt's
    start minute and none at its end minute. Markets without a halt are left as they are."""
    if not spec.halt_start or len(df) < 3:
        return df
    ts = df["ts"].to_numpy()
    step = int(np.median(np.diff(ts)))
    local = utc_index(ts).tz_convert(spec.session_tz)
    minute = (local.hour * 60 + local.minute).to_numpy()
    hs, he = (h * 60 + m for h, m in (V._parse_hhmm(spec.halt_start, "halt_start"), V._parse_hhmm(spec.halt_end, "halt_end")))
    step_min = step // 60_000_000_000
    if step_min < 1 or not ((minute == hs).sum() > 0 and (minute == he).sum() == 0 and (minute == he + step_min).sum() > 0):
        return df
    report.add("end_stamped", "info", f"bar timestamps mark each bar's end (bars at the {spec.halt_start} halt start, "
               f"none at its {spec.halt_end} end): moved one bar ({step_min} min) earlier, to the bar's start",
               count=len(df))
    return df.assign(ts=ts - step)


def find_rolls(df: pd.DataFrame, all_rows: pd.DataFrame | None = None, spec: MarketSpec | None = None) -> pd.DataFrame:
    """One row per change of contract: when (and the trading session, given the market), from, to, the
    gap not booked (new open - old close) and the calendar spread (new - old close) at the last minute
    before the roll in which both traded."""
    ids = df["instrument_id"].to_numpy()
    at = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    ts = df["ts"].to_numpy()[at]
    out = pd.DataFrame({
        "ts": pd.to_datetime(ts, utc=True),
        "session": pd.to_datetime(session_ids(ts, spec) * 86_400_000_000_000) if spec is not None else pd.NaT,
        "from_symbol": df["symbol"].to_numpy()[at - 1], "to_symbol": df["symbol"].to_numpy()[at],
        "from_id": ids[at - 1], "to_id": ids[at],
        "old_close": df["close"].to_numpy()[at - 1], "new_open": df["open"].to_numpy()[at],
        "price_gap": df["open"].to_numpy()[at] - df["close"].to_numpy()[at - 1],
        "_row": df["_row"].to_numpy()[at],
    })
    spread = np.full(len(at), np.nan)
    if all_rows is not None and len(at):
        close = {i: g.set_index("ts")["close"] for i, g in all_rows.groupby("instrument_id")}
        for j, t in enumerate(at):
            when = df["ts"].iat[t]
            old, new = close[ids[t - 1]], close[ids[t]]
            common = old.index[old.index < when].intersection(new.index[new.index < when])
            if len(common):
                spread[j] = new[common[-1]] - old[common[-1]]
    out["spread"] = spread
    return out


def validate_bars(path_or_frame, market: str = "auto", naive_tz: str = "UTC", unsorted: str = "sort",
                  symbol: str = "", terms: dict | None = None) -> tuple[V.ValidationReport, Bars | None]:
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
    df = V.check_numeric(df, report, ("open", "high", "low", "close", "volume", "buy_volume", "sell_volume",
                                      "open_interest"))
    spread = _spread_mask(df["symbol"])
    report.spreads_dropped = int(spread.sum())
    df = df[~spread].reset_index(drop=True)
    if len(df) == 0:
        report.add("empty", "error", "no outright rows left after dropping calendar spreads")
        return report, None
    if report.errors:
        return report, None
    df, report.product, how = choose_product(df, symbol, source if not isinstance(path_or_frame, pd.DataFrame) else "")
    report.has_volume = bool(df["volume"].notna().any())
    if not report.has_volume:
        report.add("no_volume", "warning", "no volume in the file: the volume features are left out")
    V.check_values(df, report, report.has_volume)
    V.check_duplicates(df, report)
    df = V.check_sorted(df, report, unsorted)
    if report.errors:
        return report, None
    spec, report.market_choice = _market(df, report.product, how, market, terms)
    report.add("market", "warning" if spec.generic and market == "auto" else "info",
               f"market: {report.market_choice}: {spec.terms()}")
    df = start_labelled(df, spec, report)
    all_rows = df
    if df["instrument_id"].nunique() > 1 and df["ts"].duplicated().any():
        has_oi = "open_interest" in df.columns and df["open_interest"].notna().any()
        if not report.has_volume and not has_oi:
            report.add("front_unknown", "error", f"{df['instrument_id'].nunique()} contracts and no volume or open "
                       "interest to choose the front month from", hint="name one contract with --symbol (config data.symbol)")
            return report, None
        expiry, order = _expiry_keys(df)
        df, report.sessions = select_front(df, spec, expiry)
        report.non_front_dropped = len(all_rows) - len(df)
        report.add("front", "info", f"front month per trading session by {'open interest' if has_oi else 'volume'} "
                   f"(expiry order from {order}): {report.non_front_dropped:,} rows of other contracts dropped",
                   count=report.non_front_dropped)
        df = df.reset_index(drop=True)
    elif df["instrument_id"].nunique() > 1:
        report.add("front", "info", "one row per timestamp: the file is already one chained series, its contract "
                   "changes are its rolls")
    rolls = find_rolls(df, all_rows, spec)
    report.rolls = rolls
    if len(rolls):
        text = ", ".join(f"{r.from_symbol}->{r.to_symbol} at the {r.session:%Y-%m-%d} session (calendar spread "
                         f"{'n/a' if not np.isfinite(r.spread) else number(r.spread)}, gap {number(r.price_gap)})"
                         for r in rolls.head(4).itertuples())
        more = f" and {len(rolls) - 4} more" if len(rolls) > 4 else ""
        report.add("rolls", "warning", f"{len(rolls)} contract roll(s), position rolled and charged, the price gap "
                   f"never booked as PnL: {text}{more}", rolls)
    if not spec.generic:
        off = off_grid_share(df[["open", "high", "low", "close"]].to_numpy().ravel(), spec.tick_size)
        if off > OFF_GRID_WARN:
            report.add("off_tick", "warning", f"{off:.1%} of the distinct prices are off {spec.name}'s "
                       f"{spec.tick_size:g} tick: a back-adjusted series or another instrument? "
                       "(check the spec, or --set data.market=generic)", count=int(off * 100))
    roll_mask = np.zeros(len(df), dtype=bool)
    roll_mask[1:] = df["instrument_id"].to_numpy()[1:] != df["instrument_id"].to_numpy()[:-1]
    V.report_gaps(df["ts"].to_numpy(), spec, report)
    V.report_outliers(df, roll_mask, report)
    report.bars = len(df)
    frame = df.set_index(utc_index(df["ts"].to_numpy(), name="ts")).drop(columns="ts")
    if frame["buy_volume"].isna().all() if "buy_volume" in frame.columns else False:
        frame = frame.drop(columns=["buy_volume", "sell_volume"], errors="ignore")
    return report, Bars(frame, rolls, report, spec, source)


def load_bars(path: str | Path | pd.DataFrame, market: str = "auto", naive_tz: str = "UTC",
              unsorted: str = "sort", symbol: str = "", terms: dict | None = None) -> Bars:
    """Read, validate and reduce bars to one product's front contract.

    Parameters
    ----------
    path : parquet file, parquet directory, CSV file (``.csv``, ``.csv.gz``), Databento DBN file
        (``.dbn``, ``.dbn.zst``; ``pip install "workbench[databento]"``), or a DataFrame in memory.
    market : ``'auto'`` (the spec of the symbols' root, else generic), a root in ``config/markets``
        (``'ES'``), ``'generic'``, or a TOML file.
    naive_tz : time zone of timestamps that carry none.
    unsorted : ``'sort'`` (default; stable sort with a warning) or ``'refuse'``.
    symbol : the product (``'NQ'``) or one contract (``'NQU4'``) to keep; required when the file holds
        several products, names the product of a file without symbols.
    terms : overrides of the spec's terms (``{'commission_per_side': 1.2}``; see
        :data:`workbench.markets.OVERRIDABLE`).

    Raises
    ------
    MissingInputError : the path does not exist.
    DataError : unreadable file, missing columns, several products, or any validation error
        (:class:`~workbench.validation.BarsValidationError`, whose ``report`` has every finding).
    """
    report, bars = validate_bars(path, market, naive_tz, unsorted, symbol, terms)
    report.raise_if_errors()
    assert bars is not None
    return bars


def bars_for(path_or_bars, cfg) -> Bars:
    """``load_bars`` with a run config's ``[data]`` and ``[market]`` settings; bars already loaded get the
    config's market (``data.market`` when it names another one, and the ``[market]`` overrides)."""
    d, terms = cfg.data, cfg.market.overrides()
    if not isinstance(path_or_bars, Bars):
        return load_bars(path_or_bars, market=d.market, naive_tz=d.naive_tz, unsorted=d.unsorted, symbol=d.symbol,
                         terms=terms)
    bars, spec = path_or_bars, path_or_bars.market
    if d.market != "auto" and d.market.lower() != spec.name.lower():
        spec, _ = _market(bars.frame, bars.report.product, "", d.market, None)
    if terms:
        spec = apply_overrides(spec, terms)
    return bars if spec == bars.market else Bars(bars.frame, bars.rolls, bars.report, spec, bars.source)
