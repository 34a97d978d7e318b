"""Contract specifications (``config/markets/*.toml``), matched to a data set by product root, and the
generic spec derived from the data when no contract matches.

A market file is either one flat spec (the keys of :class:`MarketSpec`; ``roots`` says which symbol
roots it matches) or a table per product (``[ES]``, ``[NQ]``, ...; the table name is the root) with an
optional ``[defaults]`` table that every product shares (``config/markets/cme.toml``).

Generic instruments (FX, crypto, equities, an unknown future): the tick is inferred from the data's
price increments (:func:`infer_tick`), and one unit of position is ``10^k`` of the instrument with k
chosen so that a unit's notional at the median price is nearest :data:`UNIT_NOTIONAL_USD`; the costs
(``config/markets/generic.toml``) are a percentage of notional plus one tick. Prices are taken to be
in USD.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import settings as _config
from .settings import _f
from .errors import ConfigError
from .resources import config_dir

UNIT_NOTIONAL_USD = 100_000.0
TICK_FIT_SHARE = 0.99  # an inferred tick must put this share of the distinct prices on its grid
OVERRIDABLE = ("point_value", "tick_size", "commission_per_side", "commission_bps", "slippage_ticks")


@dataclass(frozen=True)
class MarketSpec:
    """One market's contract terms; all money in USD, all prices in the quote's points."""

    name: str = _f("GENERIC", "short name (the product root for futures)")
    description: str = _f("", "human-readable name")
    roots: tuple[str, ...] = _f((), "symbol roots this spec matches (a product table's name is its root)")
    point_value: float = _f(1.0, "USD per point per contract (the multiplier)")
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

    @property
    def generic(self) -> bool:
        return self.name == "GENERIC"

    def day_end_offset(self) -> dt.timedelta:
        """Shift that maps exchange local time to its trading date: date(local + offset)."""
        hh, mm = _parse_hhmm(self.day_end, "day_end")
        end = dt.timedelta(hours=hh, minutes=mm)
        return dt.timedelta(0) if end == dt.timedelta(0) else dt.timedelta(hours=24) - end

    def terms(self) -> str:
        """One line of the economics: multiplier, tick and its value, costs."""
        unit = "unit" if self.generic else "contract"
        costs = []
        if self.commission_per_side:
            costs.append(f"${self.commission_per_side:,.2f}/{unit}/side")
        if self.commission_bps:
            costs.append(f"{self.commission_bps:g} bp of notional/side")
        costs.append(f"{self.slippage_ticks:g} tick slippage on market orders")
        return (f"${number(self.point_value)} per point per {unit}, tick {number(self.tick_size)} "
                f"(${number(self.point_value * self.tick_size, 2)}), costs " + " + ".join(costs))


def number(x: float, decimals: int = 0) -> str:
    """A number without exponent or float noise: 0.00005, 125,000, 12.50 (at least ``decimals`` places)."""
    text = np.format_float_positional(float(f"{x:.10g}"), trim="-")
    whole, _, frac = text.partition(".")
    frac = frac.ljust(decimals, "0") if frac or decimals else frac
    return f"{int(whole):,}" + (f".{frac}" if frac else "") if whole.lstrip("-").isdigit() else text


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
        value = getattr(spec, key)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"market {source}: '{key}' must be a finite number > 0, got {value}")
    for key in ("commission_per_side", "commission_bps", "slippage_ticks"):
        value = getattr(spec, key)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"market {source}: '{key}' must be a finite number >= 0, got {value}")
    if spec.commission_per_side == 0 and spec.commission_bps == 0 and spec.slippage_ticks == 0:
        raise ConfigError(f"market {source}: every cost is zero", "costs are always on; set a commission or slippage")
    if bool(spec.halt_start) != bool(spec.halt_end):
        raise ConfigError(f"market {source}: set both halt_start and halt_end, or neither")
    for key in ("halt_start", "halt_end"):
        if getattr(spec, key):
            _parse_hhmm(getattr(spec, key), key)
    _parse_hhmm(spec.day_end, "day_end")
    return spec


def _build(values: dict, source: str) -> MarketSpec:
    return _validate(_config.build(MarketSpec, values, prefix="market."), source)


def _specs_in(path: Path) -> list[MarketSpec]:
    """Every spec a market file holds: one flat spec, or a table per product plus ``[defaults]``."""
    data = _config.read_toml(path)
    tables = {k: v for k, v in data.items() if isinstance(v, dict) and k != "defaults"}
    if not tables:
        return [_build(data, str(path))]
    shared = data.get("defaults", {})
    out = []
    for name, values in tables.items():
        merged = {"name": name, "roots": [name], **shared, **values}
        out.append(_build(merged, f"{path}[{name}]"))
    return out


def futures_specs() -> dict[str, MarketSpec]:
    """Every shipped (or ``WORKBENCH_CONFIG_DIR``) futures spec by upper-case root."""
    out: dict[str, MarketSpec] = {}
    for path in sorted((config_dir() / "markets").glob("*.toml")):
        if path.stem == "generic":
            continue
        for spec in _specs_in(path):
            for root in spec.roots or (spec.name,):
                out.setdefault(root.upper(), spec)
    return out


def load_market(name_or_path: str) -> MarketSpec:
    """A futures spec by name (``es``, ``NQ``, any case) or from a TOML file holding one flat spec.
    ``generic`` is the generic template (costs only: its point value and tick come from the data,
    see :func:`generic_spec`)."""
    if str(name_or_path).endswith(".toml"):
        path = Path(name_or_path)
        if not path.is_file():
            raise ConfigError(f"market file not found: {path}")
        specs = _specs_in(path)
        if len(specs) != 1:
            raise ConfigError(f"market file {path} holds {len(specs)} specs", "name one of them instead: "
                              + ", ".join(s.name for s in specs))
        return specs[0]
    if str(name_or_path).lower() == "generic":
        return _build(_config.read_toml(config_dir() / "markets" / "generic.toml"), "generic.toml")
    specs = futures_specs()
    spec = specs.get(str(name_or_path).upper())
    if spec is None:
        raise ConfigError(f"unknown market '{name_or_path}'", f"known markets: {', '.join(sorted(specs))}, generic, "
                          "or a TOML file")
    return spec


def match_root(root: str) -> MarketSpec | None:
    """The futures spec of a product root (``ES``), or ``None``."""
    return futures_specs().get(str(root).upper())


def infer_tick(prices: np.ndarray) -> tuple[float, bool]:
    """(tick, found): the largest ``m x 10^e`` (m in 1, 2, 2.5, 5) that puts at least 99 % of the distinct
    prices on its grid, at most 1 % of the median price. ``found`` is false when no grid finer than a
    millionth of the price fits (prices computed rather than traded); the tick is then 10^-4 of the
    median price's order of magnitude."""
    p = np.unique(np.asarray(prices, dtype=np.float64))
    p = p[np.isfinite(p) & (p > 0)]
    if len(p) == 0:
        return 0.01, False
    if len(p) > 200_000:
        p = p[np.linspace(0, len(p) - 1, 200_000).astype(np.int64)]
    med = float(np.median(p))
    top = math.floor(math.log10(med * 0.01))
    for e in range(top, top - 12, -1):
        for m in (5.0, 2.5, 2.0, 1.0):
            q = m * 10.0 ** e
            if q > med * 0.01 or q < med * 1e-6:
                continue
            if _on_grid_share(p, q) >= TICK_FIT_SHARE:
                return float(f"{q:.12g}"), True
    return 10.0 ** (math.floor(math.log10(med)) - 4), False


def _on_grid_share(p: np.ndarray, tick: float) -> float:
    """Share of the prices ``p`` that are a multiple of ``tick`` (to a thousandth of a tick)."""
    x = p / tick
    return float(np.mean(np.abs(x - np.round(x)) < 1e-3))


def off_grid_share(prices: np.ndarray, tick: float) -> float:
    """Share of the distinct prices that are not a multiple of ``tick``."""
    p = np.unique(np.asarray(prices, dtype=np.float64))
    p = p[np.isfinite(p)]
    return 1.0 - _on_grid_share(p, tick) if len(p) else 0.0


def generic_spec(prices: np.ndarray, label: str = "") -> tuple[MarketSpec, str]:
    """The generic spec for these prices and one line saying how it was derived."""
    base = load_market("generic")
    tick, found = infer_tick(prices)
    finite = np.asarray(prices, dtype=np.float64)
    med = float(np.median(finite[np.isfinite(finite) & (finite > 0)])) if len(finite) else 1.0
    point_value = 10.0 ** round(math.log10(UNIT_NOTIONAL_USD / med))
    spec = dataclasses.replace(base, description=f"generic instrument{' ' + label if label else ''}",
                               point_value=float(point_value), tick_size=tick)
    how = (f"tick {number(tick)} inferred from the price increments" if found else
           f"no price grid found in the data: tick set to {number(tick)} (about {tick / med * 1e4:.2g} bp)")
    note = (f"1 unit = {number(point_value)} of the instrument (notional ~${point_value * med:,.0f} at the median "
            f"price {med:.6g}, prices taken as USD); {how}")
    return spec, note


def apply_overrides(spec: MarketSpec, overrides: dict) -> MarketSpec:
    """``spec`` with the given terms replaced (keys of :data:`OVERRIDABLE`), validated again."""
    bad = set(overrides) - set(OVERRIDABLE)
    if bad:
        raise ConfigError(f"market terms that cannot be overridden: {', '.join(sorted(bad))}",
                          f"overridable: {', '.join(OVERRIDABLE)}")
    if not overrides:
        return spec
    return _validate(dataclasses.replace(spec, **{k: float(v) for k, v in overrides.items()}),
                     f"{spec.name} with --set market.*")
