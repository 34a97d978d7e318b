"""``python -m workbench.hyperopt DATA --trials N``: particle-swarm search over config/training/dqn-hyperopt.toml.

Each trial trains the agent on the scored folds and is scored by its mean validation Sharpe (test
ranges are never used by the search). Progress on stderr; results on stdout: the best trial, the
path of ``best.toml`` (accepted by ``workbench.walkforward --config``) and the run directory.
After the search, the best configuration runs once over every fold's test range: its stitched
out-of-sample result and its deflated Sharpe (given the number of trials) go into summary.json.
Exit codes as in workbench.walkforward.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from .. import metrics as M
from ..config import load_config, parse_override, to_toml
from ..agent.backend import start_backend
from ..data import bars_for
from ..executor import runs_in_process
from cuda_kernels.nb import gpu_available

from ..cli import Parser, add_data_args, add_executor_args, data_overrides, executor_from_args, print_notes, run_guarded
from ..engine import WalkForward
from ..errors import UsageError
from ..resume import check_config
from ..rundir import RunDir
from ..dashboard import duration_text, table_of
from .bounds import TRAINING_KEYS, HyperoptProfile
from .search import Search, candidate_config


class TrialProgress:
    """A trial table updated in place on a terminal (with the running trial's epochs), plain lines otherwise;
    both with an ETA from the finished trials."""

    def __init__(self, total: int, live: bool, already: int = 0):
        self.total, self.t0, self.rows, self.already = total, time.perf_counter(), [], already
        self.current = ""
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=4) if live else None
        if self.live:
            self.live.start()

    def _eta(self) -> str:
        done, now = len(self.rows), time.perf_counter()
        elapsed = now - self.t0
        left = self.total - self.already - done
        if not done or left <= 0:
            return f"{duration_text(elapsed)} elapsed"
        per_trial = (self.t_last - self.t0) / done  # the running trial's time so far counts against it
        return f"{duration_text(elapsed)} elapsed, ETA {duration_text(per_trial * left - (now - self.t_last))}"

    def epoch(self, trial: int, fold: int, n_folds: int, log, n_epochs: int) -> None:
        """An epoch of the running trial (in-process trials only; workers report whole trials)."""
        self.current = (f"trial {trial}/{self.total}, fold {fold}/{n_folds}, epoch {log.epoch}/{n_epochs}: "
                        f"val t {log.val_bar_t:.2f}, val Sharpe {log.val_sharpe:.2f}, loss {log.loss:.4f}")
        if self.live:
            self._draw()
        else:
            print(f"[{time.perf_counter() - self.t0:7.1f}s] {self.current} | {self._eta()}", file=sys.stderr, flush=True)

    def _draw(self) -> None:
        best = max((r for r in self.rows if r["mean_val_sharpe"] == r["mean_val_sharpe"]),
                   key=lambda r: r["mean_val_sharpe"], default=None)
        b = f"{best['mean_val_sharpe']:.3f} (trial {best['trial']})" if best else "none yet"
        cols = ("trial", "iteration", "particle", "mean val Sharpe", "status", "time (s)")
        rows = [[str(r["trial"]), str(r["iteration"]), str(r["particle"]), f"{r['mean_val_sharpe']:.3f}",
                 r["status"][:30], f"{r['seconds']:.1f}"] for r in self.rows[-12:]]
        t = table_of(f"hyperopt: {self.already + len(self.rows)}/{self.total} trials, best {b}; {self._eta()}", cols,
                     rows, self.console.size.width, (0, 3, 3, 0, 1, 2), caption=self.current or None)
        self.live.update(t)

    def trial(self, row: dict, best: dict | None) -> None:
        self.rows.append(row)
        self.t_last = time.perf_counter()
        self.current = ""
        if self.live:
            self._draw()
        else:
            b = f"{best['mean_val_sharpe']:.3f} (trial {best['trial']})" if best else "none yet"
            print(f"[{time.perf_counter() - self.t0:7.1f}s] trial {row['trial']}/{self.total} (iteration "
                  f"{row['iteration']}, particle {row['particle']}): mean_val_sharpe={row['mean_val_sharpe']:.3f} "
                  f"{row['status']} in {row['seconds']:.1f}s | best {b} | {self._eta()}", file=sys.stderr, flush=True)

    def stop(self):
        if self.live:
            self.live.stop()
            self.live = None


# Fixed on the CPU backend unless --set: two epochs of 50 updates on the CPU profile's sizes (0) per fold.
CPU_BUDGET = {"epochs": 2, "max_steps_per_epoch": 50, "rollout_steps": 16, "learning_starts": 256,
              "hidden": 0, "atoms": 0, "batch": 0, "n_envs": 0}


def build_parser():
    p = Parser(prog="python -m workbench.hyperopt", description=__doc__.split("\n")[0])
    p.add_argument("data", help="bars: parquet file or directory, CSV, or Databento DBN")
    add_data_args(p)
    p.add_argument("--trials", type=int, required=True, help="trials to run in total (a resumed search counts old ones)")
    p.add_argument("--bounds", help="bounds TOML (default config/training/dqn-hyperopt.toml)")
    p.add_argument("--config", help="base run config TOML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a base config key")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), help="where trials train (default auto)")
    p.add_argument("--out", help="search directory (default runs/<time>-hyperopt)")
    p.add_argument("--resume", metavar="DIR", help="continue a search from its trial log")
    p.add_argument("--no-test", action="store_true", help="skip the final out-of-sample run of the best configuration")
    p.add_argument("--progress", choices=("auto", "live", "plain"), default="auto")
    add_executor_args(p)
    p.add_argument("--debug", action="store_true", help="print tracebacks of internal errors")
    return p


def run(args) -> int:
    if args.trials < 1:
        raise UsageError("--trials must be >= 1")
    overrides = list(args.set) + data_overrides(args) + ([f'device="{args.device}"'] if args.device else [])
    base = load_config(args.config, overrides)
    base = dataclasses.replace(base, strategy=dataclasses.replace(base.strategy, name="dqn"))
    if runs_in_process(args.workers, args.scheduler):
        start_backend(base.device)  # the GPU's context and libraries made while the bars are read and prepared
    profile = HyperoptProfile(args.bounds)
    set_keys = [parse_override(s)[0] for s in args.set]
    user_fixed = {k[1] for k in set_keys if len(k) == 2 and k[0] in ("training", "gpu")}
    if not gpu_available() or base.device == "cpu":
        budget = {k: v for k, v in CPU_BUDGET.items() if k not in user_fixed and k in profile.names}
        if budget:  # the CPU backend: a budget that finishes a smoke search in minutes, said so
            base = candidate_config(base, budget)  # applied as a trial's values would be
            profile.fix(budget)
            print_notes([("search", "no GPU: CPU budget, these are fixed and not searched: "
                                    + ", ".join(f"{k}={v or 'cpu profile'}" for k, v in budget.items())
                                    + " (--set any of them to choose it)")])
    fixed = profile.fix(user_fixed)
    if fixed:  # a --set of a searched key fixes it: applied as given, never overridden by the swarm
        values = [f"{k} = {getattr(base.training if k in TRAINING_KEYS else base.gpu, k)}" for k in fixed]
        print_notes([("search", f"fixed by --set, not searched: {', '.join(values)}; "
                                f"{len(profile.names)} parameters searched")])
    out = Path(args.resume or args.out or f"runs/{dt.datetime.now():%Y%m%d-%H%M%S}-hyperopt")
    bars = bars_for(args.data, base)
    print_notes(bars.report.lines())
    run_dir = RunDir(out, resume=bool(args.resume), kind="hyperopt")  # locked for this process's life
    try:
        if args.resume:
            check_config((out / "base_config.toml").read_text(), base, out)
        else:
            run_dir.write_text("base_config.toml", to_toml(base))
            run_dir.write_text("bounds.toml", profile.path.read_text())
        args.resume_hint = f"python -m workbench.hyperopt {args.data} --trials {args.trials} --resume {out}"
        live = args.progress == "live" or (args.progress == "auto" and sys.stderr.isatty())
        executor = executor_from_args(args, base.device)
        try:
            return _search(args, base, profile, bars, out, run_dir, live, executor)
        finally:
            executor.close()
    finally:
        run_dir.close()


def _search(args, base, profile, bars, out, run_dir, live, executor) -> int:
    search = Search(base, profile, bars, out, None, executor)
    print_notes([("splits", search.folds.attrs.get("sizing", ""))])
    kept = search.resume() if args.resume else 0
    if kept:
        print(f"workbench: resumed {out} with {kept} finished trials", file=sys.stderr)
    progress = search.progress = TrialProgress(args.trials, live, already=kept)
    try:
        log = search.run(args.trials)
    finally:
        progress.stop()
    best_values = search.best_values()
    best_cfg = candidate_config(base, best_values)
    run_dir.write_text("best.toml", to_toml(best_cfg))
    best = search.best_row()
    over = search.overfitting()
    summary = {"trials": len(log), "best_trial": int(best["trial"]), "best_mean_val_sharpe": best["mean_val_sharpe"],
               "best_values": best_values, "scored_folds": list(search.score_folds),
               "annualization": M.ANNUALIZATION_NOTE, "overfitting": over}
    pbo = over["pbo"].get("pbo", float("nan"))
    print(f"workbench: search: probability of backtest overfitting {pbo:.2f} (CSCV over {over['trials_finished']} "
          f"trials' hourly validation PnL); deflated Sharpe counts {over['trials_started']} trials started",
          file=sys.stderr)
    if not args.no_test:
        print("workbench: search: the best configuration now runs once over every test range (out of sample)",
              file=sys.stderr)
        res = WalkForward(best_cfg).run(bars, progress=None, executor=executor)
        summary["out_of_sample_test"] = {
            "label": "out-of-sample: test ranges never seen by the search, best configuration retrained per fold",
            "metrics": res.metrics, "baselines": res.baselines,
            "deflated_sharpe": res.deflated_sharpe(over["trials_started"], over["sr_variance_per_day"]),
            "trials_counted": over["trials_started"]}
    run_dir.write_json("summary.json", summary)
    print(f"best trial {best['trial']}: mean validation Sharpe {best['mean_val_sharpe']:.3f} ({M.ANNUALIZATION_NOTE})")
    if "out_of_sample_test" in summary:
        o = summary["out_of_sample_test"]
        print(f"out-of-sample test ranges (never seen by the search): Sharpe {o['metrics']['sharpe']:.3f}, "
              f"net PnL {o['metrics']['net_pnl_usd']:.0f} USD, deflated Sharpe {o['deflated_sharpe']:.3f} "
              f"over {o['trials_counted']} trials")
    print(out / "best.toml")
    print(out)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_guarded(run, args, "finished trials are kept in the trial log (--resume DIR)")


if __name__ == "__main__":
    raise SystemExit(main())
