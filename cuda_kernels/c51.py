"""Dueling, branching C51 head (Bellemare et al. 2017; Wang et al. 2016; Tavakoli et al. 2018) and its loss.

Kernel-side only (NumPy/Numba). The head GEMM writes ``head [B, atoms * (1 + A)]``: columns
``[0, atoms)`` are the value stream, then ``atoms`` columns per action of every branch
(``A = sum(branch sizes)``; branch b's actions start at ``branch_off[b]``). For branch b and action a::

    logits[z] = V[z] + Adv[b, a, z] - mean_a' Adv[b, a', z]
    logp      = log_softmax(logits);  Q[b, a] = sum_z exp(logp[z]) * support[z]

Loss (double DQN, n-step): the next action of each branch is argmax of the online Q at s'; its
target-network distribution is shifted by ``r + (1 - done) * gamma^n * z``, clipped to [v_min, v_max],
and projected onto the support; the loss is the cross-entropy against the online log-probabilities of
the taken action, averaged over branches, weighted by the importance weight and averaged over the
batch. The kernel writes the gradient with respect to ``head`` directly (through the dueling mean), the
per-sample loss (the new priority) and nothing else. Every action index is clamped to its branch.
"""
from __future__ import annotations

import math

import numpy as np

from .nb import cuda, device_function, kernel, float32, int32, int64, void

MAX_ATOMS = 128


@kernel(void(float32[:, ::1], int64, int64, int32[::1], int32[::1], int64, float32[::1], float32[:, :, ::1],
               float32[:, ::1]))
def dueling_head_kernel(head, B, n_branch, branch_size, branch_off, atoms, support, logp, q):
    """head: [B, atoms*(1+A)]; support: [atoms]; logp: out [B, A, atoms]; q: out [B, A]. One thread per (row, branch)."""
    t = cuda.grid(1)
    if t >= B * n_branch:
        return
    b, br = t // n_branch, t % n_branch
    nA, off = branch_size[br], branch_off[br]
    mean = cuda.local.array(MAX_ATOMS, float32)
    for z in range(atoms):
        s = float32(0.0)
        for a in range(nA):
            s += head[b, atoms * (1 + off + a) + z]
        mean[z] = s / nA
    for a in range(nA):
        col = atoms * (1 + off + a)
        mx = float32(-3.4e38)
        for z in range(atoms):
            mx = max(mx, head[b, z] + head[b, col + z] - mean[z])
        se = float32(0.0)
        for z in range(atoms):
            se += math.exp(head[b, z] + head[b, col + z] - mean[z] - mx)
        lse = mx + math.log(se)
        qa = float32(0.0)
        for z in range(atoms):
            lp = head[b, z] + head[b, col + z] - mean[z] - lse
            logp[b, off + a, z] = lp
            qa += math.exp(lp) * support[z]
        q[b, off + a] = qa


@kernel(void(float32[:, :, ::1], float32[:, ::1], float32[:, :, ::1], int32[:, ::1], float32[::1], float32[::1],
               float32, float32, float32, int64, float32[::1], int64, int32[::1], int32[::1], float32,
               float32[:, ::1], float32[::1], int64))
def c51_loss_kernel(logp, q_next, logp_next_target, actions, reward, done, gamma_n, v_min, v_max, atoms, is_w,
                    n_branch, branch_size, branch_off, grad_scale, dhead, loss_out, B):
    """One thread per sample. dhead: out [B, atoms*(1+A)] (fully written); loss_out: out [B]."""
    b = cuda.grid(1)
    if b >= B:
        return
    width = dhead.shape[1]
    for c in range(width):
        dhead[b, c] = 0.0
    dz = (v_max - v_min) / (atoms - 1)
    m = cuda.local.array(MAX_ATOMS, float32)
    loss = float32(0.0)
    w = is_w[b]
    for br in range(n_branch):
        nA, off = branch_size[br], branch_off[br]
        at = min(max(actions[b, br], 0), nA - 1)
        best, best_q = 0, q_next[b, off]
        for a in range(1, nA):
            if q_next[b, off + a] > best_q:
                best, best_q = a, q_next[b, off + a]
        for z in range(atoms):
            m[z] = 0.0
        for j in range(atoms):
            tz = reward[b] + (float32(1.0) - done[b]) * gamma_n * (v_min + j * dz)
            tz = min(max(tz, v_min), v_max)
            bj = (tz - v_min) / dz
            lo = min(max(int32(math.floor(bj)), 0), atoms - 1)
            hi = min(max(int32(math.ceil(bj)), 0), atoms - 1)
            pj = math.exp(logp_next_target[b, off + best, j])
            if lo == hi:
                m[lo] += pj
            else:
                m[lo] += pj * (hi - bj)
                m[hi] += pj * (bj - lo)
        ce = float32(0.0)
        col = atoms * (1 + off + at)
        for z in range(atoms):
            lp = logp[b, off + at, z]
            ce -= m[z] * lp
            g = (math.exp(lp) - m[z]) * w * grad_scale / n_branch
            dhead[b, z] += g
            dhead[b, col + z] += g
            for a in range(nA):
                dhead[b, atoms * (1 + off + a) + z] -= g / nA
        loss += ce
    loss_out[b] = loss / n_branch


# ---- NumPy references ----

def dueling_head_ref(head, branch_sizes, atoms, support):
    B = head.shape[0]
    V = head[:, :atoms]
    A_tot = sum(branch_sizes)
    adv = head[:, atoms:].reshape(B, A_tot, atoms)
    logp = np.empty((B, A_tot, atoms), np.float64)
    off = 0
    for n in branch_sizes:
        a = adv[:, off:off + n]
        logits = V[:, None, :] + a - a.mean(axis=1, keepdims=True)
        mx = logits.max(axis=2, keepdims=True)
        logp[:, off:off + n] = logits - mx - np.log(np.exp(logits - mx).sum(axis=2, keepdims=True))
        off += n
    q = (np.exp(logp) * support).sum(axis=2)
    return logp, q


def project_ref(p_next, reward, done, gamma_n, v_min, v_max, atoms):
    """C51 projection of the shifted target distribution onto the support (vectorised)."""
    B = p_next.shape[0]
    dz = (v_max - v_min) / (atoms - 1)
    z = v_min + np.arange(atoms) * dz
    tz = np.clip(reward[:, None] + (1 - done[:, None]) * gamma_n * z[None, :], v_min, v_max)
    bj = (tz - v_min) / dz
    lo = np.clip(np.floor(bj).astype(np.int64), 0, atoms - 1)
    hi = np.clip(np.ceil(bj).astype(np.int64), 0, atoms - 1)
    m = np.zeros((B, atoms))
    rows = np.repeat(np.arange(B), atoms).reshape(B, atoms)
    same = lo == hi
    np.add.at(m, (rows[same], lo[same]), p_next[same])
    np.add.at(m, (rows[~same], lo[~same]), (p_next * (hi - bj))[~same])
    np.add.at(m, (rows[~same], hi[~same]), (p_next * (bj - lo))[~same])
    return m


def c51_loss_ref(logp, q_next, logp_next_target, actions, reward, done, gamma_n, v_min, v_max, atoms, is_w,
                 branch_sizes, grad_scale):
    """Returns (dhead [B, atoms*(1+A)], per-sample loss [B]) in float64."""
    B = logp.shape[0]
    nb = len(branch_sizes)
    A = sum(branch_sizes)
    dadv = np.zeros((B, A, atoms))
    dv = np.zeros((B, atoms))
    loss = np.zeros(B)
    rows = np.arange(B)
    off = 0
    for br, n in enumerate(branch_sizes):
        at = np.clip(actions[:, br], 0, n - 1)
        best = np.argmax(q_next[:, off:off + n], axis=1)
        m = project_ref(np.exp(logp_next_target[rows, off + best]), reward, done, gamma_n, v_min, v_max, atoms)
        lp = logp[rows, off + at]
        loss += -(m * lp).sum(axis=1)
        g = (np.exp(lp) - m) * (is_w * grad_scale / nb)[:, None]
        dv += g
        dadv[rows, off + at] += g
        dadv[:, off:off + n] -= g[:, None, :] / n
        off += n
    return np.concatenate([dv, dadv.reshape(B, A * atoms)], axis=1), loss / nb
