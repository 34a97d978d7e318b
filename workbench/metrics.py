"""Performance metrics: the account model, Sharpe with its uncertainty, and empyrical's definitions.

Account model (README, honesty rules). Futures PnL is dollars per contract, not a return on equity, so
the returns here are **daily USD PnL on a fixed capital base**: ``r_d = pnl_d / capital`` (no
compounding), with ``capital`` the run's stated base (``backtest.capital``; by default the unlevered
notional of the largest position, see :mod:`workbench.account`). Trading days follow the market's
``day_end`` in exchange time (ES's day ends at 16:00 Chicago); only days with at least one bar count.

- Sharpe, Sortino, PSR and DSR are ratios of these returns: they do not change with ``capital``
  (tested), and their sign is the sign of the mean daily PnL, so a losing run never shows a positive
  Sharpe. No statistic divides by equity.
- Percentage metrics are on the base and say so: annual volatility = std(r) x sqrt(252); CAGR from the
  equity path ``capital + cumulative PnL`` ((end / capital)^(252 / days) - 1, -100 % once equity is
  gone); max drawdown on the per-bar equity (marked at every bar's close: the basis of the figures too)
  against its running peak, the base included; Calmar = CAGR / |max drawdown|.
- Every Sharpe comes with its days and its standard error: for non-normal iid returns (Mertens 2002,
  the form the PSR uses; Lo 2002 for normal returns), annualised, with a 95 % interval
  (Sharpe +- 1.96 SE). Fewer than :data:`MIN_DAYS` days is flagged ``few_days``.

Definitions of the ratios as in empyrical 0.5 / empyrical-reloaded (tests cross-check them to 1e-9):
Sharpe = mean(r) / std(r, ddof=1) * sqrt(252); Sortino = mean(r) * 252 / downside risk, downside risk
= sqrt(mean(min(r, 0)^2)) * sqrt(252); on a returns series, CAGR = prod(1 + r)^(252 / n) - 1, max
drawdown = min of wealth / running peak - 1, Calmar = CAGR / |max drawdown|.

Probabilistic Sharpe (Bailey & Lopez de Prado 2012) and deflated Sharpe (2014) use the per-day
(non-annualised) Sharpe, the sample skewness and (non-excess) kurtosis of daily returns.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd

from .markets import MarketSpec

ANNUALIZATION = 252
ANNUALIZATION_NOTE = "daily returns, 252 trading days per year, risk-free rate 0"
MIN_DAYS = 20  # a Sharpe from fewer daily returns is flagged
Z95 = 1.959963984540054
EULER_GAMMA = 0.5772156649015329
_N = NormalDist()


def daily_pnl(pnl: np.ndarray, index: pd.DatetimeIndex, spec: MarketSpec) -> pd.Series:
    """Net USD PnL per trading day (index: trading date). Grouped on the local midnights (``normalize``:
    ~7x faster than one Python date object a bar), the days' index then made from their dates."""
    local = index.tz_convert(spec.session_tz) + spec.day_end_offset()
    out = pd.Series(pnl, index=local.tz_localize(None).normalize()).groupby(level=0).sum()
    out.index = pd.DatetimeIndex(out.index.date, name="trading_day")
    return out


def daily_returns(pnl: np.ndarray, index: pd.DatetimeIndex, spec: MarketSpec, capital: float) -> pd.Series:
    """Daily USD PnL as a fraction of the fixed capital base (the account model above)."""
    if not capital > 0:
        raise ValueError(f"the capital base must be > 0, got {capital}")
    return (daily_pnl(pnl, index, spec) / capital).rename("return")


def sharpe_ratio(r: np.ndarray, ann: int = ANNUALIZATION) -> float:
    r = np.asarray(r, dtype=np.float64)
    if len(r) < 2:
        return float("nan")
    sd = np.std(r, ddof=1)
    return float(np.mean(r) / sd * math.sqrt(ann)) if sd > 0 else float("nan")


def _per_day_sharpe_and_se(r: np.ndarray) -> tuple[float, float]:
    """Per-period Sharpe and its standard error for non-normal iid returns (Mertens 2002):
    SE^2 = (1 - skew * SR + (kurt - 1) / 4 * SR^2) / (n - 1). NaNs where undefined."""
    r = np.asarray(r, dtype=np.float64)
    n = len(r)
    if n < 3 or np.std(r, ddof=1) == 0:
        return float("nan"), float("nan")
    sr = float(np.mean(r) / np.std(r, ddof=1))
    skew, kurt = _moments(r)
    var = (1.0 - skew * sr + (kurt - 1.0) / 4.0 * sr**2) / (n - 1)
    return sr, (math.sqrt(var) if var > 0 else float("nan"))


def sharpe_standard_error(r: np.ndarray, ann: int = ANNUALIZATION) -> float:
    """Standard error of the annualised Sharpe (Mertens 2002, the form the PSR uses)."""
    return _per_day_sharpe_and_se(r)[1] * math.sqrt(ann)


def drawdown_from_equity(equity: np.ndarray, capital: float) -> tuple[float, float]:
    """(max drawdown as a fraction of the running peak, in USD) of an equity path that starts at ``capital``."""
    e = np.concatenate([[capital], np.asarray(equity, dtype=np.float64)])
    peak = np.maximum.accumulate(e)
    return float(np.min(e / peak - 1.0)), float(np.min(e - peak))


def cagr_from_equity(end_equity: float, capital: float, days: int, ann: int = ANNUALIZATION) -> float:
    """Compound annual growth of the account from ``capital`` to ``end_equity`` over ``days`` trading days;
    -1 once the equity is gone."""
    if days == 0:
        return float("nan")
    return (end_equity / capital) ** (ann / days) - 1.0 if end_equity > 0 else -1.0


def sharpe_block(r: np.ndarray, prefix: str = "sharpe") -> dict:
    """A Sharpe with what it needs to be read: days, standard error, 95 % interval, few-days flag."""
    sr, se = sharpe_ratio(r), sharpe_standard_error(r)
    return {prefix: sr, f"{prefix}_se": se, f"{prefix}_ci95_low": sr - Z95 * se, f"{prefix}_ci95_high": sr + Z95 * se,
            "days": int(len(r)), "few_days": bool(len(r) < MIN_DAYS)}


def downside_risk(r: np.ndarray, ann: int = ANNUALIZATION) -> float:
    r = np.asarray(r, dtype=np.float64)
    return float(math.sqrt(np.mean(np.square(np.minimum(r, 0.0)))) * math.sqrt(ann)) if len(r) else float("nan")


def sortino_ratio(r: np.ndarray, ann: int = ANNUALIZATION) -> float:
    r = np.asarray(r, dtype=np.float64)
    if len(r) < 2:
        return float("nan")
    dr = downside_risk(r, ann)
    return float(np.mean(r) * ann / dr) if dr > 0 else (float("inf") if np.mean(r) > 0 else float("nan"))


def annual_return(r: np.ndarray, ann: int = ANNUALIZATION) -> float:
    r = np.asarray(r, dtype=np.float64)
    if len(r) == 0:
        return float("nan")
    final = float(np.prod(1.0 + r))
    return final ** (ann / len(r)) - 1.0 if final > 0 else -1.0


def annual_volatility(r: np.ndarray, ann: int = ANNUALIZATION) -> float:
    r = np.asarray(r, dtype=np.float64)
    return float(np.std(r, ddof=1) * math.sqrt(ann)) if len(r) > 1 else float("nan")


def max_drawdown(r: np.ndarray) -> float:
    r = np.asarray(r, dtype=np.float64)
    if len(r) == 0:
        return float("nan")
    wealth = np.concatenate([[1.0], np.cumprod(1.0 + r)])
    peak = np.maximum.accumulate(wealth)
    return float(np.min(wealth / peak - 1.0))


def calmar_ratio(r: np.ndarray, ann: int = ANNUALIZATION) -> float:
    mdd = max_drawdown(r)
    return annual_return(r, ann) / abs(mdd) if mdd < 0 else float("nan")


def _moments(r: np.ndarray) -> tuple[float, float]:
    r = np.asarray(r, dtype=np.float64)
    m, s = r.mean(), r.std()
    if s == 0:
        return 0.0, 3.0
    z = (r - m) / s
    return float(np.mean(z**3)), float(np.mean(z**4))


def probabilistic_sharpe(r: np.ndarray, benchmark_sr: float = 0.0) -> float:
    """P(true per-day Sharpe > ``benchmark_sr``) given the sample's length, skew and kurtosis."""
    sr, se = _per_day_sharpe_and_se(r)
    return float(_N.cdf((sr - benchmark_sr) / se)) if math.isfinite(se) else float("nan")


def expected_max_sharpe(n_trials: int, sr_variance: float) -> float:
    """Expected maximum per-day Sharpe of ``n_trials`` unskilled trials (the deflated Sharpe's bar)."""
    if n_trials <= 1 or sr_variance <= 0:
        return 0.0
    return math.sqrt(sr_variance) * ((1 - EULER_GAMMA) * _N.inv_cdf(1 - 1.0 / n_trials)
                                     + EULER_GAMMA * _N.inv_cdf(1 - 1.0 / (n_trials * math.e)))


def deflated_sharpe(r: np.ndarray, n_trials: int = 1, sr_variance: float = 0.0) -> float:
    """Probabilistic Sharpe against the best of ``n_trials`` tries with per-day Sharpe variance ``sr_variance``."""
    return probabilistic_sharpe(r, expected_max_sharpe(n_trials, sr_variance))


def trade_stats(trades: pd.DataFrame, position: np.ndarray, n_days: int) -> dict[str, float]:
    pnl = trades["pnl"].to_numpy() if len(trades) else np.zeros(0)
    wins, losses = pnl[pnl > 0], pnl[pnl < 0]
    traded = np.abs(np.diff(np.concatenate([[0], position, [0]]))).sum()
    return {
        "trades": int(len(pnl)),
        "win_rate": float(len(wins) / len(pnl)) if len(pnl) else float("nan"),
        "profit_factor": float(wins.sum() / -losses.sum()) if len(losses) else (float("inf") if len(wins) else float("nan")),
        "avg_trade_usd": float(pnl.mean()) if len(pnl) else float("nan"),
        "exposure": float(np.mean(position != 0)) if len(position) else float("nan"),
        "turnover_contracts_per_day": float(traded / n_days) if n_days else float("nan"),
    }


def summarize(pnl: np.ndarray, index: pd.DatetimeIndex, position: np.ndarray, trades: pd.DataFrame,
              spec: MarketSpec, capital: float, commission: np.ndarray | None = None,
              slippage: np.ndarray | None = None, ruined_bar: int | None = None) -> dict:
    """Every headline number of one range; keys carry their unit, ratios their sample and annualisation."""
    r = daily_returns(pnl, index, spec, capital).to_numpy()
    equity = capital + np.cumsum(pnl)
    mdd, mdd_usd = drawdown_from_equity(equity, capital) if len(pnl) else (float("nan"), float("nan"))
    cagr = cagr_from_equity(float(equity[-1]), capital, len(r)) if len(pnl) else float("nan")
    out: dict = {
        **sharpe_block(r),
        "bars": int(len(pnl)),
        "net_pnl_usd": float(np.sum(pnl)),
        "sortino": sortino_ratio(r),
        "psr": probabilistic_sharpe(r),
        "capital_usd": float(capital),
        "cagr": cagr,
        "annual_volatility": annual_volatility(r),
        "max_drawdown": mdd,
        "max_drawdown_usd": mdd_usd,
        "calmar": cagr / abs(mdd) if mdd < 0 else float("nan"),
        "ruined": ruined_bar is not None,
        "ruined_at": str(index[ruined_bar]) if ruined_bar is not None else "",
        "daily_pnl_mean_usd": float(np.mean(r) * capital) if len(r) else float("nan"),
        "daily_pnl_std_usd": float(np.std(r, ddof=1) * capital) if len(r) > 1 else float("nan"),
        "bar_pnl_mean_usd": float(np.mean(pnl)) if len(pnl) else float("nan"),
        "bar_pnl_std_usd": float(np.std(pnl, ddof=1)) if len(pnl) > 1 else float("nan"),
    }
    if commission is not None:
        out["commission_usd"] = float(np.sum(commission))
    if slippage is not None:
        out["slippage_usd"] = float(np.sum(slippage))
    out.update(trade_stats(trades, position, len(r)))
    out["annualization"] = ANNUALIZATION_NOTE
    return out
