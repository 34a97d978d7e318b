"""Proportional prioritised replay (Schaul et al. 2016) on the device: sampling, weights, updates, insertion.

Kernel-side only (NumPy/Numba). Sizes, counters and hyper-parameters are arguments; running state that
changes between graph replays (fill count, write pointer, step, max priority) lives in small device arrays.

- Sampling is stratified: sample i draws u from Philox at counter (i, step, TAG_PER) and looks for
  ``(i + u) * total / batch`` in the inclusive prefix sum of priorities (a search of the scan's three
  levels, :mod:`cuda_kernels.scan`). The total is read from device memory (the prefix at
  ``size - 1``), never from the host.
- Importance weights ``(size * p_i / total) ** -beta``, divided by the batch maximum (by the draw's
  last block to finish).
- Priority update, one block: ``(|td| + eps) ** alpha``. Indices outside ``[0, capacity)`` are skipped
  and counted in ``bad_count``. When a batch holds an index twice, the sample with the highest batch
  position wins (claimed with an integer atomic max), so the result does not depend on thread order.
"""
from __future__ import annotations

import numpy as np

from .nb import (VOTE, cuda, device_function, first_lane, float32, float64, fold_to_warp, int32, int64, kernel,
                 last_to_arrive, uint32, void, warp_max)
from .nb import U, grid_wait
from .philox import uniform4_dev
from .scan import HELD, SUB, load_sub, prefix_dev, sub_base_dev, sub_value

TAG_PER = 0x5045


def sample_launch(batch: int) -> tuple[int, int]:
    """(grid, block) of ``per_sample_kernel``: a warp per sample, four warps a block (in the simulator,
    which runs every thread in Python, ``VOTE`` = 8 lanes a sample: an eight-ary search, the same draws)."""
    tpb = 4 * VOTE
    return (batch * VOTE + tpb - 1) // tpb, tpb


@device_function
def _levels(span, lanes):
    """Levels of a ``lanes``-ary search over ``span`` candidates (each level divides the span by ``lanes``)."""
    k = 0
    while span > 1:
        span = (span + lanes - 1) // lanes
        k += 1
    return k


@device_function
def _first_above(level, lo, hi, span, base, thr, lane, lanes, levels):
    """The first index in [lo, hi) whose ``base + level[index]`` exceeds ``thr``, ``hi`` when none does (what a
    binary search over a non-decreasing level gives): a ``lanes``-ary search, one load a lane a level,
    each level keeping the chunk of the first lane whose chunk ends at or after the answer
    (``first_lane``; the last chunk ends where the span does, at an index known to be at or after it,
    so some lane always finds it). [lo, lo + span) holds [lo, hi]; every lane of the block runs
    ``levels`` levels (``_levels(span, lanes)``, the same in every warp, as the simulator's vote needs)."""
    for _ in range(levels):
        step = (span + lanes - 1) // lanes
        idx = min(lo + (lane + 1) * step, lo + span) - 1  # the last lane's chunk ends where the span does
        hit = idx >= hi
        if not hit:
            hit = base + level[U(idx)] > thr
        f = first_lane(hit)
        lo += f * step
        span = step
    return lo


@device_function
def draw_dev(prio, sub, tiles, subs_per_tile, n, batch, beta, k0, k1, step, i, lane, lanes):
    """Sample i's replay slot (int64) and importance weight (float32, before its division by the batch's
    largest), found by the ``lanes`` lanes of its warp together and returned to each of them; (0, 0) when
    the ring is empty (``n`` <= 0). Every lane of the block calls it (``first_lane`` votes); lanes of a
    sample past the batch search too and their results are not used.

    The sample's threshold is ``(i + u) * total / batch`` (u from Philox at counter (i, step, TAG_PER)).
    It looks for the first slot whose prefix sum exceeds it level by level: the first tile whose scanned
    total does, then the first sub-tile of that tile whose prefix does (``_first_above``: 32-ary
    searches, two levels each at the reference replay, one load a lane a level, where the binary
    searches made eight and seven dependent loads), then the sub-tile's 32 priorities added left to
    right (on a GPU lane k loads priority k and every lane reads them in order by shuffles,
    :func:`cuda_kernels.scan.sub_value`; every lane adds them: the same instructions for the warp as
    one lane, and every lane has the slot). Where rounding makes two levels disagree by an ulp at a boundary, the last
    candidate of the level below is taken; the weight is that slot's own priority."""
    if n <= 0:
        return int64(0), float32(0.0)
    vals = cuda.local.array(HELD, float32)
    total = prefix_dev(prio, sub, tiles, subs_per_tile, n - 1, lane)
    u, _a, _b, _c = uniform4_dev(i, step, TAG_PER, k0, k1)
    thr = (float64(i) + float64(u)) * total / float64(batch)
    last_sub = (n - 1) // SUB
    n_tile = last_sub // subs_per_tile + 1
    t = _first_above(tiles, 0, n_tile - 1, n_tile, 0.0, thr, lane, lanes, _levels(n_tile, lanes))
    base = tiles[U(t - 1)] if t > 0 else 0.0
    lo = t * subs_per_tile
    si = _first_above(sub, lo, min(lo + subs_per_tile - 1, last_sub), subs_per_tile, base, thr, lane, lanes,
                      _levels(subs_per_tile, lanes))
    first = si * SUB
    load_sub(prio, first, n, lane, vals)  # the sub-tile's priorities, loaded before they are added
    run = sub_base_dev(sub, tiles, subs_per_tile, si)
    j = min(first + SUB, n) - 1
    found = False
    for k in range(SUB):
        run += float64(sub_value(vals, k))
        if not found and run > thr and first + k < n:
            j = first + k
            found = True
    p = float64(prio[U(j)])
    return j, float32((float64(n) * p / total) ** (-float64(beta))) if p > 0 else float32(0.0)


@device_function
def draw_step_dev(step_arr, guard):
    """The update counter a draw uses: ``step_arr[0]`` advanced by one unless ``guard[0]`` is set (after a trip
    an update changes nothing that lasts). Every block reads it before the last one stores it
    (``finish_draw_dev``)."""
    return step_arr[0] + (1 if guard[0] == 0 else 0)


@device_function
def finish_draw_dev(step_arr, step, out_w, batch, arrivals, s, last):
    """The draw's last block to finish (``arrivals``: int32 [1], :func:`cuda_kernels.nb.last_to_arrive`)
    stores the advanced update counter and divides the weights by their largest (``s``: float32 [>=
    blockDim] shared, ``last``: int32 [1] shared). Every thread of every block calls it."""
    if last_to_arrive(arrivals, 0, cuda.gridDim.x, last):
        if cuda.threadIdx.x == 0:
            step_arr[0] = step
        _normalize_dev(out_w, batch, s, cuda.threadIdx.x, cuda.blockDim.x)


@kernel(void(float32[::1], float64[::1], float64[::1], int64, int64[::1], int64, float32, uint32, uint32, int64[::1],
             int32[::1], int64[::1], float32[::1], int32[::1]))
def per_sample_kernel(prio, sub, tiles, subs_per_tile, size_arr, batch, beta, k0, k1, step_arr, guard, out_idx, out_w,
                      arrivals):
    """The PER draw: a warp per sample (``draw_dev``), launched by ``sample_launch``.

    prio: float32 [capacity], zero past the fill; sub, tiles: its scan's upper levels
    (:func:`cuda_kernels.scan.launch_scan`, ``subs_per_tile``); size_arr: int64 [1]; step_arr: int64 [1],
    the update counter, advanced by one here unless ``guard[0]`` (int32 [1], the training guard) is set
    (after a trip an update changes nothing that lasts): the draw uses the advanced value, and the last
    block to finish stores it; out_idx: int64 [batch]; out_w: float32 [batch], the importance weights
    divided by the batch's largest by that last block (``finish_draw_dev``). The trainer draws with
    :func:`cuda_kernels.rollout.draw_batch_kernel`, which also gathers the batch."""
    grid_wait()
    s = cuda.shared.array(1024, float32)
    last = cuda.shared.array(1, int32)
    g = cuda.grid(1)
    lane = g % VOTE
    i = g // VOTE
    step = draw_step_dev(step_arr, guard)
    j, w = draw_dev(prio, sub, tiles, subs_per_tile, size_arr[0], batch, beta, k0, k1, step, i, lane, VOTE)
    if i < batch and lane == 0:
        out_idx[i] = j
        out_w[i] = w
    finish_draw_dev(step_arr, step, out_w, batch, arrivals, s, last)


@device_function
def _normalize_dev(w, batch, s, tid, nt):
    """One block: divide the weights by their maximum (a maximum is exact in any order: the first warp
    finishes it, ``fold_to_warp`` and a shuffle tree, then every thread reads it from shared memory)."""
    m = float32(0.0)
    for i in range(tid, batch, nt):
        m = max(m, w[i])
    s[tid] = m
    cuda.syncthreads()
    top = warp_max(fold_to_warp(s, tid, nt, 1, float32(0.0)))
    if tid == 0:
        s[0] = top
    cuda.syncthreads()
    top = s[0]
    if top > 0:
        for i in range(tid, batch, nt):
            w[i] = w[i] / top


@kernel(void(float32[::1], int64[::1], float32[::1], int32[::1], int64, int64, float32, float32, float32[::1],
             int32[::1], int32[::1]))
def priority_update_kernel(prio, idx, td, owner, batch, capacity, alpha, eps, max_prio, guard, bad_count):
    """One block: the batch's new priorities ``(|td| + eps) ** alpha`` in three phases between block
    barriers. Claim: each index's owner is its highest batch position (an integer atomic max), so a
    duplicate's result does not depend on thread order; indices outside ``[0, capacity)`` are skipped
    and counted in ``bad_count`` (int32 [1]). Write: each owner writes its slot and raises ``max_prio``
    (float32 [1]), unless ``guard`` (int32 [1]) is non-zero (the training guard tripped, this update
    or an earlier one of the epoch: nothing is written, as on the CPU backend) or its loss is not
    finite (it must never poison the priorities). Release: the slots' owners back to -1.
    prio: float32 [capacity]; td: float32 [batch] (loss or |TD error|); owner: int32 [capacity]."""
    grid_wait()
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for i in range(tid, batch, nt):
        j = idx[i]
        if j < 0 or j >= capacity:
            cuda.atomic.add(bad_count, 0, 1)
        else:
            cuda.atomic.max(owner, j, i)
    cuda.syncthreads()
    if guard[0] == 0:
        for i in range(tid, batch, nt):
            j = idx[i]
            if 0 <= j < capacity and owner[j] == i and abs(td[i]) < 3.4e38:
                p = (abs(td[i]) + eps) ** alpha
                prio[j] = p
                cuda.atomic.max(max_prio, 0, p)
    cuda.syncthreads()
    for i in range(tid, batch, nt):
        j = idx[i]
        if 0 <= j < capacity:
            owner[j] = -1


@kernel(void(int32[:, ::1], float32[:, ::1], int32[:, ::1], float32[:, ::1], float32[::1], float32[::1],
               int64[::1], int64[::1], int64, int64))
def replay_insert_kernel(int_store, float_store, int_new, float_new, prio, max_prio, ptr_arr, size_arr, n_new, capacity):
    """Write n_new transitions at the ring position ``ptr_arr[0]``; each gets the current max priority."""
    grid_wait()
    j = cuda.grid(1)
    if j >= n_new:
        return
    slot = (ptr_arr[0] + j) % capacity
    for c in range(int_store.shape[1]):
        int_store[slot, c] = int_new[j, c]
    for c in range(float_store.shape[1]):
        float_store[slot, c] = float_new[j, c]
    prio[slot] = max_prio[0]


@kernel(void(int64[::1], int64[::1], int64, int64))
def replay_advance_kernel(ptr_arr, size_arr, n_new, capacity):
    """One thread, launched after the insert: move the write pointer and grow the fill count."""
    grid_wait()
    if cuda.grid(1) == 0:
        ptr_arr[0] = (ptr_arr[0] + n_new) % capacity
        size_arr[0] = min(size_arr[0] + n_new, capacity)


# ---- NumPy references ----

def per_sample_ref(prio: np.ndarray, size: int, batch: int, beta: float, k0: int, k1: int, step: int):
    from .philox import uniforms4_ref

    cumsum = np.cumsum(prio[:size].astype(np.float64))
    total = cumsum[-1]
    u = uniforms4_ref(batch, step, TAG_PER, k0, k1)[:, 0]
    thr = (np.arange(batch) + u.astype(np.float64)) * total / batch
    idx = np.minimum(np.searchsorted(cumsum, thr, side="right"), size - 1)
    p = cumsum[idx] - np.where(idx > 0, cumsum[np.maximum(idx - 1, 0)], 0.0)
    w = (size * p / total) ** (-beta)
    return idx.astype(np.int64), (w / w.max()).astype(np.float32)


def priority_update_ref(prio: np.ndarray, idx: np.ndarray, td: np.ndarray, alpha: float, eps: float,
                        out: np.ndarray | None = None):
    """``prio`` with the batch's new priorities (``out``: written there, e.g. ``prio`` itself, where the
    caller keeps no copy; a new array by default) and the count of out-of-range indices."""
    if out is None:
        out = prio.copy()
    elif out is not prio:
        out[...] = prio
    for i in range(len(idx)):  # later batch positions win, as in the kernel
        if 0 <= idx[i] < len(prio):
            out[idx[i]] = (abs(td[i]) + eps) ** alpha
    bad = int(np.sum((idx < 0) | (idx >= len(prio))))
    return out, bad
