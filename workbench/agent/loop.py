"""The one epoch loop of a fold, for every backend.

A backend trainer (the GPU :class:`~workbench.agent.trainer.DeviceTrainer`, the CPU
:class:`~workbench.agent.cpu_trainer.CpuTrainer`) provides the phases; this loop owns their order,
the guard's restore, the epoch logs, the choice of the kept weights (:mod:`workbench.agent.selection`)
and the result. Phases a trainer provides:

- ``setup(w)``: the init phase (allocate, upload, compile or load, capture), timed here;
- ``snapshot()`` / ``restore()``: the epoch's starting weights, target and optimiser, and back to them;
- ``experience(eps)``, ``train(epoch, first)``, ``validate()``: enqueue (GPU) or run (CPU) the phases;
- ``end_epoch(epoch) -> EpochStats``: wait for the epoch (the GPU's one host sync) and report it;
- ``keep()``: the current weights become the fold's choice; ``kept()``: them, as a NumPy array;
- ``val_pnl()``: per-bar validation PnL of the kept weights; ``test()``: their test backtest as
  ``(position, pnl, actions taken)``; ``backend``, ``counters()``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .selection import EpochSelector
from .records import EpochLog, FoldTrainResult


@dataclass
class EpochStats:
    """What a backend reports of one epoch (its phase times in ms; ``val``: the validation statistics
    in ``cuda_kernels.rollout.VAL_*`` order)."""

    ms: dict
    replay_size: int
    updates: int
    loss: float
    grad_norm: float
    max_abs_q: float
    tripped: bool
    val: np.ndarray
    extra_ms: dict = field(default_factory=dict)  # reported after the total (the per-update breakdown)


def run_fold(trainer, cfg, w, on_epoch=None, test: bool = True) -> FoldTrainResult:
    """Train ``trainer`` on window ``w``; ``test=False`` (the search) never backtests the test range."""
    t0 = time.perf_counter()
    trainer.setup(w)
    init_ms = (time.perf_counter() - t0) * 1e3
    logs: list[EpochLog] = []
    chooser = EpochSelector(cfg.select_by)
    for epoch in range(cfg.epochs):
        eps = cfg.epsilon(epoch)
        trainer.snapshot()
        trainer.experience(eps)
        trainer.train(epoch, first=epoch == 0)
        trainer.validate()
        st = trainer.end_epoch(epoch)
        if st.tripped:  # back to the epoch's starting state; the guard stays off for the next epoch
            trainer.restore()
        ms = dict(st.ms)
        ms["init"] = init_ms if epoch == 0 else 0.0  # the fold's one-off init phase, reported once
        ms["total"] = sum(ms.values())
        ms.update(st.extra_ms)
        log = EpochLog.from_stats(epoch + 1, eps, st.replay_size, st.updates, st.loss, st.grad_norm, st.max_abs_q,
                                  st.tripped, st.val, ms)
        logs.append(log)
        if chooser.offer(log):
            trainer.keep()
        if on_epoch:
            on_epoch(log)
    if chooser.best_epoch < 0:
        trainer.keep()
    best_epoch, best_score = chooser.best_epoch, chooser.best_score
    if not test:
        return FoldTrainResult(logs, best_epoch, best_score, trainer.kept(), np.zeros(0, np.int32), np.zeros(0),
                               np.zeros((0, 3), np.int32), init_ms, backend=trainer.backend_name(test=False),
                               val_pnl=trainer.val_pnl())
    pos, pnl, taken = trainer.test()
    return FoldTrainResult(logs, best_epoch, best_score, trainer.kept(), pos, pnl, taken, init_ms,
                           backend=trainer.backend_name(test=True), counters=trainer.counters())
