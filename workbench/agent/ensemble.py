"""Seed ensembles: ``training.seeds = K`` trains K agents per fold that differ only in their seed, and the
fold's test range is traded by their ensemble.

Seeds (:func:`workbench.agent.fold.agent_seed`): seed index 0 is the fold's usual seed, so ``seeds = 1``
is the single agent unchanged; index s > 0 adds ``s * SEED_STRIDE``. Every seed chooses its own epoch on
the validation range, as it would alone.

The ensemble policy (``RULE``): at every test bar and held position, the mean over the seeds of each
action's expected Q (each seed with its chosen weights), and in each action branch the action with the
highest mean. Averaging Q rather than voting keeps the decision one argmax per branch like a single
agent's, and weighs a seed's confident preference above a near tie. Its test range is walked by the same
bar step as the trainers' backtests (``cuda_kernels.backtest.greedy_backtest_cpu``) and then checked bar
for bar against ``workbench.accounting.simulate`` like every fold (:func:`workbench.agent.fold.finish_dqn_fold`).

Each seed's own test result is kept beside it (``FoldResult.members``), so a report shows the
ensemble's out-of-sample result next to the distribution across seeds: the question "same settings,
different results?" answered with numbers.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from cuda_kernels.actions import greedy_ref
from cuda_kernels.backtest import greedy_backtest_cpu

from .fold import finish_dqn_fold
from .network import NetShape
from .records import FoldTrainResult
from .window import MAX_POS, N_POS

RULE = "mean_q"
RULE_DOC = ("in each action branch, the action with the highest mean over the seeds of its expected Q "
            "(each seed's chosen weights)")
SEED_KEYS = ("sharpe", "net_pnl_usd", "max_drawdown")  # per-seed metrics summarised beside the ensemble


def ensemble_test(results: list[FoldTrainResult], bars, spec, a: int, b: int) -> FoldTrainResult:
    """The ensemble's test backtest over series bars [a, b) from the seeds' test Q (``RULE``), as a
    :class:`FoldTrainResult` with no epochs of its own and the seeds' weights stacked ``[K, n_params]``."""
    T = b - a
    q = [r.test_q for r in results]
    if any(x.shape[:2] != (T, N_POS) for x in q) or len({x.shape for x in q}) != 1:
        raise ValueError(f"ensemble: the seeds' test Q tables differ in shape: {sorted({x.shape for x in q})}")
    mean_q = np.mean(np.stack(q).astype(np.float64), axis=0)
    greedy = greedy_ref(mean_q.reshape(T * N_POS, -1), list(NetShape.branch_sizes))
    test = bars.slice(a, b)
    roll = bars.roll_mask[a:b].astype(np.int8)  # of the whole series: a test range's first bar may be a roll
    position, pnl = np.zeros(T, np.int32), np.zeros(T)
    greedy_backtest_cpu(test.column("open"), test.column("high"), test.column("low"), test.column("close"), roll,
                        greedy, 0, T, N_POS, MAX_POS, spec.point_value, spec.tick_size, spec.slippage_ticks,
                        spec.commission_per_side, spec.commission_bps, position, pnl)
    taken = greedy.reshape(T, N_POS, 3)[np.arange(T), np.clip(position + MAX_POS, 0, N_POS - 1)]
    return FoldTrainResult([], -1, math.nan, np.stack([r.params for r in results]), position, pnl, taken,
                           max(r.init_ms for r in results), backend=results[0].backend,
                           counters=results[0].counters, test_q=mean_q.astype(np.float32))


def finish_fold(k: int, prep, cfg, results: list[FoldTrainResult], ranges: dict):
    """The fold's :class:`~workbench.results.FoldResult` from its seeds' training results (seed order):
    one seed is the agent's own result; several are the ensemble's, each seed's own result (checked
    and costed like any fold) in ``members`` and their spread in the metrics."""
    if len(results) == 1:
        return finish_dqn_fold(k, prep, cfg, results[0], ranges)
    members = [finish_dqn_fold(k, prep, cfg, r, ranges) for r in results]
    a, b = int(prep.folds.loc[k, "test_start"]), int(prep.folds.loc[k, "test_stop"])
    ens = finish_dqn_fold(k, prep, cfg, ensemble_test(results, prep.bars, prep.spec, a, b), ranges)
    m = {key: v for key, v in ens.metrics.items() if key not in ("best_epoch", "best_val_score", "best_val_sharpe")}
    m.update(seeds=len(results), ensemble=RULE, seed_best_epochs=[r.best_epoch for r in results],
             **spread({f"seed_{key}": [f.metrics[key] for f in members] for key in SEED_KEYS}))
    epochs = [{**dataclasses.asdict(log), "seed": s, "chosen": log.epoch == r.best_epoch}
              for s, r in enumerate(results) for log in r.epochs]
    return dataclasses.replace(ens, metrics=m, epochs=epochs, members=members)


def spread(series: dict[str, list[float]]) -> dict[str, float]:
    """``{name}_mean / _sd / _min / _max`` of each list (finite values; sd with ddof 1, NaN under two)."""
    out = {}
    for name, xs in series.items():
        v = np.asarray([x for x in xs if x is not None and np.isfinite(x)], np.float64)
        out.update({f"{name}_mean": float(v.mean()) if len(v) else math.nan,
                    f"{name}_sd": float(v.std(ddof=1)) if len(v) > 1 else math.nan,
                    f"{name}_min": float(v.min()) if len(v) else math.nan,
                    f"{name}_max": float(v.max()) if len(v) else math.nan})
    return out
