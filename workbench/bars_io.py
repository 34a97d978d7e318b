"""Reading bar files into one canonical column layout, before validation.

Layouts recognised (column names are matched case-insensitively):

- Databento OHLCV exports: ``ts_event`` (int64 UTC ns, or a timestamp column/index), ``open/high/low/close``
  as int64 fixed-point in 1e-9 units (raw DBN) or floats (``to_df``), ``volume``, ``symbol``,
  ``instrument_id``. Integer prices are scaled by 1e-9 only in this layout.
- pandas-written files: a DatetimeIndex (or a ``ts``/``timestamp``/``datetime``/``date``/``time`` column).
- backtesting.py CSV: ``,Open,High,Low,Close,Volume`` with the dates in the first, unnamed column.

Order flow: ``buy_volume``/``sell_volume`` are used as they are; ``ask_volume``/``bid_volume`` (volume
traded at the ask is buyer-initiated) are mapped to buy/sell.

Timestamps become UTC nanoseconds; integers are read as ns, us, ms or s by magnitude; naive
datetimes are taken to be in ``naive_tz`` (UTC by default).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .errors import DataError, MissingInputError

PRICE_COLUMNS = ("open", "high", "low", "close")
TIME_NAMES = ("ts_event", "ts", "timestamp", "datetime", "date", "time", "ts_recv")
FLOW_ALIASES = {"buy_volume": "buy_volume", "sell_volume": "sell_volume", "buyvolume": "buy_volume",
                "sellvolume": "sell_volume", "ask_volume": "buy_volume", "bid_volume": "sell_volume"}


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a parquet file, a parquet directory dataset, or a CSV file."""
    p = Path(path)
    if not p.exists():
        raise MissingInputError(f"no such file or directory: {p}")
    try:
        if p.is_dir() or p.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(p)
        if p.suffix.lower() in (".csv", ".txt") or p.name.lower().endswith(".csv.gz"):
            # Only empty cells and NaN spellings are missing: "n/a" or "-" must surface as non-numeric.
            return pd.read_csv(p, keep_default_na=False, na_values=["", "NaN", "nan"])
    except Exception as exc:  # pyarrow / pandas raise many types for a corrupt file
        raise DataError(f"cannot read {p}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                        "is it a valid parquet or CSV file?") from exc
    raise DataError(f"cannot read {p}: unknown file type '{p.suffix}'", "use .parquet, a parquet directory, or .csv")


def _to_utc_ns(values: pd.Series | pd.Index, naive_tz: str, column: str) -> np.ndarray:
    if pd.api.types.is_integer_dtype(values.dtype):
        v = np.asarray(values, dtype=np.int64)
        mag = np.nanmax(np.abs(v)) if len(v) else 0
        scale = 1 if mag > 1e17 else 1_000 if mag > 1e14 else 1_000_000 if mag > 1e11 else 1_000_000_000
        return v * scale
    try:
        ts = pd.to_datetime(values, utc=False, format="mixed") if not isinstance(
            values.dtype, pd.DatetimeTZDtype) and not pd.api.types.is_datetime64_any_dtype(values.dtype) else values
    except (ValueError, TypeError) as exc:
        raise DataError(f"column '{column}' has values that are not timestamps: {exc}") from exc
    idx = pd.DatetimeIndex(ts)
    if idx.tz is None:
        idx = idx.tz_localize(naive_tz, ambiguous="NaT", nonexistent="NaT")
    idx = idx.tz_convert("UTC").as_unit("ns")
    out = idx.asi8.copy()
    if idx.hasnans:
        raise DataError(f"column '{column}' has {int(idx.isna().sum())} missing or unparseable timestamps",
                        f"first at row {int(np.flatnonzero(idx.isna())[0])}")
    return out


def canonical_frame(raw: pd.DataFrame, naive_tz: str = "UTC") -> tuple[pd.DataFrame, str]:
    """Return (frame with ``ts`` int64 UTC ns + lower-case columns + ``_row``, layout name)."""
    df = raw
    layout = "columns"
    if isinstance(df.index, pd.DatetimeIndex) or (df.index.name or "").lower() in TIME_NAMES:
        df = df.reset_index()
        layout = "datetime-index"
    df = df.rename(columns={c: str(c).strip().lower() for c in df.columns})
    first = df.columns[0] if len(df.columns) else None
    time_col = next((c for c in TIME_NAMES if c in df.columns), None)
    if time_col is None and first is not None and (first == "" or first.startswith("unnamed")):
        time_col, layout = first, "backtesting.py"
    if "ts_event" in df.columns:
        layout = "databento"
    df = df.rename(columns={k: v for k, v in FLOW_ALIASES.items() if k in df.columns})
    if time_col is None:
        raise DataError("missing timestamp column", f"expected one of {', '.join(TIME_NAMES)} or a datetime index")
    missing = [c for c in (*PRICE_COLUMNS, "volume") if c not in df.columns]
    if missing:
        raise DataError(f"missing columns: {', '.join(missing)}",
                        f"found {', '.join(map(str, df.columns))}")
    out = pd.DataFrame({"_row": np.arange(len(df), dtype=np.int64)})
    out["ts"] = _to_utc_ns(df[time_col], naive_tz, time_col) if len(df) else np.zeros(0, np.int64)
    for c in (*PRICE_COLUMNS, "volume", "buy_volume", "sell_volume"):
        if c in df.columns:
            out[c] = df[c].to_numpy()
    out["symbol"] = df["symbol"].astype(str).to_numpy() if "symbol" in df.columns else ""
    if "instrument_id" in df.columns:
        out["instrument_id"] = pd.to_numeric(df["instrument_id"], errors="coerce").fillna(-1).astype(np.int64).to_numpy()
    else:
        out["instrument_id"] = np.int64(0)
    if layout == "databento":
        for c in PRICE_COLUMNS:
            if pd.api.types.is_integer_dtype(out[c].dtype):
                out[c] = out[c].astype(np.float64) * 1e-9  # DBN fixed-point prices
    return out, layout
