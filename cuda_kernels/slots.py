"""Named slots and columns of the device buffers that host code reads (kernel-side constants only).

Kernels write these layouts; the trainers, the CPU twins and the tests read them by these names
instead of bare numbers. NamedTuples of int constants (STYLE: enums).
"""
from __future__ import annotations

from typing import NamedTuple


class ReplayInt(NamedTuple):
    """Columns of the replay's int32 store (``N_INT`` = 7): a transition s -> s'."""

    T: int = 0          # bar of s
    POS: int = 1        # position index of s (0 .. 2 * max_position)
    DIR: int = 2        # the factored action taken: direction, size, execution
    SIZE: int = 3
    EXEC: int = 4
    T_NEXT: int = 5     # bar of s' (n steps later, or the episode's end)
    POS_NEXT: int = 6


class ReplayFloat(NamedTuple):
    """Columns of the replay's float32 store (``N_FLOAT`` = 2)."""

    RETURN: int = 0     # discounted n-step reward
    TERMINAL: int = 1   # 1.0 when s' ended the episode


class UpdateStats(NamedTuple):
    """Slots of the float32[4] per-epoch update statistics the guard kernel accumulates."""

    LOSS_SUM: int = 0
    NORM_SUM: int = 1   # sum of global gradient norms before clipping
    UPDATES: int = 2    # updates applied (the guard stops counting)
    MAX_ABS_Q: int = 3


class Arrivals(NamedTuple):
    """Slots of the learner's int32 arrival counts (:func:`cuda_kernels.nb.last_to_arrive`): one per kernel
    whose last block finishes its launch; every launch leaves its slot at zero."""

    SCAN: int = 0       # an update's prefix sum of the priorities (its tile totals' scan)
    DRAW: int = 1       # the PER draw (its weights' normalisation)
    NORM: int = 2       # the gradient norm (its total, the clip scale and the guard)
    FULL_SCAN: int = 3  # the full prefix sum after the experience phase's insertions


RI, RF, STAT, ARR = ReplayInt(), ReplayFloat(), UpdateStats(), Arrivals()
