"""The GPU env step against ``workbench.accounting.simulate`` on the same factored actions."""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from cuda_kernels.env import action_to_order_ref, env_step_kernel
from workbench.accounting import simulate


@pytest.mark.parametrize("seed", [0, 1])
def test_env_step_equals_simulate(bars, seed):
    rng = np.random.default_rng(seed)
    k = int(np.flatnonzero(bars.roll_mask)[0])
    start = k - 20 if seed == 0 else 500  # seed 0 crosses the roll
    T = 48
    sub = bars.slice(start, start + T)
    spec = sub.market
    o, h, l, c = (sub.column(x) for x in ("open", "high", "low", "close"))
    roll = sub.roll_mask.astype(np.int8)
    actions = rng.integers(0, 3, (T - 1, 3)).astype(np.int32)
    actions[rng.random(T - 1) < 0.1, 0] = 9  # out of range: clamped
    # the reference: decode each action against the position simulate will hold, then simulate
    target, order, limit = np.zeros(T, np.int64), np.zeros(T, np.int8), np.full(T, np.nan)
    pos = 0
    for t in range(T - 1):
        target[t], order[t], limit[t] = action_to_order_ref(actions[t], pos, c[t], spec.tick_size)
        r = simulate(np.where(np.arange(T) <= t, target, target[t]), sub, spec, order=order, limit=np.nan_to_num(limit, nan=c))
        pos = r.position[t + 1]
    target[T - 1] = target[T - 2]
    ref = simulate(target, sub, spec, order=order, limit=np.nan_to_num(limit, nan=c))
    # one env stepping through the same bars on the device
    d = {name: cuda.to_device(x) for name, x in dict(o=o, h=h, l=l, c=c, roll=roll).items()}
    t_arr, end_arr, pos_arr = cuda.to_device(np.zeros(1, np.int64)), cuda.to_device(np.array([T])), cuda.to_device(np.zeros(1, np.int32))
    rew, done, pnl = cuda.to_device(np.full(1, np.nan, np.float32)), cuda.to_device(np.full(1, np.nan, np.float32)), cuda.to_device(np.full(1, np.nan))
    got = []
    for t in range(T - 1):
        env_step_kernel[1, 1](d["o"], d["h"], d["l"], d["c"], d["roll"], t_arr, end_arr, pos_arr,
                              cuda.to_device(actions[t:t + 1]), spec.point_value, spec.tick_size, spec.slippage_ticks,
                              spec.commission_per_side, spec.commission_bps, 1e-3, rew, done, pnl, 1)
        got.append(pnl.copy_to_host()[0])
        assert done.copy_to_host()[0] == (1.0 if t == T - 2 else 0.0)
        assert rew.copy_to_host()[0] == pytest.approx(got[-1] * 1e-3, rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(got, ref.pnl[1:], rtol=1e-12, atol=1e-9)
    assert pos_arr.copy_to_host()[0] == 0 and t_arr.copy_to_host()[0] == T - 1
    assert (ref.position != 0).any()


def test_cpu_step_is_the_same_function(rng, bars):
    from cuda_kernels.env import step_bar, step_bar_cpu

    o, h, l, c = (bars.column(x) for x in ("open", "high", "low", "close"))
    roll = bars.roll_mask.astype(np.int8)
    spec = bars.market
    for _ in range(50):
        t = int(rng.integers(0, len(bars) - 2))
        args = (o, h, l, c, roll, t, int(rng.integers(-3, 4)), *map(int, rng.integers(0, 3, 3)), bool(rng.random() < 0.1),
                spec.point_value, spec.tick_size, spec.slippage_ticks, spec.commission_per_side, spec.commission_bps)
        assert step_bar_cpu(*args) == step_bar(*args)
