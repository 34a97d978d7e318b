"""Dense-layer kernels: a register-tiled GEMM (fallback for cuBLAS, and the simulator's path), and the
bias + activation epilogue with its backward (bias-gradient reduction).

Kernel-side only (NumPy/Numba). Matrices are float32, row-major, C-contiguous.
``gemm_kernel`` computes ``C = alpha * op(A) @ op(B) + beta * C`` with ``op`` a transpose when the flag is
1; a 16x16 thread block computes a 64x64 tile of C, 4x4 outputs per thread in registers, staging
64x16 slices of A and B through shared memory.
"""
from __future__ import annotations

import numpy as np

from .nb import cuda, kernel, float32, int32, int64, void

BM, BN, BK, TM, TN = 64, 64, 16, 4, 4
THREADS = (16, 16)
ACT_IDENTITY, ACT_RELU = 0, 1


@kernel(void(float32[:, ::1], float32[:, ::1], float32[:, ::1], int64, int64, int64, int32, int32, float32, float32))
def gemm_kernel(A, B, C, M, N, K, trans_a, trans_b, alpha, beta):
    """A: [M, K] (or [K, M] if trans_a); B: [K, N] (or [N, K] if trans_b); C: [M, N]. Grid (ceil(N/64), ceil(M/64))."""
    As = cuda.shared.array((BK, BM), float32)
    Bs = cuda.shared.array((BK, BN), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * 16 + tx
    row0 = cuda.blockIdx.y * BM
    col0 = cuda.blockIdx.x * BN
    acc = cuda.local.array((TM, TN), float32)
    a_reg = cuda.local.array(TM, float32)
    b_reg = cuda.local.array(TN, float32)
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = 0.0
    for k0 in range(0, K, BK):
        for l in range(4):  # 1024 elements of each tile, 256 threads
            e = tid + l * 256
            if trans_a:
                kk, mm = e // BM, e % BM
            else:
                mm, kk = e // BK, e % BK
            r, c = row0 + mm, k0 + kk
            val = float32(0.0)
            if r < M and c < K:
                val = A[c, r] if trans_a else A[r, c]
            As[kk, mm] = val
            if trans_b:
                nn, kk = e // BK, e % BK
            else:
                kk, nn = e // BN, e % BN
            r, c = k0 + kk, col0 + nn
            val = float32(0.0)
            if r < K and c < N:
                val = B[c, r] if trans_b else B[r, c]
            Bs[kk, nn] = val
        cuda.syncthreads()
        for kk in range(BK):
            for i in range(TM):
                a_reg[i] = As[kk, ty * TM + i]
            for j in range(TN):
                b_reg[j] = Bs[kk, tx * TN + j]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += a_reg[i] * b_reg[j]
        cuda.syncthreads()
    for i in range(TM):
        r = row0 + ty * TM + i
        if r < M:
            for j in range(TN):
                c = col0 + tx * TN + j
                if c < N:
                    if beta != 0:
                        C[r, c] = alpha * acc[i, j] + beta * C[r, c]
                    else:
                        C[r, c] = alpha * acc[i, j]


def gemm_grid(M: int, N: int) -> tuple[int, int]:
    return ((N + BN - 1) // BN, (M + BM - 1) // BM)


@kernel(void(float32[:, ::1], float32[::1], int64, int64, int32))
def bias_act_kernel(Y, bias, M, N, act):
    """In place: Y[i, j] = act(Y[i, j] + bias[j]); act 0 = identity, 1 = ReLU. 2-D grid
    (``bias_act_launch``): x over columns, y strided over rows, so no per-element index division."""
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if j >= N:
        return
    b = bias[j]
    for i in range(cuda.blockIdx.y, M, cuda.gridDim.y):
        y = Y[i, j] + b
        if act == ACT_RELU and y < 0:
            y = 0.0
        Y[i, j] = y


def bias_act_launch(M: int, N: int, simulator: bool) -> tuple[tuple[int, int], int]:
    tpb = 32 if simulator else 256
    rows = min(M, 2 if simulator else 4096)
    return ((N + tpb - 1) // tpb, max(1, rows)), tpb


BWD_TILE = 32  # columns per block; the block is (columns, row groups), at most 32 x 32
BWD_SMEM = (32, 33)  # a compile-time shape (one pad column against bank conflicts)


@kernel(void(float32[:, ::1], float32[:, ::1], float32[::1], int64, int64, int32))
def bias_act_backward_kernel(dY, Y, dbias, M, N, act):
    """In place dY <- dY * act'(Y) (Y is the activation's output); dbias[j] = sum_i of the result.

    Block (bx, by) <= (32, 32): bx columns side by side (coalesced rows), by row groups; thread (x, y)
    sums rows y, y + by, ... of its column, then the block adds the by partial sums of each column in a
    fixed order: deterministic, and by times more parallel than one thread per column (which left the
    GPU waiting on one chain of M loads per column)."""
    s = cuda.shared.array(BWD_SMEM, float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    by = cuda.blockDim.y
    j = cuda.blockIdx.x * cuda.blockDim.x + tx
    acc = float32(0.0)
    if j < N:
        # four rows of the thread's chain loaded before they are added: the loads overlap instead of
        # waiting one after another, and acc adds them in the same order as a row-by-row loop
        i = ty
        while i + 3 * by < M:
            d0, d1, d2, d3 = dY[i, j], dY[i + by, j], dY[i + 2 * by, j], dY[i + 3 * by, j]
            if act == ACT_RELU:
                if Y[i, j] <= 0:
                    d0 = 0.0
                if Y[i + by, j] <= 0:
                    d1 = 0.0
                if Y[i + 2 * by, j] <= 0:
                    d2 = 0.0
                if Y[i + 3 * by, j] <= 0:
                    d3 = 0.0
                dY[i, j], dY[i + by, j], dY[i + 2 * by, j], dY[i + 3 * by, j] = d0, d1, d2, d3
            acc += d0
            acc += d1
            acc += d2
            acc += d3
            i += 4 * by
        while i < M:
            d = dY[i, j]
            if act == ACT_RELU:
                if Y[i, j] <= 0:
                    d = 0.0
                dY[i, j] = d
            acc += d
            i += by
    s[ty, tx] = acc
    cuda.syncthreads()
    if ty == 0 and j < N:
        total = float32(0.0)
        for k in range(by):
            total += s[k, tx]
        dbias[j] = total


def bias_backward_launch(N: int, simulator: bool) -> tuple[int, tuple[int, int]]:
    """(grid, block) for ``bias_act_backward_kernel``: small blocks in the simulator."""
    block = (8, 4) if simulator else (BWD_TILE, BWD_TILE)
    return ((N + block[0] - 1) // block[0], block)


def gemm_ref(A, B, C, trans_a, trans_b, alpha, beta):
    a = A.T if trans_a else A
    b = B.T if trans_b else B
    return (alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * C).astype(np.float32)


def bias_act_ref(Y, bias, act):
    y = Y + bias
    return np.maximum(y, 0) if act == ACT_RELU else y


def bias_act_backward_ref(dY, Y, act):
    d = dY * (Y > 0) if act == ACT_RELU else dY
    return d, d.astype(np.float64).sum(axis=0).astype(np.float32)
