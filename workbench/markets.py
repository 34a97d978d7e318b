"""Contract specifications (``config/markets/*.toml``) and how a data set is matched to one."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from . import config as _config
from ._fields import _f
from .errors import ConfigError
from .resources import config_dir


@dataclass(frozen=True)
class MarketSpec:
    """One market's contract terms; all money in USD, all prices in the quote's points."""

    name: str = _f("GENERIC", "short name")
    description: str = _f("", "human-readable name")
    symbol_prefixes: tuple[str, ...] = _f((), "symbols starting with one of these match")
    point_value: float = _f(1.0, "USD per point per contract")
    tick_size: float = _f(0.01, "minimum price increment in points")
    commission_per_side: float = _f(0.0, "USD per contract per side")
    commission_bps: float = _f(0.0, "basis points of notional per side")
    slippage_ticks: float = _f(1.0, "ticks paid on every market order")
    session_tz: str = _f("UTC", "exchange time zone")
    halt_start: str = _f("", "daily halt start HH:MM exchange time ('' = none)")
    halt_end: str = _f("", "daily halt end HH:MM exchange time")
    day_end: str = _f("00:00", "trading-day boundary HH:MM exchange time")
    units: str = _f("contracts", "what one unit of position is")

    @property
    def slippage_points(self) -> float:
        return self.slippage_ticks * self.tick_size

    def day_end_offset(self) -> dt.timedelta:
        """Shift that maps exchange local time to its trading date: date(local + offset)."""
        hh, mm = _parse_hhmm(self.day_end, "day_end")
        end = dt.timedelta(hours=hh, minutes=mm)
        return dt.timedelta(0) if end == dt.timedelta(0) else dt.timedelta(hours=24) - end


def _parse_hhmm(text: str, key: str) -> tuple[int, int]:
    try:
        hh, mm = text.split(":")
        h, m = int(hh), int(mm)
        if not (0 <= h < 24 and 0 <= m < 60):
            raise ValueError
        return h, m
    except ValueError:
        raise ConfigError(f"market key '{key}' must be HH:MM, got {text!r}") from None


def _validate(spec: MarketSpec, source: str) -> MarketSpec:
    for key in ("point_value", "tick_size"):
        if not getattr(spec, key) > 0:
            raise ConfigError(f"market {source}: '{key}' must be > 0, got {getattr(spec, key)}")
    for key in ("commission_per_side", "commission_bps", "slippage_ticks"):
        if getattr(spec, key) < 0:
            raise ConfigError(f"market {source}: '{key}' must be >= 0, got {getattr(spec, key)}")
    if spec.commission_per_side == 0 and spec.commission_bps == 0 and spec.slippage_ticks == 0:
        raise ConfigError(f"market {source}: every cost is zero", "costs are always on; set a commission or slippage")
    if bool(spec.halt_start) != bool(spec.halt_end):
        raise ConfigError(f"market {source}: set both halt_start and halt_end, or neither")
    for key in ("halt_start", "halt_end"):
        if getattr(spec, key):
            _parse_hhmm(getattr(spec, key), key)
    _parse_hhmm(spec.day_end, "day_end")
    return spec


def load_market(name_or_path: str) -> MarketSpec:
    """Load a spec by name (``es``, ``MES``, ``generic``) or from a TOML path."""
    path = config_dir() / "markets" / f"{name_or_path.lower()}.toml"
    if name_or_path.endswith(".toml"):
        from pathlib import Path

        path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in (config_dir() / "markets").glob("*.toml")))
        raise ConfigError(f"unknown market '{name_or_path}'", f"known markets: {known}")
    spec = _config.build(MarketSpec, _config.read_toml(path), prefix="market.")
    return _validate(spec, str(path))


def all_markets() -> list[MarketSpec]:
    return [load_market(p.stem) for p in sorted((config_dir() / "markets").glob("*.toml"))]


def match_market(symbols: list[str]) -> MarketSpec:
    """The spec whose longest prefix matches the data's symbols; generic when none does."""
    best, best_len = None, 0
    for spec in all_markets():
        for prefix in spec.symbol_prefixes:
            if symbols and all(s.upper().startswith(prefix.upper()) for s in symbols) and len(prefix) > best_len:
                best, best_len = spec, len(prefix)
    return best or load_market("generic")
