"""Inclusive prefix sum of float32 priorities into float64, for any N, in one launch, as two levels.

Kernel-side only (NumPy/Numba). Phase 1 scans tiles of ``tile_len = blockDim * ITEMS`` elements
(each thread sums ITEMS adjacent elements, a block tree scans the threads' sums) into ``local`` and
writes each tile's total; phase 2, run by the last block to finish phase 1, scans the tile totals in
place (chunk by chunk with a carry). The prefix sum of element ``i`` is then ``local[i] + tiles[i // tile_len - 1]`` (``local[i]``
in the first tile): :func:`prefix_dev` on the device, :func:`two_level_ref` on the host. Readers
(the PER sampler's binary search) add the tile's offset where they look instead of a third launch
adding it to every element: the same float64 addition, so the values are those a full scan writes,
bit for bit, and 16 MB of traffic per million priorities is saved. Phase 1 moves its tile through
shared memory so that every global load and store is coalesced (a warp reads 32 adjacent floats,
writes 32 adjacent doubles); the order of every addition is fixed by the block size (a launch
parameter, at most 1024), so the result is deterministic.
"""
from __future__ import annotations

import numpy as np

from .nb import cuda, device_function, kernel, float32, float64, int32, int64, last_to_arrive, void

ITEMS = 4
MAX_THREADS = 1024
TILE_MAX = MAX_THREADS * ITEMS  # 16 KB of float32 staging + 32 KB of float64: the 48 KB static limit


@device_function
def _block_inclusive_scan_dev(s, tid, nthreads):
    off = 1
    while off < nthreads:
        t = s[tid - off] if tid >= off else 0.0
        cuda.syncthreads()
        s[tid] += t
        cuda.syncthreads()
        off *= 2


@kernel(void(float32[::1], float64[::1], float64[::1], int64, int32[::1]))
def scan_kernel(x, local, tile_sums, n, arrivals):
    """x: float32 [n]; local: float64 [n], the inclusive scan within each tile; tile_sums: float64
    [n_tiles], each tile's total, then (by the last block to finish: ``arrivals``, int32 [1],
    :func:`cuda_kernels.nb.last_to_arrive`) their inclusive scan in place."""
    xs = cuda.shared.array(TILE_MAX, float32)
    ys = cuda.shared.array(TILE_MAX, float64)  # its first blockDim slots hold the threads' sums while they scan
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    tile0 = cuda.blockIdx.x * nt * ITEMS
    for j in range(ITEMS):  # coalesced: the warp's lanes read adjacent elements
        k = j * nt + tid
        xs[k] = x[tile0 + k] if tile0 + k < n else float32(0.0)
    cuda.syncthreads()
    base = tid * ITEMS  # this thread's ITEMS adjacent elements, within the tile
    acc = float64(0.0)  # explicit: the simulator would keep float32 + 0.0 in float32
    for j in range(ITEMS):
        if tile0 + base + j < n:
            acc += float64(xs[base + j])
    ys[tid] = acc
    cuda.syncthreads()
    _block_inclusive_scan_dev(ys, tid, nt)
    run = ys[tid] - acc  # exclusive prefix of this thread
    total = ys[nt - 1]
    cuda.syncthreads()  # every thread has read the scan before the tile's results overwrite it
    for j in range(ITEMS):
        if tile0 + base + j < n:
            run += float64(xs[base + j])
            ys[base + j] = run
    cuda.syncthreads()
    for j in range(ITEMS):  # coalesced stores
        k = j * nt + tid
        if tile0 + k < n:
            local[tile0 + k] = ys[k]
    if tid == nt - 1:
        tile_sums[cuda.blockIdx.x] = total
    # xs, read for the last time before the barrier above, holds last_to_arrive's flag (a shared array of
    # its own would pass the 48 KB of static shared memory)
    if last_to_arrive(arrivals, 0, cuda.gridDim.x, xs):
        _scan_tile_sums_dev(tile_sums, cuda.gridDim.x, ys, tid, nt)


@device_function
def _scan_tile_sums_dev(tile_sums, n_tiles, s, tid, nt):
    """In place, one block: inclusive scan of the tile totals, chunk by chunk (``s``: >= nt float64 of
    shared memory)."""
    carry = 0.0
    for start in range(0, n_tiles, nt):
        i = start + tid
        s[tid] = tile_sums[i] if i < n_tiles else 0.0
        cuda.syncthreads()
        _block_inclusive_scan_dev(s, tid, nt)
        if i < n_tiles:
            tile_sums[i] = s[tid] + carry
        carry += s[nt - 1]
        cuda.syncthreads()


@device_function
def prefix_dev(local, tiles, tile_len, i):
    """The inclusive prefix sum at ``i`` from the two levels (the addition a full scan's last pass does)."""
    t = i // tile_len
    return local[i] + tiles[t - 1] if t > 0 else local[i]


def n_tiles(n: int, threads: int) -> int:
    return (n + threads * ITEMS - 1) // (threads * ITEMS)


def tile_len(threads: int) -> int:
    return threads * ITEMS


def launch_scan(x, local, tile_sums, n: int, threads: int, arrivals, stream=0) -> None:
    """Enqueue the scan, both levels in one launch (no allocation: ``tile_sums`` has at least
    ``n_tiles(n, threads)`` slots; ``arrivals``: int32 [1], zero); read the prefix sums with
    :func:`prefix_dev` (``tile_len(threads)``)."""
    scan_kernel[n_tiles(n, threads), threads, stream](x, local, tile_sums, n, arrivals)


def two_level_ref(local: np.ndarray, tiles: np.ndarray, tile_len: int) -> np.ndarray:
    """The full inclusive prefix sum from the two levels, as :func:`prefix_dev` reads it."""
    t = np.arange(len(local)) // tile_len
    off = np.where(t > 0, np.asarray(tiles)[np.maximum(t - 1, 0)], 0.0)
    return np.where(t > 0, local + off, local)


def inclusive_scan_ref(x: np.ndarray) -> np.ndarray:
    return np.cumsum(np.asarray(x, dtype=np.float64))
