"""The GPU trainer's device state, named: one small NamedTuple per part, each with its allocation function.

Every buffer the fold's graphs read or write is allocated here, once, before capture, and holds its
starting value when allocated (weights from :func:`~workbench.agent.network.init_params`, Adam state
and counters zero, every env due for a reset, every replay slot unowned, the maximum priority 1), so
nothing launched before the first epoch has to be undone. Graphs capture device addresses: these
buffers live as long as the trainer and are never reallocated.

Counters are int64[1] device arrays that kernels advance inside the graphs (a replayed graph cannot
take a new Python scalar): ``Learner.step`` counts updates (Adam's t, PER's Philox counter),
``Envs.step`` env steps (exploration and reset draws), ``Rollout.k`` the history column,
``Replay.ptr`` / ``Replay.size`` the ring's write pointer and fill.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cuda_kernels import rollout as K_ro
from cuda_kernels import scan as K_scan
from cuda_kernels.nb import cuda
from cuda_kernels.slots import ARR

from ..device import Device, HostSlot
from .network import DeviceNetwork, NetShape, init_params, to_bf16_copy
from .window import N_POS, Window

# rows the head's GEMMs read or write on the device (W3's and the head's): a multiple of 4 floats (16 bytes),
# so cuBLAS can use its vectorised and tensor-core kernels (network.NetShape.head_cols)
LAYOUT_ALIGN = 4
# the observations' rows (network.NetShape.obs_cols): not padded for now. Padded to 24 floats, every TF32 run
# on the H200 died of SIGFPE (2026-12-07): cuBLASLt's heuristic for W1's gradient planned for one SM, which
# cublaslt.sm_target no longer asks for (the padded layout then ran on the H100). Its speed, measured on the
# H100 (P = 32, TF32, 2026-12-07): +1.7 %, inside run-to-run noise, no first-layer gain: so not padded
OBS_ALIGN = 1
# bytes of replay memory per transition: both stores, priority, owner, its share of the sub-tile totals and
# of the prefix sum's levels
BYTES_PER_TRANSITION = K_ro.N_INT * 4 + K_ro.N_FLOAT * 4 + 4 + 4 + 16 / K_scan.SUB


class Mem:
    """Allocation on the device's stream: uploads, and arrays filled on the device (never inside a
    capture)."""

    def __init__(self, device: Device):
        self.device, self.stream = device, device.stream

    def up(self, x) -> object:
        return cuda.to_device(np.ascontiguousarray(x), stream=self.stream)

    def copy(self, src) -> object:
        """A new device array holding ``src``'s contents (a device-to-device copy on the stream)."""
        a = cuda.device_array(src.shape, src.dtype, stream=self.stream)
        a.copy_to_device(src, stream=self.stream)
        return a

    def zeros(self, shape, dtype) -> object:
        return self.full(shape, 0, dtype)

    def full(self, shape, value, dtype) -> object:
        a = cuda.device_array(shape, dtype, stream=self.stream)
        self.device.fill(a, value)
        return a


class WindowData(NamedTuple):
    """The fold's bars, uploaded once and resident for every epoch."""

    features: object      # float32 [T, F], normalised with the train range's statistics
    open: object          # float64 [T] each
    high: object
    low: object
    close: object
    roll: object          # int8 [T], 1 on a new contract's first bar
    day: object           # int32 [T], trading-day id
    val_range: tuple      # (start, stop) as int64[1] device arrays (the backtest kernel's range arguments)
    test_range: tuple

    @property
    def n_features(self) -> int:
        return self.features.shape[1]


def upload_window(mem: Mem, w: Window) -> WindowData:
    rng = lambda r: (mem.up(np.array([r[0]], np.int64)), mem.up(np.array([r[1]], np.int64)))  # noqa: E731
    return WindowData(mem.up(w.features), mem.up(w.open), mem.up(w.high), mem.up(w.low), mem.up(w.close),
                      mem.up(w.roll), mem.up(w.day), rng(w.val), rng(w.test))


class Learner(NamedTuple):
    """Network and optimiser: flat parameter buffers (layout :class:`NetShape`), their copies, Adam state,
    the update's scalars, and the guard."""

    params: object        # float32 [n_params], the online network (the device layout: NetShape.head_cols)
    target: object        # the target network (Polyak average of params)
    best: object          # the weights kept for the fold (epoch selection)
    grads: object
    m: object             # Adam's moments
    v: object
    snap_params: object   # the epoch's starting params, target and Adam state (the guard's restore)
    snap_target: object
    snap_m: object
    snap_v: object
    support: object       # float32 [atoms], the C51 support
    branch_sizes: object  # int32 [branches]
    branch_offsets: object
    lr: object            # float32 [1]
    step: object          # int64 [1], updates so far
    partials: object      # float64 [norm_blocks], the gradient norm's per-block partial sums
    clip: object          # float32 [2], (norm, clip scale) of this update
    guard: object         # int32 [1], 1 once a non-finite loss or |Q| over q_limit stopped the updates
    stats: object         # float32 [4], the epoch's update statistics (cuda_kernels.slots.STAT)
    arrivals: object      # int32 [len(ARR)], zero between launches (cuda_kernels.slots.ARR)
    norm_blocks: int
    # gpu.math = "bf16": params and target rounded to bfloat16 (uint16 [n_params]), what the update's and the
    # envs' networks read (DeviceNetwork's weights16); Adam and the EMA write them beside the float32 weights
    # (optim.adam_bf16_kernel), a restore converts them again (refresh16). None otherwise.
    params16: object = None
    target16: object = None

    def refresh16(self, device: Device) -> None:
        """The bfloat16 copies made from the float32 weights again (after anything but Adam wrote those)."""
        if self.params16 is not None:
            for src, dst in ((self.params, self.params16), (self.target, self.target16)):
                to_bf16_copy(src, dst, device.stream, device.simulator)

    def arrival(self, slot: int):
        """The one-slot view of ``arrivals`` a kernel counts its blocks in."""
        return self.arrivals[slot:slot + 1]


def alloc_learner(mem: Mem, shape: NetShape, cfg, seed: int, norm_blocks: int, bf16: bool = False) -> Learner:
    params = mem.up(init_params(shape, seed))
    z = lambda: mem.zeros(shape.n_params, np.float32)  # noqa: E731
    p0 = lambda: mem.copy(params)  # noqa: E731 - the starting weights copied on the device, not uploaded again
    u16 = lambda: cuda.device_array(shape.n_params, np.uint16, stream=mem.stream) if bf16 else None  # noqa: E731
    learner = Learner(params=params, target=p0(), best=p0(), grads=z(), m=z(), v=z(),
                    snap_params=p0(), snap_target=p0(), snap_m=z(), snap_v=z(),
                    support=mem.up(np.linspace(cfg.v_min, cfg.v_max, shape.atoms).astype(np.float32)),
                    branch_sizes=mem.up(np.array(shape.branch_sizes, np.int32)),
                    branch_offsets=mem.up(np.array(shape.branch_offsets, np.int32)),
                    lr=mem.up(np.array([cfg.lr], np.float32)), step=mem.zeros(1, np.int64),
                    partials=mem.zeros(norm_blocks, np.float64), clip=mem.zeros(2, np.float32),
                    guard=mem.zeros(1, np.int32), stats=mem.zeros(4, np.float32),
                    arrivals=mem.zeros(len(ARR), np.int32), norm_blocks=norm_blocks, params16=u16(), target16=u16())
    learner.refresh16(mem.device)
    return learner


class Replay(NamedTuple):
    """The prioritised replay ring: transitions as bar indices (``cuda_kernels.slots.RI`` / ``RF``)."""

    int_store: object     # int32 [capacity, N_INT]
    float_store: object   # float32 [capacity, N_FLOAT]
    prio: object          # float32 [capacity], 0 where empty
    totals: object        # float64 [n_subs], each 32-slot sub-tile's total (the full scan's, kept up by each update's)
    sub: object           # float64 [n_subs], the priorities' prefix sum of this update, per 32-slot sub-tile
    tiles: object         # float64 [n_tiles], the scan tiles' scanned totals (cuda_kernels.scan's levels)
    ptr: object           # int64 [1], next slot written
    size: object          # int64 [1], slots filled
    max_prio: object      # float32 [1], priority of new transitions
    owner: object         # int32 [capacity], -1, or the batch row writing the slot's priority
    bad: object           # int32 [1], out-of-range indices met by the priority update
    capacity: int
    scan_threads: int


def replay_capacity(device: Device, requested: int, vram_fraction: float, n_new: int) -> int:
    """``requested`` slots, at most ``vram_fraction`` of device memory, at least two rollouts."""
    cap = requested
    if device.info.total_memory:
        cap = min(cap, int(vram_fraction * device.info.total_memory / BYTES_PER_TRANSITION))
    return max(cap, 2 * n_new)


def alloc_replay(mem: Mem, capacity: int) -> Replay:
    d = mem.device
    threads = 32 if d.simulator else min(1024, d.info.max_threads_per_block)
    return Replay(int_store=mem.zeros((capacity, K_ro.N_INT), np.int32),
                  float_store=mem.zeros((capacity, K_ro.N_FLOAT), np.float32),
                  prio=mem.zeros(capacity, np.float32), totals=mem.zeros(K_scan.n_subs(capacity, threads), np.float64),
                  sub=mem.zeros(K_scan.n_subs(capacity, threads), np.float64),
                  tiles=mem.zeros(K_scan.n_tiles(capacity, threads), np.float64),
                  ptr=mem.zeros(1, np.int64), size=mem.zeros(1, np.int64), max_prio=mem.full(1, 1.0, np.float32),
                  owner=mem.full(capacity, -1, np.int32), bad=mem.zeros(1, np.int32), capacity=capacity,
                  scan_threads=threads)


class Envs(NamedTuple):
    """The training envs: one bar, position and episode end each, and their step's buffers."""

    t: object             # int64 [N], current bar
    end: object           # int64 [N], episode end (exclusive)
    pos: object           # int32 [N], contracts held (-max_pos .. max_pos)
    done: object          # float32 [N], 1 where the env resets before its next step
    obs: object           # float32 [N, obs_cols] (padding zero)
    actions: object       # int32 [N, 3]
    joint: object         # int32 [N]
    reward: object        # float32 [N]
    pnl: object           # float64 [N], USD
    eps: object           # float32 [1], exploration rate, fed by eps_slot inside the experience graph
    eps_slot: HostSlot
    step: object          # int64 [1], env steps so far
    n: int


def alloc_envs(mem: Mem, n: int, shape: NetShape, eps: float) -> Envs:
    eps_dev = mem.up(np.array([eps], np.float32))
    return Envs(t=mem.zeros(n, np.int64), end=mem.zeros(n, np.int64), pos=mem.zeros(n, np.int32),
                done=mem.full(n, 1.0, np.float32), obs=mem.zeros((n, shape.obs_cols), np.float32),
                actions=mem.zeros((n, 3), np.int32), joint=mem.zeros(n, np.int32), reward=mem.zeros(n, np.float32),
                pnl=mem.zeros(n, np.float64), eps=eps_dev, eps_slot=HostSlot(mem.device, eps_dev),
                step=mem.zeros(1, np.int64), n=n)


class Rollout(NamedTuple):
    """One rollout's history (``steps`` = rollout_steps + n_step - 1 columns) and the n-step
    transitions made from it before insertion."""

    k: object             # int64 [1], the column written by the next step
    t_hist: object        # int64 [N, steps + 1]
    pos_hist: object      # int32 [N, steps + 1], position indices
    act_hist: object      # int32 [N, steps, 3]
    rew_hist: object      # float32 [N, steps]
    done_hist: object     # float32 [N, steps]
    new_int: object       # int32 [N * rollout_steps, N_INT]
    new_float: object     # float32 [N * rollout_steps, N_FLOAT]
    new_count: object     # int64 [N * rollout_steps], 1 where a row was written
    steps: int
    emitted: int          # rollout_steps: transitions per env per rollout


def alloc_rollout(mem: Mem, n_envs: int, rollout_steps: int, n_step: int) -> Rollout:
    steps = rollout_steps + n_step - 1
    n_new = n_envs * rollout_steps
    return Rollout(k=mem.zeros(1, np.int64), t_hist=mem.zeros((n_envs, steps + 1), np.int64),
                   pos_hist=mem.zeros((n_envs, steps + 1), np.int32), act_hist=mem.zeros((n_envs, steps, 3), np.int32),
                   rew_hist=mem.zeros((n_envs, steps), np.float32), done_hist=mem.zeros((n_envs, steps), np.float32),
                   new_int=mem.zeros((n_new, K_ro.N_INT), np.int32), new_float=mem.zeros((n_new, K_ro.N_FLOAT), np.float32),
                   new_count=mem.zeros(n_new, np.int64), steps=steps, emitted=rollout_steps)


class Batch(NamedTuple):
    """One update's sampled batch and its loss."""

    idx: object           # int64 [B], replay slots
    isw: object           # float32 [B], importance weights (divided by their maximum)
    obs_pair: object      # float32 [2B, obs_cols], s over s' (the online network's one stacked forward; padding zero)
    actions: object       # int32 [B, 3]
    ret: object           # float32 [B], n-step return
    terminal: object      # float32 [B]
    dhead: object         # float32 [B, head_cols], the loss's gradient at the head (padding columns zero)
    loss: object          # float32 [B], per-sample cross-entropy
    size: int
    # uint16 [2B, obs_cols]: ``obs_pair`` in bfloat16 where the GEMMs read bfloat16 operands (gpu.math = "bf16";
    # else None), converted once per update after the draw (trainer._sample); the online and target networks'
    # forwards and the backward read it
    obs_pair16: object = None

    @property
    def obs(self):
        """float32 [B, obs_cols], s (rows of ``obs_pair``)."""
        return self.obs_pair[:self.size]

    @property
    def obs_next(self):
        """float32 [B, obs_cols], s'."""
        return self.obs_pair[self.size:]


def alloc_batch(mem: Mem, shape: NetShape, size: int, bf16: bool = False) -> Batch:
    pair16 = cuda.device_array((2 * size, shape.obs_cols), np.uint16, stream=mem.stream) if bf16 else None
    return Batch(obs_pair16=pair16,
                 idx=mem.zeros(size, np.int64), isw=mem.zeros(size, np.float32),
                 obs_pair=mem.zeros((2 * size, shape.obs_cols), np.float32),
                 actions=mem.zeros((size, 3), np.int32), ret=mem.zeros(size, np.float32),
                 terminal=mem.zeros(size, np.float32), dhead=mem.zeros((size, shape.head_cols), np.float32),
                 loss=mem.zeros(size, np.float32), size=size)


class Backtest(NamedTuple):
    """The position-enumerated greedy backtest: Q for every (bar, position) in chunks of bars."""

    obs: object           # float32 [chunk_bars * N_POS, obs_cols] (padding zero)
    greedy: object        # int32 [T * N_POS, 3], the greedy action of every (bar, position)
    joint: object         # int32 [chunk_bars * N_POS]
    eps0: object          # float32 [1], 0 (greedy)
    zero_step: object     # int64 [1]
    position: object      # int32 [T]
    pnl: object           # float64 [T], USD
    val_stats: object     # float64 [VAL_STATS], the validation statistics (cuda_kernels.rollout.VAL_*)
    chunk_bars: int


# Rows (bar x held position) of one backtest chunk's forward at most: its network workspace is ~6 KB a row at
# the reference shape, so 16,384 rows hold ~100 MB per agent where a 6,000-bar range in one chunk (42,000
# rows) held 250 MB; a chunk of 16,384 rows still fills the GPU's GEMMs, and validation is ~1 % of an epoch.
BACKTEST_ROWS = 16384


def backtest_chunk_bars(device: Device, w: Window) -> int:
    longest = max(w.val[1] - w.val[0], w.test[1] - w.test[0])  # the longest range ever backtested
    return max(1, min(longest, (8192 if device.simulator else BACKTEST_ROWS) // N_POS))


def alloc_backtest(mem: Mem, shape: NetShape, n_bars: int, chunk_bars: int) -> Backtest:
    rows = chunk_bars * N_POS
    return Backtest(obs=mem.zeros((rows, shape.obs_cols), np.float32), greedy=mem.zeros((n_bars * N_POS, 3), np.int32),
                    joint=mem.zeros(rows, np.int32), eps0=mem.zeros(1, np.float32), zero_step=mem.zeros(1, np.int64),
                    position=mem.zeros(n_bars, np.int32), pnl=mem.zeros(n_bars, np.float64),
                    val_stats=mem.zeros(K_ro.VAL_STATS, np.float64), chunk_bars=chunk_bars)


class Networks(NamedTuple):
    """Forward/backward workspaces, one per row count: the envs' step, the batch's s over its s' (the
    online network's one stacked forward: one GEMM of 2B rows where two of B ran, 1.6x faster with TF32
    on the H200), s' (target), and a backtest chunk."""

    env: DeviceNetwork
    online: DeviceNetwork
    t2: DeviceNetwork
    backtest: DeviceNetwork

    @property
    def s(self) -> DeviceNetwork:
        """The online network on s: the stacked forward's first half, what the backward pass differentiates."""
        return self.online.row_range(0, self.online.rows // 2)

    @property
    def s2(self) -> DeviceNetwork:
        """The online network on s' (the double-DQN action choice): the stacked forward's second half."""
        return self.online.row_range(self.online.rows // 2, self.online.rows)


def alloc_networks(device: Device, gemm, shape: NetShape, learner: Learner, n_envs: int, batch: Batch,
                   backtest_rows: int, fused: bool = False, bf16: bool = False) -> Networks:
    """The four networks' workspaces; ``fused``: their trunk's bias and ReLU inside the GEMMs where the
    GEMM backend can (cuBLASLt), the online network (the one that backpropagates, the only one with
    gradient workspaces) keeping ReLU masks for a fused backward
    (:attr:`~workbench.agent.network.DeviceNetwork.fuses_backward`). The update's two (online, target) run
    their heads in the loss's launch, so they hold no head outputs of their own; the envs' and the
    backtest's act on Q alone, so they keep no log-probabilities. ``bf16``: every network's GEMMs on
    bfloat16 operands (``gpu.math = "bf16"``: :class:`~workbench.agent.network.DeviceNetwork`), acting and
    backtesting too, so the policy evaluated computes as the one trained: the envs' and the update's networks
    read the learner's bfloat16 weights (``Learner.params16``, ``target16``) and the update's read the batch's
    bfloat16 observations (``Batch.obs_pair16``), the backtest's converts the weights it is given (the
    epoch's or the kept ones); the envs' and the backtest's networks convert their observations."""
    mk = lambda rows, **kw: DeviceNetwork(device, gemm, shape, rows, learner.support, fused, bf16=bf16,  # noqa: E731
                                          **kw)
    p16, t16 = (learner.params16, learner.target16) if bf16 else (None, None)
    B = batch.size
    pair, nxt = ((batch.obs_pair, batch.obs_pair16), (batch.obs_next, batch.obs_pair16[B:])) if bf16 else (None, None)
    return Networks(env=mk(n_envs, logp=False, backward=False, weights16=p16),
                    online=mk(2 * B, masks=True, head=False, weights16=p16, obs16=pair),
                    t2=mk(B, head=False, backward=False, weights16=t16, obs16=nxt),
                    backtest=mk(backtest_rows, logp=False, backward=False))


class DeviceState(NamedTuple):
    """Everything one fold's training holds on the device."""

    window: WindowData
    learner: Learner
    replay: Replay
    envs: Envs
    rollout: Rollout
    batch: Batch
    backtest: Backtest
    nets: Networks
    shape: NetShape


def alloc_state(device: Device, gemm, profile, cfg, w: Window, seed: int, norm_blocks: int,
                window: WindowData | None = None) -> DeviceState:
    """Allocate and upload a fold's whole device state, every buffer at its starting value; ``window``: the
    fold's bars already on the device (another agent's upload of the same window: kernels only read them)."""
    mem = Mem(device)
    shape = NetShape(obs_dim=w.n_features + N_POS, hidden=profile.hidden, atoms=profile.atoms, align=LAYOUT_ALIGN,
                     obs_align=OBS_ALIGN)
    bf16 = profile.math == "bf16"
    learner = alloc_learner(mem, shape, cfg, seed, norm_blocks, bf16)
    n_new = profile.n_envs * cfg.rollout_steps
    chunk = backtest_chunk_bars(device, w)
    batch = alloc_batch(mem, shape, profile.batch, bf16)
    return DeviceState(
        window=window if window is not None else upload_window(mem, w), learner=learner,
        replay=alloc_replay(mem, replay_capacity(device, cfg.replay_capacity, profile.replay_vram_fraction, n_new)),
        envs=alloc_envs(mem, profile.n_envs, shape, cfg.eps_start),
        rollout=alloc_rollout(mem, profile.n_envs, cfg.rollout_steps, cfg.n_step),
        batch=batch, backtest=alloc_backtest(mem, shape, w.n_bars, chunk),
        nets=alloc_networks(device, gemm, shape, learner, profile.n_envs, batch, chunk * N_POS,
                            profile.fused_epilogues, bf16), shape=shape)
