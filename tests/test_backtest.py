"""The enumerated-position greedy backtest equals a bar-by-bar greedy reference exactly."""
from __future__ import annotations

import numpy as np
from numba import cuda

from cuda_kernels.actions import eps_greedy_kernel, greedy_ref
from cuda_kernels.backtest import enumerate_positions_kernel, enumerate_positions_ref, greedy_backtest_kernel
from cuda_kernels.env import action_to_order_ref
from workbench.accounting import simulate

BR, OFF = np.array([3, 3, 3], np.int32), np.array([0, 3, 6], np.int32)
P, MAXPOS = 7, 3


def test_enumerate_positions(rng):
    f = rng.normal(size=(5, 4)).astype(np.float32)
    out = cuda.to_device(np.full((5 * P, 4 + P), np.nan, np.float32))
    enumerate_positions_kernel[2, 32](cuda.to_device(f), 5, 4, P, out)
    assert np.array_equal(out.copy_to_host(), enumerate_positions_ref(f, P))


def test_greedy_backtest_equals_bar_by_bar(rng, bars):
    T = 90
    k = int(np.flatnonzero(bars.roll_mask)[0])
    sub = bars.slice(k - 40, k - 40 + T)  # crosses the roll
    spec = sub.market
    q = rng.normal(size=(T * P, 9)).astype(np.float32)  # stands in for the network's Q of every (bar, position)
    acts, joint = cuda.to_device(np.full((T * P, 3), -1, np.int32)), cuda.to_device(np.zeros(T * P, np.int32))
    eps_greedy_kernel[(T * P + 63) // 64, 64](cuda.to_device(q), 3, cuda.to_device(BR), cuda.to_device(OFF),
                                               cuda.to_device(np.zeros(1, np.float32)), 0, 0,
                                               cuda.to_device(np.zeros(1, np.int64)), acts, joint, T * P)
    greedy = acts.copy_to_host()
    assert np.array_equal(greedy, greedy_ref(q, list(BR)))
    cols = [sub.column(c) for c in ("open", "high", "low", "close")]
    roll = sub.roll_mask.astype(np.int8)
    starts, stops = np.array([0, 50]), np.array([50, T])  # two ranges in one launch
    pos_out = cuda.to_device(np.full(T, -99, np.int32))
    pnl_out = cuda.to_device(np.full(T, np.nan))
    greedy_backtest_kernel[1, 32](*(cuda.to_device(c) for c in cols), cuda.to_device(roll), cuda.to_device(greedy),
                                  cuda.to_device(starts), cuda.to_device(stops), P, MAXPOS, spec.point_value,
                                  spec.tick_size, spec.slippage_ticks, spec.commission_per_side, spec.commission_bps,
                                  pos_out, pnl_out, 2)
    got_pos, got_pnl = pos_out.copy_to_host(), pnl_out.copy_to_host()
    for a, b in zip(starts, stops):  # reference: step bar by bar, look up the greedy action of the held position
        rng_bars = sub.slice(a, b)
        c = rng_bars.column("close")
        n = b - a
        target, order, limit = np.zeros(n, np.int64), np.zeros(n, np.int8), c.copy()
        pos = 0
        for t in range(n - 1):
            target[t], order[t], lim = action_to_order_ref(greedy[(a + t) * P + pos + MAXPOS], pos, c[t], spec.tick_size)
            limit[t] = c[t] if np.isnan(lim) else lim
            target[t + 1:] = target[t]
            pos = int(simulate(target, rng_bars, spec, order=order, limit=limit).position[t + 1])
        ref = simulate(target, rng_bars, spec, order=order, limit=limit)
        assert np.array_equal(got_pos[a:b], ref.position * (np.arange(n) < n - 1))
        np.testing.assert_allclose(got_pnl[a:b], np.concatenate([[0.0], ref.pnl[1:]]), rtol=1e-12, atol=1e-9)
    assert len(set(got_pos)) > 2  # the policy did trade
