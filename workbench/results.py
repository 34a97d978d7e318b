"""Result objects of a walk-forward run: one :class:`FoldResult` per fold, one :class:`WalkForwardResult`."""
from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import metrics as M
from .account import Account
from .markets import MarketSpec

PHASES = ("init", "experience", "training", "validation")  # an epoch's timed phases (ms): *_ms in epochs_frame()
HEADLINE = ("net_pnl_usd", "sharpe", "sharpe_ci95_low", "sharpe_ci95_high", "days", "few_days", "psr", "sortino", "cagr",
            "max_drawdown", "ruined", "trades", "win_rate", "exposure")


@dataclass
class FoldResult:
    """One fold's out-of-sample (test range) result."""

    fold: int                   # numbered from 1, as on screen, in tables, JSON and fold_NNN directories
    strategy: str
    bars: pd.DataFrame          # per-bar position, pnl_usd, commission_usd, slippage_usd, equity_usd
    trades: pd.DataFrame
    metrics: dict[str, float]
    ranges: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    epochs: list[dict] = field(default_factory=list)  # the agent's epoch logs (dicts; empty for a rule)
    params: np.ndarray | None = None                    # the agent's chosen weights (flat float32)
    traceback: str = ""                                 # of a failed fold
    members: list["FoldResult"] = field(default_factory=list)  # a seed ensemble's seeds, each on its own

    def __post_init__(self) -> None:
        # one shape whatever the origin: EpochLog objects from a fresh run, dicts from a run directory
        self.epochs = [dataclasses.asdict(e) if dataclasses.is_dataclass(e) else dict(e) for e in self.epochs]

    @property
    def ok(self) -> bool:
        return self.error is None

    def equity_curve(self) -> pd.Series:
        """Equity (USD) at the close of every test bar, from the starting capital."""
        return self.bars["equity_usd"]

    def epochs_frame(self) -> pd.DataFrame:
        """The agent's epochs (one row each: phase times in ms, loss, validation Sharpe); empty for a rule."""
        return _epochs_frame([self])

    def plot(self, path=None):
        """Test-range equity and drawdown; for the agent also per-epoch phase timing and validation
        Sharpe with the chosen epoch. Returns a matplotlib ``Figure`` (and writes a PNG to ``path``)."""
        from .plots import plot_fold

        return plot_fold(self.bars, self.epochs_frame(), self.metrics, self.fold, self.strategy,
                         self.ranges.get("test", ""), self.error, path)

    def _repr_html_(self) -> str:
        if not self.ok:
            return f"<b>fold {self.fold}: failed</b><pre>{html.escape(self.error or '')}</pre>"
        ranges = "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in self.ranges.items())
        return (f"<div><b>fold {self.fold} ({html.escape(self.strategy)})</b><ul>{ranges}</ul>"
                + _metrics_table_html("test range", {"value": self.metrics})
                + f"<p><i>{html.escape(M.ANNUALIZATION_NOTE)}</i></p></div>")


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
    baseline_results: dict = field(default_factory=dict, repr=False)  # their WalkForwardResults (equity, folds)
    account: Account | None = None  # the capital base and ruin level every number here is measured on

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
        level = self.account.ruin_level if self.account is not None else 0.0
        hit = np.flatnonzero(s["equity_usd"].to_numpy() <= level)
        out = M.summarize(s["pnl_usd"].to_numpy(), s.index, s["position"].to_numpy(), trades, self.market,
                          self.capital, s["commission_usd"].to_numpy(), s["slippage_usd"].to_numpy(),
                          int(hit[0]) if len(hit) else None)
        out["ruined_folds"] = sum(bool(f.metrics.get("ruined")) for f in self.fold_results if f.ok)
        return out

    @property
    def seed_results(self) -> list["WalkForwardResult"]:
        """With ``training.seeds`` > 1: each seed's own walk-forward (its chosen weights' test ranges,
        stitched like the ensemble's), in seed order; empty for one seed or a rule."""
        ok = [f for f in self.fold_results if f.ok and f.members]
        k = min((len(f.members) for f in ok), default=0)
        return [WalkForwardResult(f"{self.strategy} seed {s}", self.folds, [f.members[s] for f in ok], self.market,
                                  self.capital, account=self.account) for s in range(k)]

    def seed_summary(self) -> dict:
        """The seed ensemble beside its seeds (stitched out-of-sample): the ensemble's Sharpe, net PnL and
        drawdown, each seed's, their mean / sd / min / max and how many seeds the ensemble beats on Sharpe;
        ``{}`` without seeds."""
        from .agent.ensemble import RULE_DOC, SEED_KEYS, spread

        runs = self.seed_results
        if not runs:
            return {}
        per = [{"seed": s, "days": r.metrics.get("days"), **{k: r.metrics.get(k) for k in SEED_KEYS}}
               for s, r in enumerate(runs)]
        ens = self.metrics
        beats = sum(1 for p in per if np.isfinite(p["sharpe"]) and ens.get("sharpe", np.nan) > p["sharpe"])
        return {"seeds": len(runs), "ensemble_rule": RULE_DOC,
                "ensemble": {k: ens.get(k) for k in ("days", *SEED_KEYS)},
                "seed_spread": spread({k: [p[k] for p in per] for k in SEED_KEYS}),
                "ensemble_sharpe_beats_seeds": f"{beats} of {len(per)}", "per_seed": per,
                "annualization": M.ANNUALIZATION_NOTE}

    def daily_returns(self) -> pd.Series:
        """Stitched out-of-sample daily returns (fraction of capital per trading day), the series every
        Sharpe here is computed from."""
        s = self.stitched
        return M.daily_returns(s["pnl_usd"].to_numpy(), s.index, self.market, self.capital)

    def deflated_sharpe(self, n_trials: int, sr_variance: float) -> float:
        """Deflated Sharpe (Bailey & Lopez de Prado 2014): the probability that the stitched per-day Sharpe
        beats the expected best of ``n_trials`` unskilled tries. Both numbers come from the search that
        chose this configuration: ``n_trials`` = every trial started, ``sr_variance`` = the variance of the
        trials' per-day (not annualised) Sharpes (``workbench.hyperopt`` writes both in its summary)."""
        if n_trials < 1 or not sr_variance >= 0:
            raise ValueError(f"deflated Sharpe needs n_trials >= 1 and sr_variance >= 0, got {n_trials}, {sr_variance}")
        return M.deflated_sharpe(self.daily_returns().to_numpy(), n_trials, sr_variance)

    def epochs_frame(self) -> pd.DataFrame:
        """Every fold's epochs: phase times (ms), loss, |Q| max, validation Sharpe; empty for a rule."""
        return _epochs_frame(self.fold_results)

    def plot(self, path=None):
        """Stitched out-of-sample equity against buy-and-hold (and every baseline) with fold boundaries,
        drawdown, per-fold Sharpe and, for the agent, per-epoch phase timing. Returns a matplotlib
        ``Figure`` (and writes a PNG to ``path``)."""
        from .plots import plot_walkforward

        equity = {self.strategy: self.equity_curve(), **{n: r.equity_curve() for n, r in self.baseline_results.items()}}
        tables = {self.strategy: self.to_frame(), **{n: r.to_frame() for n, r in self.baseline_results.items()}}
        title = (f"walk-forward {self.strategy} ({self.market.name}): stitched out-of-sample test ranges, capital base "
                 f"{self.capital:,.0f} USD, costs included")
        return plot_walkforward(equity, self.stitched["fold"].to_numpy(), tables, self.epochs_frame(), title, path)

    def to_frame(self) -> pd.DataFrame:
        """One row per fold: its ranges and headline test metrics."""
        rows = []
        for f in self.fold_results:
            status = ("RUINED" if f.metrics.get("ruined") else "ok") if f.ok else f"failed: {f.error}"
            row = {"fold": f.fold, **f.ranges, "status": status}
            row.update({k: f.metrics.get(k, np.nan) for k in HEADLINE})
            if "best_epoch" in f.metrics:  # the agent: which epoch's weights, chosen by what
                row.update(epoch=f.metrics["best_epoch"], selected_by=f.metrics.get("selected_by", ""))
            elif "seed_best_epochs" in f.metrics:  # a seed ensemble: each seed's chosen epoch
                row.update(epoch="/".join(str(e) for e in f.metrics["seed_best_epochs"]),
                           selected_by=f.metrics.get("selected_by", ""),
                           seed_sharpe_mean=f.metrics.get("seed_sharpe_mean"),
                           seed_sharpe_sd=f.metrics.get("seed_sharpe_sd"))
            row["annualization"] = M.ANNUALIZATION_NOTE
            rows.append(row)
        return pd.DataFrame(rows)


    def _repr_html_(self) -> str:
        cols = {self.strategy: {k: v for k, v in self.metrics.items() if k != "annualization"}}
        cols.update(self.baselines)
        folds = self.to_frame().to_html(index=False, float_format=lambda x: f"{x:.4g}", escape=True)
        seeds = self.seed_summary()
        seed_html = (_metrics_table_html(f"the ensemble of {seeds['seeds']} seeds ({seeds['ensemble_rule']}) beside "
                                         "each seed, stitched out-of-sample",
                                         {"ensemble": seeds["ensemble"],
                                          **{f"seed {p['seed']}": p for p in seeds["per_seed"]}})
                     if seeds else "")
        return (f"<div><h3>walk-forward: {html.escape(self.strategy)} ({html.escape(self.market.name)}, "
                f"{len(self.fold_results)} folds)</h3>"
                + _metrics_table_html("stitched out-of-sample" + (" against the baselines (same folds, same costs)"
                                                                  if self.baselines else ""), cols) + seed_html
                + f"<h4>folds</h4>{folds}<p><i>{html.escape(M.ANNUALIZATION_NOTE)}</i></p></div>")

    def __rich__(self):
        from rich.table import Table

        t = Table(title=f"walk-forward: {self.strategy} ({self.market.name}), stitched out-of-sample")
        names = [self.strategy, *self.baselines]
        t.add_column("metric")
        for n in names:
            t.add_column(n, justify="right")
        rows = {self.strategy: self.metrics, **self.baselines}
        for k in self.metrics:
            if k != "annualization":
                t.add_row(k, *[_fmt(rows[n].get(k, "")) for n in names])
        t.caption = M.ANNUALIZATION_NOTE
        seeds = self.seed_summary()
        if seeds:
            sp = seeds["seed_spread"]
            t.caption += (f"\n{self.strategy} is the ensemble of {seeds['seeds']} seeds ({seeds['ensemble_rule']}); "
                          f"the seeds alone: sharpe mean {sp['sharpe_mean']:.2f} sd {sp['sharpe_sd']:.2f} "
                          f"(min {sp['sharpe_min']:.2f}, max {sp['sharpe_max']:.2f}), net_pnl_usd mean "
                          f"{sp['net_pnl_usd_mean']:,.0f}; the ensemble's sharpe beats {seeds['ensemble_sharpe_beats_seeds']}")
        return t

    def to_html(self, path, plots: bool = True) -> str:
        """Write a self-contained HTML report (tables and, with ``plots``, the figures as embedded PNGs; no
        external files, no scripts) and return its path."""
        from pathlib import Path

        from .plots import png_data_uri

        def img(fig, alt):
            return f"<img alt='{html.escape(alt)}' style='max-width:100%' src='{png_data_uri(fig)}'>" if plots else ""

        page = ("<!doctype html><html><head><meta charset='utf-8'><title>workbench report</title><style>"
                "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:.5em 0}"
                "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}</style></head><body>"
                + self._repr_html_() + img(self.plot(), "walk-forward figure")
                + "".join(f._repr_html_() + (img(f.plot(), f"fold {f.fold} figure") if f.ok else "")
                          for f in self.fold_results) + "</body></html>")
        p = Path(path)
        p.write_text(page)
        return str(p)


def _epochs_frame(folds) -> pd.DataFrame:
    rows = []
    for f in folds:
        for e in f.epochs:
            ms = e.get("ms", {})
            rows.append({"fold": f.fold, "epoch": int(e["epoch"]),
                         **{f"{p}_ms": float(ms.get(p, 0.0)) for p in PHASES}, "total_ms": float(ms.get("total", 0.0)),
                         **{k: e[k] for k in ("updates", "loss", "grad_norm", "max_abs_q", "epsilon", "val_bar_t",
                                              "val_bars", "val_sharpe", "val_days", "val_pnl_usd",
                                              "val_max_drawdown_usd", "guard_tripped") if k in e},
                         **{f"init_{k}_ms": v for k, v in ms.get("init_breakdown_ms", {}).items()},
                         **({"seed": int(e["seed"])} if "seed" in e else {}),
                         "chosen": bool(e["chosen"]) if "chosen" in e
                         else int(e["epoch"]) == int(f.metrics.get("best_epoch", -1))})
    return pd.DataFrame(rows)


# ---- display: HTML in notebooks, rich in terminals, a self-contained report ----

def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _metrics_table_html(title: str, columns: dict[str, dict]) -> str:
    keys = list(next(iter(columns.values())).keys()) if columns else []
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    rows = "".join(f"<tr><td>{html.escape(k)}</td>" + "".join(f"<td>{html.escape(_fmt(m.get(k, '')))}</td>"
                                                             for m in columns.values()) + "</tr>" for k in keys)
    return f"<h4>{html.escape(title)}</h4><table><tr><th>metric</th>{head}</tr>{rows}</table>"


