"""Progress of a walk-forward run on stderr: a live ``rich`` dashboard on a terminal, plain lines otherwise.

Both implement the same small interface (``start``, ``fold_started``, ``fold_finished``, ``finish``),
which the engine calls; results never go to stderr (they are printed on stdout by the CLI).
"""
from __future__ import annotations

import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from .results import FoldResult


def _fmt(v, spec: str) -> str:
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def epoch_line(log, n_epochs: int) -> str:
    """``epoch k/E: init=... experience=... training=... validation=... total=... ms`` plus learning figures."""
    ms = log.ms
    return (f"epoch {log.epoch + 1}/{n_epochs}: init={ms.get('init', 0.0):.1f} experience={ms['experience']:.1f} "
            f"training={ms['training']:.1f} validation={ms['validation']:.1f} total={ms['total']:.1f} ms | "
            f"updates={log.updates} loss={log.loss:.4f} |Q|max={log.max_abs_q:.3g} eps={log.epsilon:.2f} "
            f"val_sharpe={log.val_sharpe:.2f} val_pnl_usd={log.val_pnl_usd:.0f}"
            + (" | per update: sample={sample:.3f} update={update:.3f} guard={guard:.3f} ms".format(
                **ms["training_breakdown_ms_per_update"]) if "training_breakdown_ms_per_update" in ms else "")
            + (" GUARD TRIPPED: weights restored" if log.guard_tripped else ""))


class PlainProgress:
    """One line per event on stderr, for logs and pipes."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.n = 0

    def _say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {text}", file=self.stream, flush=True)

    def start(self, n_folds: int, info: dict) -> None:
        self.n = n_folds
        self._say(" ".join(f"{k}={v}" for k, v in info.items()) + f" folds={n_folds}")

    def fold_started(self, fold: int, ranges: dict) -> None:
        self._say(f"fold {fold + 1}/{self.n} started: test {ranges.get('test', '')}")

    def fold_finished(self, res: FoldResult, seconds: float) -> None:
        if not res.ok:
            self._say(f"fold {res.fold + 1}/{self.n} FAILED: {res.error}")
            return
        m = res.metrics
        self._say(f"fold {res.fold + 1}/{self.n} done in {seconds:.2f}s: net_pnl_usd={m['net_pnl_usd']:.2f} "
                  f"sharpe={_fmt(m['sharpe'], '.2f')} trades={m['trades']}")

    def epoch(self, fold: int, log, n_epochs: int) -> None:
        self._say(f"fold {fold + 1}/{self.n} " + epoch_line(log, n_epochs))

    def finish(self, summary: dict) -> None:
        self._say(f"finished: {len(summary)} metrics")


class LiveDashboard(PlainProgress):
    """A rich table of folds updated in place."""

    def __init__(self, console: Console | None = None):
        super().__init__()
        self.console = console or Console(stderr=True)
        self.rows: dict[int, list[str]] = {}
        self.info: dict = {}
        self.live: Live | None = None

    def epoch(self, fold: int, log, n_epochs: int) -> None:
        self.epochs = getattr(self, "epochs", {})
        if getattr(self, "_epoch_fold", None) != fold:
            self.epochs, self._epoch_fold = {}, fold
        self.epochs[log.epoch] = log
        self._n_epochs = n_epochs
        if fold in self.rows:
            self.rows[fold][2] = f"epoch {log.epoch + 1}/{n_epochs}"
        self.live.update(self._render())

    def _epoch_table(self):
        t = Table(title=f"fold {getattr(self, '_epoch_fold', 0) + 1}: epochs (phase times in ms)")
        for col in ("epoch", "init", "experience", "training", "validation", "total", "loss", "|Q| max", "eps",
                    "val Sharpe", "val PnL (USD)"):
            t.add_column(col, justify="right")
        for e in sorted(getattr(self, "epochs", {})):
            g = self.epochs[e]
            ms = g.ms
            t.add_row(str(e + 1), f"{ms.get('init', 0):.0f}", f"{ms['experience']:.1f}", f"{ms['training']:.1f}",
                      f"{ms['validation']:.1f}", f"{ms['total']:.1f}", f"{g.loss:.4f}", f"{g.max_abs_q:.3g}",
                      f"{g.epsilon:.2f}", _fmt(g.val_sharpe, ".2f") + (" guard" if g.guard_tripped else ""),
                      f"{g.val_pnl_usd:,.0f}")
        return t

    def _render(self):
        head = " | ".join(f"{k}: {v}" for k, v in self.info.items())
        done = sum(1 for r in self.rows.values() if r[2] in ("done", "failed"))
        t = Table(expand=False, title=f"folds {done}/{self.n}  ({time.perf_counter() - self.t0:.1f} s)")
        for col in ("fold", "test range", "status", "net PnL (USD)", "Sharpe (ann.)", "trades", "time (s)"):
            t.add_column(col, justify="right" if col not in ("test range", "status") else "left")
        for k in sorted(self.rows):
            t.add_row(*self.rows[k])
        parts = [t] + ([self._epoch_table()] if getattr(self, "epochs", None) else [])
        return Panel(Group(*parts), title="workbench walk-forward", subtitle=head)

    def start(self, n_folds: int, info: dict) -> None:
        self.n, self.info = n_folds, info
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def fold_started(self, fold: int, ranges: dict) -> None:
        self.rows[fold] = [str(fold + 1), ranges.get("test", ""), "running", "", "", "", ""]
        self.live.update(self._render())

    def fold_finished(self, res: FoldResult, seconds: float) -> None:
        row = self.rows.setdefault(res.fold, [str(res.fold + 1), "", "", "", "", "", ""])
        if res.ok:
            m = res.metrics
            row[2:] = ["done", f"{m['net_pnl_usd']:,.0f}", _fmt(m["sharpe"], ".2f"), str(m["trades"]), f"{seconds:.2f}"]
        else:
            row[2:] = ["failed", "", "", "", f"{seconds:.2f}"]
        self.live.update(self._render())

    def finish(self, summary: dict) -> None:
        if self.live:
            self.live.update(self._render())
            self.live.stop()


def make_progress(mode: str = "auto"):
    """``auto``: live dashboard when stderr is a terminal; ``plain``; ``none``."""
    if mode == "none":
        return None
    if mode == "live" or (mode == "auto" and sys.stderr.isatty()):
        return LiveDashboard()
    return PlainProgress()
