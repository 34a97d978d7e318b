"""CPU reference backend: the same agent and the same epoch loop (:func:`workbench.agent.loop.run_fold`)
as :mod:`workbench.agent.trainer`, with a float64 NumPy network and the kernels' CPU twins, which live
beside their kernels in ``cuda_kernels/`` (the env's step and the greedy backtest are the very Python
functions the kernels compile; action choice, resets and n-step transitions are NumPy twins with the
same Philox streams: counter layout, keys, tags).

It runs the main job on machines without a GPU (with the ``default`` profile's small sizes) and is
the oracle of the cross-backend tests. Phase times are host wall-clock milliseconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from cuda_kernels import actions as K_act
from cuda_kernels import backtest as K_bt
from cuda_kernels import c51 as K_c51
from cuda_kernels import env as K_env
from cuda_kernels import optim as K_opt
from cuda_kernels import per as K_per
from cuda_kernels import rollout as K_ro
from cuda_kernels.slots import RF, RI

from ..gpu_profile import GpuProfile
from ..markets import MarketSpec
from .loop import EpochStats, run_fold
from .network import NetShape, backward_ref, forward_ref, init_params
from .records import FoldTrainResult, philox_keys
from .train_config import TrainConfig
from .window import MAX_POS, N_POS, Window


@dataclass
class HostLearner:
    """Network and optimiser (the host twin of ``device_state.Learner``)."""

    params: np.ndarray
    target: np.ndarray
    best: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int = 0  # updates so far


@dataclass
class HostReplay:
    """The prioritised replay ring (the host twin of ``device_state.Replay``)."""

    int_store: np.ndarray
    float_store: np.ndarray
    prio: np.ndarray
    capacity: int
    max_prio: float = 1.0
    size: int = 0
    ptr: int = 0


@dataclass
class HostEnvs:
    """The training envs (the host twin of ``device_state.Envs``)."""

    t: np.ndarray
    end: np.ndarray
    pos: np.ndarray
    step: int = 0  # env steps so far


@dataclass
class UpdateRecord:
    """What one update computed (the cross-backend test compares it with the device's batch)."""

    idx: np.ndarray
    isw: np.ndarray
    loss: np.ndarray   # per-sample
    grads: np.ndarray
    mean_loss: float
    grad_norm: float
    max_abs_q: float
    tripped: bool


class CpuTrainer:
    """NumPy twin of :class:`~workbench.agent.trainer.DeviceTrainer` (same constructor, same result).
    After :meth:`setup`: ``learner``, ``replay``, ``envs`` (named state), ``shape`` and ``support``."""

    def __init__(self, profile: GpuProfile, cfg: TrainConfig, spec: MarketSpec, capital: float, seed: int):
        self.profile, self.cfg, self.spec, self.capital, self.seed = profile, cfg, spec, capital, seed
        self.k0, self.k1 = philox_keys(seed)

    def _obs(self, t, pos_index) -> np.ndarray:
        return np.concatenate([self.w.features[t].astype(np.float64), np.eye(N_POS)[pos_index]], axis=1)

    def reset_envs(self, done: np.ndarray) -> None:
        """Envs whose ``done`` is set restart (the twin of ``env_reset_kernel``)."""
        e, w = self.envs, self.w
        K_ro.env_reset_ref(e.t, e.end, e.pos, done, w.train[0], w.train[1], w.episode_len(self.cfg.episode_len),
                           self.k0, self.k1, e.step)

    def update(self) -> UpdateRecord:
        """One training update (no change to weights, Adam or priorities when the guard trips)."""
        cfg, B, shape, lr, rp = self.cfg, self.profile.batch, self.shape, self.learner, self.replay
        lr.step += 1
        idx, isw = K_per.per_sample_ref(rp.prio, rp.size, B, cfg.per_beta, self.k0, self.k1, lr.step)
        ints, floats = rp.int_store[idx], rp.float_store[idx]
        s = self._obs(ints[:, RI.T], ints[:, RI.POS])
        s2 = self._obs(ints[:, RI.T_NEXT], ints[:, RI.POS_NEXT])
        a_s = forward_ref(lr.params, s, shape, self.support)
        a_s2 = forward_ref(lr.params, s2, shape, self.support)
        t_s2 = forward_ref(lr.target, s2, shape, self.support)
        dhead, loss = K_c51.c51_loss_ref(a_s["logp"], a_s2["q"], t_s2["logp"], ints[:, RI.DIR:RI.EXEC + 1],
                                         floats[:, RF.RETURN], floats[:, RF.TERMINAL], cfg.gamma ** cfg.n_step,
                                         cfg.v_min, cfg.v_max, shape.atoms, isw, list(shape.branch_sizes), 1.0 / B)
        grads = backward_ref(lr.params, s, a_s, dhead, shape).astype(np.float32)
        norm, scale = K_opt.grad_norm_ref(grads, cfg.grad_clip)
        mean_loss = float(np.sum(isw * loss) / B)
        max_q = float(np.max(np.abs(a_s2["q"])))  # the online Q of s', as the GPU's loss launch writes it
        tripped = not (np.isfinite(mean_loss) and np.isfinite(norm)) or max_q > cfg.q_limit
        if not tripped:
            lr.params, lr.m, lr.v = K_opt.adam_ref(lr.params, grads, lr.m, lr.v, cfg.lr, cfg.adam_beta1,
                                                   cfg.adam_beta2, cfg.adam_eps, cfg.weight_decay, lr.step, scale)
            K_per.priority_update_ref(rp.prio, idx, loss.astype(np.float32), cfg.per_alpha, cfg.per_eps, out=rp.prio)
            rp.max_prio = max(rp.max_prio, float(((np.abs(loss) + cfg.per_eps) ** cfg.per_alpha).max()))
            lr.target = K_opt.ema_ref(lr.target, lr.params, cfg.tau)
        return UpdateRecord(idx, isw, loss, grads, mean_loss, norm, max_q, tripped)

    def _backtest(self, params, rng):
        """Greedy backtest of bars [a, b): (position, pnl) over [a, b), the greedy table and Q of [a, b)."""
        w, sp, a, b = self.w, self.spec, rng[0], rng[1]
        obs = self._obs(np.repeat(np.arange(a, b), N_POS), np.tile(np.arange(N_POS), b - a))
        q = forward_ref(params, obs, self.shape, self.support)["q"].astype(np.float32)
        greedy = np.zeros((w.n_bars * N_POS, 3), np.int32)
        greedy[a * N_POS:b * N_POS] = K_act.greedy_ref(q, list(self.shape.branch_sizes))
        position, pnl = np.zeros(w.n_bars, np.int32), np.zeros(w.n_bars)
        K_bt.greedy_backtest_cpu(w.open, w.high, w.low, w.close, w.roll, greedy, a, b, N_POS, MAX_POS, sp.point_value,
                                 sp.tick_size, sp.slippage_ticks, sp.commission_per_side, sp.commission_bps, position,
                                 pnl)
        return position[a:b], pnl[a:b], greedy, q.reshape(b - a, N_POS, -1)

    def train_fold(self, w: Window, on_epoch=None, test: bool = True) -> FoldTrainResult:
        """Train on the fold (the shared epoch loop, :func:`workbench.agent.loop.run_fold`)."""
        return run_fold(self, self.cfg, w, on_epoch, test)

    # ---------------------------------------------------------------- the phases run_fold drives
    def setup(self, w: Window) -> None:
        cfg, prof = self.cfg, self.profile
        self.w = w
        self.shape = NetShape(obs_dim=w.n_features + N_POS, hidden=prof.hidden, atoms=prof.atoms)
        self.support = np.linspace(cfg.v_min, cfg.v_max, self.shape.atoms).astype(np.float32).astype(np.float64)
        p0 = init_params(self.shape, self.seed)
        self.learner = HostLearner(p0, p0.copy(), p0.copy(), np.zeros_like(p0), np.zeros_like(p0))
        N = prof.n_envs
        cap = max(cfg.replay_capacity, 2 * N * cfg.rollout_steps)
        self.replay = HostReplay(np.zeros((cap, K_ro.N_INT), np.int32), np.zeros((cap, K_ro.N_FLOAT), np.float32),
                                 np.zeros(cap, np.float32), cap)
        self.envs = HostEnvs(np.zeros(N, np.int64), np.zeros(N, np.int64), np.zeros(N, np.int32))
        self.rollout_len = cfg.rollout_steps + cfg.n_step - 1
        self.reset_envs(np.ones(N, np.float32))

    def snapshot(self) -> None:
        lr = self.learner
        self.snap = (lr.params.copy(), lr.target.copy(), lr.m.copy(), lr.v.copy())

    def restore(self) -> None:
        lr = self.learner
        lr.params, lr.target, lr.m, lr.v = (x.copy() for x in self.snap)

    def experience(self, eps: float) -> None:
        cfg, w, sp, e, rp = self.cfg, self.w, self.spec, self.envs, self.replay
        ta = time.perf_counter()
        N, K = self.profile.n_envs, self.rollout_len
        th, ph = np.zeros((N, K + 1), np.int64), np.zeros((N, K + 1), np.int32)
        ah, rh, dh = np.zeros((N, K, 3), np.int32), np.zeros((N, K), np.float32), np.zeros((N, K), np.float32)
        for k in range(K):
            q = forward_ref(self.learner.params, self._obs(e.t, e.pos + MAX_POS), self.shape, self.support)["q"]
            acts = K_act.eps_greedy_ref(q.astype(np.float32), eps, e.step, self.k0, self.k1, self.shape.branch_sizes)
            th[:, k], ph[:, k], ah[:, k] = e.t, e.pos + MAX_POS, acts
            rew, done = K_env.env_step_cpu(w.open, w.high, w.low, w.close, w.roll, e.t, e.end, e.pos, acts,
                                           sp.point_value, sp.tick_size, sp.slippage_ticks, sp.commission_per_side,
                                           sp.commission_bps, np.float32(cfg.reward_scale))
            rh[:, k], dh[:, k] = rew, done
            self.reset_envs(done)
            th[:, k + 1], ph[:, k + 1] = e.t, e.pos + MAX_POS
            e.step += 1
        ints, floats = K_ro.rollout_to_transitions_cpu(th, ph, ah, rh, dh, cfg.rollout_steps, np.float32(cfg.gamma),
                                                       cfg.n_step)
        slots = (rp.ptr + np.arange(len(ints))) % rp.capacity
        rp.int_store[slots], rp.float_store[slots], rp.prio[slots] = ints, floats, rp.max_prio
        rp.ptr, rp.size = (rp.ptr + len(ints)) % rp.capacity, min(rp.size + len(ints), rp.capacity)
        self.ms = {"experience": (time.perf_counter() - ta) * 1e3}

    def train(self, epoch: int) -> None:
        cfg = self.cfg
        tb = time.perf_counter()
        self.losses, self.norms, self.max_q, self.tripped = [], [], 0.0, False
        if self.replay.size >= cfg.learning_starts:
            for _ in range(cfg.max_steps_per_epoch):
                r = self.update()
                if r.tripped:  # the guard: no further update this epoch (as inside the GPU graph)
                    self.tripped = True
                    break
                self.losses.append(r.mean_loss)
                self.norms.append(r.grad_norm)
                self.max_q = max(self.max_q, r.max_abs_q)
        self.ms["training"] = (time.perf_counter() - tb) * 1e3

    def validate(self) -> None:
        tc = time.perf_counter()
        w = self.w
        _vpos, vpnl, _, _ = self._backtest(self.learner.params, w.val)
        full = np.zeros(w.n_bars)
        full[w.val[0]:w.val[1]] = vpnl
        self.val = K_ro.validation_stats_ref(full, w.day, w.val[0], w.val[1])
        self.ms["validation"] = (time.perf_counter() - tc) * 1e3

    def end_epoch(self, epoch: int) -> EpochStats:
        losses, norms = self.losses, self.norms
        return EpochStats(dict(self.ms), self.replay.size, len(losses), float(np.mean(losses)) if losses else 0.0,
                          float(np.mean(norms)) if norms else 0.0, self.max_q, self.tripped, self.val)

    def keep(self) -> None:
        self.learner.best = self.learner.params.copy()

    def kept(self) -> np.ndarray:
        return self.learner.best

    def val_pnl(self) -> np.ndarray:
        return np.asarray(self._backtest(self.learner.best, self.w.val)[1], np.float64)

    def test(self):
        w = self.w
        pos, pnl, greedy, q = self._backtest(self.learner.best, w.test)
        a, b = w.test
        return pos, pnl, greedy.reshape(-1, N_POS, 3)[a:b][np.arange(b - a), np.clip(pos + MAX_POS, 0, N_POS - 1)], q

    def backend_name(self, test: bool) -> str:
        return "cpu"

    def counters(self) -> dict:
        return {"replay_capacity": self.replay.capacity}
