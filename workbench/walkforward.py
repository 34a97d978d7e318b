"""``python -m workbench.walkforward DATA``: walk-forward backtest over the folds of a bar file.

Progress goes to stderr (a live dashboard on a terminal, plain lines otherwise); results go to
stdout: the folds table, the stitched out-of-sample metrics, and the run directory on the last line
(``--json`` prints one JSON document instead). Exit codes: 0 ok, 1 internal error, 2 usage,
65 bad data, 66 missing input, 78 bad config, 130 interrupted.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import metrics as M
from .config import describe, load_config
from .dashboard import make_progress, table_of
from .data import bars_for
from .agent.backend import start_backend
from .engine import ALL_STRATEGIES, WalkForward
from .executor import runs_in_process
from .resume import check_config
from .cli import Parser, add_data_args, add_executor_args, data_overrides, executor_from_args, print_notes, run_guarded
from .errors import UsageError
from .rundir import RunDir, dumps


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m workbench.walkforward", description=__doc__.split("\n")[0])
    p.add_argument("data", nargs="?", help="bars: parquet file or directory, CSV (.csv, .csv.gz), or Databento DBN "
                                           "(.dbn, .dbn.zst)")
    add_data_args(p)
    p.add_argument("--strategy", choices=ALL_STRATEGIES,
                   help="dqn (the agent, default) or a rule baseline: buy-and-hold, momentum")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), help="where the agent trains (default auto: GPU if present)")
    p.add_argument("--epochs", type=int, help="training epochs per fold (training.epochs)")
    p.add_argument("--max-steps-per-epoch", type=int, help="gradient updates per epoch (training.max_steps_per_epoch)")
    p.add_argument("--config", help="TOML run config (see --help-config for every key)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set splits.train=30000 (repeatable)")
    p.add_argument("--out", help="run directory (default runs/<time>-<strategy>)")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty run directory")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an interrupted run: finished folds are kept, the rest run (same config)")
    p.add_argument("--progress", choices=("auto", "live", "plain", "none"), default="auto",
                   help="progress on stderr: live dashboard, plain lines, or nothing (default auto)")
    add_executor_args(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and exit")
    p.add_argument("--debug", action="store_true", help="print tracebacks of internal errors")
    return p


def _print_results(result, console: Console) -> None:
    frame = result.to_frame()
    cols = ["fold", "test", "status", "net_pnl_usd", "sharpe", "sharpe 95%", "days", "max_drawdown", "trades",
            *(["epoch"] if "epoch" in frame.columns else []), "win_rate", "exposure"]
    priority = [0, 6, 0, 0, 0, 2, 1, 3, 4, *([2] if "epoch" in frame.columns else []), 5, 5]
    rows = []
    for row in frame.to_dict(orient="records"):
        row["sharpe 95%"] = (f"{row['sharpe_ci95_low']:.3g} .. {row['sharpe_ci95_high']:.3g}"
                             if row["sharpe_ci95_low"] == row["sharpe_ci95_low"] else "n/a")
        row["days"] = f"{row['days']}{'*' if row['few_days'] is True else ''}" if row["days"] == row["days"] else ""
        row["status"] = row["status"] if len(row["status"]) < 40 else row["status"][:37] + "..."  # the error: see its file
        rows.append([(f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c])) for c in cols])
    console.print(table_of(f"{result.strategy}: out-of-sample test ranges", cols, rows, console.width, priority,
                           caption=f"Sharpe: {M.ANNUALIZATION_NOTE}, 95% interval from the Mertens standard error; "
                                   f"* fewer than {M.MIN_DAYS} days. "
                                   f"{result.account.describe() if result.account else ''}"))
    m = result.metrics
    s = Table(title="stitched out-of-sample", show_header=True)
    s.add_column("metric")
    s.add_column("value", justify="right")
    for k, v in m.items():
        s.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    console.print(s)
    if result.baselines:
        who = "agent against the rule baselines" if result.strategy == "dqn" else f"{result.strategy} against the other rules"
        c = Table(title=f"stitched out-of-sample: {who} (same folds, same costs)", caption=M.ANNUALIZATION_NOTE)
        names = [result.strategy, *result.baselines]
        c.add_column("metric")
        for n in names:
            c.add_column(n, justify="right")
        rows = {result.strategy: m, **result.baselines}
        for key in ("net_pnl_usd", "sharpe", "sharpe_se", "days", "psr", "max_drawdown", "ruined", "trades",
                    "commission_usd", "slippage_usd"):
            c.add_row(key, *[(f"{v:.4g}" if isinstance(v, float) else str(v))
                             for v in (rows[n].get(key, float("nan")) for n in names)])
        console.print(c)
    from .agent.ensemble import SEED_KEYS

    seeds = result.seed_summary()
    if seeds:  # training.seeds > 1: the ensemble beside each seed traded alone over the same test ranges
        e = Table(title=f"{result.strategy} is the ensemble of {seeds['seeds']} seeds; each seed alone "
                        "(stitched out-of-sample, same folds, same costs)",
                  caption=f"ensemble: {seeds['ensemble_rule']}; its Sharpe beats {seeds['ensemble_sharpe_beats_seeds']} "
                          f"seeds. {M.ANNUALIZATION_NOTE}")
        e.add_column("")
        for key in (*SEED_KEYS, "days"):
            e.add_column(key, justify="right")
        fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
        e.add_row("ensemble", *[fmt(seeds["ensemble"].get(k)) for k in (*SEED_KEYS, "days")])
        for p in seeds["per_seed"]:
            e.add_row(f"seed {p['seed']}", *[fmt(p.get(k)) for k in (*SEED_KEYS, "days")])
        sp = seeds["seed_spread"]
        e.add_row("seeds: mean (sd)", *[f"{sp[f'{k}_mean']:.4g} ({sp[f'{k}_sd']:.3g})" for k in SEED_KEYS], "")
        console.print(e)


def run(args: argparse.Namespace) -> int:
    overrides = list(args.set) + data_overrides(args)
    if args.strategy:
        overrides.append(f'strategy.name="{args.strategy}"')
    if args.device:
        overrides.append(f'device="{args.device}"')
    for flag, key in ((args.epochs, "training.epochs"), (args.max_steps_per_epoch, "training.max_steps_per_epoch")):
        if flag is not None:
            overrides.append(f"{key}={flag}")
    if args.resume and not args.config:
        args.config = str(Path(args.resume) / "config.toml")  # the run's own resolved config
    if not args.data:
        raise UsageError("missing DATA argument", "e.g. python -m workbench.walkforward data/es_sample.parquet")
    if args.resume and args.out:
        raise UsageError("--resume continues the run in its own directory", "drop --out")
    run_dir = RunDir(args.resume, resume=True) if args.resume else None  # locked for this process's life
    try:
        return _run(args, overrides, run_dir)
    finally:
        if run_dir is not None:
            run_dir.close()


def _run(args, overrides: list[str], run_dir: RunDir | None) -> int:
    cfg = load_config(args.config, overrides)
    if run_dir is not None:  # resuming: the same config, checked before any data is read
        check_config((run_dir.path / "config.toml").read_text(), cfg, run_dir.path)
    if cfg.strategy.name == "dqn" and runs_in_process(args.workers, args.scheduler):
        start_backend(cfg.device)  # the GPU's context and libraries made while the bars are read and prepared
    wf = WalkForward(cfg)
    bars = bars_for(args.data, cfg)
    print_notes(bars.report.lines())  # before the features and folds, which may refuse short data
    prepared = wf.prepare(bars)
    print_notes(prepared.run_notes())  # the split sizes and the account
    made = None
    if run_dir is None:
        out = args.out or f"runs/{dt.datetime.now():%Y%m%d-%H%M%S}-{cfg.strategy.name}"
        run_dir = made = RunDir(out, force=args.force)  # locked until the finally below
    if run_dir.took_over:
        print_notes([("warning", f"took over the lock of PID {run_dir.took_over}, which is no longer running")])
    args.resume_hint = f"python -m workbench.walkforward {args.data} --resume {run_dir.path}"
    executor = executor_from_args(args, cfg.device)
    progress = make_progress(args.progress)
    try:
        result = wf.run(prepared, progress=progress, run_dir=run_dir, executor=executor)
    finally:
        if progress is not None:
            progress.close()  # a live dashboard restores the terminal before anything else is printed
        executor.close()
        if made is not None:
            made.close()
    if args.json:
        print(dumps({"run_dir": str(run_dir.path), "strategy": result.strategy, "account": prepared.account.describe(),
                     "annualization": M.ANNUALIZATION_NOTE, "stitched_oos": result.metrics,
                     **({"seeds": seeds} if (seeds := result.seed_summary()) else {}),
                     "folds": result.to_frame().to_dict(orient="records")}))
    else:
        console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 80)  # a pipe gets 80 columns
        _print_results(result, console)
        print(run_dir.path)
    ruined = [f.fold for f in result.fold_results if f.ok and f.metrics.get("ruined")]
    if ruined or result.metrics.get("ruined"):
        print(f"workbench: warning: RUINED: the account's equity reached the ruin level in fold(s) "
              f"{', '.join(map(str, ruined)) or '(stitched only)'}; {prepared.account.describe()}", file=sys.stderr)
    failed = [f for f in result.fold_results if not f.ok]
    if failed:
        print(f"workbench: warning: {len(failed)} fold(s) failed; see {run_dir.path}/fold_*_error.json", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.help_config:
        for key, default, doc in describe():
            print(f"{key} = {default!r}  # {doc}")
        return 0
    return run_guarded(run, args, "finished folds are kept in the run directory")


def console_main() -> None:
    raise SystemExit(main())


if __name__ == "__main__":
    raise SystemExit(main())
