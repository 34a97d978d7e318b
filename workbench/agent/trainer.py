"""GPU trainer for one walk-forward fold: data resident for every epoch, each step a graph replay.

Phases (timed with CUDA events on the stream; init with the host clock, as it includes uploads,
allocations and the kernels' first compilation):

- init: upload the window (features, prices, masks) once and allocate the named device state
  (:mod:`workbench.agent.device_state`, every buffer at its starting value); load every declared
  kernel into the context from its signature (compiled, or read from the on-disk cache) without
  launching it, so nothing has to be undone; reset the envs; capture the experience loop, the
  update loop and the validation graph. A phase's loop is a conditional WHILE node around its body
  (:meth:`workbench.device.Device.capture_loops`): one host launch per phase per epoch.
- experience: one launch: ``rollout_steps + n_step - 1`` passes of one env step for ``n_envs`` envs
  (forward, eps-greedy, env step, history record, resets) in a graph loop, then the turn of the
  rollout into n-step transitions inserted into the PER ring, and the priorities' full prefix sum.
- training: one launch: ``max_steps_per_epoch`` passes of one update (rescan, PER sample, gathers,
  online and target forwards, C51 loss, backward, clip, Adam, guard, priority update, EMA) in a graph
  loop that ends early when the guard trips, once the replay holds ``learning_starts`` transitions.
- validation: the enumerated-position greedy backtest of the validation range; its daily Sharpe,
  net PnL, days and drawdown, with the update statistics and the guard flag, come back in one
  readback (the epoch's only host sync besides the phase events).

The epochs run in :func:`workbench.agent.loop.run_fold` (shared with the CPU backend); this class
provides its phases. The epoch kept is chosen by :mod:`workbench.agent.selection`; its weights
backtest the test range. The guard (non-finite loss or grad norm, or |Q| of the online network on the batch's
next states s' over ``q_limit``) stops every
update inside the graph at once; at the epoch's end the loop restores the weights, target and Adam
state of the epoch's start and the event is reported.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from cuda_kernels import actions as K_act
from cuda_kernels import backtest as K_bt
from cuda_kernels import c51 as K_c51
from cuda_kernels import env as K_env
from cuda_kernels import optim as K_opt
from cuda_kernels import per as K_per
from cuda_kernels import rollout as K_ro
from cuda_kernels import scan as K_scan
from cuda_kernels.nb import load_kernels
from cuda_kernels.slots import ARR, STAT

from ..device import Device, Handoff, Loop, Readback
from ..gpu_profile import GpuProfile
from ..markets import MarketSpec
from .device_state import DeviceState, alloc_state
from .loop import EpochStats, run_fold
from .network import relayout, run_steps, to_bf16_copy, views
from .records import EpochLog, FoldTrainResult, philox_keys  # noqa: F401 (re-exported)
from .train_config import TrainConfig
from .window import MAX_POS, N_POS, Window


def _tpb(device: Device) -> int:
    return 32 if device.simulator else 128


def _grid(n: int, tpb: int) -> tuple[int, int]:
    """One thread per element (kernels that guard ``i < n``)."""
    return (max(1, (n + tpb - 1) // tpb), tpb)


def _gs(device: Device, n: int, tpb: int) -> tuple[int, int]:
    """Grid-stride kernels: enough blocks to fill the GPU, a handful in the simulator."""
    cap = 4 if device.simulator else 2048
    return (max(1, min(cap, (n + tpb - 1) // tpb)), tpb)


def _gs_per_sm(device: Device, n: int, tpb: int, per_sm: int = 4) -> tuple[int, int]:
    """Grid-stride kernels with per-block setup worth sharing (Adam's two float64 powers, once a block): a
    few blocks per multiprocessor, each thread taking several elements."""
    if device.simulator:
        return _gs(device, n, 32)
    return (max(1, min(per_sm * device.info.multiprocessors, (n + tpb - 1) // tpb)), tpb)


class Graphs(NamedTuple):
    """The fold's captured graphs (eager stand-ins in the simulator); each is one launch per epoch."""

    experience: object  # loop: the rollout's env steps, then its n-step transitions into the replay ring
    update: object      # loop: the epoch's training updates (ends early when the guard trips)
    validation: object  # the validation backtest and its statistics


class Side(NamedTuple):
    """A second stream of the trainer's device and a GEMM backend bound to it: where an update's work that
    does not wait on its main chain runs beside it (:meth:`DeviceTrainer.update_beside`)."""

    device: Device
    gemm: object


class Handoffs(NamedTuple):
    """The points where an update's side branch leaves and rejoins its main chain (one
    :class:`~workbench.device.Handoff` each, made once per trainer)."""

    draw: Handoff       # main -> side: the PER draw and its gathers are done (the target forward reads s')
    target: Handoff     # side -> main: the target forward done (the loss reads it)
    loss: Handoff       # main -> side: the loss wrote dhead (the backward's side starts)
    d2: Handoff         # main -> side: d2 and its epilogue done (W2's gradient)
    grads: Handoff      # side -> main: the side's gradients done (the grad norm reads every gradient)
    norm: Handoff       # main -> side: the grad norm and guard done (the priority update)
    prio: Handoff       # side -> main: the priority update done (the next pass's scan reads it)


def epoch_stats(r: dict, ms: dict, extra: dict) -> EpochStats:
    """An epoch's report from its readback (:meth:`DeviceTrainer.readback_sources` names)."""
    stats = r["stats"]
    n_upd = int(stats[STAT.UPDATES])
    return EpochStats(ms, int(r["size"][0]), n_upd, float(stats[STAT.LOSS_SUM] / max(n_upd, 1)),
                      float(stats[STAT.NORM_SUM] / max(n_upd, 1)), float(stats[STAT.MAX_ABS_Q]),
                      bool(r["guard"][0]), r["val"], extra)


class DeviceTrainer:
    """Trains one fold on ``device`` with sizes from ``profile`` and hyper-parameters from ``cfg``.

    After :meth:`prepare`, ``state`` (:class:`~workbench.agent.device_state.DeviceState`) names every
    device buffer and ``graphs`` the captured work; tests and benchmarks read those, nothing else."""

    def __init__(self, device: Device, gemm, profile: GpuProfile, cfg: TrainConfig, spec: MarketSpec,
                 capital: float, seed: int, side=None):
        self.device, self.gemm, self.profile, self.cfg = device, gemm, profile, cfg
        self.make_side, self.side, self.handoffs = side, None, None  # side: a callable giving a Side, or None
        self.spec, self.capital, self.seed = spec, capital, seed
        self.tpb = _tpb(device)
        self.red = 32 if device.simulator else 1024  # threads of one-block reductions (a power of two)
        self.norm_blocks = 2 if device.simulator else K_opt.NORM_BLOCKS  # fixed per device: deterministic
        self.norm_threads = 32 if device.simulator else K_opt.NORM_THREADS
        self.k0, self.k1 = philox_keys(seed)
        self.state: DeviceState | None = None
        self.loss_kernel = None  # the update's heads and loss, built for the state's network shape (allocate)
        self.graphs: Graphs | None = None

    # ---------------------------------------------------------------- enqueued work (capturable)
    def _reset_envs(self, st) -> None:
        e, w, cfg = self.state.envs, self.w, self.cfg
        K_ro.env_reset_kernel[_grid(e.n, self.tpb) + (st,)](e.t, e.end, e.pos, e.done, w.train[0], w.train[1],
                                                           w.episode_len(cfg.episode_len), self.k0, self.k1, e.step,
                                                           e.n)

    def _experience_step(self, st) -> None:
        S, sp = self.state, self.spec
        e, ro, lr, wd = S.envs, S.rollout, S.learner, S.window
        g = _grid(e.n, self.tpb) + (st,)
        K_ro.env_obs_kernel[_gs(self.device, e.n * S.shape.obs_dim, self.tpb) + (st,)](wd.features, e.t, e.pos, e.n,
                                                                                      wd.n_features, MAX_POS, e.obs)
        S.nets.env.forward(lr.params, e.obs)
        K_act.eps_greedy_kernel[g](S.nets.env.q, 3, lr.branch_sizes, lr.branch_offsets, e.eps, self.k0, self.k1,
                                   e.step, e.actions, e.joint, e.n)
        hist = (ro.t_hist, ro.pos_hist, ro.act_hist, ro.rew_hist, ro.done_hist)
        record = lambda phase: K_ro.record_step_kernel[g](ro.k, e.t, e.pos, e.actions, e.reward, e.done, *hist,  # noqa: E731
                                                          e.n, MAX_POS, phase)
        record(0)
        K_env.env_step_kernel[g](wd.open, wd.high, wd.low, wd.close, wd.roll, e.t, e.end, e.pos, e.actions,
                                 sp.point_value, sp.tick_size, sp.slippage_ticks, sp.commission_per_side,
                                 sp.commission_bps, self.cfg.reward_scale, e.reward, e.done, e.pnl, e.n)
        record(1)
        self._reset_envs(st)
        record(2)
        K_opt.step_increment_kernel[1, 1, st](ro.k)
        K_opt.step_increment_kernel[1, 1, st](e.step)

    def _finish_rollout(self, st) -> None:
        cfg, ro, rp = self.cfg, self.state.rollout, self.state.replay
        n_new = self.state.envs.n * ro.emitted
        K_ro.rollout_to_transitions_kernel[_grid(n_new, self.tpb) + (st,)](
            ro.t_hist, ro.pos_hist, ro.act_hist, ro.rew_hist, ro.done_hist, self.state.envs.n, ro.steps, ro.emitted,
            cfg.gamma, cfg.n_step, ro.new_int, ro.new_float, ro.new_count)
        K_per.replay_insert_kernel[_grid(n_new, self.tpb) + (st,)](rp.int_store, rp.float_store, ro.new_int,
                                                                  ro.new_float, rp.prio, rp.max_prio, rp.ptr, rp.size,
                                                                  n_new, rp.capacity)
        K_per.replay_advance_kernel[1, 1, st](rp.ptr, rp.size, n_new, rp.capacity)
        K_ro.set_counter_kernel[1, 1, st](ro.k, 0)
        # every sub-tile total afresh after the insertions: each update rescans from them (_sample)
        K_scan.launch_scan(rp.prio, rp.totals, rp.sub, rp.tiles, rp.capacity, rp.scan_threads,
                           self.state.learner.arrival(ARR.FULL_SCAN), rp.size, st)

    def enqueue_update(self, st) -> None:
        """One training step (what the ``update`` graph's loop body holds): :meth:`update_beside` once
        :meth:`use_side` has given the trainer a side stream, else the three parts in order on ``st``."""
        if self.side is not None:
            self.update_beside(st)
        else:
            run_steps(self.update_steps(st))

    def use_side(self) -> bool:
        """Make the side stream (from the callable given as ``side``) and the handoffs, once, outside any
        capture; False where the trainer was given none."""
        if self.side is None and self.make_side is not None:
            self.side = self.make_side()
            self.handoffs = Handoffs(*(Handoff(self.device) for _ in Handoffs._fields))
        return self.side is not None

    def update_beside(self, st) -> None:
        """One training step as :meth:`update_steps` computes it, bit for bit (the same kernels on the same
        buffers in an order that respects every read after a write), with the work that does not wait
        on the main chain on the side stream beside it: the target network's forward beside the online
        network's forward, the head's bias and weight
        gradients and W2's weight gradient beside the d2 -> d1 -> W1 chain
        (:meth:`~workbench.agent.network.DeviceNetwork.backward_beside`), the priority update beside
        Adam. One agent's update leaves most of the GPU idle, so the branches overlap."""
        S, h = self.state, self.handoffs
        m, sd = self.device, self.side.device
        b, lr, nets = S.batch, S.learner, S.nets
        ss = sd.stream
        self._sample(st)
        h.draw.give(m).take(sd)
        nets.t2.on(sd, self.side.gemm).forward(lr.target, b.obs_next, head=False)
        h.target.give(sd)
        nets.online.forward(lr.params, b.obs_pair, head=False)
        h.target.take(m)
        self._loss(st)
        s = nets.s
        s.backward_beside(lr.params, lr.grads, b.obs, b.dhead, s.on(sd, self.side.gemm), h.loss, h.d2, h.grads)
        self._grad_norm_guard(st)
        h.norm.give(m).take(sd)
        self._priority_update(ss)
        h.prio.give(sd)
        self._adam(st)
        h.prio.take(m)

    def update_steps(self, st):
        """One training step as steps (:func:`~workbench.agent.network.run_steps`): its kernels enqueued,
        each GEMM yielded, so a population can run its agents' same GEMM as one batched GEMM."""
        self._sample(st)
        yield from self._learn_steps(st)
        self._update_finish(st)

    def _sample(self, st) -> None:
        """Training step, part 1 (sample): the priorities' prefix sum, then in one launch the PER draw, its
        importance weights (the draw advances the update's step unless the guard has tripped) and the
        batch's gathers (s and s' stacked, actions, n-step returns, terminal flags). The prefix sum is a
        rescan (:func:`cuda_kernels.scan.rescan_kernel`): only the priorities the last update's batch
        (``b.idx``, not yet overwritten by this draw) changed are read again, and the levels are those a
        full scan would write; the experience phase ends with a full scan (:meth:`_finish_rollout`). With
        bf16 networks the batch's observations are then converted for them (``Batch.obs_pair16``)."""
        S, cfg = self.state, self.cfg
        rp, b, lr, wd = S.replay, S.batch, S.learner, S.window
        K_scan.launch_rescan(rp.prio, b.idx, b.size, rp.totals, rp.sub, rp.tiles, rp.capacity, rp.scan_threads,
                             lr.arrival(ARR.SCAN), rp.size, st)
        K_ro.draw_batch_kernel[K_per.sample_launch(b.size) + (st,)](
            rp.prio, rp.sub, rp.tiles, K_scan.subs_per_tile(rp.scan_threads), rp.size, b.size, cfg.per_beta, self.k0,
            self.k1, lr.step, lr.guard, b.idx, b.isw, lr.arrival(ARR.DRAW), wd.features, rp.int_store, rp.float_store,
            wd.n_features, N_POS, b.obs_pair, b.actions, b.ret, b.terminal)
        if b.obs_pair16 is not None:  # bf16 networks: s and s' in bfloat16, once for both forwards and the backward
            to_bf16_copy(b.obs_pair, b.obs_pair16, st, self.device.simulator)

    def _learn_steps(self, st):
        """Part 2 (update): forwards, C51 loss, backward, grad norm and guard."""
        S = self.state
        b, lr, nets = S.batch, S.learner, S.nets
        yield from nets.online.forward_steps(lr.params, b.obs_pair, head=False)  # s and s' in one stacked forward
        yield from nets.t2.forward_steps(lr.target, b.obs_next, head=False)  # the heads: in the loss's launch
        yield from self._learn_tail_steps(st)

    def _update_learn_tail(self, st) -> None:
        """Part 2 after the forwards: C51 loss, backward, grad norm and guard."""
        run_steps(self._learn_tail_steps(st))

    def _learn_tail_steps(self, st):
        S = self.state
        b, lr = S.batch, S.learner
        self._loss(st)
        yield from S.nets.s.backward_steps(lr.params, lr.grads, b.obs, b.dhead)
        self._grad_norm_guard(st)

    def _loss(self, st) -> None:
        S, cfg = self.state, self.cfg
        b, lr, nets, sh = S.batch, S.learner, S.nets, S.shape
        nb = len(sh.branch_sizes)
        self.loss_kernel[K_c51.loss_launch(b.size, sh.atoms, nb) + (st,)](
            nets.online.head, nets.t2.head, b.actions, b.ret, b.terminal, cfg.gamma ** cfg.n_step, cfg.v_min,
            cfg.v_max, b.isw, nets.online.support, 1.0 / b.size, nets.s2.q, b.dhead, b.loss, b.size)

    def _grad_norm_guard(self, st) -> None:
        S, cfg = self.state, self.cfg
        b, lr = S.batch, S.learner
        K_opt.grad_norm_guard_kernel[lr.norm_blocks, self.norm_threads, st](
            lr.grads, S.shape.n_params, lr.partials, lr.arrival(ARR.NORM), cfg.grad_clip, lr.clip, b.loss, b.isw,
            b.size, S.nets.s2.q, b.size, cfg.q_limit, lr.guard, lr.stats)

    def _update_finish(self, st) -> None:
        """Part 3 (finish): Adam with the target's EMA, priority update (the guard ran with the grad norm)."""
        self._adam(st)
        self._priority_update(st)

    def _adam(self, st) -> None:
        S, cfg = self.state, self.cfg
        lr, n = S.learner, S.shape.n_params
        ga = _gs_per_sm(self.device, n, 256) + (st,)
        args = (lr.params, lr.grads, lr.m, lr.v, n, lr.lr, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps,
                cfg.weight_decay, lr.step, lr.clip, lr.guard, lr.target, cfg.tau)
        if lr.params16 is not None:  # gpu.math = "bf16": the networks' bfloat16 weights written in the same pass
            K_opt.adam_bf16_kernel[ga](*args, lr.params16, lr.target16)
        else:
            K_opt.adam_kernel[ga](*args)

    def _priority_update(self, st) -> None:
        S, cfg = self.state, self.cfg
        b, lr, rp = S.batch, S.learner, S.replay
        K_per.priority_update_kernel[1, self.red, st](rp.prio, b.idx, b.loss, rp.owner, b.size, rp.capacity,
                                                      cfg.per_alpha, cfg.per_eps, rp.max_prio, lr.guard, rp.bad)

    def _backtest(self, st, params, rng: tuple[int, int], dev_range, q_out: list | None = None) -> None:
        """Greedy backtest of window bars [a, b) with ``params``; positions and PnL into the backtest state;
        with ``q_out`` (a list) each chunk's expected Q is appended to it (host arrays, ready once ``st`` is)."""
        S, sp = self.state, self.spec
        bt, lr, wd = S.backtest, S.learner, S.window
        a, b = rng
        for c0 in range(a, b, bt.chunk_bars):
            c1 = min(b, c0 + bt.chunk_bars)
            rows = (c1 - c0) * N_POS
            K_bt.enumerate_positions_kernel[_gs(self.device, rows * S.shape.obs_dim, self.tpb) + (st,)](
                wd.features[c0:c1], c1 - c0, wd.n_features, N_POS, bt.obs)
            S.nets.backtest.forward(params, bt.obs)
            if q_out is not None:
                q_out.append(S.nets.backtest.q[:rows].copy_to_host(stream=st))
            K_act.eps_greedy_kernel[_grid(rows, self.tpb) + (st,)](S.nets.backtest.q, 3, lr.branch_sizes,
                                                                   lr.branch_offsets, bt.eps0, 0, 0, bt.zero_step,
                                                                   bt.greedy[c0 * N_POS:c1 * N_POS], bt.joint, rows)
        K_bt.greedy_backtest_kernel[1, 32, st](wd.open, wd.high, wd.low, wd.close, wd.roll, bt.greedy, dev_range[0],
                                               dev_range[1], N_POS, MAX_POS, sp.point_value, sp.tick_size,
                                               sp.slippage_ticks, sp.commission_per_side, sp.commission_bps,
                                               bt.position, bt.pnl, 1)

    def _validate(self, st) -> None:
        w, S = self.w, self.state
        self._backtest(st, S.learner.params, w.val, S.window.val_range)
        K_ro.validation_stats_kernel[1, 1, st](S.backtest.pnl, S.window.day, w.val[0], w.val[1], S.backtest.val_stats)

    # ---------------------------------------------------------------- the fold
    def allocate(self, w: Window, window=None) -> None:
        """Init without capture: allocate and upload the state, load the kernels, reset the envs (all
        enqueued on this trainer's stream). A population captures its agents' work together after this;
        its agents on one window share its upload (``window``: another agent's ``state.window``)."""
        d = self.device
        self.w = w
        t0 = time.perf_counter()
        self.state = alloc_state(d, self.gemm, self.profile, self.cfg, w, self.seed, self.norm_blocks, window)
        d.synchronize()
        t1 = time.perf_counter()
        sh = self.state.shape
        self.loss_kernel = K_c51.head_loss_kernel(sh.atoms, sh.branch_sizes)  # declared before the loading
        self.kernels_loaded = 0 if d.simulator else load_kernels()  # compiled or cached, loaded, none launched
        t2 = time.perf_counter()
        self._reset_envs(d.stream)  # the envs' first reset (every env starts with done = 1)
        self.init_breakdown_ms = {"allocate_upload": (t1 - t0) * 1e3, "load_kernels": (t2 - t1) * 1e3}

    def prepare(self, w: Window) -> Graphs:
        """The init phase: :meth:`allocate`, then capture this trainer's graphs."""
        d = self.device
        self.allocate(w)
        self.use_side()  # where the trainer was given a side stream: its update's independent work beside
        t2 = time.perf_counter()
        self.graphs = Graphs(experience=d.capture_loops([self.experience_loop()]),
                             update=d.capture_loops([self.update_loop()]) if self.cfg.max_steps_per_epoch else None,
                             validation=d.capture(self._validate))
        d.synchronize()
        self.init_breakdown_ms["capture"] = (time.perf_counter() - t2) * 1e3
        return self.graphs

    # the phases' loops, as branches of this trainer's (or its population's) loop graph
    def experience_loop(self) -> Loop:
        """The experience phase: the epoch's epsilon copied in, the rollout's env steps, then its
        transitions into the replay ring."""
        return Loop(self.device, self._experience_step, self.state.rollout.steps,
                    head=self.state.envs.eps_slot.enqueue, tail=self._finish_rollout)

    def update_loop(self) -> Loop:
        """The training phase: ``max_steps_per_epoch`` updates, ending early when the guard trips."""
        return Loop(self.device, self.enqueue_update, self.cfg.max_steps_per_epoch, guard=self.state.learner.guard,
                    steps=self.update_steps)

    def train_fold(self, w: Window, on_epoch=None, test: bool = True) -> FoldTrainResult:
        """Train on the fold (the shared epoch loop, :func:`workbench.agent.loop.run_fold`); ``test=False``
        (the search) never backtests the test range."""
        return run_fold(self, self.cfg, w, on_epoch, test)

    # ---------------------------------------------------------------- the phases run_fold drives
    def setup(self, w: Window) -> None:
        self.prepare(w)
        self.readback = Readback(self.device, self.readback_sources())

    def readback_sources(self) -> dict:
        """The device scalars an epoch reads back (in one sync): update statistics, guard, validation
        statistics, replay fill, bad priority indices."""
        S = self.state
        return {"stats": S.learner.stats, "guard": S.learner.guard, "val": S.backtest.val_stats,
                "size": S.replay.size, "bad": S.replay.bad}

    def _copy(self, pairs) -> None:
        st = self.device.stream
        for src, dst in pairs:
            dst.copy_to_device(src, stream=st)

    def snapshot(self) -> None:
        lr = self.state.learner
        self._copy(((lr.params, lr.snap_params), (lr.target, lr.snap_target), (lr.m, lr.snap_m), (lr.v, lr.snap_v)))
        K_opt.fill_kernel[1, 32, self.device.stream](lr.stats, 0.0)

    def restore(self) -> None:
        lr = self.state.learner
        self._copy(((lr.snap_params, lr.params), (lr.snap_target, lr.target), (lr.snap_m, lr.m), (lr.snap_v, lr.v)))
        lr.refresh16(self.device)
        lr.guard.copy_to_device(np.zeros(1, np.int32), stream=self.device.stream)

    def experience(self, eps: float) -> None:
        self.state.envs.eps_slot.value[0] = eps  # copied in by the experience graph's first node
        self.ev = [self.device.event().record()]
        self.graphs.experience.launch()
        self.ev.append(self.device.event().record())

    def updates_in(self, epoch: int) -> int:
        """Updates of ``epoch`` (from 0): none until the replay holds ``learning_starts`` transitions
        (its fill is known on the host: a rollout adds n_envs * rollout_steps); fewer on the device when
        the guard trips."""
        cfg = self.cfg
        size_now = min(self.state.replay.capacity, (epoch + 1) * self.state.envs.n * cfg.rollout_steps)
        return cfg.max_steps_per_epoch if size_now >= cfg.learning_starts and cfg.max_steps_per_epoch > 0 else 0

    def train(self, epoch: int) -> None:
        if self.updates_in(epoch):
            self.graphs.update.launch()
        self.ev.append(self.device.event().record())

    def validate(self) -> None:
        self.graphs.validation.replay(1)
        self.ev.append(self.device.event().record())

    def end_epoch(self, epoch: int) -> EpochStats:
        r = self.last = self.readback.read()  # the epoch's one host sync
        ev = self.ev
        ms = {"experience": ev[0].elapsed_ms(ev[1]), "training": ev[1].elapsed_ms(ev[2]),
              "validation": ev[2].elapsed_ms(ev[3])}
        extra = {"init_breakdown_ms": self.init_breakdown_ms} if epoch == 0 else {}
        return epoch_stats(r, ms, extra)

    def keep(self) -> None:
        lr = self.state.learner
        lr.best.copy_to_device(lr.params, stream=self.device.stream)

    def kept(self) -> np.ndarray:
        """The kept weights in the host layout (:func:`~workbench.agent.network.relayout`)."""
        self.device.synchronize()  # keep() copied on this (non-blocking) stream; the copy back does not wait on it
        return self.host_layout(self.state.learner.best.copy_to_host())

    def host_layout(self, flat: np.ndarray) -> np.ndarray:
        """A flat device parameter (or gradient) buffer, copied back, in the host layout."""
        sh = self.state.shape
        return relayout(flat, sh, sh.host)

    def _backtest_kept(self, rng: tuple[int, int], dev_range, q_out: list | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Backtest bars [a, b) with the kept weights; (position, pnl) of those bars, back on the host."""
        d, bt = self.device, self.state.backtest
        self._backtest(d.stream, self.state.learner.best, rng, dev_range, q_out)
        d.synchronize()
        a, b = rng
        return bt.position.copy_to_host()[a:b], bt.pnl.copy_to_host()[a:b].copy()

    def val_pnl(self) -> np.ndarray:
        """Per-bar validation PnL (USD) of the kept weights: the search's overfitting statistics read it."""
        return self._backtest_kept(self.w.val, self.state.window.val_range)[1]

    def test(self):
        w = self.w
        chunks: list = []
        pos, pnl = self._backtest_kept(w.test, self.state.window.test_range, chunks)  # fold end: back once
        a, b = w.test
        greedy = self.state.backtest.greedy.copy_to_host().reshape(-1, N_POS, 3)[a:b]
        q = np.concatenate(chunks).reshape(b - a, N_POS, -1)
        return pos, pnl, greedy[np.arange(b - a), np.clip(pos + MAX_POS, 0, N_POS - 1)], q

    def backend_name(self, test: bool) -> str:
        return f"gpu:{self.device.info.name}:{getattr(self.gemm, 'name', 'gemm')}" if test else "gpu"

    def counters(self) -> dict:
        return {"replay_capacity": self.state.replay.capacity, "bad_priority_indices": int(self.last["bad"][0])}
