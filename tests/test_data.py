"""Bar loading: layouts, front-contract selection, rolls, and every bad-input case through the CLI."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.data import load_bars, validate_bars
from workbench.errors import DataError, MissingInputError
from workbench.walkforward import main

from conftest import simple_frame


def test_databento_fixed_point_front_contract_and_rolls(synthetic_raw, tmp_path):
    path = tmp_path / "es.parquet"
    synthetic_raw.to_parquet(path)
    bars = load_bars(path)
    rep = bars.report
    assert rep.layout == "databento"
    assert rep.spreads_dropped == synthetic_raw["symbol"].str.contains("-").sum() > 0
    assert bars.market.name == "ES"
    f = bars.frame
    assert f.index.is_monotonic_increasing and f.index.is_unique
    assert np.allclose(np.round(f["close"] / 0.25) * 0.25, f["close"])  # fixed-point scaled to points
    assert 3000 < f["close"].median() < 8000
    # one bar per minute, front contract only, the front never goes back
    ids = f["instrument_id"].to_numpy()
    assert (np.diff(ids) >= 0).all() or (np.diff(ids) <= 0).all()
    assert len(bars.rolls) == 1
    roll = bars.rolls.iloc[0]
    assert (roll.from_symbol, roll.to_symbol) == ("ESH4", "ESM4")
    assert roll.price_gap == pytest.approx(roll.new_open - roll.old_close)
    assert any(w.code == "rolls" for w in rep.warnings)
    assert bars.roll_mask.sum() == 1
    # expected gaps are notes, not warnings; none is unexpected
    assert {"gap_maintenance_halt", "gap_weekend_holiday"} <= {f.code for f in rep.findings if f.severity == "info"}
    assert not any(f.code == "gap_unexpected" for f in rep.findings)


def test_front_selection_never_goes_back_on_a_volume_blip(synthetic_raw):
    raw = synthetic_raw[~synthetic_raw["symbol"].str.contains("-")].copy()
    bars = load_bars(raw)
    roll_ts = bars.rolls["ts"].iloc[0].value
    # a session after the roll's, give the expiring contract one minute of huge volume: it must stay out
    later = pd.Timestamp(roll_ts, tz="UTC") + pd.Timedelta("1D")
    old = raw[(raw["symbol"] == "ESH4") & (raw["ts_event"] > later.value)].index[:1]
    assert len(old) == 1
    raw.loc[old, "volume"] = 10**9
    again = load_bars(raw)
    assert len(again.rolls) == 1
    assert (again.frame.loc[again.frame.index > pd.Timestamp(roll_ts, tz="UTC"), "symbol"] == "ESM4").all()


def test_databento_float_prices_and_timestamp_column(synthetic_raw):
    raw = synthetic_raw.copy()
    for c in ("open", "high", "low", "close"):
        raw[c] = raw[c] / 1e9
    raw["ts_event"] = pd.to_datetime(raw["ts_event"], utc=True)
    a, b = load_bars(raw), load_bars(synthetic_raw)
    assert np.allclose(a.frame["close"], b.frame["close"])
    assert (a.ts == b.ts).all()


def test_pandas_datetime_index_parquet_and_directory(tmp_path):
    df = simple_frame(120)
    df.to_parquet(tmp_path / "one.parquet")
    d = tmp_path / "ds"
    d.mkdir()
    df.iloc[:60].to_parquet(d / "part-0.parquet")
    df.iloc[60:].to_parquet(d / "part-1.parquet")
    a, b = load_bars(tmp_path / "one.parquet"), load_bars(d)
    assert a.report.layout == "datetime-index" and len(a) == 120 and len(b) == 120
    assert np.allclose(a.frame["close"], df["close"]) and (a.ts == df.index.asi8).all()
    assert a.market.name == "GENERIC"
    assert not a.has_order_flow


def test_backtesting_py_csv_with_naive_times(tmp_path):
    df = simple_frame(30)
    out = df.rename(columns=str.capitalize)
    out.index = out.index.tz_localize(None)
    out.index.name = None
    path = tmp_path / "bt.csv"
    out.to_csv(path)
    assert open(path).readline().startswith(",Open,High,Low,Close,Volume")
    bars = load_bars(path)
    assert bars.report.layout == "backtesting.py"
    assert (bars.ts == df.index.asi8).all()
    ny = load_bars(path, naive_tz="America/New_York")
    assert (ny.ts - bars.ts == 5 * 3600 * 10**9).all()  # 2024-03-04 is before US DST: New York = UTC-5


def test_order_flow_aliases(tmp_path):
    df = simple_frame(40).reset_index()
    df["ask_volume"] = df["volume"] * 0.6
    df["bid_volume"] = df["volume"] * 0.4
    bars = load_bars(df)
    assert bars.has_order_flow
    assert np.allclose(bars.frame["buy_volume"], df["ask_volume"])


def test_unsorted_input_sorted_with_warning_or_refused():
    df = simple_frame(40)
    shuffled = df.iloc[np.r_[0:10, 20:30, 10:20, 30:40]]
    bars = load_bars(shuffled)
    assert (bars.ts == df.index.asi8).all()
    assert any(w.code == "unsorted" for w in bars.report.warnings)
    with pytest.raises(DataError, match="earlier than the row before"):
        load_bars(shuffled, unsorted="refuse")


def test_validate_bars_returns_report_without_raising():
    df = simple_frame(20)
    df.iloc[3, df.columns.get_loc("high")] = df.iloc[3]["low"] - 1
    report, bars = validate_bars(df)
    assert bars is None and not report.ok
    err = report.errors[0]
    assert err.code == "high_below_low" and err.count == 1 and list(err.rows["_row"]) == [3]


# ---- every bad-input case, through the real entry point: message and exit code ----

def _bad(kind: str, tmp_path):
    df = simple_frame(200).reset_index()
    path = tmp_path / f"{kind}.csv"
    if kind == "empty":
        df.iloc[:0].to_csv(path, index=False)
    elif kind == "unreadable":
        path = tmp_path / "bad.parquet"
        path.write_bytes(b"this is not parquet at all")
    elif kind == "missing_column":
        df.drop(columns=["low"]).to_csv(path, index=False)
    elif kind == "non_numeric":
        df["close"] = df["close"].astype(object)
        df.loc[[5, 9], "close"] = "n/a"
        df.to_csv(path, index=False)
    elif kind == "nan":
        df.loc[7, "open"] = np.nan
        df.to_csv(path, index=False)
    elif kind == "inf":
        df.loc[8, "close"] = np.inf
        df.to_csv(path, index=False)
    elif kind == "non_positive":
        df.loc[4, ["open", "low"]] = [0.0, 0.0]
        df.to_csv(path, index=False)
    elif kind == "high_below_low":
        df.loc[11, "high"] = df.loc[11, "low"] - 0.5
        df.to_csv(path, index=False)
    elif kind == "open_outside":
        df.loc[12, "open"] = df.loc[12, "high"] + 1.0
        df.to_csv(path, index=False)
    elif kind == "duplicate":
        df = pd.concat([df, df.iloc[[6]]]).sort_values("ts", kind="stable")
        df.to_csv(path, index=False)
    elif kind == "unsorted_refused":
        df.iloc[::-1].to_csv(path, index=False)
    elif kind == "bad_timestamp":
        df["ts"] = df["ts"].astype(str)
        df.loc[3, "ts"] = "not a time"
        df.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("kind,code,message", [
    ("empty", 65, "no rows"),
    ("unreadable", 65, "cannot read"),
    ("missing_column", 65, "missing columns: low"),
    ("non_numeric", 65, "2 non-numeric values in column 'close' (first at rows 5, 9)"),
    ("nan", 65, "1 rows with NaN or infinite prices/volume (first at rows 7)"),
    ("inf", 65, "1 rows with NaN or infinite prices/volume (first at rows 8)"),
    ("non_positive", 65, "1 rows with a price <= 0 (first at rows 4)"),
    ("high_below_low", 65, "1 rows with high < low (first at rows 11)"),
    ("open_outside", 65, "1 rows with open or close outside [low, high] (first at rows 12)"),
    ("duplicate", 65, "2 rows share a timestamp"),
    ("unsorted_refused", 65, "rows are earlier than the row before them"),
    ("bad_timestamp", 65, "not timestamps"),
])
def test_bad_input_one_line_error_and_exit_code(kind, code, message, tmp_path, capsys):
    path = _bad(kind, tmp_path)
    args = [str(path), "--out", str(tmp_path / "run"), "--progress", "none"]
    if kind == "unsorted_refused":
        args += ["--set", 'data.unsorted="refuse"']
    rc = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code
    assert len(err) == 1 and err[0].startswith("workbench: error: ")
    assert message in err[0]
    assert "Traceback" not in err[0]


def test_missing_file_exit_66(tmp_path, capsys):
    rc = main([str(tmp_path / "nope.parquet"), "--out", str(tmp_path / "run"), "--progress", "none"])
    err = capsys.readouterr().err
    assert rc == 66 and "no such file or directory" in err and err.count("\n") == 1


def test_errors_raise_typed_exceptions(tmp_path):
    with pytest.raises(MissingInputError):
        load_bars(tmp_path / "missing.csv")
    with pytest.raises(DataError, match="high < low"):
        load_bars(_bad("high_below_low", tmp_path))


def test_mixed_utc_offsets_across_a_dst_change_are_converted(tmp_path):
    # 2024-03-10 02:00 America/Chicago: the offset changes from -06:00 to -05:00 mid-file
    local = pd.date_range("2024-03-10 01:50", periods=10, freq="min", tz="America/Chicago")
    local = local.append(pd.date_range("2024-03-10 03:00", periods=10, freq="min", tz="America/Chicago"))
    df = simple_frame(20).reset_index(drop=True)
    df.insert(0, "timestamp", [t.isoformat() for t in local])
    path = tmp_path / "dst.csv"
    df.to_csv(path, index=False)
    assert "-06:00" in path.read_text() and "-05:00" in path.read_text()
    bars = load_bars(path)
    assert (bars.ts == local.tz_convert("UTC").as_unit("ns").asi8).all()
    assert np.diff(bars.ts)[9] == 60 * 10**9  # 01:59 CST -> 03:00 CDT is one minute


def test_time_column_forms_and_a_file_without_volume(tmp_path):
    df = simple_frame(30)
    out = df.drop(columns="volume")
    out.index = out.index.tz_localize(None)
    out.index.name = "timestamp_utc"
    path = tmp_path / "quotes.csv.gz"
    out.to_csv(path)
    bars = load_bars(path, naive_tz="America/New_York")  # a column named *_utc is UTC whatever naive_tz says
    assert (bars.ts == df.index.asi8).all()
    assert not bars.has_volume and bars.frame["volume"].isna().all()
    assert any(w.code == "no_volume" for w in bars.report.warnings)


def test_symbols_without_instrument_ids_are_separate_contracts():
    df = simple_frame(40).reset_index()
    df["symbol"] = ["ESH4"] * 20 + ["ESM4"] * 20
    bars = load_bars(df)
    assert bars.frame["instrument_id"].nunique() == 2 and len(bars.rolls) == 1
    assert bars.rolls.iloc[0]["to_symbol"] == "ESM4" and bars.market.name == "ES"


def test_utc_index_is_what_to_datetime_gives(rng):
    """bars_io.utc_index (a datetime64[ns] view) against pd.to_datetime(..., utc=True) on int64 nanoseconds,
    the index's name carried."""
    from workbench.bars_io import utc_index

    ts = np.sort(rng.integers(0, 2**62, 1000)).astype(np.int64)
    want = pd.DatetimeIndex(pd.to_datetime(ts, utc=True), name="ts")
    got = utc_index(ts, name="ts")
    pd.testing.assert_index_equal(got, want, exact=True)


def test_trading_day_ids_of_a_range_are_the_series_ids_less_its_first(bars):
    """A fold window's trading days come from the series' ids (computed once): for any range they equal the
    ids of that range's own bars, numbered from 0 where days end at the market's day_end."""
    ids = bars.day_ids
    assert ids.dtype == np.int32 and ids[0] == 0 and (np.diff(ids) >= 0).all() and (np.diff(ids) <= 1).all()
    local = bars.frame.index.tz_convert(bars.market.session_tz) + bars.market.day_end_offset()
    assert ids[-1] + 1 == len(np.unique(local.normalize()))
    rng = np.random.default_rng(5)
    for lo, hi in [(0, len(bars)), *sorted(tuple(sorted(rng.integers(0, len(bars), 2))) for _ in range(6))]:
        if hi - lo < 2:
            continue
        assert np.array_equal(bars.slice(lo, hi).day_ids, ids[lo:hi] - ids[lo]), (lo, hi)
