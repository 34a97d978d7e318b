"""Optimiser kernels over one flat float32 parameter buffer: global grad norm + clip + the training
guard, Adam with the target's Polyak/EMA average.

Kernel-side only (NumPy/Numba). The gradient norm is deterministic: a fixed grid of blocks each sums a
fixed strided subset in a fixed order, then the last block to finish reduces the partial sums in a
tree; no float atomics. The clip scale, the Adam step count and the learning rate are read from device arrays, so a
captured graph picks up their current values on every replay.
"""
from __future__ import annotations

import math

import numpy as np

from .bf16 import to_bf16
from .nb import (WARP, cuda, device_function, float32, float64, fold_to_warp, int32, int64, kernel, last_to_arrive,
                 uint16, void, warp_max, U, grid_wait, warp_sum, warp_sum64)

# The gradient norm's launch shape (bench/tail_probe.py, H100, 535K parameters): 128 blocks of 256 threads
# took 8.65 us alone and 1.09 us per agent in 16 lanes, against 12.73 and 6.52 for 256 blocks of 1024
# (four times fewer block barriers a level, half the blocks to wait for); the float32 norm the same.
NORM_BLOCKS = 128
NORM_THREADS = 256


@kernel(void(float32[::1], int64, float64[::1], int32[::1], float32, float32[::1], float32[::1], float32[::1], int64,
             float32[:, ::1], int64, float32, int32[::1], float32[::1]))
def grad_norm_guard_kernel(g, n, partials, arrivals, max_norm, clip, loss, is_w, B, q, n_q, q_limit, guard, stats):
    """The gradient norm, its clip scale and the training guard in one launch (power-of-two threads, at
    least a warp's width).

    Block b sums g[i]^2 over its strided subset into ``partials[b]`` (float64 [gridDim]); the last block
    to finish (``arrivals``: int32 [1], :func:`cuda_kernels.nb.last_to_arrive`) adds the partial sums
    into ``clip`` (float32 [2]: the global norm and the clip scale <= 1), then runs the guard over the
    batch's loss, importance weights and |Q|: it trips ``guard`` when the weighted batch loss or the
    grad norm is not finite or |Q| exceeds ``q_limit``; otherwise it adds the step's weighted loss and
    grad norm to ``stats`` (float32 [4]: loss sum, grad-norm sum, steps, max |Q|; slots:
    :class:`cuda_kernels.slots.UpdateStats`). Every sum is a tree over the block's threads in a fixed
    order (no float atomics: deterministic): its levels down to the warp's width in shared memory, the
    rest in the first warp's shuffles (``fold_to_warp``), the additions of a shared-memory tree in its
    order with half its barriers. The last block loads the partial sums, the loss and |Q| together and
    runs their three trees side by side (one barrier a level for all three)."""
    grid_wait()
    s = cuda.shared.array(1024, float64)
    s_l = cuda.shared.array(1024, float32)
    s_q = cuda.shared.array(1024, float32)
    last = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    acc = 0.0
    for i in range(cuda.blockIdx.x * nt + tid, n, cuda.gridDim.x * nt):
        v = float64(g[i])
        acc += v * v
    s[tid] = acc
    cuda.syncthreads()
    total = warp_sum64(fold_to_warp(s, tid, nt, 0, 0.0))
    if tid == 0:
        partials[cuda.blockIdx.x] = total
    if not last_to_arrive(arrivals, 0, cuda.gridDim.x, last):
        return
    acc = 0.0
    for i in range(tid, cuda.gridDim.x, nt):
        acc += partials[i]
    lw = float32(0.0)
    for i in range(tid, B, nt):
        lw += is_w[i] * loss[i]
    qm = float32(0.0)
    for i in range(tid, n_q, nt):
        for j in range(q.shape[1]):
            qm = max(qm, abs(q[i, j]))
            if q[i, j] != q[i, j]:
                qm = float32(3.4e38)
    s[tid] = acc  # every thread read its slot of the partials' tree before last_to_arrive's barriers
    s_l[tid] = lw
    s_q[tid] = qm
    cuda.syncthreads()
    half = nt // 2
    while half >= WARP:  # the three trees' upper levels side by side (fold_to_warp's, one barrier a level)
        if tid < half:
            s[tid] += s[tid + half]
            s_l[tid] += s_l[tid + half]
            s_q[tid] = max(s_q[tid], s_q[tid + half])
        cuda.syncthreads()
        half //= 2
    first = tid < WARP
    sq = warp_sum64(s[tid] if first else 0.0)
    lsum = warp_sum(s_l[tid] if first else float32(0.0))
    qmax = warp_max(s_q[tid] if first else float32(0.0))
    if tid == 0:
        norm = sq ** 0.5
        n32 = float32(norm)
        clip[0] = n32
        clip[1] = float32(min(1.0, float64(max_norm) / (norm + 1e-6))) if max_norm > 0 else float32(1.0)
        mean_loss = lsum / B
        bad = not (abs(mean_loss) < 3.4e38) or not (abs(n32) < 3.4e38) or qmax > q_limit
        if bad:
            guard[0] = 1
        elif guard[0] == 0:
            stats[0] += mean_loss  # slots: cuda_kernels.slots.UpdateStats
            stats[1] += n32
            stats[2] += 1.0
            stats[3] = max(stats[3], qmax)


@kernel(void(int64[::1]))
def step_increment_kernel(step_arr):
    grid_wait()
    if cuda.grid(1) == 0:
        step_arr[0] += 1


@device_function
def _adam_scalars(step_arr, beta1, beta2, lr_arr, clip):
    """An Adam launch's scalars: the bias corrections ``1 - beta ** t`` (t = ``step_arr[0]``; two float64
    powers once a block, not once a thread, shared through shared memory: every thread of the block calls
    this), the learning rate and the gradient's clip scale."""
    bc = cuda.shared.array(2, float64)
    if cuda.threadIdx.x == 0:
        t = float64(step_arr[0])
        bc[0] = 1.0 - float64(beta1) ** t
        bc[1] = 1.0 - float64(beta2) ** t
    cuda.syncthreads()
    return bc[0], bc[1], float64(lr_arr[0]), clip[1]


@device_function
def _adam_element(p, g, m, v, target, i, scale, beta1, beta2, eps, weight_decay, lr, bc1, bc2, tau):
    """Adam on element ``i`` of the weights, then the target's Polyak average of it; returns the new
    weight and target (both also stored)."""
    gi = g[i] * scale
    mi = beta1 * m[i] + (float32(1.0) - beta1) * gi
    vi = beta2 * v[i] + (float32(1.0) - beta2) * gi * gi
    m[i] = mi
    v[i] = vi
    upd = (mi / bc1) / (math.sqrt(vi / bc2) + eps) + weight_decay * p[i]  # sqrt: not pow(x, 0.5)
    pi = float32(p[i] - lr * upd)
    p[i] = pi
    ti = (float32(1.0) - tau) * target[i] + tau * pi
    target[i] = ti
    return pi, ti


_ADAM_SIG = (float32[::1], float32[::1], float32[::1], float32[::1], int64, float32[::1], float32, float32, float32,
             float32, int64[::1], float32[::1], int32[::1], float32[::1], float32)


@kernel(void(*_ADAM_SIG))
def adam_kernel(p, g, m, v, n, lr_arr, beta1, beta2, eps, weight_decay, step_arr, clip, guard, target, tau):
    """Adam on the online weights, then the target's Polyak average of them, element by element.

    p, g, m, v, target: float32 [n]; lr_arr: float32 [1]; step_arr: int64 [1] (1-based, already
    incremented); clip: float32 [2] from ``grad_norm_guard_kernel`` (the scale is clip[1]); guard:
    int32 [1], when non-zero (the training guard tripped) nothing is updated. The target becomes
    ``(1 - tau) * target + tau * p`` with p the float32 weight just written (what a separate EMA pass
    after Adam reads), one pass over the weights instead of two. The square root is ``math.sqrt``
    (``sqrt.rn.f64``, correctly rounded): ``** 0.5`` compiled to a float64 ``pow`` call per element."""
    grid_wait()
    if guard[0] != 0:
        return
    bc1, bc2, lr, scale = _adam_scalars(step_arr, beta1, beta2, lr_arr, clip)
    for i0 in range(cuda.grid(1), n, cuda.gridsize(1)):
        i = U(i0)  # unsigned: no wraparound select on each of the nine accesses
        _adam_element(p, g, m, v, target, i, scale, beta1, beta2, eps, weight_decay, lr, bc1, bc2, tau)


@kernel(void(*_ADAM_SIG, uint16[::1], uint16[::1]))
def adam_bf16_kernel(p, g, m, v, n, lr_arr, beta1, beta2, eps, weight_decay, step_arr, clip, guard, target, tau,
                     p16, target16):
    """:func:`adam_kernel`, and the new weights and target rounded to bfloat16 into ``p16`` and ``target16``
    (uint16 [n]: the bfloat16 copies a bf16 network's GEMMs read, ``gpu.math = "bf16"``), in the same pass:
    the copies stay the float32 weights rounded, as converting them before each forward would make them."""
    grid_wait()
    if guard[0] != 0:
        return
    bc1, bc2, lr, scale = _adam_scalars(step_arr, beta1, beta2, lr_arr, clip)
    for i0 in range(cuda.grid(1), n, cuda.gridsize(1)):
        i = U(i0)
        pi, ti = _adam_element(p, g, m, v, target, i, scale, beta1, beta2, eps, weight_decay, lr, bc1, bc2, tau)
        p16[i] = to_bf16(pi)
        target16[i] = to_bf16(ti)


@kernel(void(float32[::1], float32))
def fill_kernel(arr, value):
    grid_wait()
    for i in range(cuda.grid(1), arr.shape[0], cuda.gridsize(1)):
        arr[i] = value


# ---- NumPy references ----

def grad_norm_ref(g: np.ndarray, max_norm: float) -> tuple[float, float]:
    norm = float(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
    return norm, (min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0)


def adam_ref(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step, scale):
    g = g.astype(np.float64) * scale
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    upd = (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + eps) + weight_decay * p
    return (p - lr * upd).astype(np.float32), m.astype(np.float32), v.astype(np.float32)


def ema_ref(target, online, tau):
    return ((1 - tau) * target + tau * online).astype(np.float32)
