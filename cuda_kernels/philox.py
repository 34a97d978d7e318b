"""Philox4x32-10 counter-based PRNG (Salmon et al., SC 2011) as a device function, a kernel and a reference.

Kernel-side only: NumPy and Numba types, no pandas / rich / TOML. All arithmetic is done in uint64 and
masked to 32 bits so the same code runs on the GPU, in the simulator and in NumPy.

``philox4x32_10_dev(c0, c1, c2, c3, k0, k1)`` returns the four 32-bit output words. A stream of
uniforms is addressed by (counter words, key): callers put the element index, the step and a
purpose tag into the counter, so every draw is reproducible and independent of launch geometry.
"""
from __future__ import annotations

import numpy as np

from .nb import cuda, device_function, kernel, float32, uint32, uint64, void, grid_wait

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


@device_function
def philox4x32_10_dev(c0, c1, c2, c3, k0, k1):
    c0, c1, c2, c3 = uint64(c0), uint64(c1), uint64(c2), uint64(c3)
    k0, k1 = uint64(k0), uint64(k1)
    for _ in range(10):
        p0 = uint64(M0) * c0
        p1 = uint64(M1) * c2
        hi0, lo0 = p0 >> uint64(32), p0 & uint64(MASK)
        hi1, lo1 = p1 >> uint64(32), p1 & uint64(MASK)
        c0, c1, c2, c3 = (hi1 ^ c1 ^ k0) & uint64(MASK), lo1, (hi0 ^ c3 ^ k1) & uint64(MASK), lo0
        k0 = (k0 + uint64(W0)) & uint64(MASK)
        k1 = (k1 + uint64(W1)) & uint64(MASK)
    return c0, c1, c2, c3


@device_function
def uniform_dev(word):
    """A 32-bit word to a float32 in [0, 1) (the top 24 bits, so 1.0 is never returned)."""
    return float32(word >> uint64(8)) * float32(1.0 / 16777216.0)


@device_function
def uniform4_dev(index, step, tag, k0, k1):
    r0, r1, r2, r3 = philox4x32_10_dev(index, step, tag, 0, k0, k1)
    return uniform_dev(r0), uniform_dev(r1), uniform_dev(r2), uniform_dev(r3)


@kernel(void(float32[::1], uint32, uint32, uint32, uint32, uint32))
def philox_uniform_kernel(out, step, tag, k0, k1, n_groups):
    """out: float32 [4 * n_groups], C-contiguous; group g holds the four uniforms of counter (g, step, tag, 0)."""
    grid_wait()
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for g in range(start, n_groups, stride):
        a, b, c, d = uniform4_dev(g, step, tag, k0, k1)
        out[4 * g] = a
        out[4 * g + 1] = b
        out[4 * g + 2] = c
        out[4 * g + 3] = d


@kernel(void(uint32[:, ::1], uint32[:, ::1], uint32[:, ::1]))
def philox_words_kernel(counters, keys, out):
    """counters: uint32 [n, 4]; keys: uint32 [n, 2]; out: uint32 [n, 4] (known-answer tests)."""
    grid_wait()
    i = cuda.grid(1)
    if i >= counters.shape[0]:
        return
    r0, r1, r2, r3 = philox4x32_10_dev(counters[i, 0], counters[i, 1], counters[i, 2], counters[i, 3],
                                       keys[i, 0], keys[i, 1])
    out[i, 0] = uint32(r0)
    out[i, 1] = uint32(r1)
    out[i, 2] = uint32(r2)
    out[i, 3] = uint32(r3)


def philox4x32_10_ref(counter, key) -> np.ndarray:
    """NumPy reference: counter uint [..., 4], key uint [..., 2] -> uint32 [..., 4]."""
    c = np.asarray(counter, dtype=np.uint64).copy()
    k = np.asarray(key, dtype=np.uint64).copy()
    c0, c1, c2, c3 = (c[..., i] for i in range(4))
    k0, k1 = k[..., 0], k[..., 1]
    m = np.uint64(MASK)
    for _ in range(10):
        p0, p1 = np.uint64(M0) * c0, np.uint64(M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0) & m, p1 & m, ((p0 >> np.uint64(32)) ^ c3 ^ k1) & m, p0 & m
        k0, k1 = (k0 + np.uint64(W0)) & m, (k1 + np.uint64(W1)) & m
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def uniforms4_ref(n: int, step: int, tag: int, k0: int, k1: int) -> np.ndarray:
    """float32 [n, 4]: the uniforms of counters (i, step, tag, 0) for i < n, as ``uniform4_dev`` draws them."""
    g = np.arange(n, dtype=np.uint64)
    ctr = np.stack([g, np.full_like(g, step), np.full_like(g, tag), np.zeros_like(g)], axis=-1)
    words = philox4x32_10_ref(ctr, np.broadcast_to(np.array([k0, k1], np.uint64), (n, 2)))
    return (words.astype(np.uint64) >> np.uint64(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def philox_uniform_ref(n_groups: int, step: int, tag: int, k0: int, k1: int) -> np.ndarray:
    return uniforms4_ref(n_groups, step, tag, k0, k1).reshape(-1)
