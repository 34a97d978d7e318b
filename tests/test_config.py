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


@pytest.mark.parametrize("switch", ["batched_gemm", "sm_share", "branches", "fused_epilogues"])
def test_gpu_switches_take_on_or_off_and_refuse_the_rest(switch):
    """The [gpu] on/off switches override the profile's value, and anything else is refused naming the key;
    an agent's side stream is only made where ``gpu.branches`` is on."""
    import dataclasses

    from workbench.agent.backend import Backend
    from workbench.config import GpuOverrides

    backend = Backend("cpu")
    assert getattr(backend.sized(GpuOverrides(**{switch: "on"})), switch) is True
    assert getattr(backend.sized(GpuOverrides(**{switch: "off"})), switch) is False
    assert backend.sized(GpuOverrides()) == backend.profile
    with pytest.raises(ConfigError, match=f"gpu.{switch} must be 'on' or 'off'"):
        backend.sized(GpuOverrides(**{switch: "yes"}))
    if switch == "branches":
        off = dataclasses.replace(backend.profile, branches=False)
        assert backend._side_maker(0, None, off) is None
        assert callable(backend._side_maker(0, None, dataclasses.replace(off, branches=True)))
