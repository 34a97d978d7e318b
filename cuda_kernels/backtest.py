"""Position-enumerated greedy backtest: no Python loop over bars, one GPU pass per range.

Kernel-side only (NumPy/Numba). The policy's observation is the bar's features plus a one-hot of the
current position, and positions are few (``-max_pos .. max_pos``). So Q is computed for every bar x
every reachable position at once: ``enumerate_positions_kernel`` builds the ``[T * P, F + P]``
observation matrix, the network's batched GEMMs give Q for all rows, ``eps_greedy_kernel`` with
eps = 0 gives the greedy action of every row, and ``greedy_backtest_kernel`` walks each range bar by bar
(one thread per range: the only sequential part, a table look-up and the env's bar step per bar).
"""
from __future__ import annotations

import numpy as np

from .env import step_bar_cpu, step_bar_dev
from .nb import cached_njit, cuda, device_function, float32, float64, int8, int32, int64, kernel, void, grid_wait


@kernel(void(float32[:, ::1], int64, int64, int64, float32[:, ::1]))
def enumerate_positions_kernel(features, T, F, P, obs):
    """features: float32 [T, F]; obs: out float32 [T * P, F + P], row t * P + p = features[t] ++ onehot(p)."""
    grid_wait()
    for e in range(cuda.grid(1), T * P * (F + P), cuda.gridsize(1)):
        row, col = e // (F + P), e % (F + P)
        t, p = row // P, row % P
        if col < F:
            obs[row, col] = features[t, col]
        else:
            obs[row, col] = 1.0 if col - F == p else 0.0


def _make_walk_range(step_bar):
    def walk_range(open_, high, low, close, roll, greedy, a, b, P, max_pos, pv, tick, slip_ticks, comm, bps, position,
                   pnl):
        """Walk bars [a, b) flat-started with the greedy table (one range of the kernel below)."""
        pos = 0
        position[a] = 0
        pnl[a] = 0.0
        for t in range(a, b - 1):
            row = t * P + min(max(pos + max_pos, 0), P - 1)
            pos, v = step_bar(open_, high, low, close, roll, t, pos, greedy[row, 0], greedy[row, 1], greedy[row, 2],
                              t + 1 == b - 1, pv, tick, slip_ticks, comm, bps)
            position[t + 1] = pos
            pnl[t + 1] = v

    return walk_range


# One source: the kernel's per-range body and the CPU backend's backtest.
walk_range_dev = device_function(_make_walk_range(step_bar_dev))
greedy_backtest_cpu = cached_njit(_make_walk_range(step_bar_cpu))
greedy_backtest_cpu.__doc__ = """CPU twin of ``greedy_backtest_kernel`` for one range [a, b): same arguments as one
range of the kernel, position and pnl written in place over [a, b)."""


@kernel(void(float64[::1], float64[::1], float64[::1], float64[::1], int8[::1], int32[:, ::1], int64[::1], int64[::1],
             int64, int64, float64, float64, float64, float64, float64, int32[::1], float64[::1], int64))
def greedy_backtest_kernel(open_, high, low, close, roll, greedy, starts, stops, P, max_pos, pv, tick, slip_ticks,
                           comm, bps, position, pnl, n_ranges):
    """greedy: int32 [T * P, 3], the action for (bar t, position index p = pos + max_pos);
    starts/stops: int64 [n_ranges] bar ranges; position (int32) and pnl (float64 USD): out [T],
    written inside each range (position held over bar t, net PnL of bar t; 0 at each range's first bar;
    the position is liquidated at the close of a range's last bar, where 0 is written)."""
    grid_wait()
    r = cuda.grid(1)
    if r >= n_ranges:
        return
    walk_range_dev(open_, high, low, close, roll, greedy, starts[r], stops[r], P, max_pos, pv, tick, slip_ticks, comm,
                   bps, position, pnl)


def enumerate_positions_ref(features: np.ndarray, P: int) -> np.ndarray:
    T, F = features.shape
    obs = np.zeros((T * P, F + P), np.float32)
    obs[:, :F] = np.repeat(features, P, axis=0)
    obs[np.arange(T * P), F + np.tile(np.arange(P), T)] = 1.0
    return obs
