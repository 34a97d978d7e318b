"""What training a fold produces, whatever the backend: one :class:`EpochLog` per epoch and the
:class:`FoldTrainResult`; and the Philox keys of a seed (both backends draw from the same streams)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cuda_kernels import rollout as K_ro


@dataclass
class EpochLog:
    epoch: int                  # numbered from 1 (as on screen and in epochs.json)
    epsilon: float
    replay_size: int
    updates: int
    loss: float
    grad_norm: float
    max_abs_q: float
    guard_tripped: bool
    val_sharpe: float           # annualised Sharpe of daily validation PnL (252 days, rf 0), capital-free
    val_pnl_usd: float
    val_days: int
    val_max_drawdown_usd: float  # of the cumulative validation PnL, per bar
    val_bar_t: float            # t-statistic of the mean per-bar validation PnL
    val_bars: int
    ms: dict = field(default_factory=dict)

    @classmethod
    def from_stats(cls, epoch, eps, replay_size, updates, loss, grad_norm, max_abs_q, tripped, val, ms) -> "EpochLog":
        """One epoch's log from the validation statistics (``cuda_kernels.rollout.VAL_*`` order)."""
        nan = float("nan")
        return cls(epoch, eps, replay_size, updates, loss, grad_norm, max_abs_q, tripped,
                   nan if tripped else float(val[K_ro.VAL_DAILY_SHARPE]), float(val[K_ro.VAL_PNL]),
                   int(val[K_ro.VAL_DAYS]), float(val[K_ro.VAL_MAX_DD]),
                   nan if tripped else float(val[K_ro.VAL_BAR_T]), int(val[K_ro.VAL_BARS]), ms)


@dataclass
class FoldTrainResult:
    epochs: list[EpochLog]
    best_epoch: int             # the chosen epoch's number (from 1); -1: none
    best_val_score: float       # the selection statistic of the chosen epoch (training.select_by)
    params: np.ndarray
    test_position: np.ndarray   # int32 [T_test]
    test_pnl: np.ndarray        # float64 [T_test], USD
    test_actions: np.ndarray    # int32 [T_test, 3], the greedy action taken at each bar
    init_ms: float
    backend: str
    counters: dict = field(default_factory=dict)
    val_pnl: np.ndarray = field(default_factory=lambda: np.zeros(0))  # float64 [T_val] USD, chosen weights (search)
    # float32 [T_test, N_POS, sum(branch sizes)]: the chosen weights' expected Q of every action branch at every
    # test bar and position (what a seed ensemble averages, workbench/agent/ensemble.py)
    test_q: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), np.float32))


def philox_keys(seed: int) -> tuple[int, int]:
    """The two 32-bit Philox key words of a run seed (both backends draw from the same streams)."""
    return (seed * 2654435761) & 0xFFFFFFFF, (seed * 40503 + 12345) & 0xFFFFFFFF
