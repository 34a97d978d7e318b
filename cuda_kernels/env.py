"""Vectorised futures environment step, one thread per env, with the accounting of ``workbench.accounting``.

Kernel-side only (NumPy/Numba). Prices are float64 (PnL in USD must not drift). Env e holds bar
``t[e]``, position ``pos[e]`` and its episode end ``end[e]``. The agent's factored action at bar t is
(direction {0 short, 1 flat, 2 long}, size {0, 1, 2} -> 1..3 contracts, execution {0 market,
1 passive limit one tick inside the close, 2 keep the position}); each index is clamped to its range.
The order executes at bar t+1 exactly as ``simulate`` does: market at the open plus slippage, passive
limit only if bar t+1 trades through it (at the open if it opens through), commission per contract
and bps of notional, marks from the previous close (from the open on the first bar of a new
contract, with the contracts carried across charged two trades each). When t+1 is the episode's last bar the
position is liquidated at its close with slippage and commission. ``reward = pnl * reward_scale``.
"""
from __future__ import annotations

import numpy as np

from .nb import cached_njit, cuda, device_function, float32, float64, int8, int32, int64, kernel, void, grid_wait

EXEC_MARKET, EXEC_PASSIVE, EXEC_KEEP = 0, 1, 2


def fill_bar(open_, high, low, close, roll, n, pos, want, passive, lim, pv, slip, comm, bps):
    """Bar ``n`` of the futures accounting: the one source for the env step below (kernels and the CPU
    backend) and for ``workbench.accounting.simulate``.

    ``pos`` is held into bar n; the order to ``want`` was placed at bar n-1's close (``passive``: a
    limit at ``lim``, filled only if bar n trades through it, at the open if it opens through; else at
    bar n's open plus ``slip`` price points against us). Marks run from bar n-1's close, or from bar n's
    open when bar n starts a new contract (``roll[n]``), where the contracts carried into the new
    contract are rolled and charged two trades each (a position the fill closes or reverses trades
    once, as any fill). Commission: ``comm`` USD per contract per side plus ``bps`` of notional.

    Returns (pos after bar n, net USD PnL of bar n, roll commission, roll slippage, filled, fill price,
    PnL of the old position up to the fill, PnL of the new position from the fill, fill commission,
    fill slippage); costs in USD, every one of them already inside the net PnL.
    """
    ref = close[n - 1]
    pnl = 0.0
    roll_comm = 0.0
    roll_slip = 0.0
    filled = False
    fill = 0.0
    if want != pos:
        buy = want > pos
        if not passive:
            fill = open_[n] + slip if buy else open_[n] - slip
            filled = True
        elif buy and low[n] < lim:
            fill = min(lim, open_[n])
            filled = True
        elif (not buy) and high[n] > lim:
            fill = max(lim, open_[n])
            filled = True
    if roll[n] != 0:
        ref = open_[n]
        # only contracts carried into the new contract are rolled; those the fill closes trade once
        q = abs(pos)
        if filled:
            q = min(abs(pos), abs(want)) if pos * want > 0 else 0
        if q != 0:
            roll_comm = q * (2.0 * comm + 2.0 * bps * 1e-4 * open_[n] * pv)
            roll_slip = q * 2.0 * slip * pv
            pnl -= roll_comm + roll_slip
    old_part = 0.0
    new_part = 0.0
    fill_comm = 0.0
    fill_slip = 0.0
    if filled:
        q = abs(want - pos)
        fill_comm = q * (comm + bps * 1e-4 * fill * pv)
        fill_slip = 0.0 if passive else q * slip * pv  # inside the fill price already
        old_part = pv * pos * (fill - ref)
        new_part = pv * want * (close[n] - fill)
        pnl += old_part + new_part - fill_comm
        pos = want
    else:
        pnl += pv * pos * (close[n] - ref)
    return pos, pnl, roll_comm, roll_slip, filled, fill, old_part, new_part, fill_comm, fill_slip


def liquidation_cost(pos, price, pv, slip, comm, bps):
    """(commission, slippage) in USD of closing ``pos`` at ``price`` with slippage against us."""
    q = abs(pos)
    return q * (comm + bps * 1e-4 * price * pv), q * slip * pv


def _make_step_bar(fill_bar, liquidation_cost):
    def step_bar(open_, high, low, close, roll, t, pos, a_dir, a_size, a_exec, last, pv, tick, slip_ticks, comm, bps):
        """Apply the factored action decided at bar t; return (position over bar t+1, net USD PnL of bar t+1).
        ``last``: bar t+1 ends the episode (the position is liquidated at its close)."""
        d = min(max(a_dir, 0), 2)
        size = min(max(a_size, 0), 2) + 1
        ex = min(max(a_exec, 0), 2)
        want = pos if ex == EXEC_KEEP else (d - 1) * size
        slip = slip_ticks * tick
        n = t + 1
        lim = close[t] - tick if want > pos else close[t] + tick
        pos, pnl, _rc, _rs, _f, _p, _o, _w, _c, _s = fill_bar(open_, high, low, close, roll, n, pos, want,
                                                              ex == EXEC_PASSIVE, lim, pv, slip, comm, bps)
        if last and pos != 0:
            c, s = liquidation_cost(pos, close[n], pv, slip, comm, bps)
            pnl -= c + s
            pos = 0
        return pos, pnl

    return step_bar


# One source for the bar accounting: plain Python (the reference the tests call), a device function
# for the kernels, and njit for the CPU reference backend and workbench.accounting.simulate.
step_bar = _make_step_bar(fill_bar, liquidation_cost)
fill_bar_dev = device_function(fill_bar)
liquidation_cost_dev = device_function(liquidation_cost)
step_bar_dev = device_function(_make_step_bar(fill_bar_dev, liquidation_cost_dev))
fill_bar_cpu = cached_njit(fill_bar)
liquidation_cost_cpu = cached_njit(liquidation_cost)
step_bar_cpu = cached_njit(_make_step_bar(fill_bar_cpu, liquidation_cost_cpu))


def _make_env_step_one(step_bar):
    def env_step_one(open_, high, low, close, roll, t_arr, end_arr, pos_arr, actions, e, pv, tick, slip_ticks, comm,
                     bps):
        """Env e takes its action at bar t_arr[e] and moves to the next bar; returns (net USD PnL of that
        bar, whether it ended the episode)."""
        t = t_arr[e]
        finished = t + 1 >= end_arr[e] - 1
        pos, pnl = step_bar(open_, high, low, close, roll, t, pos_arr[e], actions[e, 0], actions[e, 1],
                            actions[e, 2], finished, pv, tick, slip_ticks, comm, bps)
        pos_arr[e] = pos
        t_arr[e] = t + 1
        return pnl, finished

    return env_step_one


# One source for an env's step too: the kernel's thread body and the CPU backend's loop body.
env_step_one_dev = device_function(_make_env_step_one(step_bar_dev))
env_step_one_cpu = cached_njit(_make_env_step_one(step_bar_cpu))


@kernel(void(float64[::1], float64[::1], float64[::1], float64[::1], int8[::1], int64[::1], int64[::1], int32[::1],
             int32[:, ::1], float64, float64, float64, float64, float64, float32, float32[::1], float32[::1],
             float64[::1], int64))
def env_step_kernel(open_, high, low, close, roll, t_arr, end_arr, pos_arr, actions, pv, tick, slip_ticks, comm, bps,
                    reward_scale, reward, done, pnl_out, N):
    """One step of N envs. t_arr, end_arr: int64 [N]; pos_arr: int32 [N]; actions: int32 [N, 3];
    reward, done: out float32 [N]; pnl_out: out float64 [N] (USD)."""
    grid_wait()
    e = cuda.grid(1)
    if e >= N:
        return
    pnl, finished = env_step_one_dev(open_, high, low, close, roll, t_arr, end_arr, pos_arr, actions, e, pv, tick,
                                     slip_ticks, comm, bps)
    pnl_out[e] = pnl
    reward[e] = float32(pnl) * reward_scale
    done[e] = 1.0 if finished else 0.0


@cached_njit
def env_step_cpu(open_, high, low, close, roll, t_arr, end_arr, pos_arr, actions, pv, tick, slip_ticks, comm, bps,
                 reward_scale):  # pragma: no cover (compiled)
    """CPU twin of ``env_step_kernel`` (the CPU backend): returns (reward, done) float32 [N]."""
    N = t_arr.shape[0]
    reward = np.zeros(N, np.float32)
    done = np.zeros(N, np.float32)
    for e in range(N):
        pnl, finished = env_step_one_cpu(open_, high, low, close, roll, t_arr, end_arr, pos_arr, actions, e, pv, tick,
                                         slip_ticks, comm, bps)
        reward[e] = np.float32(pnl) * reward_scale
        done[e] = 1.0 if finished else 0.0
    return reward, done


def action_to_order_ref(action, pos: int, close_t: float, tick: float):
    """(target, order kind for ``simulate``, limit price) of one factored action; the reference decoding."""
    d, size, ex = (min(max(int(a), 0), 2) for a in action)
    if ex == EXEC_KEEP:
        return pos, 0, float("nan")
    want = (d - 1) * (size + 1)
    if ex == EXEC_MARKET:
        return want, 0, float("nan")
    return want, 1, (close_t - tick if want > pos else close_t + tick)
