from __future__ import annotations

import pytest

from workbench.config import RunConfig, load_config, to_toml
from workbench.errors import ConfigError
from workbench.markets import load_market
from workbench.walkforward import main

from conftest import SAMPLE


def test_defaults_overrides_and_round_trip(tmp_path):
    cfg = load_config(None, ["splits.train=30000", 'strategy.name="momentum"', "features.vol_windows=[10, 20]"])
    assert cfg.splits.train == "30000" and cfg.strategy.name == "momentum"
    assert cfg.features.vol_windows == (10, 20)
    p = tmp_path / "c.toml"
    p.write_text(to_toml(cfg))
    assert load_config(p) == cfg
    assert load_config(None) == RunConfig()


@pytest.mark.parametrize("override,match", [
    ("splits.trian=3", "unknown config key 'splits.trian'"),
    ("nosuch.key=1", "unknown config key 'nosuch'"),
    ("backtest.capital=abc", "must be a number"),
    ("backtest.contracts=1.5", "must be an integer"),
    ("splits=3", "must be a table"),
])
def test_bad_keys_and_types_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_bad_config_file_exit_78(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text("[splits]\ntrain = 100\nbogus = 1\n")
    rc = main([str(SAMPLE), "--config", str(p), "--out", str(tmp_path / "r"), "--progress", "none"])
    err = capsys.readouterr().err
    assert rc == 78 and "unknown config key 'splits.bogus'" in err and err.count("\n") == 1
    p.write_text("this is = = not toml")
    assert main([str(SAMPLE), "--config", str(p), "--out", str(tmp_path / "r2")]) == 78


def test_zero_cost_market_is_refused(tmp_path):
    p = tmp_path / "free.toml"
    p.write_text('name = "FREE"\ncommission_per_side = 0.0\ncommission_bps = 0.0\nslippage_ticks = 0.0\n')
    with pytest.raises(ConfigError, match="every cost is zero"):
        load_market(str(p))
