"""The search: each particle is a training configuration, scored by its mean validation Sharpe.

Objective: for every scored fold (``swarm.folds``, all by default) the agent trains with the
candidate's ``[training]`` values and keeps its best epoch by validation Sharpe; the trial's score
is the mean of those Sharpes over the folds (with ``training.seeds = K``, over the folds and the K
seeds: a less noisy score for K times the training). Test ranges are never backtested during the search.

Trial log (``RUN/trials.parquet``, rewritten atomically after every trial): trial, iteration,
particle, the unit-cube coordinates (``u_*``), the decoded values, each fold's validation Sharpe,
the mean, seconds and status. A resumed search replays the completed iterations' scores into a
swarm built from the same seed and checks that it proposes the logged positions again.

On a GPU in this process the particles of one iteration train side by side: every (particle,
scored fold) is one agent of a population (:func:`workbench.agent.population.train_jobs`, grouped
by size, schedules may differ; ``gpu.population = 1`` turns it off); each trial's score is the one
it gets alone, bit for bit, and its ``seconds`` is the population's wall time. (With
``gpu.batched_gemm = "on"`` an iteration of 8 or more agents batches their GEMMs: ~5 % faster, but a
trial's score is then its score under rounding perturbations, which moved mean validation Sharpes
of the shipped sample by up to 8 on the H200: not the score its configuration gets alone.)

The particles of one iteration are independent jobs: with an executor (``--workers`` /
``--scheduler``, :mod:`workbench.executor`) they train side by side, each logged as it finishes
(the log is kept in trial order), and the swarm moves once the whole iteration is in. A trial's
seeds come from the config and the fold, so the scores do not depend on where it ran.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..agent.backend import make_backend
from ..agent.train_config import validate
from ..agent.fold import seeds_counting_on, train_fold
from ..agent.population import Job, side_by_side, train_jobs
from ..config import RunConfig
from ..errors import ConfigError
from .bounds import GPU_KEYS, HyperoptProfile
from .pso import ParticleSwarm


def candidate_config(base: RunConfig, values: dict) -> RunConfig:
    """``base`` with the candidate's values: training keys into ``[training]``, size keys into ``[gpu]``
    (v_min < v_max kept by swapping the two when a candidate inverts them)."""
    v = {k: x for k, x in values.items() if k not in GPU_KEYS}
    g = {k: x for k, x in values.items() if k in GPU_KEYS}
    if "v_min" in v and "v_max" in v and v["v_min"] >= v["v_max"]:
        v["v_min"], v["v_max"] = v["v_max"], v["v_min"]
    return dataclasses.replace(base, training=validate(dataclasses.replace(base.training, **v)),
                               gpu=dataclasses.replace(base.gpu, **g))


def evaluate_candidate(base: RunConfig, values: dict, bars, score_folds, backend=None, prep=None, on_epoch=None):
    """(validation Sharpe per scored fold, status, hourly validation PnL of the chosen epochs) of one
    candidate; runs in whichever process holds the job. ``on_epoch(fold, log, n_epochs)``: progress, in
    process. In a worker that holds a GPU the trial's (fold, seed) agents train as one population."""
    try:
        cfg = candidate_config(base, values)
    except ConfigError as exc:
        return [float("nan")] * len(score_folds), f"invalid: {exc.message}", []
    if prep is None:  # a worker process: features, folds and backend cached per process
        from ..engine import worker_context

        prep, backend = worker_context(base, bars)
    E, K = cfg.training.epochs, cfg.training.seeds
    runs: dict[int, list] = {}
    jobs = [Job(label - 1, cfg, s) for label in score_folds for s in range(K)]
    if on_epoch is None and side_by_side(backend, cfg.gpu, True, len(jobs)):
        # a worker process holding a GPU: the trial's folds and seeds train side by side (each as alone)
        for j, res in train_jobs(jobs, prep, backend, test=False):
            runs.setdefault(jobs[j].k, [None] * K)[jobs[j].s] = res
    else:
        for label in score_folds:  # fold numbers, from 1
            # the fold's seeds train one after another: their epochs count on (seed s's epoch e as s * E + e)
            report = (lambda log, f=label: on_epoch(f, log, E * K)) if on_epoch else None
            runs[label - 1] = [train_fold(label - 1, prep, cfg, backend, test=False,
                                          on_epoch=seeds_counting_on(report, E, s), s=s) for s in range(K)]
    sharpes, hourly = [], []
    for label in score_folds:
        sharpe, pnl = fold_score(prep, label - 1, runs[label - 1])
        sharpes.append(sharpe)
        hourly.extend(pnl)
    return sharpes, "ok", hourly


def fold_score(prep, k: int, runs: list) -> tuple[float, list[float]]:
    """A trained fold's score from its seeds' training results (``training.seeds``; one for a single
    agent): the validation Sharpe of each seed's chosen epoch, averaged over the seeds, and the seeds'
    mean validation PnL (USD) summed per hour (the overfitting statistics' input)."""
    folds = prep.folds
    sharpe = float(np.mean([r.epochs[r.best_epoch - 1].val_sharpe if r.best_epoch >= 1 else float("nan")
                            for r in runs]))
    when = prep.bars.frame.index[int(folds.loc[k, "val_start"]):int(folds.loc[k, "val_stop"])]
    pnl = np.mean([r.val_pnl for r in runs], axis=0)
    return sharpe, pd.Series(pnl, index=when).groupby(when.floor("h")).sum().tolist()


class Search:
    def __init__(self, base: RunConfig, profile: HyperoptProfile, bars, run_dir: Path, progress=None, executor=None):
        from ..executor import InlineExecutor

        self.base, self.profile, self.bars, self.dir, self.progress = base, profile, bars, Path(run_dir), progress
        self.executor = executor or InlineExecutor()
        from ..engine import WalkForward

        self.prep = WalkForward(base).prepare(bars)  # the same preparation as a walk-forward's
        self.feats, self.folds = self.prep.feats, self.prep.folds
        chosen = profile.swarm.folds or tuple(range(1, len(self.folds) + 1))
        bad = [k for k in chosen if not 1 <= k <= len(self.folds)]
        if bad:
            raise ConfigError(f"swarm.folds names folds {bad} but the data has folds 1..{len(self.folds)}")
        self.score_folds = chosen
        self.backend = make_backend(base.device) if self.executor.live_progress else None
        s = profile.swarm
        self.pso = ParticleSwarm(len(profile.names), s.particles, s.inertia, s.cognitive, s.social, s.seed, s.boundary)
        self.log_path = self.dir / "trials.parquet"
        self.rows: list[dict] = []

    # ---- resume ----
    def resume(self) -> int:
        """Replay a trial log; returns the number of trials kept."""
        if not self.log_path.is_file():
            return 0
        log = pd.read_parquet(self.log_path)
        P = self.profile.swarm.particles
        ucols = [f"u_{n}" for n in self.profile.names]
        if list(c for c in log.columns if c.startswith("u_")) != ucols:
            raise ConfigError(f"cannot resume {self.log_path}: its parameters differ from the bounds file")
        complete = len(log) // P
        for it in range(complete):
            block = log.iloc[it * P:(it + 1) * P]
            if not np.allclose(block[ucols].to_numpy(), self.pso.ask(), atol=1e-12):
                raise ConfigError(f"cannot resume {self.log_path}: iteration {it} does not replay "
                                  "(different seed or swarm settings?)")
            self.pso.tell(block["mean_val_sharpe"].to_numpy(dtype=np.float64))
        partial = log.iloc[complete * P:]  # finished trials of an unfinished iteration are kept too
        if len(partial) and not np.allclose(partial[ucols].to_numpy(),
                                            self.pso.ask()[partial["particle"].to_numpy(dtype=int)], atol=1e-12):
            raise ConfigError(f"cannot resume {self.log_path}: iteration {complete} does not replay")
        self.rows = log.to_dict(orient="records")
        return len(self.rows)

    # ---- evaluation ----
    def evaluate(self, values: dict, trial: int = 0) -> tuple[list[float], str, list]:
        """One candidate in this process (its epochs reported to the progress display)."""
        report = None
        if self.progress is not None and hasattr(self.progress, "epoch"):
            n = len(self.score_folds)
            report = lambda fold, log, n_epochs: self.progress.epoch(trial, fold, n, log, n_epochs)  # noqa: E731
        return evaluate_candidate(self.base, values, self.bars, self.score_folds, self.backend, self.prep, report)

    def _record_trial(self, it: int, p: int, positions, values: dict, out, seconds: float) -> None:
        names, P = self.profile.names, self.profile.swarm.particles
        sharpes, status, hourly = out if isinstance(out, tuple) else (
            [float("nan")] * len(self.score_folds), f"failed: {out}", [])
        fin = [s for s in sharpes if np.isfinite(s)]
        row = {"trial": it * P + p + 1, "iteration": it, "particle": p,  # trials counted from 1
               **{f"u_{n}": float(u) for n, u in zip(names, positions[p])},
               **{f"p_{n}": v for n, v in values[p].items()},
               "val_sharpes": json.dumps(sharpes), "mean_val_sharpe": float(np.mean(fin)) if len(fin) == len(sharpes) else float("nan"),
               "val_pnl_hourly": json.dumps(hourly), "seconds": seconds, "status": status}
        self.rows.append(row)
        self._write_log()
        if self.progress:
            self.progress.trial(row, self.best_row())

    # ---- populations: an iteration's particles side by side on the GPU ----
    def _evaluate_together(self, todo: list[int], values: dict, it: int) -> dict:
        """Every (particle, scored fold) of an iteration trained in populations
        (:func:`workbench.agent.population.train_jobs`: grouped by size); each particle's
        outcome is the one :func:`evaluate_candidate` gives it alone, bit for bit (not where a run turns
        ``gpu.batched_gemm`` on: then within rounding, which training amplifies). ``seconds`` of these trials is the
        iteration's wall time (they trained together)."""
        n, P = len(self.score_folds), self.profile.swarm.particles
        out, jobs, owner = {}, [], []
        for p in todo:
            try:
                cfg = candidate_config(self.base, values[p])
            except ConfigError as exc:
                out[p] = ([float("nan")] * n, f"invalid: {exc.message}", [])
                continue
            for label in self.score_folds:
                for s in range(cfg.training.seeds):
                    jobs.append(Job(label - 1, cfg, s))
                    owner.append((p, label))
        report = None
        if self.progress is not None and hasattr(self.progress, "epoch"):
            def report(j, log):
                p, label = owner[j]
                if jobs[j].s == 0:
                    self.progress.epoch(it * P + p + 1, label, n, log, jobs[j].cfg.training.epochs)
        runs: dict[tuple, list] = {}
        try:
            for j, res in train_jobs(jobs, self.prep, self.backend, test=False, on_epoch=report):
                runs.setdefault(owner[j], {})[jobs[j].s] = res
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 (as a worker's failure: the trials fail, the search goes on)
            for p in {p for p, _ in owner} - set(out):
                out[p] = f"{type(exc).__name__}: {exc}"
            return dict(sorted(out.items()))
        for p in dict.fromkeys(p for p, _ in owner):
            mine = [fold_score(self.prep, label - 1, [runs[(p, label)][s] for s in sorted(runs[(p, label)])])
                    for label in self.score_folds]
            out[p] = ([s for s, _ in mine], "ok", [h for _, pnl in mine for h in pnl])
        return dict(sorted(out.items()))

    def _write_log(self) -> None:
        tmp = self.log_path.with_name(".trials.parquet.tmp")
        pd.DataFrame(sorted(self.rows, key=lambda r: r["trial"])).to_parquet(tmp)
        os.replace(tmp, self.log_path)

    def run(self, trials: int) -> pd.DataFrame:
        P = self.profile.swarm.particles
        ex = self.executor
        shared = None if ex.live_progress else ex.share(self.bars)
        while len(self.rows) < trials:
            it = len(self.rows) // P
            positions = self.pso.ask()
            done = {r["particle"] for r in self.rows if r["iteration"] == it}
            todo = [p for p in range(P) if p not in done][: trials - len(self.rows)]
            values = {p: self.profile.decode(positions[p]) for p in todo}
            if side_by_side(self.backend, self.base.gpu, ex.live_progress,
                            len(todo) * len(self.score_folds) * self.base.training.seeds):
                start = time.perf_counter()
                outs = self._evaluate_together(todo, values, it)
                took = time.perf_counter() - start  # trained together: each trial's seconds is the population's
                for p, out in outs.items():
                    self._record_trial(it, p, positions, values, out, took)
            else:
                if ex.live_progress:
                    fn, jobs = self.evaluate, [(values[p], it * P + p + 1) for p in todo]
                else:
                    fn, jobs = evaluate_candidate, [(self.base, values[p], shared, self.score_folds) for p in todo]
                t0: dict[int, float] = {}
                for i, out in ex.imap_unordered(fn, jobs, on_start=lambda i: t0.__setitem__(i, time.perf_counter())):
                    self._record_trial(it, todo[i], positions, values, out, time.perf_counter() - t0.get(i, time.perf_counter()))
            block = [r for r in self.rows if r["iteration"] == it]
            if len(block) == P:
                block.sort(key=lambda r: r["particle"])
                self.pso.tell(np.array([r["mean_val_sharpe"] for r in block], dtype=np.float64))
        self.rows.sort(key=lambda r: r["trial"])
        return pd.DataFrame(self.rows)

    def overfitting(self) -> dict:
        """The search's overfitting statistics: the deflated Sharpe's inputs (every trial started, the
        variance of the finished trials' per-day validation Sharpes) and the PBO by CSCV over the trials'
        hourly validation PnL (:mod:`workbench.overfitting`)."""
        from ..metrics import ANNUALIZATION
        from ..overfitting import pbo_cscv

        scores = np.array([r["mean_val_sharpe"] for r in self.rows], dtype=np.float64)
        per_day = scores[np.isfinite(scores)] / np.sqrt(ANNUALIZATION)
        out = {"trials_started": len(self.rows), "trials_finished": int(len(per_day)),
               "sr_variance_per_day": float(np.var(per_day, ddof=1)) if len(per_day) > 1 else 0.0}
        series = [json.loads(r.get("val_pnl_hourly", "[]") or "[]") for r in self.rows if np.isfinite(r["mean_val_sharpe"])]
        lengths = {len(x) for x in series}
        if len(series) >= 2 and len(lengths) == 1 and lengths.pop() >= 4:
            res = pbo_cscv(np.array(series, dtype=np.float64).T)
            out["pbo"] = {**res.to_dict(), "observations": "hourly validation PnL (USD) of each trial's chosen epochs, "
                          "scored folds in time order"}
        else:
            out["pbo"] = {"pbo": float("nan"), "why": "fewer than two finished trials with validation PnL"}
        return out

    def best_row(self) -> dict | None:
        ok = sorted((r for r in self.rows if np.isfinite(r["mean_val_sharpe"])), key=lambda r: r["trial"])
        return max(ok, key=lambda r: r["mean_val_sharpe"]) if ok else None  # ties: the earliest trial

    def best_values(self) -> dict:
        row = self.best_row()
        if row is None:
            raise ConfigError("no trial finished with a finite validation Sharpe")
        return {n: row[f"p_{n}"] for n in self.profile.names}
