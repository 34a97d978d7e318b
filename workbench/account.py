"""The account a run is measured on: its capital base and its ruin level, both stated.

- Capital base (``backtest.capital``): a positive number is used as given; ``0`` (the default) derives
  it: the unlevered notional of the largest position the run can hold (``training.max_position`` for
  the agent, ``backtest.contracts`` for a rule, the larger of the two in an agent run, whose baselines
  share the base) at the close of the first test bar. One base for every fold and every strategy of a
  run. Sharpe, Sortino, PSR and DSR do not depend on it (:mod:`workbench.metrics`); percentage metrics
  are on it.
- Ruin (``backtest.ruin_fraction``): each fold's account starts at the base and stops trading when its
  equity falls to ``ruin_fraction x base`` or below (0: zero equity), reported as ruined.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .markets import number


@dataclass(frozen=True)
class Account:
    capital: float      # USD, the base every percentage is on
    ruin_level: float   # USD equity at or below which a fold stops trading
    basis: str          # how the base was chosen, for reports

    def describe(self) -> str:
        return (f"capital base ${self.capital:,.0f} ({self.basis}); a fold stops trading (ruined) at equity "
                f"${self.ruin_level:,.0f} or below")


def account_for(cfg, bars, folds) -> Account:
    """The run's account from its config, the bars' market and the first fold's first test bar."""
    b = cfg.backtest
    if not (0.0 <= b.ruin_fraction < 1.0):
        raise ConfigError(f"backtest.ruin_fraction must be in [0, 1), got {b.ruin_fraction}")
    if b.capital < 0 or b.capital != b.capital:
        raise ConfigError(f"backtest.capital must be > 0, or 0 for the unlevered notional, got {b.capital}")
    if b.capital > 0:
        capital, basis = float(b.capital), "set by backtest.capital"
    else:
        spec = bars.market
        size = b.contracts if cfg.strategy.name != "dqn" else max(cfg.training.max_position, b.contracts)
        first = int(folds["test_start"].iloc[0])
        price = float(bars.frame["close"].iloc[first])
        capital = size * spec.point_value * price
        unit = "contracts" if not spec.generic else "units"
        basis = (f"unlevered notional of {size} {spec.name} {unit} at {number(price)} on "
                 f"{bars.frame.index[first]:%Y-%m-%d}, set backtest.capital to choose another")
    return Account(capital, b.ruin_fraction * capital, basis)
