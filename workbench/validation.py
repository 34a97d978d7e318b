"""Checks on bars and the report they produce.

Errors (the data cannot be used): empty input, non-numeric prices, NaN/inf, non-positive prices, OHLC
inconsistency (high < low, open or close outside [low, high]), duplicate timestamps per instrument,
and unsorted input when ``unsorted='refuse'``. Each error carries the number of offending rows and the
first few, with their row numbers in the file (0-based data rows).

Warnings (the data is used, the user should know): unsorted input that was sorted (the default: a
stable sort by timestamp), unexpected gaps, outlier returns, contract rolls with their price gap,
prices off the spec's tick grid, a file without volume. Notes (``info``): the market spec chosen and
why, the front-month choice, the expected gaps (no-trade minutes, the daily maintenance halt,
weekends/holidays). :meth:`ValidationReport.lines` gives one line per kind, for stderr.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .errors import DataError
from .markets import MarketSpec, _parse_hhmm

FIRST_ROWS = 5
NO_TRADE_MAX_MIN = 15  # a gap of at most this many minutes inside a session is a quiet market
OUTLIER_ROBUST_SIGMAS = 12.0
OUTLIER_MIN_ABS = 0.005


@dataclass
class Finding:
    """One check's result: ``severity`` is 'error' or 'warning'."""

    code: str
    severity: str
    message: str
    count: int
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)
    hint: str = ""

    def one_line(self) -> str:
        first = ""
        if len(self.rows) and "_row" in self.rows.columns:
            first = f" (first at rows {', '.join(str(int(r)) for r in self.rows['_row'].head(FIRST_ROWS))})"
        return f"{self.message}{first}"


@dataclass
class ValidationReport:
    """Everything learnt while loading bars: findings, gaps, rolls and row counts."""

    source: str = ""
    layout: str = ""
    rows_read: int = 0
    bars: int = 0
    spreads_dropped: int = 0
    non_front_dropped: int = 0
    product: str = ""
    market_choice: str = ""
    has_volume: bool = True
    findings: list[Finding] = field(default_factory=list)
    gaps: pd.DataFrame = field(default_factory=pd.DataFrame)
    rolls: pd.DataFrame = field(default_factory=pd.DataFrame)
    sessions: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, code: str, severity: str, message: str, rows: pd.DataFrame | None = None, count: int | None = None,
            hint: str = ""):
        rows = rows if rows is not None else pd.DataFrame()
        self.findings.append(Finding(code, severity, message, len(rows) if count is None else count,
                                     rows.head(FIRST_ROWS).copy(), hint))

    def lines(self) -> list[tuple[str, str]]:
        """(level, text) for stderr: what was read and kept, then one line per kind of note or warning
        (the expected gaps together on one line); the full lists stay in the report."""
        from pathlib import Path

        name = Path(self.source).name if self.source and not self.source.startswith("<") else self.source
        kept = f"{name}: {self.layout} layout, {self.rows_read:,} rows read, {self.bars:,} bars kept"
        if self.spreads_dropped:
            kept += f" ({self.spreads_dropped:,} calendar-spread rows dropped)"
        out = [("data", kept)]
        expected = []
        for f in self.findings:
            if f.code.startswith("gap_") and f.severity == "info":
                expected.append(f.message)
            elif f.severity != "error":
                out.append(("data" if f.severity == "info" else "warning", f.one_line()))
        if expected:
            out.append(("data", "expected gaps: " + ", ".join(expected)))
        return out

    def raise_if_errors(self) -> None:
        if self.errors:
            raise BarsValidationError(self)

    def summary(self) -> str:
        lines = [f"{self.source}: {self.layout} layout, {self.rows_read} rows read, {self.bars} bars kept"]
        if self.spreads_dropped or self.non_front_dropped:
            lines.append(f"  dropped {self.spreads_dropped} spread rows, {self.non_front_dropped} non-front rows")
        lines += [f"  {f.severity}: {f.one_line()}" for f in self.findings]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"source": self.source, "layout": self.layout, "rows_read": self.rows_read, "bars": self.bars,
                "spreads_dropped": self.spreads_dropped, "non_front_dropped": self.non_front_dropped,
                "findings": [{"code": f.code, "severity": f.severity, "message": f.message, "count": f.count}
                             for f in self.findings],
                "product": self.product, "market": self.market_choice, "has_volume": self.has_volume,
                "rolls": len(self.rolls), "roll_list": [
                    {"ts": str(r.ts), "from": r.from_symbol, "to": r.to_symbol, "price_gap": float(r.price_gap),
                     "spread": None if not np.isfinite(r.spread) else float(r.spread)}
                    for r in self.rolls.itertuples()] if len(self.rolls) else [],
                "gaps": self.gaps["kind"].value_counts().to_dict() if len(self.gaps) else {}}

    def __str__(self) -> str:
        return self.summary()


class BarsValidationError(DataError):
    """Bars with errors; ``report`` holds every finding."""

    def __init__(self, report: ValidationReport):
        errs = report.errors
        head = errs[0].one_line()
        more = f"; and {len(errs) - 1} more error kind(s)" if len(errs) > 1 else ""
        super().__init__(f"{report.source}: {head}{more}",
                         errs[0].hint or "see the validation report (workbench.data.validate_bars)")
        self.report = report


def check_numeric(df: pd.DataFrame, report: ValidationReport, columns: tuple[str, ...]) -> pd.DataFrame:
    """Coerce price/volume columns to float64; values that are not numbers are an error."""
    for c in columns:
        if c not in df.columns:
            continue
        if pd.api.types.is_numeric_dtype(df[c].dtype) and not pd.api.types.is_bool_dtype(df[c].dtype):
            df[c] = df[c].astype(np.float64)
            continue
        coerced = pd.to_numeric(df[c], errors="coerce")
        bad = coerced.isna() & df[c].notna()
        if bad.any():
            report.add("non_numeric", "error", f"{int(bad.sum())} non-numeric values in column '{c}'", df[bad])
        df[c] = coerced.astype(np.float64)
    return df


def check_values(df: pd.DataFrame, report: ValidationReport, has_volume: bool = True) -> None:
    """NaN/inf, non-positive prices, OHLC consistency, negative volume (volume only if the file has it)."""
    px = df[["open", "high", "low", "close"]].to_numpy()
    nonfinite = ~np.isfinite(px).all(axis=1)
    if has_volume:
        nonfinite |= ~np.isfinite(df["volume"].to_numpy())
    if nonfinite.any():
        report.add("non_finite", "error", f"{int(nonfinite.sum())} rows with NaN or infinite prices/volume", df[nonfinite])
    finite = ~nonfinite
    nonpos = finite & (px <= 0).any(axis=1)
    if nonpos.any():
        report.add("non_positive", "error", f"{int(nonpos.sum())} rows with a price <= 0", df[nonpos])
    o, h, l, c = px.T
    hl = finite & (h < l)
    if hl.any():
        report.add("high_below_low", "error", f"{int(hl.sum())} rows with high < low", df[hl])
    outside = finite & ~hl & ((o > h) | (o < l) | (c > h) | (c < l))
    if outside.any():
        report.add("ohlc_outside_range", "error", f"{int(outside.sum())} rows with open or close outside [low, high]",
                   df[outside])
    negvol = finite & (np.nan_to_num(df["volume"].to_numpy()) < 0)
    if negvol.any():
        report.add("negative_volume", "error", f"{int(negvol.sum())} rows with negative volume", df[negvol])


def check_duplicates(df: pd.DataFrame, report: ValidationReport) -> None:
    dup = df.duplicated(["instrument_id", "ts"], keep=False).to_numpy()
    if dup.any():
        report.add("duplicate_timestamps", "error",
                   f"{int(dup.sum())} rows share a timestamp with another row of the same instrument", df[dup])


def check_sorted(df: pd.DataFrame, report: ValidationReport, policy: str) -> pd.DataFrame:
    """Unsorted input is sorted (stable, with a warning) or refused, by ``policy``."""
    ts = df["ts"].to_numpy()
    back = np.flatnonzero(np.diff(ts) < 0) + 1
    if len(back) == 0:
        return df
    rows = df.iloc[back]
    if policy == "refuse":
        report.add("unsorted", "error", f"{len(back)} rows are earlier than the row before them", rows)
        return df
    report.add("unsorted", "warning", f"input was not sorted by time ({len(back)} rows out of order): sorted it", rows)
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def classify_gaps(ts: np.ndarray, spec: MarketSpec) -> pd.DataFrame:
    """One row per gap longer than the bar interval, with its kind."""
    if len(ts) < 3:
        return pd.DataFrame(columns=["after", "before", "missing_min", "kind"])
    diff = np.diff(ts)
    interval = int(np.median(diff))
    idx = np.flatnonzero(diff > interval)
    after, before = ts[idx], ts[idx + 1]
    missing_min = (before - after - interval) / 60e9
    kinds = np.full(len(idx), "unexpected", dtype=object)
    a_loc = pd.DatetimeIndex(after + interval, tz="UTC").tz_convert(spec.session_tz)
    b_loc = pd.DatetimeIndex(before - interval, tz="UTC").tz_convert(spec.session_tz)
    # A closure that holds a Saturday is a weekend; any other gap of 4 hours or more is a holiday or
    # early close (CME's abbreviated sessions last at least that long).
    days_between = (b_loc.normalize() - a_loc.normalize()).days.to_numpy()
    wd_a = a_loc.day_of_week.to_numpy()
    holds_saturday = days_between >= (5 - wd_a) % 7
    kinds[(missing_min >= 4 * 60) | holds_saturday] = "weekend_holiday"
    if spec.halt_start:
        hs, he = (h * 60 + m for (h, m) in (_parse_hhmm(spec.halt_start, "halt_start"), _parse_hhmm(spec.halt_end, "halt_end")))
        start_m = (a_loc.hour * 60 + a_loc.minute).to_numpy()
        end_m = (b_loc.hour * 60 + b_loc.minute).to_numpy()
        covers_halt = (start_m <= hs) & (end_m >= he - 1) & (missing_min <= (he - hs) + 60)
        kinds[(kinds == "unexpected") & covers_halt] = "maintenance_halt"
        in_halt = (start_m >= hs) & (end_m < he)
        kinds[(kinds == "unexpected") & in_halt] = "maintenance_halt"
    kinds[(kinds == "unexpected") & (missing_min <= NO_TRADE_MAX_MIN)] = "no_trade_minute"
    return pd.DataFrame({"after": pd.to_datetime(after, utc=True), "before": pd.to_datetime(before, utc=True),
                         "missing_min": missing_min, "kind": kinds})


def report_gaps(ts: np.ndarray, spec: MarketSpec, report: ValidationReport) -> None:
    gaps = classify_gaps(ts, spec)
    report.gaps = gaps
    for kind, label in (("no_trade_minute", "short gaps (no trade in the minute)"),
                        ("maintenance_halt", "daily maintenance halts"),
                        ("weekend_holiday", "weekend or holiday closures"),
                        ("unexpected", "UNEXPECTED gaps (inside a session, longer than "
                                       f"{NO_TRADE_MAX_MIN} min)")):
        sel = gaps[gaps["kind"] == kind]
        if len(sel):
            first = f" (first after {sel['after'].iloc[0]:%Y-%m-%d %H:%M} UTC)" if kind == "unexpected" else ""
            report.add(f"gap_{kind}", "warning" if kind == "unexpected" else "info", f"{len(sel)} {label}{first}",
                       sel.rename(columns={"after": "ts"}))


def report_outliers(df: pd.DataFrame, roll_mask: np.ndarray, report: ValidationReport) -> None:
    close = df["close"].to_numpy()
    if len(close) < 10:
        return
    r = np.diff(np.log(close))
    r[roll_mask[1:]] = 0.0  # the price gap of a roll is not a return
    mad = np.median(np.abs(r - np.median(r)))
    sigma = 1.4826 * mad if mad > 0 else np.std(r)
    bad = np.flatnonzero((np.abs(r) > OUTLIER_ROBUST_SIGMAS * sigma) & (np.abs(r) > OUTLIER_MIN_ABS)) + 1
    if len(bad):
        rows = df.iloc[bad].assign(log_return=r[bad - 1])
        report.add("outlier_returns", "warning",
                   f"{len(bad)} bar returns beyond {OUTLIER_ROBUST_SIGMAS:g} robust sigmas and {OUTLIER_MIN_ABS:.1%}", rows)
