from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.data import load_bars
from workbench.features import build_features
from workbench.synthetic import generate_bars, main


def test_layout_ticks_hours_and_rolls(synthetic_raw):
    raw = synthetic_raw
    assert list(raw.columns[:10]) == ["ts_event", "rtype", "publisher_id", "instrument_id", "open", "high", "low",
                                      "close", "volume", "symbol"]
    assert raw["ts_event"].dtype == np.int64 and raw["close"].dtype == np.int64
    out = raw[~raw["symbol"].str.contains("-")]
    px = out["close"].to_numpy() / 1e9
    assert np.allclose(px / 0.25, np.round(px / 0.25))
    local = pd.DatetimeIndex(pd.to_datetime(out["ts_event"], utc=True)).tz_convert("America/Chicago")
    minute = local.hour * 60 + local.minute
    assert not ((minute >= 960) & (minute < 1020)).any()  # the 16:00-17:00 halt
    assert not (local.day_of_week == 5).any()  # no Saturday
    assert set(out["symbol"]) == {"ESH4", "ESM4"}
    assert raw["symbol"].str.contains("-").any()  # calendar spreads around the roll


def test_planted_signal_is_there_only_when_asked():
    corr = {}
    for signal in (0.0, 0.3):
        bars = load_bars(generate_bars(20_000, seed=1, signal=signal, spreads=False))
        f = build_features(bars)
        ofi = f.values[:, f.names.index("ofi_1")][:-1]
        nxt = f.log_return[1:] / f.values[1:, f.names.index("vol_30")]
        ok = np.isfinite(nxt) & np.isfinite(ofi)
        corr[signal] = np.corrcoef(ofi[ok], nxt[ok])[0, 1]
    assert abs(corr[0.0]) < 0.03
    assert corr[0.3] > 0.1


def test_cli_writes_parquet_and_csv(tmp_path, capsys):
    assert main([str(tmp_path / "a.parquet"), "--bars", "500", "--seed", "2"]) == 0
    assert main([str(tmp_path / "a.csv"), "--bars", "500", "--seed", "2", "--no-spreads"]) == 0
    a, b = load_bars(tmp_path / "a.parquet"), load_bars(tmp_path / "a.csv")
    assert len(a) == len(b) == 500 and np.allclose(a.frame["close"], b.frame["close"])
    assert main([str(tmp_path / "x.parquet"), "--bars", "5"]) != 0
