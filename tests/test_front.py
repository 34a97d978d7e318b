"""The front month by trading session: a regular roll, a block trade in a deferred month, a thin
holiday session, an expiring front, open interest, and a file that is already one chained series."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.data import load_bars, validate_bars

DAYS = pd.bdate_range("2024-03-04", periods=8)  # Mon 4 .. Wed 13 March 2024


def _contracts(volumes: dict[str, list[float]], minutes: int = 10, oi: dict[str, list[float]] | None = None,
               block: tuple[str, int, int, float] | None = None) -> pd.DataFrame:
    """ESH4 / ESM4 minute bars at 09:00.. Chicago on each day of DAYS; ``volumes[sym][d]`` is that
    contract's volume per minute on day d (0 = no bars that day); ``block`` = (symbol, day, minute, volume)."""
    rows = []
    rng = np.random.default_rng(0)
    for sym, base, iid in (("ESH4", 5000.0, 1), ("ESM4", 5060.0, 2)):
        for d, day in enumerate(DAYS):
            v = volumes[sym][d]
            if v == 0:
                continue
            for m in range(minutes):
                ts = (day + pd.Timedelta(hours=9, minutes=m)).tz_localize("America/Chicago").tz_convert("UTC")
                px = base + d + 0.25 * rng.integers(-4, 5)
                vol = block[3] if block and (sym, d, m) == block[:3] else v
                row = {"ts_event": ts, "open": px, "high": px + 0.5, "low": px - 0.5, "close": px + 0.25,
                       "volume": vol, "symbol": sym, "instrument_id": iid}
                if oi is not None:
                    row["open_interest"] = oi[sym][d]
                rows.append(row)
    return pd.DataFrame(rows).sort_values("ts_event", kind="stable").reset_index(drop=True)


def _fronts(bars) -> list[str]:
    """The contract used on each day of DAYS ('' where the day has no bars)."""
    local = bars.frame.index.tz_convert("America/Chicago").normalize().tz_localize(None)
    by_day = bars.frame.groupby(local)["symbol"].agg(lambda s: "/".join(sorted(set(s))))
    return [by_day.get(d, "") for d in DAYS]


def test_roll_at_the_first_session_the_next_expiry_leads_and_never_back():
    vol = {"ESH4": [900, 900, 900, 400, 300, 900, 200, 100], "ESM4": [10, 20, 50, 500, 700, 100, 800, 900]}
    bars = load_bars(_contracts(vol))
    assert _fronts(bars) == ["ESH4"] * 3 + ["ESM4"] * 5  # day 5: ESH4 leads again, but never back
    assert len(bars.rolls) == 1 and bars.rolls.iloc[0]["ts"].tz_convert("America/Chicago").day == DAYS[3].day
    assert bars.report.non_front_dropped == 8 * 10
    s = bars.report.sessions
    assert list(s["measure"].unique()) == ["volume"] and not s["thin"].any()


def test_a_block_trade_in_a_deferred_month_does_not_roll():
    vol = {"ESH4": [900] * 8, "ESM4": [5] * 8}
    # one minute of 5,000 in ESM4: more than any minute of ESH4, less than ESH4's session (9,000)
    bars = load_bars(_contracts(vol, block=("ESM4", 2, 4, 5000.0)))
    assert _fronts(bars) == ["ESH4"] * 8 and len(bars.rolls) == 0


def test_a_thin_holiday_session_decides_no_roll():
    vol = {"ESH4": [900, 900, 900, 900, 9, 900, 900, 900], "ESM4": [20, 20, 20, 20, 30, 20, 20, 20]}
    bars = load_bars(_contracts(vol))
    assert _fronts(bars) == ["ESH4"] * 8 and len(bars.rolls) == 0
    assert bars.report.sessions["thin"].tolist() == [False] * 4 + [True] + [False] * 3


def test_an_expired_front_rolls_even_in_a_thin_session():
    vol = {"ESH4": [900, 900, 900, 900, 0, 0, 0, 0], "ESM4": [20, 20, 20, 20, 30, 900, 900, 900]}
    bars = load_bars(_contracts(vol))
    assert _fronts(bars) == ["ESH4"] * 4 + ["ESM4"] * 4 and len(bars.rolls) == 1


def test_open_interest_decides_where_the_file_has_it():
    vol = {"ESH4": [900] * 8, "ESM4": [100] * 8}  # by volume ESH4 would stay the front
    oi = {"ESH4": [3e6, 3e6, 2e6, 1e6, 9e5, 5e5, 2e5, 1e5], "ESM4": [1e5, 3e5, 1e6, 2e6, 2.2e6, 3e6, 3e6, 3e6]}
    bars = load_bars(_contracts(vol, oi=oi))
    assert _fronts(bars) == ["ESH4"] * 3 + ["ESM4"] * 5
    assert (bars.report.sessions["measure"].iloc[1:] == "open_interest").all()


def test_a_chained_series_is_kept_as_it_is():
    vol = {"ESH4": [900] * 4 + [0] * 4, "ESM4": [0] * 4 + [900] * 4}
    raw = _contracts(vol)
    bars = load_bars(raw)
    assert len(bars) == len(raw) and len(bars.rolls) == 1 and bars.report.non_front_dropped == 0


def test_several_contracts_without_volume_need_a_choice(tmp_path):
    raw = _contracts({"ESH4": [900] * 8, "ESM4": [100] * 8}).drop(columns="volume")
    report, bars = validate_bars(raw)
    assert bars is None and report.errors[0].code == "front_unknown"
    one = load_bars(raw, symbol="ESM4")
    assert set(one.frame["symbol"]) == {"ESM4"} and not one.has_volume


@pytest.mark.parametrize("symbol,root", [("", None), ("NQ", "NQ"), ("es", "ES"), ("NQU4", "NQ")])
def test_one_product_per_series(symbol, root):
    es = _contracts({"ESH4": [900] * 8, "ESM4": [0] * 8})
    nq = es.assign(symbol="NQU4", instrument_id=7, open=es["open"] * 3.6, high=es["high"] * 3.6,
                   low=es["low"] * 3.6, close=es["close"] * 3.6)
    raw = pd.concat([es, nq]).sort_values("ts_event", kind="stable")
    if root is None:
        from workbench.errors import DataError

        with pytest.raises(DataError, match=r"2 products in one file: ES \(80 rows\), NQ \(80 rows\)") as e:
            load_bars(raw)
        assert "--symbol ES" in e.value.hint
        return
    bars = load_bars(raw, symbol=symbol)
    assert bars.market.name == root and len(bars) == 80 and len(bars.rolls) == 0
