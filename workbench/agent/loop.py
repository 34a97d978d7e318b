"""The one epoch loop, for every backend and for any number of agents trained side by side.

A backend trainer (the GPU :class:`~workbench.agent.trainer.DeviceTrainer`, the CPU
:class:`~workbench.agent.cpu_trainer.CpuTrainer`) provides the phases; this loop owns their order,
the guard's restore, the epoch logs, the choice of the kept weights (:mod:`workbench.agent.selection`)
and the result. Phases a trainer provides:

- ``setup(w)``: the init phase (allocate, upload, compile or load, capture), timed here;
- ``snapshot()`` / ``restore()``: the epoch's starting weights, target and optimiser, and back to them;
- ``experience(eps)``, ``train(epoch)``, ``validate()``: enqueue (GPU) or run (CPU) the phases;
- ``end_epoch(epoch) -> EpochStats``: wait for the epoch (the GPU's one host sync) and report it;
- ``keep()``: the current weights become the fold's choice; ``kept()``: them, as a NumPy array;
- ``val_pnl()``: per-bar validation PnL of the kept weights; ``test()``: their test backtest as
  ``(position, pnl, actions taken, expected Q [T, N_POS, actions])``; ``backend``, ``counters()``.

:func:`run_agents` runs that loop for P agents at once: a population (``GpuPopulation``: every
agent's phase in one graph launch, one readback per epoch) provides the same phases over the agents
still training (``active``; agents may train different numbers of epochs), ``end_epoch`` returning
one report per active agent and the per-agent ones (restore, keep, kept, val_pnl, test, counters)
taking the agent's index; :class:`Single` presents one trainer that way, so :func:`run_fold` is the
same loop with P = 1.
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
    extra_ms: dict = field(default_factory=dict)  # reported after the total (the init breakdown, agents per launch)


def run_fold(trainer, cfg, w, on_epoch=None, test: bool = True) -> FoldTrainResult:
    """Train ``trainer`` on window ``w``; ``test=False`` (the search) never backtests the test range."""
    cb = (lambda _i, log: on_epoch(log)) if on_epoch else None
    return run_agents(Single(trainer, w), [cfg], cb, test)[0]


class Single:
    """One trainer seen as a population of one (the phases :func:`run_agents` drives; ``active`` is
    always this one agent while it trains)."""

    def __init__(self, trainer, w):
        self.trainer, self.window = trainer, w

    def setup(self) -> None:
        self.trainer.setup(self.window)

    def snapshot(self, active) -> None:
        self.trainer.snapshot()

    def train(self, epoch: int, active) -> None:
        self.trainer.train(epoch)

    def validate(self, active) -> None:
        self.trainer.validate()

    def backend_name(self, test: bool) -> str:
        return self.trainer.backend_name(test)

    def experience(self, active, eps: list[float]) -> None:
        self.trainer.experience(eps[0])

    def end_epoch(self, epoch: int, active) -> list[EpochStats]:
        return [self.trainer.end_epoch(epoch)]

    def restore(self, i: int) -> None:
        self.trainer.restore()

    def keep(self, i: int) -> None:
        self.trainer.keep()

    def kept(self, i: int) -> np.ndarray:
        return self.trainer.kept()

    def val_pnl(self, i: int) -> np.ndarray:
        return self.trainer.val_pnl()

    def test(self, i: int):
        return self.trainer.test()

    def counters(self, i: int) -> dict:
        return self.trainer.counters()


def run_agents(agents, cfgs, on_epoch=None, test: bool = True) -> list[FoldTrainResult]:
    """The epoch loop of P agents trained side by side (``agents``: :class:`Single`, or a population
    such as :class:`workbench.agent.population.GpuPopulation`); agent i uses ``cfgs[i]`` and trains its
    own number of epochs (the phases of an epoch take the agents still training, ``active``). Every
    agent has its own guard restore, epoch logs and kept epoch; ``on_epoch(i, log)`` per agent and epoch."""
    n_epochs = [c.epochs for c in cfgs]
    t0 = time.perf_counter()
    agents.setup()
    init_ms = (time.perf_counter() - t0) * 1e3
    logs: list[list[EpochLog]] = [[] for _ in cfgs]
    choosers = [EpochSelector(c.select_by) for c in cfgs]
    for epoch in range(max(n_epochs)):
        active = [i for i, n in enumerate(n_epochs) if epoch < n]
        eps = [cfgs[i].epsilon(epoch) for i in active]
        agents.snapshot(active)
        agents.experience(active, eps)
        agents.train(epoch, active)
        agents.validate(active)
        for i, e, st in zip(active, eps, agents.end_epoch(epoch, active)):
            if st.tripped:  # back to the epoch's starting state; the guard stays off for the next epoch
                agents.restore(i)
            ms = dict(st.ms)
            ms["init"] = init_ms if epoch == 0 else 0.0  # the one-off init phase, reported once
            ms["total"] = sum(ms.values())
            ms.update(st.extra_ms)
            log = EpochLog.from_stats(epoch + 1, e, st.replay_size, st.updates, st.loss, st.grad_norm,
                                      st.max_abs_q, st.tripped, st.val, ms)
            logs[i].append(log)
            if choosers[i].offer(log):
                agents.keep(i)
            if on_epoch:
                on_epoch(i, log)
    out = []
    for i, chooser in enumerate(choosers):
        if chooser.best_epoch < 0:
            agents.keep(i)
        if not test:
            out.append(FoldTrainResult(logs[i], chooser.best_epoch, chooser.best_score, agents.kept(i),
                                       np.zeros(0, np.int32), np.zeros(0), np.zeros((0, 3), np.int32), init_ms,
                                       backend=agents.backend_name(test=False), val_pnl=agents.val_pnl(i)))
            continue
        pos, pnl, taken, q = agents.test(i)
        out.append(FoldTrainResult(logs[i], chooser.best_epoch, chooser.best_score, agents.kept(i), pos, pnl, taken,
                                   init_ms, backend=agents.backend_name(test=True), counters=agents.counters(i),
                                   test_q=q))
    return out
