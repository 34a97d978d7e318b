"""Prefix sums of float32 priorities in float64, for any N, in one launch, as three levels.

Kernel-side only (NumPy/Numba). Block b takes tile b of ``tile_len = blockDim * ITEMS`` elements and
writes, for each of its sub-tiles of ``SUB`` adjacent elements, the inclusive prefix sum of the
sub-tile totals within the tile (``sub``: one float64 per 32 priorities, 256 KB per million) and the
tile's total; the last block to finish scans the tile totals in place (``tiles``). The prefix sum of
element ``i`` is then ``tiles[t - 1] + sub[s - 1]`` (the tile before's, the sub-tiles before i's in
its tile; either term absent at the start of a tile or of the series) plus the priorities of i's
sub-tile up to i, added left to right: :func:`prefix_dev` on the device, :func:`three_level_ref` on
the host. The PER sampler searches the three levels in turn (:mod:`cuda_kernels.per`), so the
element level is never written: the scan moves 4 MB of priorities per million and writes 256 KB
where a scan of every element wrote 8 MB more. Every addition's order is fixed by the block size
(a launch parameter, a multiple of ``SUB // ITEMS``, at most 1024): deterministic.

The full scan also keeps every sub-tile's total (``totals``). Between two updates only the slots the
update's batch drew change, so an update's scan (:func:`rescan_kernel`) recomputes the totals of the
sub-tiles those slots fall in, from the priorities and in the full scan's additions, and scans the
sub-tile totals: 256 KB read per million priorities where the full scan reads 4 MB, and levels bit
for bit the full scan's of the same priorities. Whatever else writes priorities (the replay's
insertion) is followed by a full scan.
"""
from __future__ import annotations

import numpy as np

from .nb import FULL_MASK, VOTE, cuda, device_function, kernel, float32, float64, int32, int64, last_to_arrive, void
from .nb import U, grid_wait

ITEMS = 4
SUB = 32  # priorities per sub-tile: the sampler's last level reads one sub-tile's priorities
PER_SUB = SUB // ITEMS  # threads per sub-tile
MAX_THREADS = 1024
MAX_SUBS = MAX_THREADS // PER_SUB  # sub-tiles of the largest tile


@kernel(void(float32[::1], float64[::1], float64[::1], float64[::1], int64, int64[::1], int32[::1]))
def scan_kernel(x, totals, sub, tile_sums, n, fill, arrivals):
    """x: float32 [n]; totals: float64 [n_tiles * subs_per_tile], each sub-tile's total (what
    :func:`rescan_kernel` starts from); sub: float64 [n_tiles * subs_per_tile], each sub-tile's inclusive prefix of
    sub-tile totals within its tile; tile_sums: float64 [n_tiles], each tile's total, then (by the last
    block to finish: ``arrivals``, int32 [1], :func:`cuda_kernels.nb.last_to_arrive`) their inclusive
    scan in place. Elements at or past ``fill[0]`` (int64 [1]: a ring's filled slots, read when the
    launch runs) count as zero and are not read: a ring filling up is scanned only as far as it holds,
    and a block whose tile is all past it writes its zeros and does nothing else.

    Each thread adds its ``ITEMS`` adjacent elements (read straight from global memory: the warp's
    four loads cover its 512 bytes once between them), the first ``PER_SUB``-th of the threads a
    sub-tile's ``PER_SUB`` thread sums, left to right; the sub-tile totals are scanned in a
    Hillis-Steele pattern between two buffers (``_steps_dev``), one barrier a step."""
    grid_wait()
    ys = cuda.shared.array(MAX_THREADS, float64)
    ys2 = cuda.shared.array(MAX_THREADS, float64)  # the tile totals' scan: its second buffer
    za = cuda.shared.array(MAX_SUBS, float64)
    zb = cuda.shared.array(MAX_SUBS, float64)
    last = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    n_sub = nt // PER_SUB
    blk = cuda.blockIdx.x
    tile0 = blk * nt * ITEMS
    live = min(n, fill[0])
    if tile0 >= live:  # an empty tile: its levels are zeros (what summing its zeros gives)
        if tid < n_sub:
            sub[blk * n_sub + tid] = 0.0
            totals[blk * n_sub + tid] = 0.0
        if tid == 0:
            tile_sums[blk] = 0.0
    else:
        acc = float64(0.0)  # explicit: the simulator would keep float32 + 0.0 in float32
        first = tile0 + tid * ITEMS
        for j in range(ITEMS):  # this thread's ITEMS adjacent elements, left to right
            if first + j < live:
                acc += float64(x[first + j])
        ys[tid] = acc
        cuda.syncthreads()
        if tid < n_sub:  # sub-tile tid's total: its PER_SUB threads' sums, left to right
            total = float64(0.0)
            for j in range(PER_SUB):
                total += ys[tid * PER_SUB + j]
            za[tid] = total
            totals[blk * n_sub + tid] = total
        cuda.syncthreads()
        src = _steps_dev(za, zb, tid, tid, n_sub, tid < n_sub)
        if tid < n_sub:
            v = za[tid] if src == 0 else zb[tid]
            sub[blk * n_sub + tid] = v
            if tid == n_sub - 1:
                tile_sums[blk] = v
    if last_to_arrive(arrivals, 0, cuda.gridDim.x, last):
        _scan_tile_sums_dev(tile_sums, cuda.gridDim.x, ys, ys2, tid, nt)


@device_function
def _steps_dev(a, b, tid, pos, width, active):
    """The steps of Hillis-Steele scans of segments of ``width`` elements between the shared buffers ``a``
    and ``b`` (step ``off``: element i adds element i - off of the step before where that is in its
    segment), one barrier a step, every thread of the block calling it; thread ``tid`` holds element
    ``tid``, at position ``pos`` of its segment (``tid`` itself for one segment), and the ``active``
    threads write. Returns which buffer holds the result: 0 ``a``, 1 ``b``."""
    off = 1
    src = 0
    while off < width:
        if active:
            if src == 0:
                b[tid] = a[tid] + (a[tid - off] if pos >= off else 0.0)
            else:
                a[tid] = b[tid] + (b[tid - off] if pos >= off else 0.0)
        cuda.syncthreads()
        src = 1 - src
        off *= 2
    return src


@device_function
def _scan_tile_sums_dev(tile_sums, n_tiles, s, s2, tid, nt):
    """In place, one block: inclusive scan of the tile totals, chunk by chunk of ``nt``, each a Hillis-Steele
    scan (``_steps_dev``) between the shared buffers ``s`` and ``s2`` (>= nt float64 each), one barrier a
    step. The last chunk stops once the step reaches its live count: the steps after add only zeros to
    its live elements, and the carry they would have completed is not used after it (a full chunk runs
    every step: the same sums as ever)."""
    carry = 0.0
    for start in range(0, n_tiles, nt):
        i = start + tid
        live = min(nt, n_tiles - start)
        s[tid] = tile_sums[i] if i < n_tiles else 0.0
        cuda.syncthreads()
        src = _steps_dev(s, s2, tid, tid, live, True)
        v = s[tid] if src == 0 else s2[tid]
        if i < n_tiles:
            tile_sums[i] = v + carry
        carry += s[nt - 1] if src == 0 else s2[nt - 1]
        cuda.syncthreads()


@kernel(void(float32[::1], int64[::1], int64, float64[::1], float64[::1], float64[::1], int64, int64[::1], int32[::1]))
def rescan_kernel(x, idx, n_idx, totals, sub, tile_sums, n, fill, arrivals):
    """The levels of :func:`scan_kernel` after the slots ``idx[0:n_idx)`` (int64: a batch's drawn slots;
    those outside ``[0, n)`` are skipped) changed their priorities, from ``totals`` (float64, every
    sub-tile's total as the last scan left it): bit for bit what a full scan of ``x`` writes, when no
    other slot changed since that scan. Launched by :func:`launch_rescan` with the full scan's block
    size: each thread owns one sub-tile, a block ``blockDim`` of them (whole tiles, ``blockDim //
    PER_SUB`` of them).

    Each block marks which of its sub-tiles hold a changed slot (a shared flag a sub-tile, set by
    whichever thread meets it: duplicates set it twice), recomputes their totals from ``x`` with the
    additions the full scan makes (``_sub_total_dev``) and stores them, then scans each tile's sub-tile
    totals as the full scan does (the same Hillis-Steele steps, each tile a segment of the block)
    and writes ``sub`` and the tile totals; the last block to finish scans the tile totals in place
    (``_scan_tile_sums_dev``, as the full scan's last block does)."""
    grid_wait()
    ys = cuda.shared.array(MAX_THREADS, float64)
    ys2 = cuda.shared.array(MAX_THREADS, float64)
    flag = cuda.shared.array(MAX_THREADS, int32)
    last = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    spt = nt // PER_SUB
    n_subs_all = totals.shape[0]
    s0 = cuda.blockIdx.x * nt
    si = s0 + tid
    flag[tid] = 0
    cuda.syncthreads()
    for i in range(tid, n_idx, nt):
        j = idx[i]
        if 0 <= j < n:
            r = j // SUB - s0
            if 0 <= r < nt:
                flag[r] = 1
    cuda.syncthreads()
    v = float64(0.0)
    if si < n_subs_all:
        if flag[tid] != 0:
            v = _sub_total_dev(x, si * SUB, min(n, fill[0]))
            totals[si] = v
        else:
            v = totals[si]
    ys[tid] = v
    cuda.syncthreads()
    src = _steps_dev(ys, ys2, tid, tid % spt, spt, True)
    v = ys[tid] if src == 0 else ys2[tid]
    if si < n_subs_all:
        sub[si] = v
        if tid % spt == spt - 1:
            tile_sums[si // spt] = v
    if last_to_arrive(arrivals, 0, cuda.gridDim.x, last):
        _scan_tile_sums_dev(tile_sums, n_subs_all // spt, ys, ys2, tid, nt)


@device_function
def _sub_total_dev(x, first, live):
    """The total of the sub-tile starting at ``first`` with the full scan's additions: ``PER_SUB`` sums of
    ``ITEMS`` adjacent elements, each left to right from 0.0, then those added left to right from 0.0;
    elements at or past ``live`` count as zero and are not read."""
    total = float64(0.0)
    for k in range(PER_SUB):
        acc = float64(0.0)
        for j in range(ITEMS):
            e = first + k * ITEMS + j
            if e < live:
                acc += float64(x[U(e)])
        total += acc
    return total


@device_function
def sub_base_dev(sub, tiles, subs_per_tile, si):
    """The prefix sum before sub-tile ``si``: the tile before's scanned total plus the sub-tiles before
    ``si`` in its tile (0.0 at the start of the series)."""
    t = si // subs_per_tile
    base = tiles[U(t - 1)] if t > 0 else 0.0
    if si % subs_per_tile > 0:
        base += sub[U(si - 1)]
    return base


@device_function
def prefix_dev(x, sub, tiles, subs_per_tile, i, lane):
    """The inclusive prefix sum at ``i`` from the three levels (what :func:`three_level_ref` reads): the
    sub-tile's priorities up to i added left to right (:func:`sub_value`: on a GPU lane k of the warp
    loads priority k). Every lane of the warp calls it, and gets the sum."""
    si = i // SUB
    first = si * SUB
    run = sub_base_dev(sub, tiles, subs_per_tile, si)
    vals = cuda.local.array(HELD, float32)
    load_sub(x, first, i + 1, lane, vals)
    for k in range(SUB):
        v = sub_value(vals, k)
        if first + k <= i:
            run += float64(v)
    return run


# A sub-tile's SUB priorities, read by every lane of a warp in order: on a GPU (a warp of SUB lanes) lane k
# loads priority k and the others read it by a shuffle, one value held a lane; in the simulator (Python
# threads, ``VOTE`` < SUB lanes a vote) each lane loads all SUB itself. The same values in the same order
# either way, so the same sums. Holding all 32 in each lane cost the PER draw 128 registers a thread
# (ptxas 13.0, sm_90), so a quarter of an SM's warps.
HELD = 1 if VOTE == SUB else SUB


@device_function
def load_sub(x, first, stop, lane, vals):
    """Into ``vals`` (local float32 [HELD]): the priorities of the sub-tile at ``first`` that this lane
    holds (0.0 at and past ``stop``)."""
    if HELD == 1:
        vals[0] = x[U(first + lane)] if first + lane < stop else float32(0.0)
    else:
        for k in range(SUB):
            vals[k] = x[U(first + k)] if first + k < stop else float32(0.0)


@device_function
def sub_value(vals, k):
    """Priority ``k`` of the sub-tile ``load_sub`` spread over the warp's lanes (every lane calls it)."""
    if HELD == 1:
        return cuda.shfl_sync(FULL_MASK, vals[0], k)
    return vals[k]


def n_tiles(n: int, threads: int) -> int:
    return (n + threads * ITEMS - 1) // (threads * ITEMS)


def subs_per_tile(threads: int) -> int:
    if threads % PER_SUB or not 0 < threads <= MAX_THREADS:
        raise ValueError(f"the scan's block is a multiple of {PER_SUB} threads up to {MAX_THREADS}, not {threads}")
    return threads // PER_SUB


def n_subs(n: int, threads: int) -> int:
    """Slots of the ``sub`` level for n elements (whole tiles)."""
    return n_tiles(n, threads) * subs_per_tile(threads)


def launch_scan(x, totals, sub, tile_sums, n: int, threads: int, arrivals, fill, stream=0) -> None:
    """Enqueue the scan, its levels in one launch (no allocation: ``totals`` and ``sub`` have ``n_subs(n,
    threads)`` slots, ``tile_sums`` ``n_tiles(n, threads)``; ``arrivals``: int32 [1], zero; ``fill``:
    int64 [1], the elements scanned, the rest zero); read the prefix sums with :func:`prefix_dev`
    (``subs_per_tile(threads)``)."""
    subs_per_tile(threads)
    scan_kernel[n_tiles(n, threads), threads, stream](x, totals, sub, tile_sums, n, fill, arrivals)


def launch_rescan(x, idx, n_idx: int, totals, sub, tile_sums, n: int, threads: int, arrivals, fill,
                  stream=0) -> None:
    """Enqueue :func:`rescan_kernel`: the levels after the slots ``idx[0:n_idx)`` changed, from the totals
    a full scan (:func:`launch_scan`, the same ``n`` and ``threads``) and the rescans since left."""
    subs_per_tile(threads)
    rescan_kernel[rescan_blocks(n, threads), threads, stream](x, idx, n_idx, totals, sub, tile_sums, n, fill,
                                                             arrivals)


def rescan_blocks(n: int, threads: int) -> int:
    """Blocks of :func:`rescan_kernel`: a thread a sub-tile."""
    return (n_subs(n, threads) + threads - 1) // threads


def three_level_ref(x: np.ndarray, sub: np.ndarray, tiles: np.ndarray, threads: int) -> np.ndarray:
    """Every element's prefix sum from the three levels, in the additions :func:`prefix_dev` makes."""
    spt, out = subs_per_tile(threads), np.empty(len(x), np.float64)
    for si in range((len(x) + SUB - 1) // SUB):
        t = si // spt
        run = tiles[t - 1] if t > 0 else 0.0
        if si % spt:
            run += sub[si - 1]
        for k in range(si * SUB, min(len(x), si * SUB + SUB)):
            run += np.float64(x[k])
            out[k] = run
    return out


def inclusive_scan_ref(x: np.ndarray) -> np.ndarray:
    return np.cumsum(np.asarray(x, dtype=np.float64))
