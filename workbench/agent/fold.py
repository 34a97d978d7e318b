"""One DQN fold end to end: window -> train (GPU or CPU) -> test backtest -> host accounting check.

The test range is backtested by the trainer (on the device for the GPU backend). The host then
rebuilds the orders the greedy policy placed along its own position path and runs them through
``workbench.accounting.simulate`` -- the same accounting as the baselines -- and refuses the fold if
the two disagree on any bar's PnL by more than a cent. Trades and metrics come from ``simulate``.
"""
from __future__ import annotations

import numpy as np

from cuda_kernels.env import EXEC_KEEP, EXEC_PASSIVE

from .. import metrics as M
from ..accounting import PASSIVE, simulate
from ..results import FoldResult
from .window import make_window


def orders_from_actions(actions: np.ndarray, position: np.ndarray, close: np.ndarray, tick: float):
    """Vectorised: (target, order kind, limit) of the action taken at every bar along the held path."""
    d, size, ex = (np.clip(actions[:, i], 0, 2) for i in range(3))
    held = position.astype(np.int64)
    target = np.where(ex == EXEC_KEEP, held, (d - 1) * (size + 1))
    order = np.where((ex == EXEC_PASSIVE) & (target != held), PASSIVE, 0).astype(np.int8)
    limit = np.where(target > held, close - tick, close + tick)
    return target, order, limit


class AccountingMismatch(ArithmeticError):
    pass


def fold_seed(seed: int, k: int) -> int:
    """The training seed of the k-th fold (from 0): from the run's seed and the fold, never the worker, so
    a fold trains the same wherever it runs (in process, a spawned worker, a Dask worker, a search)."""
    return seed * 1000 + k


SEED_STRIDE = 1_000_003  # between the seeds of one fold's ensemble: above any fold number fold_seed adds


def agent_seed(seed: int, k: int, s: int = 0) -> int:
    """The training seed of seed index ``s`` of the k-th fold's ensemble (``training.seeds``); ``s = 0``
    is the fold's seed (:func:`fold_seed`), so one seed trains as it always did."""
    return fold_seed(seed, k) + s * SEED_STRIDE


def train_fold(k: int, prep, cfg, backend, test: bool = True, on_epoch=None, s: int = 0):
    """Train the agent (seed index ``s``) on the k-th fold of ``prep`` (``WalkForward.prepare``): the one
    path the walk-forward and the search share. ``test=False`` (the search) never backtests the test range."""
    w = fold_window(k, prep)
    trainer = backend.trainer(cfg.training, prep.spec, prep.account.capital, seed=agent_seed(cfg.seed, k, s),
                              overrides=cfg.gpu)
    return trainer.train_fold(w, on_epoch=on_epoch, test=test)


def fold_window(k: int, prep):
    """The k-th fold's window of ``prep`` (``WalkForward.prepare``)."""
    return make_window(prep.bars, prep.feats, prep.folds.loc[k].to_dict())


def seeds_counting_on(on_epoch, epochs: int, s: int):
    """Seed ``s``'s progress callback when a fold's seeds train one after another: ``on_epoch(log)`` sees
    seed s's epoch e as ``s * epochs + e`` (of ``seeds * epochs``), so progress and its ETA count the
    fold's whole work; the logs kept are each seed's own. None stays None."""
    if on_epoch is None:
        return None
    import dataclasses

    return lambda log: on_epoch(dataclasses.replace(log, epoch=s * epochs + log.epoch))


def run_dqn_fold(k: int, prep, cfg, backend, ranges: dict, on_epoch=None):
    """Train and test the k-th fold, its ``training.seeds`` agents one after another;
    :func:`workbench.agent.ensemble.finish_fold` checks and reports it. ``on_epoch(log)`` sees every
    seed's epochs counted on across the seeds (:func:`seeds_counting_on`)."""
    from .ensemble import finish_fold

    E = cfg.training.epochs
    results = [train_fold(k, prep, cfg, backend, on_epoch=seeds_counting_on(on_epoch, E, s), s=s)
               for s in range(cfg.training.seeds)]
    return finish_fold(k, prep, cfg, results, ranges)


def finish_dqn_fold(k: int, prep, cfg, res, ranges: dict):
    """A trained fold's test range: the host accounting check, the account, metrics (the same for a fold
    trained alone or in a population)."""
    bars, folds, spec, acct = prep.bars, prep.folds, prep.spec, prep.account
    fold = folds.loc[k].to_dict()
    a, b = int(fold["test_start"]), int(fold["test_stop"])
    test = bars.slice(a, b)
    close = test.column("close")
    # the decision at bar t is taken holding the position over bar t (the backtest's table look-up)
    target, order, limit = orders_from_actions(res.test_actions, res.test_position, close, spec.tick_size)
    # the account: a ruined one stops trading; the trainer's backtest never stops, so it is checked bar for bar
    # against the accounting without the ruin rule (the same run where the account was never ruined)
    sim = simulate(target, test, spec, order=order, limit=limit, capital=acct.capital, ruin_level=acct.ruin_level)
    unruined = sim if sim.ruined_bar is None else simulate(target, test, spec, order=order, limit=limit,
                                                             capital=acct.capital)
    gap = np.abs(unruined.pnl[1:] - res.test_pnl[1:])
    if len(gap) and gap.max() > 0.01:
        t = int(np.argmax(gap)) + 1
        raise AccountingMismatch(f"fold {k}: backtest PnL differs from simulate() by {gap.max():.4f} USD at test bar {t}")
    m = M.summarize(sim.pnl, sim.index, sim.position, sim.trades, spec, acct.capital, sim.commission, sim.slippage,
                    sim.ruined_bar)
    chosen = res.epochs[res.best_epoch - 1] if res.best_epoch >= 1 else None
    m.update(best_epoch=res.best_epoch, selected_by=cfg.training.select_by, best_val_score=res.best_val_score,
             best_val_sharpe=chosen.val_sharpe if chosen else float("nan"), backend=res.backend,
             init_ms=res.init_ms, **{f"counter_{key}": v for key, v in res.counters.items()})
    return FoldResult(k + 1, "dqn", sim.frame(), sim.trades, m, ranges, epochs=res.epochs, params=res.params)
