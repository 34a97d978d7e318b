"""Real exchange files (``../shared/realdata``, see its README): the front month, the product, the market
spec, the split sizes and the DBN reader on data nobody here generated. Skipped, with the reason, only
where the folder is absent. ``WORKBENCH_REALDATA`` points elsewhere (a copy carried to the GPU machine)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.config import SplitConfig
from workbench.data import load_bars
from workbench.errors import DataError
from workbench.features import build_features
from workbench.splits import walk_forward_splits
from workbench.walkforward import main

from conftest import ROOT

REAL = Path(os.environ.get("WORKBENCH_REALDATA", ROOT.parent / "shared" / "realdata")).resolve()
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason=f"real-data folder {REAL} not present")
ES = "es_lean_algoseek_2013_1min_all_contracts.parquet"
GC = "gc_lean_algoseek_2013-10_1min_all_contracts.parquet"
E6, E6_CSV = "6EH4_cme_1min_2024-01.parquet", "6EH4.XCME_1min_bars_20240101_20240131.csv.gz"
BTC, GBP = "ftx_btc-perp_1min_2022-01.csv", "fxcm_gbpusd_m1_bid_2012-02.csv"
DBN, DBN_PARQUET = "glbx_esu4_nqu4_ohlcv-1m_2024-07-01T23-40.dbn.zst", "glbx_esu4_nqu4_ohlcv-1m_2024-07-01T23-40.parquet"
DBN_RAW, ESU4 = "glbx_esu4_nqu4_ohlcv-1m_2024-07-01T23-40.raw.parquet", "glbx_esu4_ohlcv-1m_2024-07-01T23-40.parquet"


@pytest.fixture(scope="module")
def es():
    return load_bars(REAL / ES)


def test_es_front_month_by_session_volume(es):
    # README: ESZ3 leads by daily volume until the December roll; ESH4 from the session of 2013-12-18
    assert len(es.rolls) == 1
    roll = es.rolls.iloc[0]
    assert (roll.from_symbol, roll.to_symbol) == ("ESZ3", "ESH4")
    assert roll.ts.tz_convert("America/Chicago").date().isoformat() == "2013-12-17"  # 17:00 CT opens the 18th
    assert roll.session == pd.Timestamp("2013-12-18")
    assert (es.report.sessions.loc[es.report.sessions["session"] < "2013-12-18", "front"] == 201312).all()
    assert len(es) == 17_658 and es.report.non_front_dropped == 22_246 - 17_658
    # the overnight minute where ESH4 traded 212 against ESZ3's 98 stays on ESZ3
    assert es.frame.loc[pd.Timestamp("2013-10-11 04:58", tz="UTC"), "symbol"] == "ESZ3"
    assert (es.frame.loc[: "2013-12-17 22:00", "symbol"] == "ESZ3").all()
    assert es.market.name == "ES" and np.isfinite(roll.spread)
    assert not any(f.code == "gap_unexpected" for f in es.report.findings)


def test_gc_and_6e_specs_and_bar_labels():
    gc = load_bars(REAL / GC)
    assert gc.market.name == "GC" and set(gc.frame["symbol"]) == {"GCZ3"} and len(gc.rolls) == 0
    e6, csv = load_bars(REAL / E6), load_bars(REAL / E6_CSV)
    assert e6.market.name == csv.market.name == "6E" and e6.market.tick_size == 0.00005
    assert "file name ('6EH4')" in csv.report.market_choice
    # NinjaTrader stamps bars with their end: moved to their start, the halt is then a halt
    assert {"end_stamped"} <= {f.code for f in e6.report.findings}
    assert e6.frame.index[0] == pd.Timestamp("2024-01-01 23:00", tz="UTC")
    assert (e6.ts == csv.ts).all() and np.allclose(e6.column("close"), csv.column("close"))
    assert not any(f.code == "gap_unexpected" for f in e6.report.findings)


def test_unknown_instruments_get_a_generic_spec_from_the_data():
    btc = load_bars(REAL / BTC)
    assert btc.market.generic and btc.market.tick_size == 1.0 and btc.market.point_value == 1.0
    gbp = load_bars(REAL / GBP)
    assert gbp.market.generic and gbp.market.tick_size == pytest.approx(1e-5) and gbp.market.point_value == 1e5
    assert not gbp.has_volume and any(f.code == "no_volume" for f in gbp.report.warnings)
    assert not any(n.startswith("volz") for n in build_features(gbp).names)
    assert any(f.code == "market" for f in btc.report.warnings)  # the generic fallback is a warning


def test_two_products_refused_then_chosen_and_dbn_read_like_its_parquet():
    for name in (DBN, DBN_PARQUET, DBN_RAW):
        with pytest.raises(DataError, match=r"2 products in one file: (ES \(30 rows\), NQ|NQ \(30 rows\), ES)"):
            load_bars(REAL / name)
    dbn, parquet, raw = (load_bars(REAL / n, symbol="ES") for n in (DBN, ESU4, DBN_RAW))
    assert dbn.market.name == "ES" and len(dbn) == 30
    for other in (parquet, raw):
        assert (dbn.ts == other.ts).all()
        assert np.array_equal(dbn.frame[["open", "high", "low", "close", "volume"]].to_numpy(),
                              other.frame[["open", "high", "low", "close", "volume"]].to_numpy())
    nq = load_bars(REAL / DBN, symbol="NQU4")
    assert nq.market.name == "NQ" and nq.market.point_value == 20.0


def test_dbn_without_the_extra_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "databento", None)  # import fails as if not installed
    with pytest.raises(DataError) as e:
        load_bars(REAL / DBN)
    assert 'pip install "workbench[databento]"' in e.value.one_line()


@pytest.mark.parametrize("name,n_folds", [(ES, 5), (GC, 5), (E6, 5), (BTC, 5), (GBP, 5)])
def test_auto_split_sizes_fit_each_file(name, n_folds):
    bars = load_bars(REAL / name)
    f = build_features(bars)
    folds = walk_forward_splits(bars.ts, SplitConfig(), f.max_lookback, f.warmup)
    assert len(folds) == n_folds and folds["test_stop"].iloc[-1] <= len(bars)
    train = folds["train_stop"] - folds["train_start"]
    test = folds["test_stop"] - folds["test_start"]
    assert (train * 3 == test * 10).all() and "auto" in folds.attrs["sizing"]


@pytest.mark.parametrize("name,market", [(ES, "ES"), (GC, "GC"), (E6, "6E"), (E6_CSV, "6E"), (BTC, "GENERIC"),
                                         (GBP, "GENERIC")])
def test_cli_runs_every_real_file_with_default_settings(name, market, tmp_path, capsys):
    # the rule baseline keeps CI fast; the agent on these files runs in bench/realdata_check.sh
    rc = main([str(REAL / name), "--strategy", "momentum", "--out", str(tmp_path / "run"), "--progress", "none"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    err = cap.err.splitlines()
    assert any(line.startswith(f"workbench: data: market: {market}") or
               line.startswith(f"workbench: warning: market: {market}") for line in err)
    assert any(line.startswith("workbench: splits: 5 rolling folds") for line in err)
    assert all(line.startswith("workbench: ") for line in err)


def test_cli_two_product_file_and_symbol(tmp_path, capsys):
    rc = main([str(REAL / DBN), "--strategy", "momentum", "--out", str(tmp_path / "a"), "--progress", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 65 and len(err) == 1
    assert "2 products in one file" in err[0] and "ES (30 rows)" in err[0] and "NQ (30 rows)" in err[0]
    assert "--symbol" in err[0]
    # chosen, the 30 bars are read and costed as ES, and too short for a fold: the minimum is stated
    rc = main([str(REAL / DBN), "--symbol", "ES", "--strategy", "momentum", "--out", str(tmp_path / "b"),
               "--progress", "none"])
    err = capsys.readouterr().err
    assert rc == 65 and "market: ES (CME E-mini S&P 500)" in err
    assert "data too short for one fold: 30 bars; the minimum with these features is 1,062 bars" in err
