"""Result objects of a walk-forward run: one :class:`FoldResult` per fold, one :class:`WalkForwardResult`."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import metrics as M
from .markets import MarketSpec

HEADLINE = ("net_pnl_usd", "sharpe", "sortino", "cagr", "max_drawdown", "trades", "win_rate", "exposure")


@dataclass
class FoldResult:
    """One fold's out-of-sample (test range) result."""

    fold: int
    strategy: str
    bars: pd.DataFrame          # per-bar position, pnl_usd, commission_usd, slippage_usd, equity_usd
    trades: pd.DataFrame
    metrics: dict[str, float]
    ranges: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class WalkForwardResult:
    """All folds, the folds table and the stitched out-of-sample series."""

    strategy: str
    folds: pd.DataFrame
    fold_results: list[FoldResult]
    market: MarketSpec
    capital: float
    run_dir: str | None = None
    baselines: dict = field(default_factory=dict)  # stitched metrics of the rule baselines on the same folds

    @property
    def stitched(self) -> pd.DataFrame:
        """Test ranges back to back: per-bar PnL and equity compounding from the starting capital."""
        parts = [f.bars.assign(fold=f.fold) for f in self.fold_results if f.ok]
        if not parts:
            return pd.DataFrame(columns=["position", "pnl_usd", "equity_usd", "fold"])
        df = pd.concat(parts)
        df["equity_usd"] = self.capital + df["pnl_usd"].cumsum()
        return df

    def equity_curve(self) -> pd.Series:
        return self.stitched["equity_usd"]

    @property
    def metrics(self) -> dict[str, float]:
        s = self.stitched
        if not len(s):
            return {}
        trades = pd.concat([f.trades for f in self.fold_results if f.ok], ignore_index=True)
        out = M.summarize(s["pnl_usd"].to_numpy(), s.index, s["position"].to_numpy(), trades, self.market,
                          self.capital, s["commission_usd"].to_numpy(), s["slippage_usd"].to_numpy())
        out["annualization"] = M.ANNUALIZATION_NOTE
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per fold: its ranges and headline test metrics."""
        rows = []
        for f in self.fold_results:
            row = {"fold": f.fold, **f.ranges, "status": "ok" if f.ok else f"failed: {f.error}"}
            row.update({k: f.metrics.get(k, np.nan) for k in HEADLINE})
            rows.append(row)
        return pd.DataFrame(rows)
