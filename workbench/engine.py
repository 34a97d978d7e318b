"""The walk-forward engine: bars -> features -> folds -> per-fold test backtest -> stitched result.

``WalkForward(config).run(bars)`` is the notebook API; the CLI (``workbench.walkforward``) wraps it.
A fold that fails is recorded with its error chain and the run goes on to the next one.
"""
from __future__ import annotations

import dataclasses
import json
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import metrics as M
from .account import Account, account_for
from .accounting import simulate
from .agent.backend import make_backend
from .agent.ensemble import finish_fold
from .agent.gemm import BATCH_MIN_AGENTS
from .agent.fold import run_dqn_fold
from .agent.population import side_by_side, train_folds
from .background import Deferred
from .baselines import STRATEGIES, baseline_targets
from .config import RunConfig, to_toml
from .dashboard import resolve_progress
from .data import Bars, bars_for
from .errors import ConfigError, WorkbenchError
from .executor import InlineExecutor, WorkerLost, resolve
from .features import Features, build_features
from .markets import MarketSpec
from .results import FoldResult, WalkForwardResult
from .resume import check_config, check_fingerprint, fingerprint
from .rundir import RunDir
from .splits import walk_forward_splits

ALL_STRATEGIES = ("dqn", *STRATEGIES)


class Prepared(NamedTuple):
    """What every fold shares: the bars, their market, the features, the folds and the account."""

    bars: Bars
    spec: MarketSpec
    feats: Features
    folds: "object"  # pandas DataFrame of the folds (workbench.splits)
    account: Account

    def notes(self) -> list[tuple[str, str]]:
        """(level, line) for stderr: what was read, the market and why, one line per kind of warning, the
        split sizes and the account."""
        return [*self.bars.report.lines(), *self.run_notes()]

    def run_notes(self) -> list[tuple[str, str]]:
        """The lines of what preparing added to the bars' own: the split sizes and the account."""
        return [("splits", self.folds.attrs.get("sizing", f"{len(self.folds)} folds")),
                ("account", self.account.describe())]


def _range_text(folds, k: int, part: str) -> str:
    a, b = folds.loc[k, f"{part}_first"], folds.loc[k, f"{part}_last"]
    return f"{a:%Y-%m-%d %H:%M} .. {b:%Y-%m-%d %H:%M}"


def _error_chain(exc: BaseException) -> str:
    parts, e = [], exc
    while e is not None:
        parts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)


def _failed(cfg, bars, k: int, ranges: dict, exc: BaseException, tb: str = "") -> FoldResult:
    return FoldResult(k + 1, cfg.strategy.name, bars.frame.iloc[:0], bars.frame.iloc[:0], {}, ranges,
                      error=_error_chain(exc), traceback=tb)


def fold_result(cfg, k: int, prep: Prepared, backend, ranges: dict, on_epoch=None) -> FoldResult:
    """One fold's test-range result; a fold that fails is returned with its error chain, not raised."""
    try:
        if cfg.strategy.name == "dqn":
            return run_dqn_fold(k, prep, cfg, backend, ranges, on_epoch)
        return rule_fold(cfg, k, prep, ranges)
    except (WorkbenchError, ValueError, ArithmeticError, IndexError) as exc:
        return _failed(cfg, prep.bars, k, ranges, exc, traceback.format_exc())


def rule_fold(cfg, k: int, prep: Prepared, ranges: dict) -> FoldResult:
    """A rule baseline's test range of fold ``k``, on the run's account."""
    bars, folds, acct = prep.bars, prep.folds, prep.account
    a, b = int(folds.loc[k, "test_start"]), int(folds.loc[k, "test_stop"])
    target = baseline_targets(cfg.strategy.name, prep.feats, a, b, cfg.backtest.contracts, cfg.strategy)
    test = bars.slice(a, b)
    sim = simulate(target, test, prep.spec, capital=acct.capital, ruin_level=acct.ruin_level)
    m = M.summarize(sim.pnl, sim.index, sim.position, sim.trades, prep.spec, acct.capital, sim.commission,
                    sim.slippage, sim.ruined_bar)
    if not np.isfinite(m["net_pnl_usd"]):
        raise ArithmeticError(f"fold {k}: non-finite PnL")
    return FoldResult(k + 1, cfg.strategy.name, sim.frame(), sim.trades, m, ranges)


_WORKER_CACHE: dict = {}


def worker_context(cfg: RunConfig, bars) -> tuple[Prepared, object]:
    """In a worker process: (prepared, backend) for ``cfg``, built once per process and config and reused
    by every job it runs. ``bars`` may be a :class:`workbench.executor.Shared`."""
    bars = resolve(bars)
    key = (id(bars), repr(cfg.data), repr(cfg.market), repr(cfg.features), repr(cfg.splits), repr(cfg.backtest),
           cfg.strategy.name, cfg.training.max_position)
    if _WORKER_CACHE.get("prep_key") != key:
        _WORKER_CACHE["prep_key"], _WORKER_CACHE["prep"] = key, WalkForward(cfg).prepare(bars)
        _WORKER_CACHE["bars"] = bars  # keeps id(bars) from being reused while cached
    backend = None
    if cfg.strategy.name == "dqn":
        if _WORKER_CACHE.get("device") != cfg.device:
            _WORKER_CACHE["device"], _WORKER_CACHE["backend"] = cfg.device, make_backend(cfg.device)
        backend = _WORKER_CACHE["backend"]
    return _WORKER_CACHE["prep"], backend


def run_fold_job(cfg: RunConfig, bars, k: int, ranges: dict) -> FoldResult:
    """Fold ``k`` in a worker process (see :mod:`workbench.executor`)."""
    prep, backend = worker_context(cfg, bars)
    return fold_result(cfg, k, prep, backend, ranges)


def run_folds_job(cfg: RunConfig, bars, ks: list[int], ranges: dict) -> tuple[list[FoldResult], dict]:
    """Folds ``ks`` in a worker process that holds one GPU (see :mod:`workbench.executor`): trained side
    by side as populations where its backend allows, as in one process (each fold's result is the one it
    gets alone), else one after another. Returns (their results in the order of ``ks``, the population
    plan or ``{}``)."""
    prep, backend = worker_context(cfg, bars)
    if cfg.strategy.name == "dqn" and side_by_side(backend, cfg.gpu, True, len(ks) * cfg.training.seeds):
        out: dict[int, FoldResult] = {}
        plan: dict = {}
        WalkForward(cfg)._run_populations(ks, prep, backend, ranges, None, {}, out.__setitem__, plan)
        return [out[k] for k in ks], plan
    return [fold_result(cfg, k, prep, backend, ranges[k]) for k in ks], {}


class WalkForward:
    """Walk-forward evaluation of one strategy under one :class:`~workbench.config.RunConfig`.

    ``strategy.name = "dqn"`` (the default) trains the agent per fold on the GPU (or the CPU reference
    backend), picks the epoch by validation Sharpe and backtests the test range; the rule baselines
    run on the same folds for comparison (``result.baselines``)."""

    def __init__(self, config: RunConfig = RunConfig()):
        self.config = config

    def run(self, bars: Bars | str | Path, progress="auto", run_dir: RunDir | None = None,
            executor=None) -> WalkForwardResult:
        """Run every fold and return the :class:`WalkForwardResult`.

        Parameters
        ----------
        bars : Bars, a path that :func:`workbench.data.load_bars` reads (validated on load), or what
            :meth:`prepare` returned.
        progress : ``"auto"`` (default: a table updated in place inside a Jupyter kernel, silent
            elsewhere), ``"notebook"``, ``"live"``, ``"plain"``, ``"none"``/``None``, or an object with the
            dashboard interface (``workbench.dashboard``).
        run_dir : a :class:`workbench.rundir.RunDir` to write every fold to (atomically) and resume from.
        executor : where the folds run (``workbench.executor``): in this process (default), one spawned
            process per GPU, or a Dask cluster. Each finished fold is written as it arrives; the result is
            the same whichever worker ran which fold.
        """
        cfg = self.config
        progress = resolve_progress(progress)
        executor = executor or InlineExecutor()
        if cfg.strategy.name not in ALL_STRATEGIES:
            raise ConfigError(f"unknown strategy '{cfg.strategy.name}'", f"choose one of: {', '.join(ALL_STRATEGIES)}")
        agent = cfg.strategy.name == "dqn"
        here = executor.live_progress  # folds run in this process (else in workers, which build their own)
        backend = make_backend(cfg.device) if agent and here else None
        prep = self.prepare(bars)
        bars, spec, feats, folds, acct = prep
        if run_dir is not None and run_dir.resume:
            check_config((run_dir.path / "config.toml").read_text(), cfg, run_dir.path)
            saved = run_dir.path / "fingerprint.json"
            check_fingerprint(json.loads(saved.read_text()) if saved.is_file() else {}, fingerprint(prep), run_dir.path)
        elif run_dir is not None:
            run_dir.write_text("config.toml", to_toml(cfg))
            run_dir.write_json("fingerprint.json", fingerprint(prep))
            run_dir.write_json("data_report.json", bars.report.to_dict())
            run_dir.write_parquet("folds.parquet", folds)
            run_dir.write_json("folds.json", folds.to_dict(orient="records"))
        where = backend.describe(cfg.gpu) if backend is not None else executor.describe() if agent and not here else None
        if progress:
            info = {"data": Path(bars.source).name if bars.source else "bars", "market": spec.name,
                    "strategy": cfg.strategy.name, "bars": len(bars)}
            if where:
                info["backend"] = where
            progress.start(len(folds), info)
        ranges = {k: {p: _range_text(folds, k, p) for p in ("train", "val", "test")} for k in range(len(folds))}
        by_fold: dict[int, FoldResult] = {}
        todo = []
        for k in range(len(folds)):
            done = run_dir.finished_fold(k) if run_dir is not None and run_dir.resume else None
            if done is None:
                todo.append(k)
                continue
            by_fold[k] = done  # finished by an earlier run: kept as it is
            if progress:
                progress.fold_started(k, ranges[k])
                progress.fold_finished(done, 0.0)
        started: dict[int, float] = {}

        def on_start(i: int) -> None:
            started[todo[i]] = time.perf_counter()
            if progress:
                progress.fold_started(todo[i], ranges[todo[i]])

        def finished(k: int, res: FoldResult) -> None:
            by_fold[k] = res
            self._record(run_dir, res, ranges[k], agent)
            if progress:
                progress.fold_finished(res, time.perf_counter() - started.get(k, time.perf_counter()))

        plan: dict = {}
        others = [n for n in STRATEGIES if n != cfg.strategy.name]  # the rule baselines reported beside the run
        # the baselines need only the data: where populations train, the CPU computes them on a thread once the
        # GPU is busy (from the first epoch's end: before it the host's own work, preparing, allocating and
        # capturing, would share the interpreter with them), and their first simulate() pays the CPU
        # accounting's one-off load before any fold's backtest; elsewhere after the folds, in this thread
        baselines = Deferred(lambda: self._baselines(others, prep), "workbench-baselines")
        if agent and side_by_side(backend, cfg.gpu, here, len(todo) * cfg.training.seeds):
            self._run_populations(todo, prep, backend, ranges, progress, started, finished, plan, busy=baselines.start)
            todo = []  # every fold done, in populations
        if agent and not here and getattr(executor, "gpu_workers", False) and len(todo) > 1:
            self._run_on_gpu_workers(todo, executor, bars, ranges, progress, started, finished, plan)
            todo = []  # every fold done, a share per worker
        if here:
            def job(k):
                # a fold's seeds train one after another here: their epochs count on (run_dqn_fold)
                on_epoch = ((lambda log: progress.epoch(k, log, cfg.training.epochs * cfg.training.seeds))
                            if progress and agent else None)
                return fold_result(cfg, k, prep, backend, ranges[k], on_epoch)
            fn, jobs = job, [(k,) for k in todo]
        else:
            shared = executor.share(bars)
            fn, jobs = run_fold_job, [(cfg, shared, k, ranges[k]) for k in todo]
        for i, res in executor.imap_unordered(fn, jobs, on_start=on_start):
            k = todo[i]
            if isinstance(res, WorkerLost):
                res = _failed(cfg, bars, k, ranges[k], res)
            finished(k, res)
        results = [by_fold[k] for k in range(len(folds))]
        result = WalkForwardResult(cfg.strategy.name, folds, results, spec, acct.capital,
                                   str(run_dir.path) if run_dir else None, account=acct)
        summary = result.metrics
        # every other rule baseline on the same folds and costs, for comparison (and the plots' reference)
        by_name = baselines.result()
        for name in others:
            br = WalkForwardResult(name, folds, by_name[name], spec, acct.capital, account=acct)
            result.baseline_results[name] = br
            result.baselines[name] = br.metrics
        if run_dir is not None:
            run_dir.write_parquet("oos_equity.parquet", result.stitched)
            run_dir.write_json("summary.json", {"strategy": cfg.strategy.name, "market": spec.name,
                                                "account": acct.describe(), "annualization": M.ANNUALIZATION_NOTE,
                                                "backend": where or "host",
                                                "fold_backends": sorted({str(f.metrics.get("backend", "host"))
                                                                         for f in results if f.ok}),
                                                **({"population": plan} if plan else {}),
                                                "stitched_oos": summary,
                                                **({"seeds": seeds} if (seeds := result.seed_summary()) else {}),
                                                "baselines": result.baselines,
                                                "folds": result.to_frame().to_dict(orient="records")})
        if progress:
            progress.finish(summary)
        return result

    def _baselines(self, names: list[str], prep: Prepared) -> dict[str, list[FoldResult]]:
        """The rule baselines ``names`` on every fold's test range, with the run's costs and account."""
        cfg = self.config
        out = {}
        for name in names:
            sub = dataclasses.replace(cfg, strategy=dataclasses.replace(cfg.strategy, name=name))
            out[name] = [rule_fold(sub, k, prep, {}) for k in range(len(prep.folds))]
        return out

    def _run_on_gpu_workers(self, todo, executor, bars, ranges, progress, started, finished, plan: dict) -> None:
        """Workers that hold one GPU each: every worker gets a share of the folds (every n-th, so the shares
        cost alike) and trains it as populations (:func:`run_folds_job`); a worker's folds are written as
        its share finishes. A share whose worker was lost fails its folds (a resume runs them again)."""
        cfg = self.config
        n = min(executor.slots, len(todo))
        shares = [todo[i::n] for i in range(n)]

        def on_start(i: int) -> None:
            for k in shares[i]:
                started[k] = time.perf_counter()
                if progress:
                    progress.fold_started(k, ranges[k])

        shared = executor.share(bars)
        jobs = [(cfg, shared, ks, {k: ranges[k] for k in ks}) for ks in shares]
        for i, out in executor.imap_unordered(run_folds_job, jobs, on_start=on_start):
            if isinstance(out, WorkerLost):
                results = [_failed(cfg, bars, k, ranges[k], out) for k in shares[i]]
            else:
                results, worker_plan = out
                if worker_plan:
                    plan.setdefault("per_worker", []).append({"folds": [k + 1 for k in shares[i]], **worker_plan})
            for k, res in zip(shares[i], results):
                finished(k, res)

    def _run_populations(self, todo, prep, backend, ranges, progress, started, finished, plan: dict,
                         busy=None) -> None:
        """The GPU path for several folds: folds trained side by side in populations
        (:mod:`workbench.agent.population`; each fold's result is the one it gets alone), each fold
        checked and reported as it would be alone. A group that fails to train fails its folds.
        ``busy()``: called at every epoch's end (the GPU then has the population's next epoch to run)."""
        cfg = self.config

        def on_group(group, size, per_agent):
            prof = backend.sized(cfg.gpu)
            batched = prof.batches_gemms
            plan.update(agents_per_graph=size, seeds_per_fold=cfg.training.seeds,
                        device_mib_per_agent=round(per_agent / 2**20, 1),
                        chosen_by="gpu.population" if prof.population else "free device memory (gpu.population = 0)",
                        groups=plan.get("groups", 0) + 1,
                        batched_gemm=(f"on from {BATCH_MIN_AGENTS} agents per graph: results within rounding of one "
                                      "agent at a time, which training amplifies" if batched else
                                      "off: every agent bit for bit as alone"),
                        sm_share=("on: each agent's GEMMs planned for the SMs they fill beside the others' (the "
                                  "same alone with this setting; within rounding of the results with it off)"
                                  if prof.sm_share and getattr(backend.gemm, "fuses_epilogues", False) else
                                  "off: each agent's GEMMs as cuBLAS picks them for the whole GPU"))
            for k in dict.fromkeys(group):  # a fold's seeds are one fold on screen
                if k in started:
                    continue
                started[k] = time.perf_counter()
                if progress:
                    progress.fold_started(k, ranges[k])

        def on_epoch(k, s, log):
            if busy is not None:
                busy()
            if progress and s == 0:
                progress.epoch(k, log, cfg.training.epochs)

        left, seeds = list(todo), {k: {} for k in todo}
        try:
            for k, s, trained in train_folds(todo, prep, cfg, backend, on_epoch, on_group):
                seeds[k][s] = trained
                if len(seeds[k]) < cfg.training.seeds:
                    continue  # the fold's other seeds train in this population or the next
                try:
                    res = finish_fold(k, prep, cfg, [seeds[k][i] for i in range(cfg.training.seeds)], ranges[k])
                except (WorkbenchError, ValueError, ArithmeticError, IndexError) as exc:
                    res = _failed(cfg, prep.bars, k, ranges[k], exc, traceback.format_exc())
                del seeds[k]
                left.remove(k)
                finished(k, res)
        except ConfigError:
            raise  # a population that cannot fit is refused, not a fold failure
        except (WorkbenchError, ValueError, ArithmeticError, IndexError) as exc:
            tb = traceback.format_exc()
            for k in left:
                finished(k, _failed(cfg, prep.bars, k, ranges[k], exc, tb))

    @staticmethod
    def _record(run_dir, res: FoldResult, ranges: dict, agent: bool) -> None:
        if run_dir is None:
            return
        k = res.fold  # the fold's number, from 1
        if res.ok:
            extra = {"ranges": ranges, "strategy": res.strategy}
            files = {}
            if agent:
                from .agent.selection import describe as select_doc

                rule = res.metrics.get("selected_by", "")
                files = {"epochs.json": {"annualization": M.ANNUALIZATION_NOTE + " (val_sharpe)",
                                         "selected_by": rule, "selection": select_doc(rule) if rule else "",
                                         "chosen_epoch": res.metrics.get("best_epoch",
                                                                         res.metrics.get("seed_best_epochs")),
                                         "epochs": res.epochs},
                         "weights.npy": res.params}
                for s, mem in enumerate(res.members):  # a seed ensemble: each seed on its own
                    files.update({f"seed_{s:02d}_metrics.json": mem.metrics, f"seed_{s:02d}_trades.parquet": mem.trades,
                                  f"seed_{s:02d}_bars.parquet": mem.bars})
            run_dir.write_fold(k, res.metrics, res.trades, res.bars, extra, files)
        else:
            run_dir.write_json(f"fold_{k:03d}_error.json", {"fold": k, "error": res.error,
                                                            "traceback": res.traceback})

    def prepare(self, bars: "Bars | str | Path | Prepared") -> Prepared:
        """Load (with the config's ``[data]`` and ``[market]``), build the features and lay out the folds.
        ``Prepared.notes()`` says what was chosen: the market and why, rolls, gaps, the split sizes."""
        if isinstance(bars, Prepared):
            return bars
        cfg = self.config
        bars = bars_for(bars, cfg)
        feats = build_features(bars, cfg.features)
        folds = walk_forward_splits(bars.ts, cfg.splits, feats.max_lookback, feats.warmup)
        return Prepared(bars, bars.market, feats, folds, account_for(cfg, bars, folds))

    def folds(self, bars: Bars | str | Path):
        """The folds this config makes of ``bars`` (bar ranges and timestamps of train / validation / test,
        with the purge and embargo gaps), without running anything; ``folds.attrs["sizing"]`` says how
        their sizes were chosen."""
        return self.prepare(bars).folds

