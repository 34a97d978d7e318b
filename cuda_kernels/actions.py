"""Factored (branching) action selection and Q statistics.

Kernel-side only (NumPy/Numba). Joint actions are decoded generically from the branch sizes (mixed
radix, branch 0 most significant) and every decoded index is clamped to its branch's range.
"""
from __future__ import annotations

import numpy as np

from .nb import cuda, kernel, float32, int32, int64, uint32, void, grid_wait
from .philox import uniform4_dev, uniforms4_ref

TAG_ACTION = 0x4143


@kernel(void(float32[:, ::1], int64, int32[::1], int32[::1], float32[::1], uint32, uint32, int64[::1],
               int32[:, ::1], int32[::1], int64))
def eps_greedy_kernel(q, n_branch, branch_size, branch_off, eps_arr, k0, k1, step_arr, actions, joint, N):
    """q: [N, A]; eps_arr: float32 [1]; actions: out int32 [N, n_branch]; joint: out int32 [N]."""
    grid_wait()
    i = cuda.grid(1)
    if i >= N:
        return
    eps = eps_arr[0]
    code = 0
    for br in range(n_branch):
        nA, off = branch_size[br], branch_off[br]
        u_explore, u_pick, _a, _b = uniform4_dev(i, step_arr[0], TAG_ACTION + br, k0, k1)
        if u_explore < eps:
            a = int32(u_pick * nA)
        else:
            a, best = 0, q[i, off]
            for k in range(1, nA):
                if q[i, off + k] > best:
                    a, best = k, q[i, off + k]
        a = min(max(a, 0), nA - 1)
        actions[i, br] = a
        code = code * nA + a
    joint[i] = code


@kernel(void(float32[:, ::1], int64, int64, int32[::1], int32[::1], int64, float32[::1]))
def q_stats_kernel(q, N, A, branch_size, branch_off, n_branch, out):
    """One block (power-of-two threads). out: float32 [4] = mean Q, max Q, min Q, mean over rows and
    branches of max_a Q (the greedy value)."""
    grid_wait()
    s_sum = cuda.shared.array(1024, float32)
    s_max = cuda.shared.array(1024, float32)
    s_min = cuda.shared.array(1024, float32)
    s_gv = cuda.shared.array(1024, float32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    acc, mx, mn, gv = float32(0.0), float32(-3.4e38), float32(3.4e38), float32(0.0)
    for i in range(tid, N, nt):
        for br in range(n_branch):
            best = float32(-3.4e38)
            for a in range(branch_size[br]):
                v = q[i, branch_off[br] + a]
                acc += v
                mx = max(mx, v)
                mn = min(mn, v)
                best = max(best, v)
            gv += best
    s_sum[tid], s_max[tid], s_min[tid], s_gv[tid] = acc, mx, mn, gv
    cuda.syncthreads()
    half = nt // 2
    while half > 0:
        if tid < half:
            s_sum[tid] += s_sum[tid + half]
            s_max[tid] = max(s_max[tid], s_max[tid + half])
            s_min[tid] = min(s_min[tid], s_min[tid + half])
            s_gv[tid] += s_gv[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        out[0] = s_sum[0] / (N * A)
        out[1] = s_max[0]
        out[2] = s_min[0]
        out[3] = s_gv[0] / (N * n_branch)


def decode_joint_ref(joint: np.ndarray, branch_sizes) -> np.ndarray:
    out = np.zeros((len(joint), len(branch_sizes)), np.int32)
    code = np.asarray(joint).copy()
    for br in range(len(branch_sizes) - 1, -1, -1):
        out[:, br] = np.clip(code % branch_sizes[br], 0, branch_sizes[br] - 1)
        code //= branch_sizes[br]
    return out


def greedy_ref(q: np.ndarray, branch_sizes) -> np.ndarray:
    out, off = [], 0
    for n in branch_sizes:
        out.append(np.argmax(q[:, off:off + n], axis=1))
        off += n
    return np.stack(out, axis=1).astype(np.int32)


def q_stats_ref(q: np.ndarray, branch_sizes) -> np.ndarray:
    gv, off = [], 0
    for n in branch_sizes:
        gv.append(q[:, off:off + n].max(axis=1))
        off += n
    return np.array([q.mean(), q.max(), q.min(), np.mean(gv)], np.float32)


def eps_greedy_ref(q: np.ndarray, eps: float, step: int, k0: int, k1: int, branch_sizes) -> np.ndarray:
    """NumPy twin of ``eps_greedy_kernel`` (the CPU backend's action choice): the same Philox draws."""
    N = q.shape[0]
    out = greedy_ref(q, list(branch_sizes))
    for br, n in enumerate(branch_sizes):
        u = uniforms4_ref(N, step, TAG_ACTION + br, k0, k1)
        explore = u[:, 0] < np.float32(eps)
        out[explore, br] = np.clip((u[explore, 1] * n).astype(np.int32), 0, n - 1)
    return out
