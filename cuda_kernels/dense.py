"""Dense-layer kernels: a register-tiled GEMM (fallback for cuBLAS, and the simulator's path), and the
bias + activation epilogue with its backward (bias-gradient reduction).

Kernel-side only (NumPy/Numba). Matrices are float32, row-major, C-contiguous.
``gemm_kernel`` computes ``C = alpha * op(A) @ op(B) + beta * C`` with ``op`` a transpose when the flag is
1; a 16x16 thread block computes a 64x64 tile of C, 4x4 outputs per thread in registers, staging
64x16 slices of A and B through shared memory. ``gemm_bf16_kernel`` is the same GEMM on bfloat16
operands (``uint16`` bits, :mod:`cuda_kernels.bf16`), each widened to float32 as it is staged, float32
accumulation and output: the simulator's stand-in for cuBLAS's bf16 GEMMs.
"""
from __future__ import annotations

import numpy as np

from .bf16 import from_bf16, to_bf16
from .nb import cuda, device_function, kernel, float32, int32, int64, last_to_arrive, uint16, void
from .nb import U, grid_wait

BM, BN, BK, TM, TN = 64, 64, 16, 4, 4
THREADS = (16, 16)
ACT_IDENTITY, ACT_RELU = 0, 1


@device_function
def _float32(x):
    return x


def _make_gemm(load, name: str):
    """The register-tiled GEMM whose operands' elements become float32 through ``load`` as they are staged."""
    def gemm(A, B, C, M, N, K, trans_a, trans_b, alpha, beta):
        """A: [M, K] (or [K, M] if trans_a); B: [K, N] (or [N, K] if trans_b); C: [M, N].
        Grid (ceil(N/64), ceil(M/64))."""
        grid_wait()
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
                    val = load(A[c, r]) if trans_a else load(A[r, c])
                As[kk, mm] = val
                if trans_b:
                    nn, kk = e // BK, e % BK
                else:
                    kk, nn = e // BN, e % BN
                r, c = k0 + kk, col0 + nn
                val = float32(0.0)
                if r < K and c < N:
                    val = load(B[c, r]) if trans_b else load(B[r, c])
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

    gemm.__name__ = gemm.__qualname__ = name
    return gemm


_GEMM_SCALARS = (int64, int64, int64, int32, int32, float32, float32)
gemm_kernel = kernel(void(float32[:, ::1], float32[:, ::1], float32[:, ::1], *_GEMM_SCALARS))(
    _make_gemm(_float32, "gemm_kernel"))
gemm_bf16_kernel = kernel(void(uint16[:, ::1], uint16[:, ::1], float32[:, ::1], *_GEMM_SCALARS))(
    _make_gemm(from_bf16, "gemm_bf16_kernel"))


def gemm_grid(M: int, N: int) -> tuple[int, int]:
    return ((N + BN - 1) // BN, (M + BM - 1) // BM)


@kernel(void(float32[:, ::1], float32[::1], int64, int64, int32))
def bias_act_kernel(Y, bias, M, N, act):
    """In place: Y[i, j] = act(Y[i, j] + bias[j]); act 0 = identity, 1 = ReLU. 2-D grid
    (``bias_act_launch``): x over columns, y strided over rows, so no per-element index division."""
    grid_wait()
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if j >= N:
        return
    b = bias[j]
    for i in range(cuda.blockIdx.y, M, cuda.gridDim.y):
        y = Y[i, j] + b
        if act == ACT_RELU and y < 0:
            y = 0.0
        Y[i, j] = y


@kernel(void(float32[:, ::1], float32[::1], uint16[:, ::1], int64, int64, int32))
def bias_act_bf16_kernel(Y, bias, out, M, N, act):
    """out[i, j] = to_bf16(act(Y[i, j] + bias[j])) (Y read only): a layer's forward epilogue where its output
    is a bfloat16 operand of the next GEMM and the GEMM did not fuse it. Launch: ``bias_act_launch``."""
    grid_wait()
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if j >= N:
        return
    b = bias[j]
    for i in range(cuda.blockIdx.y, M, cuda.gridDim.y):
        y = Y[i, j] + b
        if act == ACT_RELU and y < 0:
            y = 0.0
        out[i, j] = to_bf16(y)


def bias_act_launch(M: int, N: int, simulator: bool) -> tuple[tuple[int, int], int]:
    tpb = 32 if simulator else 256
    rows = min(M, 2 if simulator else 4096)
    return ((N + tpb - 1) // tpb, max(1, rows)), tpb


BWD_BLOCK = (32, 8)  # (columns, row groups) of a block on the GPU: a warp reads a row's 128 bytes whole
BWD_SLICES = 8  # blocks per 32 columns on the GPU, each over its own slice of the rows
BWD_SMEM = 1024  # the block's partial sums, one per thread (a compile-time shape)


def _make_bias_backward(load, name: str):
    """The bias-gradient kernel whose activations ``Y`` become float32 through ``load`` (their ReLU test)."""
    def bias_backward(dY, Y, dbias, M, N, act, partial, arrivals):
        """In place dY <- dY * act'(Y) (Y is the activation's output); dbias[j] = sum_i of the result.

        Grid (column tiles, row slices), block (bx, by) with by a power of two: block (t, r) takes bx columns
        side by side and the r-th of ``gridDim.y`` equal slices of the rows; thread (x, y) sums rows y,
        y + by, ... of its column in the slice, then the block adds the by partial sums of each column in a
        tree over shared memory (row group g with g + by / 2, then + by / 4, ...) and writes them to
        ``partial[r]``. The last block of a column tile to finish (counted in ``arrivals[t]``, which it
        sets back to 0 for the next launch) adds the slices' sums in slice order: deterministic whatever
        order the blocks ran in. On the H200 32 columns by 8 slices made 128 blocks at 512 columns where
        one block per 32 columns made 16 (most SMs idle for one agent alone), and a warp reads whole
        128-byte rows (narrower tiles made 16 agents at once twice as slow).
        ``partial``: [gridDim.y, >= N] scratch; ``arrivals``: [>= gridDim.x] zeros before the first launch
        (:func:`cuda_kernels.nb.last_to_arrive`)."""
        grid_wait()
        s = cuda.shared.array(BWD_SMEM, float32)
        last = cuda.shared.array(1, int32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        bx = cuda.blockDim.x
        by = cuda.blockDim.y
        tile = cuda.blockIdx.x
        sl = cuda.blockIdx.y
        slices = cuda.gridDim.y
        chunk = (M + slices - 1) // slices
        r0 = sl * chunk
        r1 = min(M, r0 + chunk)
        j = tile * bx + tx
        acc = float32(0.0)
        if j < N:
            # four rows of the thread's chain loaded before they are added: the loads overlap instead of
            # waiting one after another, and acc adds them in the same order as a row-by-row loop
            # (indices cast to unsigned where they index: no wraparound select on each access)
            i = r0 + ty
            c = U(j)
            while i + 3 * by < r1:
                i0, i1, i2, i3 = U(i), U(i + by), U(i + 2 * by), U(i + 3 * by)
                d0, d1, d2, d3 = dY[i0, c], dY[i1, c], dY[i2, c], dY[i3, c]
                if act == ACT_RELU:
                    if load(Y[i0, c]) <= 0:
                        d0 = 0.0
                    if load(Y[i1, c]) <= 0:
                        d1 = 0.0
                    if load(Y[i2, c]) <= 0:
                        d2 = 0.0
                    if load(Y[i3, c]) <= 0:
                        d3 = 0.0
                    dY[i0, c], dY[i1, c], dY[i2, c], dY[i3, c] = d0, d1, d2, d3
                acc += d0
                acc += d1
                acc += d2
                acc += d3
                i += 4 * by
            while i < r1:
                d = dY[U(i), c]
                if act == ACT_RELU:
                    if load(Y[U(i), c]) <= 0:
                        d = 0.0
                    dY[U(i), c] = d
                acc += d
                i += by
        s[ty * bx + tx] = acc
        cuda.syncthreads()
        half = by // 2
        while half > 0:
            if ty < half:
                s[ty * bx + tx] += s[(ty + half) * bx + tx]
            cuda.syncthreads()
            half //= 2
        if ty == 0 and j < N:
            partial[sl, j] = s[tx]
        if last_to_arrive(arrivals, tile, slices, last):
            if ty == 0 and j < N:
                total = float32(0.0)
                for r in range(slices):
                    total += partial[r, j]
                dbias[j] = total

    bias_backward.__name__ = bias_backward.__qualname__ = name
    return bias_backward


_BWD_REST = (float32[::1], int64, int64, int32, float32[:, ::1], int32[::1])
bias_act_backward_kernel = kernel(void(float32[:, ::1], float32[:, ::1], *_BWD_REST))(
    _make_bias_backward(_float32, "bias_act_backward_kernel"))
# the same with the activations in bfloat16 (a bf16 network's h1, h2): dY and the bias gradient stay float32
bias_act_backward_bf16_kernel = kernel(void(float32[:, ::1], uint16[:, ::1], *_BWD_REST))(
    _make_bias_backward(from_bf16, "bias_act_backward_bf16_kernel"))


def bias_backward_launch(N: int, simulator: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    """(grid, block) for ``bias_act_backward_kernel`` over N columns (small blocks in the simulator)."""
    block, slices = ((8, 4), 3) if simulator else (BWD_BLOCK, BWD_SLICES)
    return ((N + block[0] - 1) // block[0], slices), block


def bias_backward_scratch_shapes(N: int, simulator: bool) -> tuple[tuple[int, int], int]:
    """The shapes of ``bias_act_backward_kernel``'s ``partial`` (float32) and ``arrivals`` (int32, zeros)
    for launches over at most N columns (one scratch serves the launches of one stream in turn)."""
    (tiles, slices), _ = bias_backward_launch(N, simulator)
    return (slices, N), tiles


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
