"""CPU reference backend: the same agent and training loop as :mod:`workbench.agent.trainer` in NumPy
(float64 network) and Numba-CPU (the env's bar step is the very function the GPU kernels compile).

It runs the main job on machines without a GPU (with the ``default`` profile's small sizes) and is
the oracle of the cross-backend test. Random draws use the same Philox streams (counter layout,
keys, tags) as the kernels. Phase times are host wall-clock milliseconds.
"""
from __future__ import annotations

import time

import numpy as np

from cuda_kernels import actions as K_act
from cuda_kernels import c51 as K_c51
from cuda_kernels import optim as K_opt
from cuda_kernels import per as K_per
from cuda_kernels import rollout as K_ro
from cuda_kernels.env import step_bar_cpu
from cuda_kernels.nb import cached_njit
from cuda_kernels.philox import uniforms4_ref
from cuda_kernels.slots import RF, RI

from ..gpu_profile import GpuProfile
from ..markets import MarketSpec
from .network import NetShape, backward_ref, forward_ref, init_params
from .loop import EpochStats, run_fold
from .train_config import TrainConfig
from .records import FoldTrainResult, philox_keys
from .window import MAX_POS, N_POS, Window


def eps_greedy_ref(q: np.ndarray, eps: float, step: int, k0: int, k1: int, branch_sizes) -> np.ndarray:
    N = q.shape[0]
    out = K_act.greedy_ref(q, list(branch_sizes))
    for br, n in enumerate(branch_sizes):
        u = uniforms4_ref(N, step, K_act.TAG_ACTION + br, k0, k1)
        explore = u[:, 0] < np.float32(eps)
        out[explore, br] = np.clip((u[explore, 1] * n).astype(np.int32), 0, n - 1)
    return out


@cached_njit  # cached per hash of cuda_kernels/ (fill_bar lives there): see cuda_kernels/nb.py
def env_step_cpu(o, h, l, c, roll, t_arr, end_arr, pos_arr, actions, pv, tick, slip, comm, bps, scale):  # pragma: no cover
    N = t_arr.shape[0]
    reward = np.zeros(N, np.float32)
    done = np.zeros(N, np.float32)
    for e in range(N):
        t = t_arr[e]
        last = t + 1 >= end_arr[e] - 1
        pos, pnl = step_bar_cpu(o, h, l, c, roll, t, pos_arr[e], actions[e, 0], actions[e, 1], actions[e, 2], last,
                                pv, tick, slip, comm, bps)
        pos_arr[e] = pos
        t_arr[e] = t + 1
        reward[e] = np.float32(pnl) * scale
        done[e] = 1.0 if last else 0.0
    return reward, done


@cached_njit  # cached per hash of cuda_kernels/ (fill_bar lives there): see cuda_kernels/nb.py
def greedy_backtest_cpu(o, h, l, c, roll, greedy, a, b, pv, tick, slip, comm, bps):  # pragma: no cover
    n = b - a
    position = np.zeros(n, np.int32)
    pnl = np.zeros(n)
    pos = 0
    for t in range(a, b - 1):
        row = t * 7 + min(max(pos + 3, 0), 6)
        pos, v = step_bar_cpu(o, h, l, c, roll, t, pos, greedy[row, 0], greedy[row, 1], greedy[row, 2], t + 1 == b - 1,
                              pv, tick, slip, comm, bps)
        position[t + 1 - a] = pos
        pnl[t + 1 - a] = v
    return position, pnl


def rollout_to_transitions_vec(t_hist, pos_hist, act_hist, rew_hist, done_hist, K_emit, gamma, nstep):
    """Vectorised equivalent of ``rollout_to_transitions_kernel`` for K_hist = K_emit + n - 1."""
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
    return ints.reshape(N * K_emit, 7).astype(np.int32), np.stack([R, terminal.astype(np.float32)], -1).reshape(-1, 2)


class CpuTrainer:
    """NumPy twin of :class:`~workbench.agent.trainer.DeviceTrainer` (same constructor, same result)."""

    def __init__(self, profile: GpuProfile, cfg: TrainConfig, spec: MarketSpec, capital: float, seed: int):
        self.profile, self.cfg, self.spec, self.capital, self.seed = profile, cfg, spec, capital, seed
        self.k0, self.k1 = philox_keys(seed)

    def _obs(self, feats, t, pos_index):
        return np.concatenate([feats[t].astype(np.float64), np.eye(N_POS)[pos_index]], axis=1)

    def _reset(self, done, w: Window):
        cfg = self.cfg
        idx = np.flatnonzero(done != 0)
        if len(idx):
            u = uniforms4_ref(self.profile.n_envs, self.env_step, K_ro.TAG_RESET, self.k0, self.k1)[idx, 0]
            episode = w.episode_len(cfg.episode_len)
            span = w.train[1] - episode - w.train[0]
            start = w.train[0] + np.minimum((u.astype(np.float64) * (span + 1)).astype(np.int64), span)
            self.t[idx], self.end[idx], self.pos[idx] = start, start + episode, 0
            done[idx] = 0

    def _update(self, w: Window, shape: NetShape, support) -> tuple[float, float, float, bool]:
        cfg, B = self.cfg, self.profile.batch
        self.step += 1
        size = self.size
        idx, isw = K_per.per_sample_ref(self.prio, size, B, cfg.per_beta, self.k0, self.k1, self.step)
        ints, floats = self.int_store[idx], self.float_store[idx]
        s = self._obs(w.features, ints[:, RI.T], ints[:, RI.POS])
        s2 = self._obs(w.features, ints[:, RI.T_NEXT], ints[:, RI.POS_NEXT])
        a_s = forward_ref(self.params, s, shape, support)
        a_s2 = forward_ref(self.params, s2, shape, support)
        t_s2 = forward_ref(self.target, s2, shape, support)
        dhead, loss = K_c51.c51_loss_ref(a_s["logp"], a_s2["q"], t_s2["logp"], ints[:, RI.DIR:RI.EXEC + 1], floats[:, RF.RETURN],
                                         floats[:, RF.TERMINAL],
                                         cfg.gamma ** cfg.n_step, cfg.v_min, cfg.v_max, shape.atoms, isw,
                                         list(shape.branch_sizes), 1.0 / B)
        grads = backward_ref(self.params, s, a_s, dhead, shape).astype(np.float32)
        self.last = {"idx": idx, "isw": isw, "loss": loss, "grads": grads}  # for the cross-backend test
        norm, scale = K_opt.grad_norm_ref(grads, cfg.grad_clip)
        mean_loss = float(np.sum(isw * loss) / B)
        max_q = float(np.max(np.abs(a_s["q"])))
        if not (np.isfinite(mean_loss) and np.isfinite(norm)) or max_q > cfg.q_limit:
            return mean_loss, norm, max_q, True
        self.params, self.m, self.v = K_opt.adam_ref(self.params, grads, self.m, self.v, cfg.lr, cfg.adam_beta1,
                                                     cfg.adam_beta2, cfg.adam_eps, cfg.weight_decay, self.step, scale)
        self.prio, _ = K_per.priority_update_ref(self.prio, idx, loss.astype(np.float32), cfg.per_alpha, cfg.per_eps)
        self.max_prio = max(self.max_prio, float(((np.abs(loss) + cfg.per_eps) ** cfg.per_alpha).max()))
        self.target = K_opt.ema_ref(self.target, self.params, cfg.tau)
        return mean_loss, norm, max_q, False

    def _backtest(self, params, w: Window, rng, shape, support):
        a, b = rng
        obs = self._obs(w.features, np.repeat(np.arange(a, b), N_POS), np.tile(np.arange(N_POS), b - a))
        q = forward_ref(params, obs, shape, support)["q"].astype(np.float32)
        greedy = np.zeros((w.n_bars * N_POS, 3), np.int32)
        greedy[a * N_POS:b * N_POS] = K_act.greedy_ref(q, list(shape.branch_sizes))
        sp = self.spec
        pos, pnl = greedy_backtest_cpu(w.open, w.high, w.low, w.close, w.roll, greedy, a, b, sp.point_value,
                                       sp.tick_size, sp.slippage_ticks, sp.commission_per_side, sp.commission_bps)
        return pos, pnl, greedy

    def train_fold(self, w: Window, on_epoch=None, test: bool = True) -> FoldTrainResult:
        """Train on the fold (the shared epoch loop, :func:`workbench.agent.loop.run_fold`)."""
        return run_fold(self, self.cfg, w, on_epoch, test)

    # ---------------------------------------------------------------- the phases run_fold drives
    def setup(self, w: Window) -> None:
        cfg, prof = self.cfg, self.profile
        self.w = w
        self.shape = NetShape(obs_dim=w.n_features + N_POS, hidden=prof.hidden, atoms=prof.atoms)
        self.support = np.linspace(cfg.v_min, cfg.v_max, self.shape.atoms).astype(np.float32).astype(np.float64)
        self.params = init_params(self.shape, self.seed)
        self.target, self.best = self.params.copy(), self.params.copy()
        self.m, self.v = np.zeros_like(self.params), np.zeros_like(self.params)
        N, Ke = prof.n_envs, cfg.rollout_steps
        self.K_hist = Ke + cfg.n_step - 1
        self.cap = cap = max(cfg.replay_capacity, 2 * N * Ke)
        self.int_store, self.float_store = np.zeros((cap, K_ro.N_INT), np.int32), np.zeros((cap, K_ro.N_FLOAT), np.float32)
        self.prio, self.max_prio, self.size, self.ptr = np.zeros(cap, np.float32), 1.0, 0, 0
        self.t, self.end, self.pos = np.zeros(N, np.int64), np.zeros(N, np.int64), np.zeros(N, np.int32)
        self.step, self.env_step = 0, 0
        self._reset(np.ones(N, np.float32), w)

    def snapshot(self) -> None:
        self.snap = (self.params.copy(), self.target.copy(), self.m.copy(), self.v.copy())

    def restore(self) -> None:
        self.params, self.target, self.m, self.v = (x.copy() for x in self.snap)

    def experience(self, eps: float) -> None:
        cfg, w, sp, shape, N = self.cfg, self.w, self.spec, self.shape, self.profile.n_envs
        ta = time.perf_counter()
        K_hist = self.K_hist
        th, ph = np.zeros((N, K_hist + 1), np.int64), np.zeros((N, K_hist + 1), np.int32)
        ah, rh, dh = np.zeros((N, K_hist, 3), np.int32), np.zeros((N, K_hist), np.float32), np.zeros((N, K_hist), np.float32)
        for k in range(K_hist):
            q = forward_ref(self.params, self._obs(w.features, self.t, self.pos + MAX_POS), shape, self.support)["q"]
            acts = eps_greedy_ref(q.astype(np.float32), eps, self.env_step, self.k0, self.k1, shape.branch_sizes)
            th[:, k], ph[:, k], ah[:, k] = self.t, self.pos + MAX_POS, acts
            rew, done = env_step_cpu(w.open, w.high, w.low, w.close, w.roll, self.t, self.end, self.pos, acts,
                                     sp.point_value, sp.tick_size, sp.slippage_ticks, sp.commission_per_side,
                                     sp.commission_bps, np.float32(cfg.reward_scale))
            rh[:, k], dh[:, k] = rew, done
            self._reset(done, w)
            th[:, k + 1], ph[:, k + 1] = self.t, self.pos + MAX_POS
            self.env_step += 1
        ints, floats = rollout_to_transitions_vec(th, ph, ah, rh, dh, cfg.rollout_steps, np.float32(cfg.gamma), cfg.n_step)
        slots = (self.ptr + np.arange(len(ints))) % self.cap
        self.int_store[slots], self.float_store[slots], self.prio[slots] = ints, floats, self.max_prio
        self.ptr, self.size = (self.ptr + len(ints)) % self.cap, min(self.size + len(ints), self.cap)
        self.ms = {"experience": (time.perf_counter() - ta) * 1e3}

    def train(self, epoch: int, first: bool) -> None:
        cfg = self.cfg
        tb = time.perf_counter()
        self.losses, self.norms, self.max_q, self.tripped = [], [], 0.0, False
        if self.size >= cfg.learning_starts:
            for _ in range(cfg.max_steps_per_epoch):
                loss, norm, mq, bad = self._update(self.w, self.shape, self.support)
                if bad:  # the guard: no further update this epoch (as inside the GPU graph)
                    self.tripped = True
                    break
                self.losses.append(loss)
                self.norms.append(norm)
                self.max_q = max(self.max_q, mq)
        self.ms["training"] = (time.perf_counter() - tb) * 1e3

    def validate(self) -> None:
        tc = time.perf_counter()
        w = self.w
        _vpos, vpnl, _ = self._backtest(self.params, w, w.val, self.shape, self.support)
        full = np.zeros(w.n_bars)
        full[w.val[0]:w.val[1]] = vpnl
        self.val = K_ro.validation_stats_ref(full, w.day, w.val[0], w.val[1])
        self.ms["validation"] = (time.perf_counter() - tc) * 1e3

    def end_epoch(self, epoch: int) -> EpochStats:
        losses, norms = self.losses, self.norms
        return EpochStats(dict(self.ms), self.size, len(losses), float(np.mean(losses)) if losses else 0.0,
                          float(np.mean(norms)) if norms else 0.0, self.max_q, self.tripped, self.val)

    def keep(self) -> None:
        self.best = self.params.copy()

    def kept(self) -> np.ndarray:
        return self.best

    def val_pnl(self) -> np.ndarray:
        _vpos, vpnl, _ = self._backtest(self.best, self.w, self.w.val, self.shape, self.support)
        return np.asarray(vpnl, np.float64)

    def test(self):
        w = self.w
        pos, pnl, greedy = self._backtest(self.best, w, w.test, self.shape, self.support)
        a, b = w.test
        return pos, pnl, greedy.reshape(-1, N_POS, 3)[a:b][np.arange(b - a), np.clip(pos + MAX_POS, 0, N_POS - 1)]

    def backend_name(self, test: bool) -> str:
        return "cpu"

    def counters(self) -> dict:
        return {"replay_capacity": self.cap}
