"""Inclusive prefix sum of float32 priorities into float64, for any N, in three launches.

Kernel-side only (NumPy/Numba). Phase 1 scans tiles of ``blockDim * ITEMS`` elements and writes each
tile's total; phase 2 scans the tile totals in one block (chunk by chunk with a carry); phase 3 adds
each tile's offset. The block size is a launch parameter (from the device limit, at most 1024); the
order of every addition is fixed, so the result is deterministic.
"""
from __future__ import annotations

import numpy as np

from .nb import cuda, device_function, kernel, float32, float64, int64, void

ITEMS = 4
MAX_THREADS = 1024


@device_function
def _block_inclusive_scan_dev(s, tid, nthreads):
    off = 1
    while off < nthreads:
        t = s[tid - off] if tid >= off else 0.0
        cuda.syncthreads()
        s[tid] += t
        cuda.syncthreads()
        off *= 2


@kernel(void(float32[::1], float64[::1], float64[::1], int64))
def scan_tiles_kernel(x, out, tile_sums, n):
    """x: float32 [n]; out: float64 [n] inclusive scan within each tile; tile_sums: float64 [n_tiles]."""
    s = cuda.shared.array(MAX_THREADS, float64)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = cuda.blockIdx.x * nt * ITEMS + tid * ITEMS
    acc = float64(0.0)  # explicit: the simulator would keep float32 + 0.0 in float32
    for j in range(ITEMS):
        if base + j < n:
            acc += float64(x[base + j])
    s[tid] = acc
    cuda.syncthreads()
    _block_inclusive_scan_dev(s, tid, nt)
    run = s[tid] - acc  # exclusive prefix of this thread
    for j in range(ITEMS):
        if base + j < n:
            run += float64(x[base + j])
            out[base + j] = run
    if tid == nt - 1:
        tile_sums[cuda.blockIdx.x] = s[tid]


@kernel(void(float64[::1], int64))
def scan_tile_sums_kernel(tile_sums, n_tiles):
    """In place, one block: inclusive scan of the tile totals, chunk by chunk."""
    s = cuda.shared.array(MAX_THREADS, float64)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
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


@kernel(void(float64[::1], float64[::1], int64))
def scan_add_offsets_kernel(out, tile_sums, n):
    tile = cuda.blockIdx.x
    if tile == 0:
        return
    off = tile_sums[tile - 1]
    base = tile * cuda.blockDim.x * ITEMS
    for j in range(cuda.threadIdx.x, cuda.blockDim.x * ITEMS, cuda.blockDim.x):
        if base + j < n:
            out[base + j] += off


def n_tiles(n: int, threads: int) -> int:
    return (n + threads * ITEMS - 1) // (threads * ITEMS)


def launch_scan(x, out, tile_sums, n: int, threads: int, stream=0) -> None:
    """Enqueue the three phases (no allocation: ``tile_sums`` has at least ``n_tiles(n, threads)`` slots)."""
    tiles = n_tiles(n, threads)
    scan_tiles_kernel[tiles, threads, stream](x, out, tile_sums, n)
    scan_tile_sums_kernel[1, threads, stream](tile_sums, tiles)
    scan_add_offsets_kernel[tiles, threads, stream](out, tile_sums, n)


def inclusive_scan_ref(x: np.ndarray) -> np.ndarray:
    return np.cumsum(np.asarray(x, dtype=np.float64))
