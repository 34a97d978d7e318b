"""Dense-layer kernels: a register-tiled GEMM (fallback for cuBLAS, and the simulator's path), and the
bias + activation epilogue with its backward (bias-gradient reduction).

Kernel-side only (NumPy/Numba). Matrices are float32, row-major, C-contiguous.
``gemm_kernel`` computes ``C = alpha * op(A) @ op(B) + beta * C`` with ``op`` a transpose when the flag is
1; a 16x16 thread block computes a 64x64 tile of C, 4x4 outputs per thread in registers, staging
64x16 slices of A and B through shared memory. ``gemm_bf16_kernel`` is the same GEMM on bfloat16
operands (``uint16`` bits, :mod:`cuda_kernels.bf16`), each widened to float32 as it is staged, float32
accumulation and output: the simulator's stand-in for cuBLAS's bf16 GEMMs.
``narrow_layer_kernel(k)`` and ``narrow_backward_kernel(k)``, built once per input width ``k`` <= 32: the
first layer's forward (bias and ReLU included) and its backward (W's and the bias's gradients in one pass
over the incoming gradient) without a GEMM library, whose tiles are made for a deep inner dimension.
"""
from __future__ import annotations

import functools

import numpy as np

from .bf16 import from_bf16, to_bf16
from .nb import cuda, device_function, kernel, float32, int32, int64, last_to_arrive, uint16, void
from .nb import Kernel, U, grid_wait

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


NARROW_MAX_K = 32  # the most inputs narrow_layer_kernel takes (its weights' column is held in registers)
NARROW_THREADS = 128  # columns a block of narrow_layer_kernel (on the GPU)
NARROW_ROWS = 16  # rows a block


def narrow_layer_kernel(k: int) -> Kernel:
    """``out = act(x @ W + bias)`` for a layer of ``k`` (1..32) inputs, built once per ``k`` (a compile-time
    constant: the weights' column in registers, the sum unrolled): the first layer, whose GEMM has too
    little inner dimension for a GEMM library's tiles (K = 23: a write-bound 2048 x 512 output that
    cuBLASLt's TF32 kernels wrote at ~1.2 TB/s in a saturated population). float32 products summed in
    order of k, then the bias, then the activation, as a GEMM with a bias epilogue does. Launch with
    ``narrow_layer_launch(M, N, simulator)`` and (x [M, k], W [k, N], bias [N], out [M, N], M, N, act)."""
    if not 1 <= k <= NARROW_MAX_K:
        raise ValueError(f"narrow_layer_kernel takes 1..{NARROW_MAX_K} inputs, not {k}")
    return _narrow_layer_kernel(int(k))


@device_function
def _narrow_row(xs, w, b, out, r, r0, j, act, K):
    """One output of narrow_layer_kernel: row r of the block's rows, column j."""
    acc = float32(0.0)
    for k in range(K):
        acc += xs[r, k] * w[k]
    y = acc + b
    if act == ACT_RELU and y < 0:
        y = float32(0.0)
    out[U(r0 + r), U(j)] = y


@functools.cache
def _narrow_layer_kernel(K: int) -> Kernel:
    R = NARROW_ROWS

    def narrow_layer(x, W, bias, out, M, N, act):
        grid_wait()
        xs = cuda.shared.array((R, K), float32)  # the block's rows of x, read by every thread
        t = cuda.threadIdx.x
        r0 = cuda.blockIdx.y * R
        for e in range(t, R * K, cuda.blockDim.x):
            r = e // K
            xs[r, e - r * K] = x[U(r0 + r), U(e - r * K)] if r0 + r < M else float32(0.0)
        cuda.syncthreads()
        j = cuda.blockIdx.x * cuda.blockDim.x + t
        if j >= N:
            return
        w = cuda.local.array(K, float32)
        for k in range(K):
            w[k] = W[k, U(j)]
        b = bias[U(j)]
        if r0 + R <= M:  # a full block: the rows' loop unrolled too
            for r in range(R):
                _narrow_row(xs, w, b, out, r, r0, j, act, K)
        else:
            for r in range(M - r0):
                _narrow_row(xs, w, b, out, r, r0, j, act, K)

    narrow_layer.__name__ = narrow_layer.__qualname__ = f"narrow_layer_k{K}"
    return kernel(void(float32[:, ::1], float32[:, ::1], float32[::1], float32[:, ::1], int64, int64, int32))(
        narrow_layer)


def narrow_layer_launch(M: int, N: int, simulator: bool) -> tuple[tuple[int, int], int]:
    """(grid, threads) of ``narrow_layer_kernel``: a thread a column, a block NARROW_ROWS rows."""
    tpb = 32 if simulator else NARROW_THREADS
    return ((N + tpb - 1) // tpb, (M + NARROW_ROWS - 1) // NARROW_ROWS), tpb


def narrow_backward_kernel(k: int) -> Kernel:
    """The first layer's backward in one pass, for a layer of ``k`` (1..32) inputs, built once per ``k``:
    with ``g = d * (h > 0)`` (``d`` the gradient at the layer's ReLU output, ``h`` that output),
    ``dW[q, j] = sum_i x[i, q] g[i, j]`` and ``dbias[j] = sum_i g[i, j]``; ``d`` is only read (nothing
    downstream reads the gated gradient of the first layer), so the pass replaces the ReLU-gradient
    kernel's write-back of ``d`` and the weight-gradient GEMM's second read of it. The sums as
    ``bias_act_backward_kernel`` makes its one: each thread a column's rows of its slice in order, a tree
    over the block's row groups in shared memory, the slices added in order by the last block of each
    column tile (deterministic). Launch with ``bias_backward_launch(N, simulator)`` (blocks of at most
    NARROW_BWD_THREADS threads) and (d [M, N], h [M, N], x [M, k], dW [k, N], dbias [N], M, N, partial,
    arrivals); ``partial``: float32 [slices, k + 1, >= N] (``narrow_backward_scratch_shape``),
    ``arrivals``: int32 [>= column tiles], zeros."""
    if not 1 <= k <= NARROW_MAX_K:
        raise ValueError(f"narrow_backward_kernel takes 1..{NARROW_MAX_K} inputs, not {k}")
    return _narrow_backward_kernel(int(k))


@device_function
def _row_slice(M, sl, slices):
    """Rows [r0, r1) of slice ``sl`` of ``slices`` equal slices of M rows: the row-sliced gradient kernels'
    (bias_act_backward_kernel's, narrow_backward_kernel's) split, one block row a slice."""
    chunk = (M + slices - 1) // slices
    r0 = sl * chunk
    return r0, min(M, r0 + chunk)


@device_function
def _narrow_grad_row(acc, x, i, g, K):
    """One row's share of narrow_backward_kernel's sums: acc[q] += x[i, q] g for the K inputs, then the
    bias's acc[K] += g."""
    for q in range(K):
        acc[q] += x[i, q] * g
    acc[K] += g


NARROW_BWD_THREADS = 256  # the most threads a block of narrow_backward_kernel (its shared sums: k + 1 a thread)


@functools.cache
def _narrow_backward_kernel(K: int) -> Kernel:
    S = K + 1  # sums a column: the K weights', then the bias's

    def narrow_backward(d, h, x, dW, dbias, M, N, partial, arrivals):
        grid_wait()
        s = cuda.shared.array((S, NARROW_BWD_THREADS), float32)
        last = cuda.shared.array(1, int32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        bx = cuda.blockDim.x
        by = cuda.blockDim.y
        tile = cuda.blockIdx.x
        sl = cuda.blockIdx.y
        slices = cuda.gridDim.y
        r0, r1 = _row_slice(M, sl, slices)
        j = tile * bx + tx
        acc = cuda.local.array(S, float32)
        for q in range(S):
            acc[q] = float32(0.0)
        if j < N:
            c = U(j)
            i = r0 + ty
            while i + 3 * by < r1:  # four rows' loads issued before their sums (added in row order, as below)
                i0, i1, i2, i3 = U(i), U(i + by), U(i + 2 * by), U(i + 3 * by)
                g0, g1, g2, g3 = d[i0, c], d[i1, c], d[i2, c], d[i3, c]
                if h[i0, c] <= 0:
                    g0 = float32(0.0)
                if h[i1, c] <= 0:
                    g1 = float32(0.0)
                if h[i2, c] <= 0:
                    g2 = float32(0.0)
                if h[i3, c] <= 0:
                    g3 = float32(0.0)
                _narrow_grad_row(acc, x, i0, g0, K)
                _narrow_grad_row(acc, x, i1, g1, K)
                _narrow_grad_row(acc, x, i2, g2, K)
                _narrow_grad_row(acc, x, i3, g3, K)
                i += 4 * by
            while i < r1:
                g = d[U(i), c]
                if h[U(i), c] <= 0:
                    g = float32(0.0)
                _narrow_grad_row(acc, x, U(i), g, K)
                i += by
        t = ty * bx + tx
        for q in range(S):
            s[q, t] = acc[q]
        cuda.syncthreads()
        half = by // 2
        while half > 0:
            if ty < half:
                for q in range(S):
                    s[q, t] += s[q, t + half * bx]
            cuda.syncthreads()
            half //= 2
        if ty == 0 and j < N:
            for q in range(S):
                partial[sl, q, j] = s[q, tx]
        if last_to_arrive(arrivals, tile, slices, last):
            if ty == 0 and j < N:
                for q in range(S):
                    total = float32(0.0)
                    for r in range(slices):
                        total += partial[r, q, j]
                    if q < K:
                        dW[q, j] = total
                    else:
                        dbias[j] = total

    narrow_backward.__name__ = narrow_backward.__qualname__ = f"narrow_backward_k{K}"
    return kernel(void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[::1], int64,
                       int64, float32[:, :, ::1], int32[::1]))(narrow_backward)


def narrow_backward_scratch_shape(k: int, N: int, simulator: bool) -> tuple[int, int, int]:
    """The shape of ``narrow_backward_kernel``'s ``partial`` for ``k`` inputs and N columns (its
    ``arrivals``: ``bias_backward_scratch_shapes``'s count)."""
    (_, slices), _ = bias_backward_launch(N, simulator)
    return (slices, k + 1, N)


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
        r0, r1 = _row_slice(M, sl, slices)
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
