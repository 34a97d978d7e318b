"""GPU trainer for one walk-forward fold: data resident for every epoch, each step a graph replay.

Phases (timed with CUDA events on the stream; init with the host clock, as it includes uploads,
allocations and the kernels' first compilation):

- init: upload the window (features, prices, masks) once; preallocate network, optimiser, replay,
  env and rollout buffers; launch every kernel once (compile and load) before capture; capture the
  experience-step graph, the update graph, the rollout-finalise graph and the two backtest graphs.
- experience: ``rollout_steps + n_step - 1`` replays of one env step for ``n_envs`` envs (forward,
  eps-greedy, env step, history record, resets), then one replay that turns the rollout into n-step
  transitions and inserts them into the PER ring.
- training: ``max_steps_per_epoch`` replays of one update (scan, PER sample, gathers, online and
  target forwards, C51 loss, backward, clip, Adam, guard, priority update, EMA), once the replay holds
  ``learning_starts`` transitions.
- validation: the enumerated-position greedy backtest of the validation range; its daily Sharpe,
  net PnL, days and drawdown, with the update statistics and the guard flag, come back in one
  readback (the epoch's only host sync besides the phase events).

The epochs run in :func:`workbench.agent.loop.run_fold` (shared with the CPU backend); this class
provides its phases. The epoch kept is chosen by :mod:`workbench.agent.selection`; its weights
backtest the test range. The guard (non-finite loss or grad norm, or |Q| over ``q_limit``) stops every
update inside the graph at once; at the epoch's end the loop restores the weights, target and Adam
state of the epoch's start and the event is reported.
"""
from __future__ import annotations


import numpy as np

from cuda_kernels import actions as K_act
from cuda_kernels import backtest as K_bt
from cuda_kernels import c51 as K_c51
from cuda_kernels import env as K_env
from cuda_kernels import optim as K_opt
from cuda_kernels import per as K_per
from cuda_kernels import rollout as K_ro
from cuda_kernels import scan as K_scan
from cuda_kernels.nb import cuda
from cuda_kernels.slots import STAT

from ..device import Device, HostSlot, Readback
from ..gpu_profile import GpuProfile
from ..markets import MarketSpec
from .network import DeviceNetwork, NetShape, init_params
from .loop import EpochStats, run_fold
from .records import EpochLog, FoldTrainResult, philox_keys  # noqa: F401 (re-exported)
from .train_config import TrainConfig
from .window import MAX_POS, N_POS, Window

BYTES_PER_TRANSITION = 7 * 4 + 2 * 4 + 4 + 8 + 4  # stores, priority, prefix sum, owner


def _tpb(device: Device) -> int:
    return 32 if device.simulator else 128


def _grid(n: int, tpb: int) -> tuple[int, int]:
    """One thread per element (kernels that guard ``i < n``)."""
    return (max(1, (n + tpb - 1) // tpb), tpb)


def _gs(device: Device, n: int, tpb: int) -> tuple[int, int]:
    """Grid-stride kernels: enough blocks to fill the GPU, a handful in the simulator."""
    cap = 4 if device.simulator else 2048
    return (max(1, min(cap, (n + tpb - 1) // tpb)), tpb)


class DeviceTrainer:
    """Trains one fold on ``device`` with sizes from ``profile`` and hyper-parameters from ``cfg``."""

    def __init__(self, device: Device, gemm, profile: GpuProfile, cfg: TrainConfig, spec: MarketSpec,
                 capital: float, seed: int):
        self.device, self.gemm, self.profile, self.cfg = device, gemm, profile, cfg
        self.spec, self.capital, self.seed = spec, capital, seed
        self.tpb = _tpb(device)
        self.red = 32 if device.simulator else 1024  # threads of one-block reductions (a power of two)
        self.norm_blocks = 2 if device.simulator else K_opt.NORM_BLOCKS  # fixed per device: deterministic
        self.k0, self.k1 = philox_keys(seed)

    # ---------------------------------------------------------------- setup
    def _capacity(self, n_new: int) -> int:
        cap = self.cfg.replay_capacity
        if self.device.info.total_memory:
            cap = min(cap, int(self.profile.replay_vram_fraction * self.device.info.total_memory / BYTES_PER_TRANSITION))
        return max(cap, 2 * n_new)

    def _allocate(self, w: Window) -> None:
        d, s, cfg, prof = self.device, self.device.stream, self.cfg, self.profile
        up = lambda x: cuda.to_device(np.ascontiguousarray(x), stream=s)  # noqa: E731
        zeros = lambda shape, dt: cuda.to_device(np.zeros(shape, dt), stream=s)  # noqa: E731
        self.F = w.n_features
        self.shape = NetShape(obs_dim=self.F + N_POS, hidden=prof.hidden, atoms=prof.atoms)
        sh = self.shape
        # window data: uploaded once, resident for every epoch of the fold
        self.features = up(w.features)
        self.o, self.h, self.l, self.c = up(w.open), up(w.high), up(w.low), up(w.close)
        self.roll, self.day = up(w.roll), up(w.day)
        # parameters, target, gradients, Adam state, best and last-good copies
        p0 = init_params(sh, self.seed)
        self.params, self.target, self.best = up(p0), up(p0), up(p0)
        self.snap_p, self.snap_t = up(p0), up(p0)
        self.grads = zeros(sh.n_params, np.float32)
        self.m, self.v = zeros(sh.n_params, np.float32), zeros(sh.n_params, np.float32)
        self.snap_m, self.snap_v = zeros(sh.n_params, np.float32), zeros(sh.n_params, np.float32)
        self.support = up(np.linspace(cfg.v_min, cfg.v_max, sh.atoms).astype(np.float32))
        self.bsz, self.boff = up(np.array(sh.branch_sizes, np.int32)), up(np.array(sh.branch_offsets, np.int32))
        self.lr = up(np.array([cfg.lr], np.float32))
        self.step = zeros(1, np.int64)          # update counter (Adam's t, PER's Philox step)
        self.env_step_ctr = zeros(1, np.int64)  # env-step counter (exploration and reset draws)
        self.partials = zeros(self.norm_blocks, np.float64)
        self.clip = zeros(2, np.float32)
        self.guard = zeros(1, np.int32)
        self.stats = zeros(4, np.float32)
        # envs and rollout history
        N, Ke = prof.n_envs, cfg.rollout_steps
        self.K_hist = Ke + cfg.n_step - 1
        self.t_arr, self.end_arr = zeros(N, np.int64), zeros(N, np.int64)
        self.pos_arr = zeros(N, np.int32)
        self.done = up(np.ones(N, np.float32))  # every env starts with a reset
        self.env_obs = zeros((N, sh.obs_dim), np.float32)
        self.actions, self.joint = zeros((N, 3), np.int32), zeros(N, np.int32)
        self.reward, self.pnl_env = zeros(N, np.float32), zeros(N, np.float64)
        self.eps_dev = up(np.array([cfg.eps_start], np.float32))
        self.eps_slot = HostSlot(d, self.eps_dev)
        self.k_arr = zeros(1, np.int64)
        self.t_hist, self.pos_hist = zeros((N, self.K_hist + 1), np.int64), zeros((N, self.K_hist + 1), np.int32)
        self.act_hist = zeros((N, self.K_hist, 3), np.int32)
        self.rew_hist, self.done_hist = zeros((N, self.K_hist), np.float32), zeros((N, self.K_hist), np.float32)
        n_new = N * Ke
        self.new_int, self.new_float = zeros((n_new, K_ro.N_INT), np.int32), zeros((n_new, K_ro.N_FLOAT), np.float32)
        self.new_count = zeros(n_new, np.int64)
        # replay ring
        self.cap = self._capacity(n_new)
        self.int_store, self.float_store = zeros((self.cap, K_ro.N_INT), np.int32), zeros((self.cap, K_ro.N_FLOAT), np.float32)
        self.prio, self.cumsum = zeros(self.cap, np.float32), zeros(self.cap, np.float64)
        self.scan_threads = min(1024, d.info.max_threads_per_block) if not d.simulator else 32
        self.tiles = zeros(K_scan.n_tiles(self.cap, self.scan_threads), np.float64)
        self.ptr, self.size = zeros(1, np.int64), zeros(1, np.int64)
        self.max_prio = up(np.ones(1, np.float32))
        self.owner = up(np.full(self.cap, -1, np.int32))
        self.bad = zeros(1, np.int32)
        # batch buffers and networks
        B = prof.batch
        self.idx, self.isw = zeros(B, np.int64), zeros(B, np.float32)
        self.obs_s, self.obs_s2 = zeros((B, sh.obs_dim), np.float32), zeros((B, sh.obs_dim), np.float32)
        self.b_act, self.b_rew, self.b_done = zeros((B, 3), np.int32), zeros(B, np.float32), zeros(B, np.float32)
        self.dhead, self.loss_b = zeros((B, sh.head_width), np.float32), zeros(B, np.float32)
        mk = lambda rows: DeviceNetwork(d, self.gemm, sh, rows, self.support, self.bsz, self.boff)  # noqa: E731
        self.net_env, self.net_s, self.net_s2, self.net_t2 = mk(N), mk(B), mk(B), mk(B)
        # backtests: Q for every (bar, position) in chunks of bars
        longest = max(w.val[1] - w.val[0], w.test[1] - w.test[0])  # the longest range ever backtested
        self.chunk_bars = max(1, min(longest, (8192 if d.simulator else 65536) // N_POS))
        self.net_bt = mk(self.chunk_bars * N_POS)
        self.bt_obs = zeros((self.chunk_bars * N_POS, sh.obs_dim), np.float32)
        self.greedy = zeros((w.n_bars * N_POS, 3), np.int32)
        self.bt_joint = zeros(self.chunk_bars * N_POS, np.int32)
        self.eps0, self.zero_step = zeros(1, np.float32), zeros(1, np.int64)
        self.bt_pos, self.bt_pnl = zeros(w.n_bars, np.int32), zeros(w.n_bars, np.float64)
        self.val_range = (up(np.array([w.val[0]], np.int64)), up(np.array([w.val[1]], np.int64)))
        self.test_range = (up(np.array([w.test[0]], np.int64)), up(np.array([w.test[1]], np.int64)))
        self.val_out = zeros(K_ro.VAL_STATS, np.float64)

    # ---------------------------------------------------------------- enqueued work (capturable)
    def _reset_envs(self, st, w: Window) -> None:
        cfg, N = self.cfg, self.profile.n_envs
        K_ro.env_reset_kernel[_grid(N, self.tpb) + (st,)](self.t_arr, self.end_arr, self.pos_arr, self.done, w.train[0],
                                                         w.train[1], w.episode_len(cfg.episode_len), self.k0, self.k1,
                                                         self.env_step_ctr, N)

    def _experience_step(self, st, w: Window) -> None:
        N, sh, sp = self.profile.n_envs, self.shape, self.spec
        g = _grid(N, self.tpb) + (st,)
        self.eps_slot.enqueue(st)
        K_ro.env_obs_kernel[_gs(self.device, N * sh.obs_dim, self.tpb) + (st,)](self.features, self.t_arr, self.pos_arr, N, self.F,
                                                                    MAX_POS, self.env_obs)
        self.net_env.forward(self.params, self.env_obs)
        K_act.eps_greedy_kernel[g](self.net_env.q, 3, self.bsz, self.boff, self.eps_dev, self.k0, self.k1,
                                   self.env_step_ctr, self.actions, self.joint, N)
        hist = (self.t_hist, self.pos_hist, self.act_hist, self.rew_hist, self.done_hist)
        K_ro.record_step_kernel[g](self.k_arr, self.t_arr, self.pos_arr, self.actions, self.reward, self.done, *hist, N,
                                   MAX_POS, 0)
        K_env.env_step_kernel[g](self.o, self.h, self.l, self.c, self.roll, self.t_arr, self.end_arr, self.pos_arr,
                                 self.actions, sp.point_value, sp.tick_size, sp.slippage_ticks, sp.commission_per_side,
                                 sp.commission_bps, self.cfg.reward_scale, self.reward, self.done, self.pnl_env, N)
        K_ro.record_step_kernel[g](self.k_arr, self.t_arr, self.pos_arr, self.actions, self.reward, self.done, *hist, N,
                                   MAX_POS, 1)
        self._reset_envs(st, w)
        K_ro.record_step_kernel[g](self.k_arr, self.t_arr, self.pos_arr, self.actions, self.reward, self.done, *hist, N,
                                   MAX_POS, 2)
        K_opt.step_increment_kernel[1, 1, st](self.k_arr)
        K_opt.step_increment_kernel[1, 1, st](self.env_step_ctr)

    def _finish_rollout(self, st) -> None:
        cfg, N = self.cfg, self.profile.n_envs
        n_new = N * cfg.rollout_steps
        K_ro.rollout_to_transitions_kernel[_grid(n_new, self.tpb) + (st,)](
            self.t_hist, self.pos_hist, self.act_hist, self.rew_hist, self.done_hist, N, self.K_hist, cfg.rollout_steps,
            cfg.gamma, cfg.n_step, self.new_int, self.new_float, self.new_count)
        K_per.replay_insert_kernel[_grid(n_new, self.tpb) + (st,)](self.int_store, self.float_store, self.new_int,
                                                                  self.new_float, self.prio, self.max_prio, self.ptr,
                                                                  self.size, n_new, self.cap)
        K_per.replay_advance_kernel[1, 1, st](self.ptr, self.size, n_new, self.cap)
        K_ro.set_counter_kernel[1, 1, st](self.k_arr, 0)

    def _update(self, st) -> None:
        """One training step: the three parts in order (one graph)."""
        self._update_sample(st)
        self._update_learn(st)
        self._update_finish(st)

    def _update_sample(self, st) -> None:
        """Training step, part 1 (sample): prefix sum, PER draw and weights, batch gathers."""
        cfg, B, sh = self.cfg, self.profile.batch, self.shape
        g = _grid(B, self.tpb) + (st,)
        K_scan.launch_scan(self.prio, self.cumsum, self.tiles, self.cap, self.scan_threads, st)
        K_opt.step_increment_kernel[1, 1, st](self.step)
        K_per.per_sample_kernel[g](self.cumsum, self.size, B, cfg.per_beta, self.k0, self.k1, self.step, self.idx,
                                   self.isw)
        K_per.normalize_weights_kernel[1, self.red, st](self.isw, B)
        gobs = _gs(self.device, B * sh.obs_dim, self.tpb) + (st,)
        K_ro.gather_obs_kernel[gobs](self.features, self.int_store, self.idx, B, self.F, N_POS, 0, self.obs_s)
        K_ro.gather_obs_kernel[gobs](self.features, self.int_store, self.idx, B, self.F, N_POS, 1, self.obs_s2)
        K_ro.gather_batch_kernel[g](self.int_store, self.float_store, self.idx, B, self.b_act, self.b_rew, self.b_done)

    def _update_learn(self, st) -> None:
        """Part 2 (update): forwards, C51 loss, backward, grad norm."""
        cfg, B, sh = self.cfg, self.profile.batch, self.shape
        self.net_s.forward(self.params, self.obs_s)
        self.net_s2.forward(self.params, self.obs_s2)
        self.net_t2.forward(self.target, self.obs_s2)
        K_c51.c51_loss_kernel[K_c51.loss_launch(B, sh.atoms) + (st,)](self.net_s.logp, self.net_s2.q, self.net_t2.logp, self.b_act, self.b_rew, self.b_done,
                                 cfg.gamma ** cfg.n_step, cfg.v_min, cfg.v_max, sh.atoms, self.isw, 3, self.bsz,
                                 self.boff, 1.0 / B, self.dhead, self.loss_b, B)
        self.net_s.backward(self.params, self.grads, self.obs_s, self.dhead)
        K_opt.sumsq_partial_kernel[self.norm_blocks, self.red, st](self.grads, sh.n_params, self.partials)
        K_opt.grad_norm_finalize_kernel[1, self.red, st](self.partials, self.norm_blocks, cfg.grad_clip, self.clip)

    def _update_finish(self, st) -> None:
        """Part 3 (guard): guard, Adam, priority update, target EMA."""
        cfg, B, sh = self.cfg, self.profile.batch, self.shape
        g = _grid(B, self.tpb) + (st,)
        K_opt.guard_kernel[1, self.red, st](self.loss_b, self.isw, B, self.net_s.q, B, cfg.q_limit, self.clip,
                                            self.guard, self.stats)
        gp = _gs(self.device, sh.n_params, 256 if not self.device.simulator else 32) + (st,)
        K_opt.adam_kernel[gp](self.params, self.grads, self.m, self.v, sh.n_params, self.lr, cfg.adam_beta1,
                              cfg.adam_beta2, cfg.adam_eps, cfg.weight_decay, self.step, self.clip, self.guard)
        K_per.priority_claim_kernel[g](self.idx, self.owner, B, self.cap, self.bad)
        K_per.priority_write_kernel[g](self.prio, self.idx, self.loss_b, self.owner, B, self.cap, cfg.per_alpha,
                                       cfg.per_eps, self.max_prio)
        K_per.priority_release_kernel[g](self.idx, self.owner, B, self.cap)
        K_opt.ema_kernel[gp](self.target, self.params, sh.n_params, cfg.tau, self.guard)

    def _backtest(self, st, params, rng: tuple[int, int], dev_range) -> None:
        """Greedy backtest of window bars [a, b) with ``params``; positions and PnL into bt_pos / bt_pnl."""
        sh, sp = self.shape, self.spec
        a, b = rng
        for c0 in range(a, b, self.chunk_bars):
            c1 = min(b, c0 + self.chunk_bars)
            rows = (c1 - c0) * N_POS
            K_bt.enumerate_positions_kernel[_gs(self.device, rows * sh.obs_dim, self.tpb) + (st,)](
                self.features[c0:c1], c1 - c0, self.F, N_POS, self.bt_obs)
            self.net_bt.forward(params, self.bt_obs)
            K_act.eps_greedy_kernel[_grid(rows, self.tpb) + (st,)](self.net_bt.q, 3, self.bsz, self.boff, self.eps0, 0, 0,
                                                                   self.zero_step, self.greedy[c0 * N_POS:c1 * N_POS],
                                                                   self.bt_joint, rows)
        K_bt.greedy_backtest_kernel[1, 32, st](self.o, self.h, self.l, self.c, self.roll, self.greedy, dev_range[0],
                                               dev_range[1], N_POS, MAX_POS, sp.point_value, sp.tick_size,
                                               sp.slippage_ticks, sp.commission_per_side, sp.commission_bps,
                                               self.bt_pos, self.bt_pnl, 1)

    def _validate(self, st, w: Window) -> None:
        self._backtest(st, self.params, w.val, self.val_range)
        K_ro.validation_stats_kernel[1, 1, st](self.bt_pnl, self.day, w.val[0], w.val[1], self.val_out)

    # ---------------------------------------------------------------- the fold
    def prepare(self, w: Window) -> dict:
        """The init phase: allocate, upload, launch everything once, capture the graphs."""
        d = self.device
        self._allocate(w)
        st = d.stream
        self._reset_envs(st, w)
        if not d.simulator:
            # Launch everything once (compile + load) before capture; then undo its effects.
            self._experience_step(st, w)
            self._update(st)
            self._validate(st, w)
            self._finish_rollout(st)
            self._restore_after_warmup(st, w)
        graphs = {"experience": d.capture(lambda s: self._experience_step(s, w)),
                  "finish_rollout": d.capture(self._finish_rollout),
                  "update": d.capture(self._update),
                  "update_parts": [d.capture(self._update_sample), d.capture(self._update_learn),
                                   d.capture(self._update_finish)],
                  "validation": d.capture(lambda s: self._validate(s, w))}
        d.synchronize()
        return graphs

    def train_fold(self, w: Window, on_epoch=None, test: bool = True) -> FoldTrainResult:
        """Train on the fold (the shared epoch loop, :func:`workbench.agent.loop.run_fold`); ``test=False``
        (the search) never backtests the test range."""
        return run_fold(self, self.cfg, w, on_epoch, test)

    # ---------------------------------------------------------------- the phases run_fold drives
    def setup(self, w: Window) -> None:
        self.w = w
        self.graphs = self.prepare(w)
        self.readback = Readback(self.device, {"stats": self.stats, "guard": self.guard, "val": self.val_out,
                                               "size": self.size, "bad": self.bad})

    def snapshot(self) -> None:
        st = self.device.stream
        for src, dst in ((self.params, self.snap_p), (self.target, self.snap_t), (self.m, self.snap_m),
                         (self.v, self.snap_v)):
            dst.copy_to_device(src, stream=st)
        K_opt.fill_kernel[1, 32, st](self.stats, 0.0)

    def restore(self) -> None:
        st = self.device.stream
        for src, dst in ((self.snap_p, self.params), (self.snap_t, self.target), (self.snap_m, self.m),
                         (self.snap_v, self.v)):
            dst.copy_to_device(src, stream=st)
        self.guard.copy_to_device(np.zeros(1, np.int32), stream=st)

    def experience(self, eps: float) -> None:
        self.eps_slot.value[0] = eps  # copied in by the experience graph's first node
        self.ev = [self.device.event().record()]
        self.graphs["experience"].replay(self.K_hist)
        self.graphs["finish_rollout"].replay(1)
        self.ev.append(self.device.event().record())

    def train(self, epoch: int, first: bool) -> None:
        cfg, d = self.cfg, self.device
        size_now = min(self.cap, (epoch + 1) * self.profile.n_envs * cfg.rollout_steps)  # known on the host
        self.updates = cfg.max_steps_per_epoch if size_now >= cfg.learning_starts else 0
        self.marks = []
        if first and self.updates:  # the first epoch replays the three parts with events between them
            for _ in range(self.updates):
                for part in self.graphs["update_parts"]:
                    self.marks.append(d.event().record())
                    part.replay(1)
            self.marks.append(d.event().record())
            self.ev.append(self.marks[-1])
        else:
            self.graphs["update"].replay(self.updates)
            self.ev.append(d.event().record())

    def validate(self) -> None:
        self.graphs["validation"].replay(1)
        self.ev.append(self.device.event().record())

    def end_epoch(self, epoch: int) -> EpochStats:
        r = self.last = self.readback.read()  # the epoch's one host sync
        ev = self.ev
        ms = {"experience": ev[0].elapsed_ms(ev[1]), "training": ev[1].elapsed_ms(ev[2]),
              "validation": ev[2].elapsed_ms(ev[3])}
        extra = {}
        if self.marks:
            sums = [0.0, 0.0, 0.0]
            for i in range(len(self.marks) - 1):
                sums[i % 3] += self.marks[i].elapsed_ms(self.marks[i + 1])
            u = self.updates
            extra["training_breakdown_ms_per_update"] = {"sample": sums[0] / u, "update": sums[1] / u, "guard": sums[2] / u}
        stats = r["stats"]
        n_upd = int(stats[STAT.UPDATES])
        return EpochStats(ms, int(r["size"][0]), n_upd, float(stats[STAT.LOSS_SUM] / max(n_upd, 1)),
                          float(stats[STAT.NORM_SUM] / max(n_upd, 1)), float(stats[STAT.MAX_ABS_Q]),
                          bool(r["guard"][0]), r["val"], extra)

    def keep(self) -> None:
        self.best.copy_to_device(self.params, stream=self.device.stream)

    def kept(self) -> np.ndarray:
        return self.best.copy_to_host()

    def val_pnl(self) -> np.ndarray:
        return self._val_pnl(self.w)

    def test(self):
        d, w = self.device, self.w
        self._backtest(d.stream, self.best, w.test, self.test_range)
        d.synchronize()
        a, b = w.test
        pos = self.bt_pos.copy_to_host()[a:b]  # fold end: the per-bar test arrays come back once
        pnl = self.bt_pnl.copy_to_host()[a:b]
        greedy = self.greedy.copy_to_host().reshape(-1, N_POS, 3)[a:b]
        return pos, pnl, greedy[np.arange(b - a), np.clip(pos + MAX_POS, 0, N_POS - 1)]

    def backend_name(self, test: bool) -> str:
        return f"gpu:{self.device.info.name}:{getattr(self.gemm, 'name', 'gemm')}" if test else "gpu"

    def counters(self) -> dict:
        return {"replay_capacity": self.cap, "bad_priority_indices": int(self.last["bad"][0])}

    def _val_pnl(self, w: Window) -> np.ndarray:
        """Per-bar validation PnL (USD) of the chosen weights: the search's overfitting statistics read it."""
        self._backtest(self.device.stream, self.best, w.val, self.val_range)
        self.device.synchronize()
        return self.bt_pnl.copy_to_host()[w.val[0]:w.val[1]].copy()

    def _restore_after_warmup(self, st, w: Window) -> None:
        """Undo the warm-up launches: weights, optimiser, counters, replay and envs back to their start."""
        sh = self.shape
        p0 = init_params(sh, self.seed)
        for arr in (self.params, self.target, self.best):
            arr.copy_to_device(p0, stream=st)
        for arr in (self.m, self.v, self.stats, self.prio):
            K_opt.fill_kernel[_gs(self.device, arr.size, 256) + (st,)](arr, 0.0)
        for ctr in (self.step, self.env_step_ctr, self.k_arr, self.ptr, self.size):
            K_ro.set_counter_kernel[1, 1, st](ctr, 0)
        K_opt.fill_kernel[1, 32, st](self.max_prio, 1.0)
        K_opt.fill_kernel[_gs(self.device, self.profile.n_envs, 256) + (st,)](self.done, 1.0)
        self.guard.copy_to_device(np.zeros(1, np.int32), stream=st)
        self.bad.copy_to_device(np.zeros(1, np.int32), stream=st)
        self._reset_envs(st, w)
