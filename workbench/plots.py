"""Matplotlib figures of a walk-forward result and of one fold.

Figures are built on ``matplotlib.figure.Figure`` directly, not through ``pyplot``: they render the
same headless (CI, a report file) as in a notebook, and pyplot's global figure list never holds them,
so a notebook cell ending in ``result.plot()`` shows the figure once (inline backends would show a
pyplot figure at the end of the cell *and* the returned object). In an IPython kernel the PNG
formatter for ``Figure`` is registered on first use, so the returned figure displays itself.

Units: equity in USD, drawdown in percent of the running peak of equity, Sharpe annualised from daily
returns (252 days, rf 0, as every metric in ``workbench.metrics``), phase times in milliseconds.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd

from .metrics import ANNUALIZATION_NOTE

PHASES = ("experience", "training", "validation")  # stacked per epoch; init is written above a fold's first

PHASE_COLOURS = {"init": "#9e9e9e", "experience": "#1f77b4", "training": "#d62728", "validation": "#2ca02c"}
BASELINE_COLOURS = {"buy-and-hold": "#7f7f7f", "momentum": "#ff7f0e"}


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # matplotlib is a dependency; a broken install should say so plainly
        raise ImportError("plots need matplotlib: pip install matplotlib") from exc
    _register_ipython_png()
    return Figure(figsize=(width, height), layout="constrained")


def _register_ipython_png() -> None:
    """Let IPython display a bare ``Figure`` (the inline backend only registers pyplot's path)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    from matplotlib.figure import Figure

    fmt = ip.display_formatter.formatters["image/png"]
    fmt.for_type(Figure, lambda fig: figure_png(fig, dpi=90))


def figure_png(fig, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def png_data_uri(fig, dpi: int = 110) -> str:
    return "data:image/png;base64," + base64.b64encode(figure_png(fig, dpi)).decode("ascii")


def _drawdown_pct(equity: pd.Series) -> pd.Series:
    return 100.0 * (equity / equity.cummax() - 1.0)


def _bar_axis(ax, index: pd.DatetimeIndex) -> None:
    """x = bar number (trading time: nights, weekends and the gaps between test ranges closed up),
    labelled with the bar's timestamp."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    n = len(index)
    ax.xaxis.set_major_locator(MaxNLocator(8, integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _pos: index[int(v)].strftime("%Y-%m-%d\n%H:%M") if 0 <= int(v) < n else ""))
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlim(0, max(n - 1, 1))


def _equity_panel(ax, series: dict[str, pd.Series], strategy: str, boundaries=()) -> None:
    index = series[strategy].index
    x = np.arange(len(index))
    for name, eq in series.items():
        main = name == strategy
        y = eq.reindex(index).to_numpy()  # baselines run on the same test bars; reindex guards the order
        ax.plot(x, y, lw=1.4 if main else 1.0, color=None if main else BASELINE_COLOURS.get(name),
                ls="-" if main else "--", label=name, zorder=3 if main else 2)
    for k, i in boundaries:
        if i:
            ax.axvline(i, color="#555", lw=0.7, ls=":", zorder=1)
        ax.annotate(f"fold {k}", (i, 0.0), xycoords=("data", "axes fraction"), xytext=(3, 3),
                    textcoords="offset points", va="bottom", fontsize=7, color="#555")
    ax.set_ylabel("equity (USD)")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    _bar_axis(ax, index)


def _drawdown_panel(ax, series: dict[str, pd.Series], strategy: str, boundaries=()) -> None:
    index = series[strategy].index
    x = np.arange(len(index))
    for name, eq in series.items():
        dd = _drawdown_pct(eq.reindex(index)).to_numpy()
        if name == strategy:
            ax.fill_between(x, dd, 0.0, color="#d62728", alpha=0.35, label=name, lw=0)
        else:
            ax.plot(x, dd, lw=0.8, ls="--", color=BASELINE_COLOURS.get(name), label=name)
    for _k, i in boundaries:
        if i:
            ax.axvline(i, color="#555", lw=0.7, ls=":", zorder=1)
    ax.set_ylabel("drawdown (% of peak)")
    ax.set_xlabel("out-of-sample bar (trading time; labels are bar timestamps)", fontsize=8)
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    _bar_axis(ax, index)


def _ms_text(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"


def _timing_panel(ax, epochs: pd.DataFrame, title: str) -> bool:
    """Stacked per-epoch phase times (ms), epochs of every fold side by side. False if nothing trained.

    ``init`` is once per fold (upload, allocation, kernel compilation and graph capture), so it is written
    above the fold's first epoch rather than stacked: it would dwarf the epochs. Epochs far above the
    median (a first epoch that compiled kernels) are clipped and labelled with their total."""
    if epochs is not None and "seed" in epochs.columns:  # a seed ensemble: seed 0's epochs stand for the fold
        epochs = epochs[epochs["seed"] == epochs["seed"].min()]
    if epochs is None or not len(epochs):
        return False
    rows = list(zip(epochs["fold"].to_numpy(), epochs["epoch"].to_numpy(), epochs["init_ms"].to_numpy(dtype=float)))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for phase in PHASES:
        h = epochs[f"{phase}_ms"].to_numpy(dtype=float)
        ax.bar(x, h, bottom=bottom, width=0.85, color=PHASE_COLOURS[phase], label=phase)
        bottom += h
    med = float(np.median(bottom)) if bottom.any() else 1.0
    cap = float(bottom.max()) if bottom.max() <= 4 * med else 4 * med
    ax.set_ylim(0, max(cap, 1e-9) * 1.45)  # headroom for the legend and the init labels
    for i in np.flatnonzero(bottom > cap):
        ax.annotate(f"{_ms_text(bottom[i])} (clipped)", (i, cap), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7)
    labels, first = [], {}
    for i, (k, epoch, init) in enumerate(rows):
        new_fold = k not in first
        first.setdefault(k, i)
        labels.append(f"{int(epoch)}" + (f"\nfold {k}" if new_fold else ""))
        if new_fold:
            if i:
                ax.axvline(i - 0.5, color="#555", lw=0.7, ls=":")
            y = min(bottom[i], cap)
            ax.annotate(f"init\n{_ms_text(init)}", (i, y), xytext=(0, 12 if bottom[i] > cap else 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7, color="#555")
    ax.set_xticks(x, labels, fontsize=6 if len(rows) > 30 else 8)
    ax.set_xlabel("epoch (within its fold)")
    ax.set_ylabel("phase time (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper right", fontsize=8, ncols=3)
    ax.grid(alpha=0.3, axis="y")
    return True


def plot_walkforward(equity: dict[str, pd.Series], fold_of_bar: np.ndarray, fold_tables: dict[str, pd.DataFrame],
                     epochs: pd.DataFrame, title: str, path=None, dpi: int = 110):
    """Stitched out-of-sample equity against the baselines with fold boundaries, drawdown, per-fold Sharpe
    and, for the agent, per-epoch phase timing. Frames in: ``equity`` by strategy (the first is the one
    run), the fold number of every stitched bar, each strategy's folds table (``fold``, ``status``,
    ``sharpe``), the epochs table. Returns the ``Figure``; writes a PNG too when ``path``."""
    strategy = next(iter(equity))
    trained = epochs is not None and len(epochs) > 0
    fig = _figure(11, 11.5 if trained else 8.5)
    axes = fig.subplots(4 if trained else 3, 1, height_ratios=[3, 1.4, 1.6, 2][: 4 if trained else 3])
    fold_of_bar = np.asarray(fold_of_bar)
    bounds = [(int(k), int(np.argmax(fold_of_bar == k))) for k in pd.unique(fold_of_bar)]
    if len(fold_of_bar):
        _equity_panel(axes[0], equity, strategy, bounds)
        _drawdown_panel(axes[1], equity, strategy, bounds)
    else:
        axes[0].text(0.5, 0.5, "no fold finished", ha="center", va="center", transform=axes[0].transAxes)
    axes[0].set_title(title, fontsize=10)

    # per-fold Sharpe: the strategy and each baseline, grouped by fold; failed folds marked
    ax = axes[2]
    names = list(fold_tables)
    main = fold_tables[strategy]
    folds = main["fold"].tolist()
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        t = fold_tables[name]
        by_fold = dict(zip(t["fold"], np.where(t["status"].astype(str).str.startswith("failed"), np.nan,
                                               t["sharpe"].to_numpy(dtype=float))))
        vals = np.array([by_fold.get(k, np.nan) for k in folds], dtype=float)
        bars = ax.bar(np.arange(len(folds)) + (j - (len(names) - 1) / 2) * width, np.nan_to_num(vals), width,
                      label=name, color=None if name == strategy else BASELINE_COLOURS.get(name))
        ax.bar_label(bars, labels=["" if not np.isfinite(v) else f"{v:.1f}" for v in vals], fontsize=7, padding=1)
    for i, status in enumerate(main["status"].astype(str)):
        if status.startswith("failed"):
            ax.annotate("failed", (i, 0), ha="center", va="bottom", fontsize=8, color="#d62728")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(np.arange(len(folds)), [f"fold {k}" for k in folds])
    ax.set_ylabel("Sharpe (annualised)")
    ax.set_title(f"test-range Sharpe per fold ({ANNUALIZATION_NOTE})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    if trained:
        _timing_panel(axes[3], epochs, "phase times per epoch (ms; on the GPU from device events); init = the "
                                       "fold's one-time upload, allocation, compilation and graph capture")
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def plot_fold(bars: pd.DataFrame, epochs: pd.DataFrame, m: dict, fold: int, strategy: str, test_range: str = "",
              error: str | None = None, path=None, dpi: int = 110):
    """One fold's test-range equity and drawdown (``bars``: its per-bar frame) and, for the agent, per-epoch
    phase timing with the statistic that chose the epoch (``epochs``: its epochs table; ``m``: its metrics).
    Returns the ``Figure``; writes a PNG too when ``path``."""
    trained = epochs is not None and len(epochs) > 0
    fig = _figure(10, 8.5 if trained else 5.5)
    axes = fig.subplots(3 if trained else 2, 1, height_ratios=[3, 1.4, 2][: 3 if trained else 2])
    if error is not None:
        axes[0].text(0.5, 0.5, f"fold {fold} failed:\n{error}", ha="center", va="center",
                     wrap=True, transform=axes[0].transAxes)
        return fig
    eq = {strategy: bars["equity_usd"]}
    _equity_panel(axes[0], eq, strategy)
    _drawdown_panel(axes[1], eq, strategy)
    axes[0].set_title(f"fold {fold} {strategy}: test range {test_range}; "
                      f"net {m.get('net_pnl_usd', np.nan):,.0f} USD, Sharpe {m.get('sharpe', np.nan):.2f} "
                      "(annualised daily)", fontsize=10)
    if trained:
        ax = axes[2]
        from .agent.selection import SELECT_RULES

        rule = m.get("selected_by", "daily_sharpe")
        key = SELECT_RULES.get(rule, SELECT_RULES["daily_sharpe"])[0]
        # a seed ensemble's epochs carry "seed": the timing of seed 0 (its seeds train side by side or alike),
        # each seed's validation curve with its own chosen epoch
        seeds = sorted(set(epochs["seed"])) if "seed" in epochs.columns else [None]
        _timing_panel(ax, epochs, f"phase times per epoch (ms) and the statistic that chose the epoch ({rule})"
                      + (f"; {len(seeds)} seeds, each its own epoch" if seeds[0] is not None else ""))
        tw = ax.twinx()
        fin = []
        for s in seeds:
            e = epochs[epochs["seed"] == s] if s is not None else epochs
            vs = e[key].to_numpy(dtype=float) if key in e.columns else np.full(len(e), np.nan)
            tw.plot(np.arange(len(vs)), vs, "o-" if s else "ko-", ms=3, lw=1,
                    label=f"validation {rule}" + (f" seed {s}" if s is not None else ""))
            chosen = np.flatnonzero(e["chosen"].to_numpy(dtype=bool)) if "chosen" in e.columns else []
            if len(chosen):
                c = int(chosen[0])
                tw.plot([c], [vs[c]], marker="*", ms=12, color="gold", mec="black", ls="",
                        label=f"chosen epoch {c + 1}" if s in (None, seeds[0]) else None)
            fin.extend(vs[np.isfinite(vs)])
        fin = np.asarray(fin)
        if len(fin):
            lo, hi = float(fin.min()), float(fin.max())
            span = max(hi - lo, 1e-6)
            tw.set_ylim(lo - 0.1 * span, hi + 0.5 * span)
        tw.set_ylabel(f"validation {rule}")
        # one legend, on the twin axis (drawn on top), so the init label at the upper left stays visible
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = tw.get_legend_handles_labels()
        ax.get_legend().remove()
        tw.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=8, ncols=len(h1 + h2))
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig
