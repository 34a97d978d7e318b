"""Contract specs against the exchange's published terms, symbol forms, the generic spec for unknown
instruments, and the per-run overrides of the terms."""
from __future__ import annotations

import numpy as np
import pytest

from workbench.config import load_config
from workbench.contracts import is_spread, parse_symbol, roots_in_name
from workbench.data import bars_for, load_bars
from workbench.errors import ConfigError
from workbench.markets import futures_specs, generic_spec, infer_tick, load_market, match_root

from conftest import simple_frame

# (multiplier in USD per point, tick in points), from CME Group's contract specification pages.
PUBLISHED = {
    "ES": (50.0, 0.25),        # $50 x S&P 500, 0.25 index points = $12.50
    "NQ": (20.0, 0.25),        # $20 x Nasdaq-100, 0.25 = $5.00
    "CL": (1000.0, 0.01),      # 1,000 barrels, $0.01 per barrel = $10.00
    "GC": (100.0, 0.10),       # 100 troy ounces, $0.10 per ounce = $10.00
    "ZN": (1000.0, 1 / 64),    # $100,000 face ($1,000 per point), 1/2 of 1/32 = $15.625
    "6E": (125000.0, 0.00005),  # 125,000 EUR, $0.00005 per EUR = $6.25
}
CME_MAJORS = ("ES MES NQ MNQ YM MYM RTY M2K CL MCL NG GC MGC SI HG ZN ZB ZF ZT 6E 6J 6B 6A").split()


@pytest.mark.parametrize("root", sorted(PUBLISHED))
def test_specs_match_the_published_contract_terms(root):
    spec = load_market(root.lower())
    assert (spec.point_value, spec.tick_size) == pytest.approx(PUBLISHED[root], rel=1e-12)
    assert spec.commission_per_side > 0 and spec.slippage_ticks == 1.0
    assert (spec.session_tz, spec.halt_start, spec.halt_end, spec.day_end) == ("America/Chicago", "16:00", "17:00", "16:00")


def test_every_cme_major_has_a_spec_with_costs():
    specs = futures_specs()
    assert set(CME_MAJORS) <= set(specs)
    for root in CME_MAJORS:
        s = specs[root]
        assert s.name == root and s.point_value > 0 and s.tick_size > 0 and s.commission_per_side > 0
    # a micro is one tenth of its standard contract (MYM: $0.50 vs YM's $5), same tick
    for micro, full in (("MES", "ES"), ("MNQ", "NQ"), ("MYM", "YM"), ("M2K", "RTY"), ("MCL", "CL"), ("MGC", "GC")):
        assert specs[micro].point_value * 10 == pytest.approx(specs[full].point_value)
        assert specs[micro].tick_size == specs[full].tick_size
    assert specs["ES"].terms().startswith("$50 per point per contract, tick 0.25 ($12.50), costs $2.15")
    assert specs["6E"].terms().startswith("$125,000 per point per contract, tick 0.00005 ($6.25)")


@pytest.mark.parametrize("symbol,root,month,year", [
    ("ESZ3", "ES", 12, 3), ("ESZ23", "ES", 12, 23), ("esz2023", "ES", 12, 2023), ("ES.FUT", "ES", 0, 0),
    ("ES.c.0", "ES", 0, 0), ("ES", "ES", 0, 0), ("/ESH4", "ES", 3, 4), ("ES 12-23", "ES", 12, 23),
    ("6EH4.XCME", "6E", 3, 4), ("MESZ3", "MES", 12, 3), ("M2KZ3", "M2K", 12, 3), ("HGZ3", "HG", 12, 3),
    ("ZNZ3", "ZN", 12, 3), ("6JH4", "6J", 3, 4), ("NGF4", "NG", 1, 4), ("BTC-PERP", "BTC-PERP", 0, 0),
    ("EURUSD", "EURUSD", 0, 0),
])
def test_symbol_forms(symbol, root, month, year):
    c = parse_symbol(symbol)
    assert (c.root, c.month, c.year) == (root, month, year)


def test_expiry_year_from_the_first_bar_and_spreads():
    assert parse_symbol("ESZ3").expiry_year(2013) == 2013
    assert parse_symbol("ESH4").expiry_year(2013) == 2014
    assert parse_symbol("ESH0").expiry_year(2019) == 2020
    assert parse_symbol("ESZ23").expiry_year(2023) == 2023
    assert parse_symbol("ESH4").expiry_key(2013) > parse_symbol("ESZ3").expiry_key(2013)
    assert is_spread("ESH4-ESM4") and is_spread("UD:1V: VT 0620") and not is_spread("BTC-PERP")
    assert not is_spread("ESH4")
    known = set(futures_specs())
    assert roots_in_name("6EH4.XCME_1min_bars_20240101_20240131.csv.gz", known) == [("6E", "6EH4")]
    assert roots_in_name("ftx_btc-perp_1min_2022-01.csv", known) == []
    assert roots_in_name("fxcm_gbpusd_m1_bid_2012-02.csv", known) == []


def test_match_by_root_any_case():
    assert match_root("es").name == "ES" and match_root("MES").name == "MES" and match_root("EURUSD") is None
    with pytest.raises(ConfigError, match="unknown market 'zz'"):
        load_market("zz")


@pytest.mark.parametrize("prices,tick", [
    (np.round(1.57 + np.cumsum(np.random.default_rng(1).normal(0, 2e-4, 5000)), 5), 1e-5),   # 5-decimal FX
    (np.round(46000 + np.cumsum(np.random.default_rng(2).normal(0, 30, 5000))), 1.0),      # BTC on $1
    (np.round((1.09 + np.cumsum(np.random.default_rng(3).normal(0, 2e-4, 5000))) / 5e-5) * 5e-5, 5e-5),  # 6E
    (np.round((4500 + np.cumsum(np.random.default_rng(4).normal(0, 1, 5000))) * 4) / 4, 0.25),  # ES
])
def test_tick_inferred_from_price_increments(prices, tick):
    got, found = infer_tick(prices)
    assert found and got == pytest.approx(tick)


def test_generic_spec_never_a_cent_tick_on_a_price_of_one():
    rng = np.random.default_rng(5)
    prices = np.round((1.09 + np.cumsum(rng.normal(0, 2e-4, 3000))) / 5e-5) * 5e-5
    spec, note = generic_spec(prices)
    assert spec.generic and spec.tick_size == pytest.approx(5e-5)
    assert spec.point_value == 100_000.0  # a unit's notional is nearest $100k: ~$109k
    assert spec.commission_bps > 0 and spec.slippage_ticks > 0
    assert "inferred from the price increments" in note
    computed = 100 + rng.normal(0, 1, 3000)  # prices with no grid at all
    spec2, note2 = generic_spec(computed)
    assert "no price grid" in note2 and spec2.tick_size == pytest.approx(0.01)


def test_overrides_reach_the_spec_and_are_checked(tmp_path):
    df = simple_frame(60).reset_index().assign(symbol="ESM4")
    cfg = load_config(None, ["market.commission_per_side=1.1", "market.slippage_ticks=2"])
    bars = bars_for(df, cfg)
    assert (bars.market.name, bars.market.commission_per_side, bars.market.slippage_ticks) == ("ES", 1.1, 2.0)
    assert bars.market.point_value == 50.0
    again = bars_for(load_bars(df), cfg)  # bars loaded first get the run's overrides too
    assert again.market == bars.market
    with pytest.raises(ConfigError, match="market.commission_bps"):
        load_config(None, ["market.commission_bps=inf"])
    with pytest.raises(ConfigError, match="every cost is zero"):
        bars_for(df, load_config(None, ["market.commission_per_side=0", "market.slippage_ticks=0"]))
