"""Run configuration: frozen dataclasses loaded from TOML, with ``section.key=value`` overrides.

Every field has a default and a one-line doc (``doc`` metadata). Unknown sections or keys are errors
that name the key; values are type-checked against the field's annotation. The resolved config is
written into every run directory (``config.toml``) so a run can be reproduced from it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .agent.train_config import TrainConfig, validate
from .errors import ConfigError
from .settings import _f, build, merge_overrides, parse_override, read_toml, to_dict, to_toml  # noqa: F401 (API)
from .settings import describe as _describe


@dataclass(frozen=True)
class DataConfig:
    market: str = _f("auto", "market spec: 'auto' (matched by the symbol root), a root in config/markets "
                     "('ES', 'GC'), 'generic', or a TOML file")
    symbol: str = _f("", "the product to run on (a root like 'NQ' or a contract like 'NQU4'); needed when a "
                     "file holds several products, names the product of a file without symbols")
    naive_tz: str = _f("UTC", "time zone assumed for timestamps that carry none")
    unsorted: str = _f("sort", "'sort' (stable sort, with a warning) or 'refuse' unsorted input")


@dataclass(frozen=True)
class MarketTerms:
    point_value: float = _f(-1.0, "USD per point per contract (-1 = the market spec's)")
    tick_size: float = _f(-1.0, "minimum price increment in points (-1 = the spec's)")
    commission_per_side: float = _f(-1.0, "USD per contract per side (-1 = the spec's assumption)")
    commission_bps: float = _f(-1.0, "basis points of notional per side (-1 = the spec's)")
    slippage_ticks: float = _f(-1.0, "ticks paid on every market order (-1 = the spec's)")

    def overrides(self) -> dict[str, float]:
        """The terms set in this run (every value that is not -1)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != -1.0}


@dataclass(frozen=True)
class FeatureConfig:
    return_horizons: tuple[int, ...] = _f((1, 5, 15, 60), "log-return horizons in bars")
    vol_windows: tuple[int, ...] = _f((30, 120), "realised-volatility windows in bars")
    range_window: int = _f(30, "window of the mean high-low range in bars")
    volume_window: int = _f(120, "window of the volume z-score in bars")
    ofi_windows: tuple[int, ...] = _f((1, 5, 30), "order-flow-imbalance windows in bars (if buy/sell volume)")


@dataclass(frozen=True)
class SplitConfig:
    scheme: str = _f("rolling", "'rolling' (fixed-length train) or 'anchored' (expanding train)")
    train: str = _f("auto", "train length: 'auto' (fitted to the data, see workbench.splits), bars ('20000') or a "
                    "duration ('14D', '36h')")
    val: str = _f("auto", "validation length: 'auto', bars or a duration")
    test: str = _f("auto", "test length: 'auto', bars or a duration")
    step: str = _f("", "distance between fold starts; empty = test length + embargo")
    purge: str = _f("auto", "bars dropped before val and test; 'auto' = feature look-back + horizon")
    embargo: int = _f(60, "bars skipped after each test range before the next test range (test ranges never touch)")
    horizon: int = _f(1, "return horizon of a decision in bars (n-step for the agent)")
    max_folds: int = _f(0, "use at most this many folds (0 = all)")


@dataclass(frozen=True)
class BacktestConfig:
    capital: float = _f(0.0, "capital base in USD for returns and equity; 0 = the unlevered notional of the largest "
                        "position at the first test bar (workbench.account)")
    ruin_fraction: float = _f(0.0, "a fold's account stops trading (ruined) when its equity falls to this fraction of "
                              "the capital base or below (0 = zero equity)")
    contracts: int = _f(1, "position size of the rule baselines, in contracts")


@dataclass(frozen=True)
class StrategyConfig:
    name: str = _f("dqn", "'dqn' (the agent), or a baseline: 'buy-and-hold', 'momentum'")
    momentum_lookback: int = _f(60, "momentum look-back in bars")
    momentum_threshold: float = _f(0.0, "minimum |log return| over the look-back to hold a position")


@dataclass(frozen=True)
class GpuOverrides:
    hidden: int = _f(0, "MLP trunk width (0 = the GPU profile's value)")
    atoms: int = _f(0, "C51 atoms, 2..128 (0 = the profile's)")
    batch: int = _f(0, "replay batch per update (0 = the profile's)")
    n_envs: int = _f(0, "parallel environments (0 = the profile's)")
    population: int = _f(0, "agents (folds, seeds, search trials) trained side by side in one graph on the GPU "
                            "(0 = the profile's: as many as "
                            "fit in free device memory; 1 = one at a time)")
    batched_gemm: str = _f("", "'on' or 'off': from 8 agents on, a population's agents' same GEMM as one batched "
                               "GEMM ('' = the profile's, off: every agent bit for bit what it computes alone; on: "
                               "within rounding of it, ~8 % faster)")
    sm_share: str = _f("", "'on' or 'off': every GEMM's algorithm chosen for the SMs it fills beside the other "
                           "agents' ('' = the profile's; on: a population faster, an agent alone slower, each agent "
                           "the same alone and in a population; on and off differ by rounding)")
    branches: str = _f("", "'on' or 'off': an update's independent work on a second stream beside its main chain "
                           "('' = the profile's; the same results bit for bit either way)")
    fused_epilogues: str = _f("", "'on' or 'off': the trunk's bias + ReLU inside cuBLASLt's GEMMs ('' = the "
                                  "profile's; off: our kernels after each GEMM)")
    pdl: str = _f("", "'off', 'programmatic' or 'order': programmatic dependent launch between a graph's kernels "
                      "('' = the profile's; the same results bit for bit)")
    math: str = _f("", "'fp32', 'tf32' or 'bf16': the GEMMs' arithmetic ('' = the profile's; tensor-core maths "
                       "round the GEMMs' inputs, so results differ from fp32's: BENCHMARKS.md shows by how much; "
                       "tf32 with cuBLAS only, bf16 with either GEMM; the CPU backend computes fp32)")


@dataclass(frozen=True)
class RunConfig:
    seed: int = _f(0, "seed of every random choice in the run")
    data: DataConfig = _f(DataConfig(), "how bars are read")
    market: MarketTerms = _f(MarketTerms(), "overrides of the market spec's contract terms and cost assumptions")
    features: FeatureConfig = _f(FeatureConfig(), "causal feature set")
    splits: SplitConfig = _f(SplitConfig(), "walk-forward folds")
    backtest: BacktestConfig = _f(BacktestConfig(), "accounting")
    strategy: StrategyConfig = _f(StrategyConfig(), "strategy: the DQN agent or a rule baseline")
    training: TrainConfig = _f(TrainConfig(), "DQN hyper-parameters (defaults: config/training/dqn.toml)")
    device: str = _f("auto", "'auto' (GPU when present), 'gpu' or 'cpu' (the reference backend)")
    gpu: GpuOverrides = _f(GpuOverrides(), "per-run overrides of the GPU profile's sizes (config/gpu/*.toml)")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, cls: type = RunConfig) -> Any:
    """Load a run config: built-in defaults, then ``path`` (TOML), then ``overrides``."""
    values = read_toml(path) if path else {}
    values = merge_overrides(values, overrides or [])
    cfg = build(cls, values)  # the training defaults are config/training/dqn.toml's (agent/train_config.py)
    if cls is RunConfig:
        validate(cfg.training)
        g = cfg.gpu
        if min(g.hidden, g.atoms, g.batch, g.n_envs) < 0 or g.atoms == 1 or g.atoms > 128:
            raise ConfigError("gpu overrides must be >= 0 (0 = the profile's value) and atoms in [2, 128]")
        for key, value in cfg.market.overrides().items():
            positive = key in ("point_value", "tick_size")
            if not (value == value and abs(value) != float("inf") and (value > 0 if positive else value >= 0)):
                raise ConfigError(f"config key 'market.{key}' must be a finite number {'> 0' if positive else '>= 0'} "
                                  f"(or -1 for the market spec's value), got {value!r}")
        if cfg.device not in ("auto", "gpu", "cpu"):
            raise ConfigError(f"device must be 'auto', 'gpu' or 'cpu', got {cfg.device!r}")
    return cfg


def describe(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(key, default, doc) for every field, for ``--help-config`` and the docs."""
    return _describe(cls, prefix)
