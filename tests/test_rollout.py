from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from numba import cuda

from cuda_kernels import rollout as R
from workbench import metrics as M



def test_env_obs(rng):
    T, F, maxp = 12, 5, 3
    P = 2 * maxp + 1
    feats = rng.normal(size=(T, F)).astype(np.float32)
    t = rng.integers(0, T, 6)
    pos = rng.integers(-3, 4, 6).astype(np.int32)
    obs = cuda.to_device(np.full((6, F + P), np.nan, np.float32))
    R.env_obs_kernel[2, 32](cuda.to_device(feats), cuda.to_device(t), cuda.to_device(pos), 6, F, maxp, obs)
    want = np.concatenate([feats[t], np.eye(P, dtype=np.float32)[pos + maxp]], axis=1)
    assert np.array_equal(obs.copy_to_host(), want)


def test_the_draw_gathers_the_drawn_transitions(rng):
    """draw_batch_kernel draws what per_sample_kernel draws (slots, weights, the advanced counter) and
    gathers each drawn transition: s over s' (features of its bars and the one-hot of its positions),
    its actions, n-step return and terminal flag; every output poisoned first."""
    from cuda_kernels import per, scan

    T, F, P, cap, size, batch, threads = 12, 5, 7, 40, 33, 11, 8
    feats = rng.normal(size=(T, F)).astype(np.float32)
    store = rng.integers(0, T, (cap, R.N_INT)).astype(np.int32)
    store[:, [1, 6]] = rng.integers(0, P, (cap, 2))
    fstore = rng.normal(size=(cap, R.N_FLOAT)).astype(np.float32)
    prio = np.zeros(cap, np.float32)
    prio[:size] = rng.uniform(0.1, 2.0, size)
    dev = cuda.to_device
    sub, tiles = dev(np.zeros(scan.n_subs(cap, threads))), dev(np.zeros(scan.n_tiles(cap, threads)))
    arrivals, d_prio, fill = dev(np.zeros(3, np.int32)), dev(prio), dev(np.array([size]))
    scan.launch_scan(d_prio, dev(np.zeros(scan.n_subs(cap, threads))), sub, tiles, cap, threads, arrivals[0:1], fill)
    k0, step0 = int(rng.integers(0, 2**32)), int(rng.integers(0, 1000))
    outs = []
    for fused in (False, True):
        idx, w = dev(np.full(batch, -9, np.int64)), dev(np.full(batch, np.nan, np.float32))
        step = dev(np.array([step0]))
        args = (d_prio, sub, tiles, scan.subs_per_tile(threads), fill, batch, 0.4, k0, 5, step,
                dev(np.zeros(1, np.int32)), idx, w, arrivals[1 + fused:2 + fused])
        if fused:
            obs = dev(np.full((2 * batch, F + P), np.nan, np.float32))
            a, r, d = (dev(np.full((batch, 3), -1, np.int32)), dev(np.full(batch, np.nan, np.float32)),
                       dev(np.full(batch, np.nan, np.float32)))
            R.draw_batch_kernel[per.sample_launch(batch)](*args, dev(feats), dev(store), dev(fstore), F, P, obs, a, r,
                                                          d)
        else:
            per.per_sample_kernel[per.sample_launch(batch)](*args)
        outs.append((idx.copy_to_host(), w.copy_to_host(), step.copy_to_host()))
    for x, y in zip(*outs):
        assert np.array_equal(x, y)
    j = outs[1][0]
    assert outs[1][2][0] == step0 + 1 and (j >= 0).all() and (j < size).all()
    onehot = np.eye(P, dtype=np.float32)
    want = np.concatenate([np.concatenate([feats[store[j, 0]], onehot[store[j, 1]]], axis=1),
                           np.concatenate([feats[store[j, 5]], onehot[store[j, 6]]], axis=1)])
    assert np.array_equal(obs.copy_to_host(), want)
    assert np.array_equal(a.copy_to_host(), store[j, 2:5])
    assert np.array_equal(r.copy_to_host(), fstore[j, 0]) and np.array_equal(d.copy_to_host(), fstore[j, 1])


def test_env_reset_only_done_envs_inside_range(rng):
    N = 40
    t, end = cuda.to_device(np.full(N, 7)), cuda.to_device(np.full(N, 9))
    pos = cuda.to_device(np.full(N, 2, np.int32))
    done = (rng.random(N) < 0.5).astype(np.float32)
    d = cuda.to_device(done)
    R.env_reset_kernel[2, 32](t, end, pos, d, 100, 500, 50, 3, 4, cuda.to_device(np.array([5])), N)
    tt, ee, pp = t.copy_to_host(), end.copy_to_host(), pos.copy_to_host()
    r = done == 1
    assert ((tt[r] >= 100) & (tt[r] <= 450)).all() and (ee[r] == tt[r] + 50).all() and (pp[r] == 0).all()
    assert (tt[~r] == 7).all() and (pp[~r] == 2).all() and (d.copy_to_host() == 0).all()


def test_rollout_to_nstep_transitions(rng):
    N, K, n, gamma = 3, 9, 3, 0.9
    t_hist = np.cumsum(rng.integers(1, 3, (N, K + 1)), axis=1).astype(np.int64)
    pos_hist = rng.integers(0, 7, (N, K + 1)).astype(np.int32)
    act_hist = rng.integers(0, 3, (N, K, 3)).astype(np.int32)
    rew = rng.normal(size=(N, K)).astype(np.float32)
    done = np.zeros((N, K), np.float32)
    done[0, 4] = 1  # an episode end inside the rollout
    io = cuda.to_device(np.full((N * K, 7), -5, np.int32))
    fo = cuda.to_device(np.full((N * K, 2), np.nan, np.float32))
    cnt = cuda.to_device(np.full(N * K, -1, np.int64))
    R.rollout_to_transitions_kernel[1, 32](cuda.to_device(t_hist), cuda.to_device(pos_hist), cuda.to_device(act_hist),
                                           cuda.to_device(rew), cuda.to_device(done), N, K, K, gamma, n, io, fo, cnt)
    want = R.rollout_to_transitions_ref(t_hist, pos_hist, act_hist, rew, done, gamma, n)
    c = cnt.copy_to_host()
    assert set(np.flatnonzero(c == 1)) == set(want) and set(np.unique(c)) <= {0, 1}
    ints, floats = io.copy_to_host(), fo.copy_to_host()
    for j, (wi, wf) in want.items():
        assert tuple(ints[j]) == tuple(int(x) for x in wi)
        assert floats[j, 0] == pytest.approx(wf[0], rel=1e-5, abs=1e-5) and floats[j, 1] == wf[1]
    assert floats[0 * K + 3, 1] == 1.0 and floats[0 * K + 5, 1] == 0.0  # the done flag cuts the return
    # with K = K_emit + n - 1, every emitted step has a full window or a terminal: no gaps to compact
    K_emit = K - n + 1
    cnt2 = cuda.to_device(np.full(N * K_emit, -1, np.int64))
    io2, fo2 = cuda.to_device(np.full((N * K_emit, 7), -5, np.int32)), cuda.to_device(np.full((N * K_emit, 2), np.nan, np.float32))
    R.rollout_to_transitions_kernel[1, 32](cuda.to_device(t_hist), cuda.to_device(pos_hist), cuda.to_device(act_hist),
                                           cuda.to_device(rew), cuda.to_device(done), N, K, K_emit, gamma, n, io2, fo2, cnt2)
    assert (cnt2.copy_to_host() == 1).all()
    want2 = R.rollout_to_transitions_ref(t_hist, pos_hist, act_hist, rew, done, gamma, n, K_emit)
    assert len(want2) == N * K_emit
    for j, (wi, wf) in want2.items():
        assert tuple(io2.copy_to_host()[j]) == tuple(int(x) for x in wi)


@pytest.mark.parametrize("seed", [int(x) for x in np.random.SeedSequence().generate_state(2)])
def test_validation_stats_match_reference_and_metrics(seed):
    rng = np.random.default_rng(seed)
    pnl = rng.normal(20, 400, 300) * (rng.random(300) < 0.7)  # flat bars too
    day = np.repeat(np.arange(30), 10).astype(np.int32)
    out = cuda.to_device(np.full(R.VAL_STATS, np.nan))
    R.validation_stats_kernel[1, 1](cuda.to_device(pnl), cuda.to_device(day), 23, 281, out)
    got = out.copy_to_host()
    ref = R.validation_stats_ref(pnl, day, 23, 281)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9, err_msg=f"seed {seed}")
    x = pnl[23:281]
    d = pd.Series(x).groupby(day[23:281]).sum().to_numpy()
    assert got[R.VAL_DAILY_SHARPE] == pytest.approx(M.sharpe_ratio(d), rel=1e-9), f"seed {seed}"  # capital-free
    assert got[R.VAL_BAR_T] == pytest.approx(x.mean() / x.std(ddof=1) * np.sqrt(len(x)), rel=1e-9), f"seed {seed}"
    cum = np.cumsum(x)
    assert got[R.VAL_MAX_DD] == pytest.approx(min(0.0, np.min(cum - np.maximum.accumulate(np.maximum(cum, 0)))))
    assert (got[R.VAL_DAYS], got[R.VAL_BARS]) == (27, 258)


def test_record_step_phases(rng):
    N, K = 4, 5
    th, ph = cuda.to_device(np.full((N, K + 1), -1, np.int64)), cuda.to_device(np.full((N, K + 1), -1, np.int32))
    ah, rh = cuda.to_device(np.full((N, K, 3), -1, np.int32)), cuda.to_device(np.full((N, K), np.nan, np.float32))
    dh = cuda.to_device(np.full((N, K), np.nan, np.float32))
    k = cuda.to_device(np.array([2]))
    t, pos = rng.integers(0, 100, N), rng.integers(-3, 4, N).astype(np.int32)
    acts, rew, done = rng.integers(0, 3, (N, 3)).astype(np.int32), rng.normal(size=N).astype(np.float32), np.array([0, 1, 0, 0], np.float32)
    args = [cuda.to_device(x) for x in (t, pos, acts, rew, done)]
    for phase in (0, 1, 2):
        R.record_step_kernel[1, 32](k, *args, th, ph, ah, rh, dh, N, 3, phase)
    TH, PH, AH = th.copy_to_host(), ph.copy_to_host(), ah.copy_to_host()
    assert (TH[:, 2] == t).all() and (TH[:, 3] == t).all() and (PH[:, 2] == pos + 3).all() and (AH[:, 2] == acts).all()
    assert (rh.copy_to_host()[:, 2] == rew).all() and (dh.copy_to_host()[:, 2] == done).all()
    assert (TH[:, [0, 1, 4, 5]] == -1).all()
    R.set_counter_kernel[1, 1](k, 0)
    assert k.copy_to_host()[0] == 0


def test_episodes_stay_inside_a_training_range_shorter_than_episode_len(bars):
    """A short fold (hourly or daily bars): the episode is capped at the range less one bar, on both
    backends, so no episode starts before the range or runs past it."""
    from workbench.agent.cpu_trainer import CpuTrainer
    from workbench.agent.train_config import TrainConfig
    from workbench.agent.window import make_window
    from workbench.features import build_features
    from workbench.gpu_profile import GpuProfile

    fold = dict(train_start=200, train_stop=260, val_start=280, val_stop=300, test_start=320, test_stop=340)
    w = make_window(bars, build_features(bars), fold)
    assert w.episode_len(1024) == 59 and w.episode_len(30) == 30
    N = 40
    t, end = cuda.to_device(np.full(N, -1, np.int64)), cuda.to_device(np.full(N, -1, np.int64))
    pos, d = cuda.to_device(np.ones(N, np.int32)), cuda.to_device(np.ones(N, np.float32))
    R.env_reset_kernel[2, 32](t, end, pos, d, w.train[0], w.train[1], w.episode_len(1024), 3, 4,
                              cuda.to_device(np.array([5])), N)
    starts, ends = t.copy_to_host(), end.copy_to_host()
    assert (starts >= w.train[0]).all() and (ends <= w.train[1]).all() and (ends - starts == 59).all()
    cpu = CpuTrainer(GpuProfile(hidden=8, atoms=5, batch=8, n_envs=N), TrainConfig(episode_len=1024), bars.market,
                     100_000.0, seed=3)
    cpu.setup(w)  # resets every env once
    e = cpu.envs
    assert (e.t >= w.train[0]).all() and (e.end <= w.train[1]).all() and (e.end - e.t == 59).all()
    e.t[:], e.end[:], e.pos[:], e.step = -1, -1, 1, 5
    cpu.k0, cpu.k1 = 3, 4  # the kernel's keys above
    cpu.reset_envs(np.ones(N, np.float32))
    assert (e.t >= w.train[0]).all() and (e.end <= w.train[1]).all() and (e.end - e.t == 59).all()
    assert np.array_equal(e.t, starts) and np.array_equal(e.end, ends)  # the kernel's draws, on the host


def test_named_slots_cover_the_buffers_the_kernels_write():
    from cuda_kernels.slots import RF, RI, STAT

    assert tuple(RI) == tuple(range(R.N_INT)) and tuple(RF) == tuple(range(R.N_FLOAT))
    assert tuple(STAT) == (0, 1, 2, 3)  # grad_norm_guard_kernel's float32[4] statistics
