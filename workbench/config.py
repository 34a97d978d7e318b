"""Run configuration: frozen dataclasses loaded from TOML, with ``section.key=value`` overrides.

Every field has a default and a one-line doc (``doc`` metadata). Unknown sections or keys are errors
that name the key; values are type-checked against the field's annotation. The resolved config is
written into every run directory (``config.toml``) so a run can be reproduced from it.
"""
from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError


from ._fields import _f  # noqa: E402
from .agent.train_config import TrainConfig  # noqa: E402


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


def _check_value(key: str, value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        (elem, _ellipsis) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        return tuple(_check_value(f"{key}[{i}]", v, elem) for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"config key '{key}' must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # sizes like train = 20000 may be written as numbers
        if not isinstance(value, str):
            raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
        return value
    raise ConfigError(f"config key '{key}' has an unsupported type")


def build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested dict, rejecting unknown keys by name."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"unknown config key '{prefix}{key}'", f"known keys here: {known}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        hint, value = hints[f.name], values[f.name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{prefix}{f.name}' must be a table")
            kwargs[f.name] = build(hint, value, f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _check_value(prefix + f.name, value, hint)
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict of a config dataclass (tuples as lists)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        out[f.name] = to_dict(v) if dataclasses.is_dataclass(v) else (list(v) if isinstance(v, tuple) else v)
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        return repr(v) if v == v and abs(v) != float("inf") else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def to_toml(cfg: Any) -> str:
    """Serialise a config dataclass to TOML that :func:`load_config` reads back to an equal object."""
    d = to_dict(cfg)
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
    return "\n".join(lines) + "\n"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value``; the value is read as TOML, falling back to a bare string."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not key=value", "e.g. --set splits.train=30000")
    key, raw = text.split("=", 1)
    key, raw = key.strip(), raw.strip()
    if not key:
        raise ConfigError(f"override '{text}' has no key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def merge_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides onto a nested dict (a copy)."""
    import copy

    out = copy.deepcopy(values)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{text}': '{part}' is not a table")
        node[path[-1]] = value
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file with errors that name the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, cls: type = RunConfig) -> Any:
    """Load a run config: built-in defaults, then ``path`` (TOML), then ``overrides``."""
    values = read_toml(path) if path else {}
    values = merge_overrides(values, overrides or [])
    if cls is RunConfig:  # the training table starts from config/training/dqn.toml
        from .resources import config_file

        base = read_toml(config_file("training", "dqn.toml"))
        training = values.get("training", {})
        if not isinstance(training, dict):
            raise ConfigError("config key 'training' must be a table")
        values["training"] = {**base, **training}
    cfg = build(cls, values)
    if cls is RunConfig:
        from .agent.train_config import validate

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
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(describe(hints[f.name], f"{prefix}{f.name}."))
        else:
            rows.append((prefix + f.name, f.default, f.metadata.get("doc", "")))
    return rows
