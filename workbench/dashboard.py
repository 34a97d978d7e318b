"""Progress of a walk-forward run: a live ``rich`` dashboard on a terminal, plain lines on stderr
otherwise, and in a notebook an HTML table updated in place through an IPython display handle (no
ipywidgets needed).

All implement the same small interface (``start``, ``fold_started``, ``epoch``, ``fold_finished``,
``finish``, ``close``), which the engine calls; results never go to stderr (they are printed on stdout by
the CLI). ``close`` stops a live display (the cursor comes back) and is safe to call twice.

The live dashboard fits its terminal: columns are dropped by priority rather than cut to ``12…``
(:func:`fit_columns`, also used for the result tables on stdout), only the folds that fit the height
are listed with a count of the rest, and the title carries an ETA from the finished epochs and folds.
"""
from __future__ import annotations

import html
import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from .results import FoldResult


FOLD_COLUMNS = ("fold", "test range", "status", "net PnL (USD)", "Sharpe (ann., days)", "trades", "epoch", "time (s)")
FOLD_PRIORITY = (0, 6, 0, 1, 1, 4, 2, 5)  # lower stays longer when the terminal is narrow
EPOCH_COLUMNS = ("epoch", "init", "experience", "training", "validation", "total", "loss", "|Q| max", "eps",
                 "val t (bars)", "val Sharpe (days)", "val PnL (USD)")
EPOCH_PRIORITY = (0, 5, 2, 1, 2, 1, 4, 7, 6, 2, 3, 5)  # the phase times first: they are what this table is for


def fit_columns(columns, rows, width: int, priority=None) -> list[int]:
    """Indices of the columns to show so that a table of ``rows`` fits ``width`` characters: columns are
    dropped from the highest ``priority`` number down (ties: the rightmost first), never cut."""
    priority = priority or tuple(range(len(columns)))
    need = [max([len(str(c))] + [len(str(r[i])) for r in rows]) + 3 for i, c in enumerate(columns)]  # padding, rule
    keep = list(range(len(columns)))
    while len(keep) > 1 and sum(need[i] for i in keep) + 1 > width:
        keep.remove(max(keep, key=lambda i: (priority[i], i)))
    return keep


def table_of(title: str, columns, rows, width: int, priority=None, caption: str | None = None) -> Table:
    """A rich table that fits ``width``: the columns that fit, numbers whole."""
    keep = fit_columns(columns, rows, width, priority)
    t = Table(title=title, caption=caption)
    for i in keep:
        t.add_column(str(columns[i]), justify="left" if columns[i] in ("test range", "status", "test") else "right",
                     no_wrap=True)
    for r in rows:
        t.add_row(*[str(r[i]) for i in keep])
    return t


def _fit_items(info: dict, width: int) -> str:
    """``key: value | ...`` with whole items only, as many as fit ``width``."""
    out = ""
    for k, v in info.items():
        item = f"{k}: {v}"
        if len(out) + len(item) + 3 > width:
            break
        out = f"{out} | {item}" if out else item
    return out


def duration_text(seconds: float) -> str:
    s = int(max(seconds, 0) + 0.5)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Eta:
    """Time left from the work done: epochs when the agent trains (folds x epochs units), else folds."""

    def __init__(self):
        self.t0, self.n_folds, self.n_epochs, self.epochs_done, self.folds_done = time.perf_counter(), 0, 0, 0, 0

    def start(self, n_folds: int) -> None:
        self.t0, self.n_folds = time.perf_counter(), n_folds

    def epoch(self, n_epochs: int) -> None:
        self.n_epochs = n_epochs
        self.epochs_done += 1

    def fold(self) -> None:
        self.folds_done += 1
        if self.n_epochs:  # a fold's epochs all count as done once it finishes (a resumed fold had none)
            self.epochs_done = max(self.epochs_done, self.folds_done * self.n_epochs)

    def text(self) -> str:
        elapsed = time.perf_counter() - self.t0
        total, done = ((self.n_folds * self.n_epochs, self.epochs_done) if self.n_epochs
                       else (self.n_folds, self.folds_done))
        if not done or done >= total:
            return f"{duration_text(elapsed)} elapsed"
        return f"{duration_text(elapsed)} elapsed, ETA {duration_text(elapsed / done * (total - done))}"


def _fmt(v, spec: str) -> str:
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def epoch_line(log, n_epochs: int) -> str:
    """``epoch k/E: init=... experience=... training=... validation=... total=... ms`` plus learning figures."""
    ms = log.ms
    return (f"epoch {log.epoch}/{n_epochs}: init={ms.get('init', 0.0):.1f} experience={ms['experience']:.1f} "
            f"training={ms['training']:.1f} validation={ms['validation']:.1f} total={ms['total']:.1f} ms | "
            f"updates={log.updates} loss={log.loss:.4f} |Q|max={log.max_abs_q:.3g} eps={log.epsilon:.2f} "
            f"val_t={log.val_bar_t:.2f} val_sharpe={log.val_sharpe:.2f} val_pnl_usd={log.val_pnl_usd:.0f}"
            + (" | init: " + " ".join(f"{k}={v:.0f}" for k, v in ms["init_breakdown_ms"].items()) + " ms"
               if "init_breakdown_ms" in ms else "")
            + (" GUARD TRIPPED: weights restored" if log.guard_tripped else ""))


class PlainProgress:
    """One line per event on stderr, for logs and pipes."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.n = 0
        self.eta = Eta()

    def close(self) -> None:
        pass

    def _say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {text}", file=self.stream, flush=True)

    def start(self, n_folds: int, info: dict) -> None:
        self.n = n_folds
        self.eta.start(n_folds)
        self._say(" ".join(f"{k}={v}" for k, v in info.items()) + f" folds={n_folds}")

    def fold_started(self, fold: int, ranges: dict) -> None:
        self._say(f"fold {fold + 1}/{self.n} started: test {ranges.get('test', '')}")

    def fold_finished(self, res: FoldResult, seconds: float) -> None:
        self.eta.fold()
        if not res.ok:
            self._say(f"fold {res.fold}/{self.n} FAILED: {res.error}")
            return
        m = res.metrics
        chosen = (f" chosen epoch {m['best_epoch']} by {m['selected_by']} {_fmt(m.get('best_val_score'), '.2f')}"
                  if "best_epoch" in m else "")
        if "seed_best_epochs" in m:  # a seed ensemble
            chosen = (f" ensemble of {m['seeds']} seeds (epochs {'/'.join(map(str, m['seed_best_epochs']))} by "
                      f"{m['selected_by']}); seeds alone: sharpe mean {_fmt(m['seed_sharpe_mean'], '.2f')} "
                      f"sd {_fmt(m['seed_sharpe_sd'], '.2f')}")
        self._say(f"fold {res.fold}/{self.n} done in {seconds:.2f}s: net_pnl_usd={m['net_pnl_usd']:.2f} "
                  f"sharpe={_fmt(m['sharpe'], '.2f')} ({m['days']} days{', FEW' if m.get('few_days') else ''}) "
                  f"trades={m['trades']}{' RUINED' if m.get('ruined') else ''}{chosen} | {self.eta.text()}")

    def epoch(self, fold: int, log, n_epochs: int) -> None:
        self.eta.epoch(n_epochs)
        self._say(f"fold {fold + 1}/{self.n} " + epoch_line(log, n_epochs) + f" | {self.eta.text()}")

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
        self.eta.epoch(n_epochs)
        self.epochs = getattr(self, "epochs", {})
        if getattr(self, "_epoch_fold", None) != fold:
            self.epochs, self._epoch_fold = {}, fold
        self.epochs[log.epoch] = log
        self._n_epochs = n_epochs
        if fold in self.rows:
            self.rows[fold][2] = f"epoch {log.epoch}/{n_epochs}"
        self._refresh()

    def _epoch_rows(self) -> list[list[str]]:
        rows = []
        for e in sorted(getattr(self, "epochs", {})):
            g = self.epochs[e]
            ms = g.ms
            rows.append([str(e), f"{ms.get('init', 0):.0f}", f"{ms['experience']:.1f}", f"{ms['training']:.1f}",
                         f"{ms['validation']:.1f}", f"{ms['total']:.1f}", f"{g.loss:.4f}", f"{g.max_abs_q:.3g}",
                         f"{g.epsilon:.2f}", _fmt(g.val_bar_t, ".2f") + (" guard" if g.guard_tripped else ""),
                         _fmt(g.val_sharpe, ".2f"),
                         f"{g.val_pnl_usd:,.0f}"])
        return rows

    def _epoch_title(self) -> str:
        return f"fold {getattr(self, '_epoch_fold', 0) + 1}: epochs (phase times in ms)"

    def _epoch_table(self, width: int, max_rows: int):
        rows = self._epoch_rows()[-max(max_rows, 1):]
        return table_of(self._epoch_title(), EPOCH_COLUMNS, rows, width, EPOCH_PRIORITY)

    def _visible_folds(self, max_rows: int) -> tuple[list[list[str]], str]:
        """The fold rows that fit: running ones and the latest finished, with a count of the rest."""
        keys = sorted(self.rows)
        if len(keys) <= max_rows:
            return [self.rows[k] for k in keys], ""
        running = [k for k in keys if self.rows[k][2] not in ("done", "failed", "RUINED")]
        shown = sorted(set(running[-max_rows:]) | set(keys[-max(max_rows - len(running), 0):]))[-max_rows:]
        hidden = [k for k in keys if k not in shown]
        done_hidden = sum(1 for k in hidden if self.rows[k][2] != "running")
        return [self.rows[k] for k in shown], f"{len(hidden)} more folds not shown ({done_hidden} finished)"

    def _render(self):
        width = max(40, self.console.size.width - 4)  # inside the panel's border
        height = self.console.size.height
        done = sum(1 for r in self.rows.values() if r[2] in ("done", "failed", "RUINED"))
        epochs = bool(getattr(self, "epochs", None))
        fold_room = max(3, (height - 8) // (2 if epochs else 1) - 4)
        rows, more = self._visible_folds(fold_room)
        t = table_of(f"folds {done}/{self.n} - {self.eta.text()}", FOLD_COLUMNS, rows, width, FOLD_PRIORITY,
                     caption=more or None)
        parts = [t] + ([self._epoch_table(width, max(3, height - fold_room - 14))] if epochs else [])
        return Panel(Group(*parts), title="workbench walk-forward", subtitle=_fit_items(self.info, width - 10))

    def start(self, n_folds: int, info: dict) -> None:
        self.n, self.info = n_folds, info
        self.eta.start(n_folds)
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def fold_started(self, fold: int, ranges: dict) -> None:
        self.rows[fold] = [str(fold + 1), ranges.get("test", ""), "running", "", "", "", "", ""]
        self._refresh()

    def fold_finished(self, res: FoldResult, seconds: float) -> None:
        self.eta.fold()
        row = self.rows.setdefault(res.fold - 1, [str(res.fold), "", "", "", "", "", "", ""])
        if res.ok:
            m = res.metrics
            sharpe = _fmt(m["sharpe"], ".2f") + f" ({m['days']} d{', few' if m.get('few_days') else ''})"
            row[2:] = ["RUINED" if m.get("ruined") else "done", f"{m['net_pnl_usd']:,.0f}", sharpe,
                       str(m["trades"]), str(m.get("best_epoch", "/".join(map(str, m.get("seed_best_epochs", ()))))),
                       f"{seconds:.2f}"]
        else:
            row[2:] = ["failed", "", "", "", "", f"{seconds:.2f}"]
        self._refresh()

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def finish(self, summary: dict) -> None:
        if self.live:
            self._refresh()
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()  # shows the cursor again
            self.live = None


def in_notebook() -> bool:
    """True inside a Jupyter (ZMQ) kernel, where a display handle can be updated in place."""
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class NotebookProgress(LiveDashboard):
    """The dashboard's folds and epoch tables as HTML in one notebook output, updated in place.

    Updates are throttled to ``min_interval`` seconds (each one is a message to the front end), except
    fold events and the end of the run, which always show."""

    def __init__(self, min_interval: float = 0.5):
        super().__init__()  # the folds/epochs state; its console and Live stay unused here
        self.min_interval, self._last = min_interval, 0.0
        self.handle = None
        self.summary: dict | None = None

    def start(self, n_folds: int, info: dict) -> None:
        from IPython.display import HTML, display

        self.n, self.info = n_folds, info
        self.eta.start(n_folds)
        self.handle = display(HTML(self._html()), display_id=True)

    def _refresh(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.handle is None or (not force and now - self._last < self.min_interval):
            return
        from IPython.display import HTML

        self._last = now
        self.handle.update(HTML(self._html()))

    def fold_started(self, fold: int, ranges: dict) -> None:
        super().fold_started(fold, ranges)
        self._refresh(force=True)

    def fold_finished(self, res: FoldResult, seconds: float) -> None:
        super().fold_finished(res, seconds)
        self._refresh(force=True)

    def finish(self, summary: dict) -> None:
        self.summary = summary
        self._refresh(force=True)

    def _html(self) -> str:
        def table(title, cols, rows):
            head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>" for r in rows)
            return f"<b>{html.escape(title)}</b><table><tr>{head}</tr>{body}</table>"

        done = sum(1 for r in self.rows.values() if r[2] in ("done", "failed", "RUINED"))
        state = "finished" if self.summary is not None else "running"
        parts = [f"<div><b>workbench walk-forward ({state})</b> - "
                 + html.escape(" | ".join(f"{k}: {v}" for k, v in self.info.items())) + "<br>",
                 table(f"folds {done}/{self.n} ({self.eta.text()})",
                       FOLD_COLUMNS, [self.rows[k] for k in sorted(self.rows)])]
        if getattr(self, "epochs", None):
            parts.append(table(self._epoch_title(), EPOCH_COLUMNS, self._epoch_rows()))
        return "".join(parts) + "</div>"


def make_progress(mode: str = "auto"):
    """``auto``: live dashboard when stderr is a terminal, plain lines otherwise; ``live``; ``plain``;
    ``notebook`` (HTML updated in place); ``none``."""
    if mode == "none":
        return None
    if mode == "notebook":
        return NotebookProgress()
    if mode == "live" or (mode == "auto" and sys.stderr.isatty()):
        return LiveDashboard()
    return PlainProgress()


def resolve_progress(progress):
    """The Python API's ``progress=`` argument: a progress object, ``None`` (silent), or a mode name;
    ``"auto"`` there means the notebook table inside a Jupyter kernel and silence elsewhere (scripts and
    tests call the API; the CLIs choose their own)."""
    if progress is None or not isinstance(progress, str):
        return progress
    if progress == "auto":
        return NotebookProgress() if in_notebook() else None
    if progress not in ("live", "plain", "notebook", "none"):
        raise ValueError(f"progress must be a progress object, None or one of auto/live/plain/notebook/none, "
                         f"got {progress!r}")
    return make_progress(progress)
