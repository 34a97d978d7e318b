"""Experience plumbing: observations from resident features, env resets, n-step transitions, and the
validation Sharpe reduced on the device.

Kernel-side only (NumPy/Numba). A transition stores bar indices and positions, never observations:
``int_store[slot] = (t, pos_index, a_dir, a_size, a_exec, t_next, pos_index_next)`` and
``float_store[slot] = (n-step discounted reward, done)``. Observations are rebuilt from the window's
resident feature matrix when a batch is gathered: ``features[t] ++ one_hot(pos_index)``.
"""
from __future__ import annotations

import math

import numpy as np

from .nb import VOTE, cuda, device_function, float32, float64, int32, int64, uint32, void, kernel
from .nb import U, grid_wait
from .per import draw_dev, draw_step_dev, finish_draw_dev
from .philox import uniform4_dev, uniforms4_ref

TAG_RESET = 0x5253
N_INT, N_FLOAT = 7, 2


@kernel(void(float32[:, ::1], int64[::1], int32[::1], int64, int64, int64, float32[:, ::1]))
def env_obs_kernel(features, t_arr, pos_arr, N, F, max_pos, obs):
    """obs: out [N, F + 2 * max_pos + 1] for envs at bars t_arr with positions pos_arr."""
    grid_wait()
    P = 2 * max_pos + 1
    for e in range(cuda.grid(1), N * (F + P), cuda.gridsize(1)):
        i, c = e // (F + P), e % (F + P)
        if c < F:
            obs[i, c] = features[t_arr[i], c]
        else:
            obs[i, c] = 1.0 if c - F == min(max(pos_arr[i] + max_pos, 0), P - 1) else 0.0


@device_function
def _obs_value(features, int_store, row, tc, pc, c, F):
    """Column c of the observation a transition stores as (bar in column ``tc``, position index in ``pc``)
    of ``int_store[row]``: ``features[bar] ++ one_hot(position index)``."""
    r = int_store[U(row)]
    if c < F:
        return features[U(r[tc]), U(c)]
    return float32(1.0) if c - F == r[pc] else float32(0.0)


@kernel(void(float32[::1], float64[::1], float64[::1], int64, int64[::1], int64, float32, uint32, uint32, int64[::1],
             int32[::1], int64[::1], float32[::1], int32[::1], float32[:, ::1], int32[:, ::1], float32[:, ::1], int64,
             int64, float32[:, ::1], int32[:, ::1], float32[::1], float32[::1]))
def draw_batch_kernel(prio, sub, tiles, subs_per_tile, size_arr, batch, beta, k0, k1, step_arr, guard, out_idx, out_w,
                      arrivals, features, int_store, float_store, F, P, obs_pair, actions, reward, done):
    """An update's sample in one launch: :func:`cuda_kernels.per.per_sample_kernel`'s draw (the same
    arguments first, the same draws, counter and weights), then each sample's warp gathers the drawn
    transition, whose slot its lanes all hold: s and s' (``features[t] ++ one_hot(pos_index)``, F + P
    columns) into rows i and batch + i of ``obs_pair`` (float32 [2 batch, F + P]), its actions
    (int32 [batch, 3]), n-step return and terminal flag (float32 [batch]). Launch:
    :func:`cuda_kernels.per.sample_launch`. Three launches fewer than drawing and gathering apart."""
    grid_wait()
    s = cuda.shared.array(1024, float32)
    last = cuda.shared.array(1, int32)
    g = cuda.grid(1)
    lane = g % VOTE
    i = g // VOTE
    step = draw_step_dev(step_arr, guard)
    j, w = draw_dev(prio, sub, tiles, subs_per_tile, size_arr[0], batch, beta, k0, k1, step, i, lane, VOTE)
    if i < batch:
        if lane == 0:
            out_idx[i] = j
            out_w[i] = w
            reward[i] = float_store[U(j), 0]
            done[i] = float_store[U(j), 1]
        if lane < 3:
            actions[U(i), U(lane)] = int_store[U(j), U(2 + lane)]
        for c in range(lane, F + P, VOTE):
            obs_pair[U(i), U(c)] = _obs_value(features, int_store, j, 0, 1, c, F)
            obs_pair[U(batch + i), U(c)] = _obs_value(features, int_store, j, 5, 6, c, F)
    finish_draw_dev(step_arr, step, out_w, batch, arrivals, s, last)


@kernel(void(int64[::1], int64[::1], int32[::1], float32[::1], int64, int64, int64, uint32, uint32, int64[::1], int64))
def env_reset_kernel(t_arr, end_arr, pos_arr, done, lo, hi, episode_len, k0, k1, step_arr, N):
    """Envs whose ``done`` is set (or all, before the first step, when done is 1) restart flat at a random
    bar in [lo, hi - episode_len] and run for episode_len bars."""
    grid_wait()
    e = cuda.grid(1)
    if e >= N or done[e] == 0:
        return
    u, _a, _b, _c = uniform4_dev(e, step_arr[0], TAG_RESET, k0, k1)
    span = hi - episode_len - lo
    start = lo + min(int64(u * (span + 1)), span)
    t_arr[e] = start
    end_arr[e] = start + episode_len
    pos_arr[e] = 0
    done[e] = 0.0


@kernel(void(int64[:, ::1], int32[:, ::1], int32[:, :, ::1], float32[:, ::1], float32[:, ::1], int64, int64, int64,
             float32, int64, int32[:, ::1], float32[:, ::1], int64[::1]))
def rollout_to_transitions_kernel(t_hist, pos_hist, act_hist, rew_hist, done_hist, N, K, K_emit, gamma, nstep,
                                  int_out, float_out, count):
    """Histories of K steps for N envs ([N, K + 1] bars/positions, [N, K, 3] actions, [N, K] rewards and
    done flags) -> n-step transitions for the first K_emit steps. Step k of env e yields one transition
    when its n-step window fits in the rollout or meets a done flag first (truncated return, done = 1);
    with K = K_emit + n - 1 every emitted step does. int_out/float_out: out [N * K_emit, 7] /
    [N * K_emit, 2], rows e * K_emit + k; ``count[row]`` is 1 where a row was written, else 0."""
    grid_wait()
    j = cuda.grid(1)
    if j >= N * K_emit:
        return
    e, k = j // K_emit, j % K_emit
    R = float32(0.0)
    g = float32(1.0)
    end_k = -1
    terminal = False
    for m in range(nstep):
        if k + m >= K:
            break
        R += g * rew_hist[e, k + m]
        g *= gamma
        if done_hist[e, k + m] != 0:
            end_k = k + m
            terminal = True
            break
        end_k = k + m
    if not terminal and end_k - k + 1 < nstep:
        count[j] = 0
        return
    int_out[j, 0] = int32(t_hist[e, k])  # columns: cuda_kernels.slots.ReplayInt / ReplayFloat
    int_out[j, 1] = pos_hist[e, k]
    int_out[j, 2] = act_hist[e, k, 0]
    int_out[j, 3] = act_hist[e, k, 1]
    int_out[j, 4] = act_hist[e, k, 2]
    int_out[j, 5] = int32(t_hist[e, end_k + 1])
    int_out[j, 6] = pos_hist[e, end_k + 1]
    float_out[j, 0] = R
    float_out[j, 1] = 1.0 if terminal else 0.0
    count[j] = 1


VAL_STATS = 8  # validation_stats_kernel's outputs, in this order:
VAL_DAILY_SHARPE, VAL_PNL, VAL_DAYS, VAL_MAX_DD, VAL_BAR_MEAN, VAL_BAR_STD, VAL_BARS, VAL_BAR_T = range(VAL_STATS)


@kernel(void(float64[::1], int32[::1], int64, int64, float64[::1]))
def validation_stats_kernel(pnl, day, start, stop, out):
    """One thread: statistics of the net USD PnL of bars [start, stop), capital-free. out float64 [8] =
    (annualised Sharpe of daily PnL (252 days, ddof 1), net PnL USD, days, max drawdown USD (<= 0, of the
    cumulative PnL against its running peak), mean and std (ddof 1) of per-bar PnL USD, bars, and the
    t-statistic of the per-bar mean, mean / std * sqrt(bars)). Zero where undefined."""
    grid_wait()
    if cuda.grid(1) != 0:
        return
    cum = 0.0
    peak = 0.0
    mdd = 0.0
    d1 = 0.0
    d2 = 0.0
    nd = 0
    day_pnl = 0.0
    b1 = 0.0
    b2 = 0.0
    for t in range(start, stop):
        x = pnl[t]
        day_pnl += x
        b1 += x
        b2 += x * x
        if t == stop - 1 or day[t + 1] != day[t]:
            cum += day_pnl
            d1 += day_pnl
            d2 += day_pnl * day_pnl
            nd += 1
            day_pnl = 0.0
        peak = max(peak, cum + day_pnl)
        mdd = min(mdd, cum + day_pnl - peak)
    nb = stop - start
    sharpe = 0.0
    if nd > 1:
        m = d1 / nd
        var = (d2 - nd * m * m) / (nd - 1)
        sharpe = m / math.sqrt(var) * math.sqrt(252.0) if var > 0 else 0.0
    bmean = b1 / nb if nb > 0 else 0.0
    bstd = 0.0
    bt = 0.0
    if nb > 1:
        bvar = (b2 - nb * bmean * bmean) / (nb - 1)
        if bvar > 0:
            bstd = math.sqrt(bvar)
            bt = bmean / bstd * math.sqrt(float(nb))
    out[0] = sharpe
    out[1] = b1
    out[2] = nd
    out[3] = mdd
    out[4] = bmean
    out[5] = bstd
    out[6] = nb
    out[7] = bt


@kernel(void(int64[::1], int64[::1], int32[::1], int32[:, ::1], float32[::1], float32[::1], int64[:, ::1],
             int32[:, ::1], int32[:, :, ::1], float32[:, ::1], float32[:, ::1], int64, int64, int64))
def record_step_kernel(k_arr, t_arr, pos_arr, actions, reward, done, t_hist, pos_hist, act_hist, rew_hist, done_hist,
                       N, max_pos, phase):
    """Write one experience step into the rollout history at column k = k_arr[0] (a device counter, so
    one captured graph serves every step). phase 0, before the env step: bar, position index and
    action at k; phase 1, after it: reward and done at k; phase 2, after resets: bar and position
    index at k + 1."""
    grid_wait()
    e = cuda.grid(1)
    if e >= N:
        return
    k = k_arr[0]
    if phase == 0:
        t_hist[e, k] = t_arr[e]
        pos_hist[e, k] = pos_arr[e] + max_pos
        for c in range(3):
            act_hist[e, k, c] = actions[e, c]
    elif phase == 1:
        rew_hist[e, k] = reward[e]
        done_hist[e, k] = done[e]
    else:
        t_hist[e, k + 1] = t_arr[e]
        pos_hist[e, k + 1] = pos_arr[e] + max_pos


@kernel(void(int64[::1], int64))
def set_counter_kernel(counter, value):
    grid_wait()
    if cuda.grid(1) == 0:
        counter[0] = value


# ---- NumPy references ----

def rollout_to_transitions_ref(t_hist, pos_hist, act_hist, rew_hist, done_hist, gamma, nstep, K_emit=None):
    N, K = rew_hist.shape
    K_emit = K if K_emit is None else K_emit
    rows = {}
    for e in range(N):
        for k in range(K_emit):
            R, g, end_k, term = 0.0, 1.0, -1, False
            for m in range(nstep):
                if k + m >= K:
                    break
                R += g * rew_hist[e, k + m]
                g *= gamma
                end_k = k + m
                if done_hist[e, k + m]:
                    term = True
                    break
            if term or end_k - k + 1 == nstep:
                rows[e * K_emit + k] = ((t_hist[e, k], pos_hist[e, k], *act_hist[e, k], t_hist[e, end_k + 1],
                                    pos_hist[e, end_k + 1]), (R, 1.0 if term else 0.0))
    return rows


def env_reset_ref(t, end, pos, done, lo, hi, episode_len, k0, k1, step) -> None:
    """NumPy twin of ``env_reset_kernel`` (in place; the CPU backend's resets): the same Philox draws."""
    idx = np.flatnonzero(done != 0)
    if len(idx):
        u = uniforms4_ref(len(done), step, TAG_RESET, k0, k1)[idx, 0]
        span = hi - episode_len - lo
        start = lo + np.minimum((u.astype(np.float64) * (span + 1)).astype(np.int64), span)
        t[idx], end[idx], pos[idx] = start, start + episode_len, 0
        done[idx] = 0


def rollout_to_transitions_cpu(t_hist, pos_hist, act_hist, rew_hist, done_hist, K_emit, gamma, nstep):
    """The CPU backend's twin of ``rollout_to_transitions_kernel`` (vectorised over envs and steps) for
    K = K_emit + n - 1, where every emitted step yields a transition: (int rows [N * K_emit, N_INT],
    float rows [N * K_emit, N_FLOAT]) in the kernel's row order and float32 arithmetic."""
    N = t_hist.shape[0]
    k = np.arange(K_emit)
    R = np.zeros((N, K_emit), np.float32)
    g = np.float32(1.0)
    alive = np.ones((N, K_emit), bool)
    terminal = np.zeros((N, K_emit), bool)
    end_k = np.broadcast_to(k, (N, K_emit)).copy()
    for m in range(nstep):
        kk = k + m
        R += np.where(alive, g * rew_hist[:, kk], 0).astype(np.float32)
        end_k = np.where(alive, kk, end_k)
        terminal |= alive & (done_hist[:, kk] != 0)
        alive &= done_hist[:, kk] == 0
        g = np.float32(g * gamma)
    e = np.repeat(np.arange(N), K_emit).reshape(N, K_emit)
    ints = np.stack([t_hist[:, :K_emit], pos_hist[:, :K_emit], act_hist[:, :K_emit, 0], act_hist[:, :K_emit, 1],
                     act_hist[:, :K_emit, 2], t_hist[e, end_k + 1], pos_hist[e, end_k + 1]], axis=-1)
    floats = np.stack([R, terminal.astype(np.float32)], -1)
    return ints.reshape(N * K_emit, N_INT).astype(np.int32), floats.reshape(N * K_emit, N_FLOAT)


def validation_stats_ref(pnl, day, start, stop):
    """NumPy reference of ``validation_stats_kernel``."""
    import pandas as pd

    x = np.asarray(pnl[start:stop], dtype=np.float64)
    d = pd.Series(x).groupby(day[start:stop], sort=False).sum().to_numpy()
    sharpe = d.mean() / d.std(ddof=1) * np.sqrt(252) if len(d) > 1 and d.std(ddof=1) > 0 else 0.0
    cum = np.cumsum(x)
    mdd = float(np.min(np.minimum(cum - np.maximum.accumulate(np.maximum(cum, 0.0)), 0.0))) if len(x) else 0.0
    n = len(x)
    bstd = x.std(ddof=1) if n > 1 else 0.0
    bt = x.mean() / bstd * np.sqrt(n) if bstd > 0 else 0.0
    return np.array([sharpe, x.sum(), len(d), mdd, x.mean() if n else 0.0, bstd, n, bt])