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

import functools
import math

import numpy as np

from .nb import SIMULATOR, WARP, cuda, device_function, float32, float64, int32, int64, kernel, void, warp_max, warp_sum
from .nb import Kernel, U, grid_wait

MAX_ATOMS = 128
MAX_BRANCHES = 4
RED_SHAPE = (MAX_BRANCHES, MAX_ATOMS)  # the loss's shared-memory reduction rows (compile-time shape)
HEAD_SLOTS = MAX_ATOMS // WARP  # atoms a lane of the dueling head holds at most


def _tree_width(atoms: int) -> int:
    """The reduction trees' width over atoms: the smallest power of two >= atoms."""
    lanes = 1
    while lanes < atoms:
        lanes *= 2
    return lanes


def head_launch(B: int, atoms: int, n_branch: int) -> tuple[int, tuple[int, int]]:
    """(grid, block) of ``dueling_head_kernel``: one block per row, a warp per branch (in the simulator,
    which runs every thread in Python, a row of only as many lanes as the tree's width needs)."""
    return B, (min(_tree_width(atoms), WARP) if SIMULATOR else WARP, n_branch)


def loss_launch(B: int, atoms: int, n_branch: int) -> tuple[int, tuple[int, int]]:
    """(grid, block) of a ``head_loss_kernel``: one block per sample, a warp per branch (each branch has its own
    row of the kernel's shared arrays: at most MAX_BRANCHES; in the simulator a row of only as many lanes
    as the tree's width needs, as ``head_launch``)."""
    if not 1 <= n_branch <= MAX_BRANCHES or atoms > MAX_ATOMS:
        raise ValueError(f"the C51 loss holds 1..{MAX_BRANCHES} branches of at most {MAX_ATOMS} atoms, "
                         f"not {n_branch} of {atoms}")
    return head_launch(B, atoms, n_branch)


@device_function
def _warp_row():
    """(lane, width, branch) of the calling thread in a launch by ``head_launch`` or ``loss_launch``: a warp
    per row and branch (fewer lanes a row only in the simulator, see ``head_launch``)."""
    return cuda.threadIdx.x, cuda.blockDim.x if SIMULATOR else WARP, cuda.threadIdx.y


def _offsets(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Each branch's first action: the sizes of the branches before it, summed."""
    return tuple(sum(sizes[:i]) for i in range(len(sizes)))


def _shape_name(prefix: str, atoms: int, sizes: tuple[int, ...]) -> str:
    """A kernel built for one shape is named for it (its cubin cache entry and its entry point)."""
    return f"{prefix}_a{atoms}_b{'x'.join(map(str, sizes))}"


@device_function
def _fold(t, k, op):
    """The lane's own ``k`` (1, 2 or 4) values, atoms lane + 32 j, reduced in the tree's order for the
    levels at and above the warp's width (atom i with atom i + 64, then with i + 32); constant indices,
    so the values stay in registers."""
    if k == 4:
        t[0] = t[0] + t[2] if op == 0 else max(t[0], t[2])
        t[1] = t[1] + t[3] if op == 0 else max(t[1], t[3])
    if k >= 2:
        t[0] = t[0] + t[1] if op == 0 else max(t[0], t[1])
    return t[0]


@device_function
def _advantage_mean(hrow, z, atoms, off, nA, max_actions):
    """Mean over the branch's actions of atom z's advantage, in float32 (``hrow``: the row, its bias added).
    The loop runs to ``max_actions`` and leaves at ``nA``: a constant trip count where the kernel is
    built for one shape (``head_loss_kernel``), so it unrolls; the same additions in the same order."""
    total = float32(0.0)
    c = U(atoms * (1 + off) + z)  # the first action's column; each next action is ``atoms`` further on
    for a in range(max_actions):
        if a >= nA:
            break
        total += hrow[c]
        c += U(atoms)
    return total * (float32(1.0) / float32(nA))


@device_function
def _row_setup(hrow, lane, width, k, atoms, off, nA, max_actions, v, mean):
    """The row's value stream and the branch's advantage mean at the lane's atoms."""
    for j in range(HEAD_SLOTS):
        if j >= k:
            break
        z = lane + width * j
        valid = z < atoms
        v[j] = hrow[U(z)] if valid else float32(0.0)
        mean[j] = _advantage_mean(hrow, z, atoms, off, nA, max_actions) if valid else float32(0.0)


@device_function
def _action_lse(hrow, lane, width, k, atoms, off, a, live, v, mean, logit, t):
    """Action a's logits at the lane's atoms into ``logit`` (-3.4e38 past the atoms and for an action past
    the branch's, ``live`` false) and their log-sum-exp over the atoms (0 when not ``live``); ``t``:
    scratch. Every lane of the warp calls it."""
    for j in range(HEAD_SLOTS):
        if j >= k:
            break
        z = lane + width * j
        c = atoms * (1 + off + a) + z
        logit[j] = v[j] + hrow[U(c)] - mean[j] if z < atoms and live else float32(-3.4e38)
        t[j] = logit[j]
    mx = warp_max(_fold(t, k, 1))
    for j in range(HEAD_SLOTS):
        if j >= k:
            break
        z = lane + width * j
        t[j] = float32(0.0)
        if z < atoms and live:
            t[j] = math.exp(logit[j] - mx)
    total = warp_sum(_fold(t, k, 0))  # called when not live too: every warp makes the same calls (the simulator's
    return mx + math.log(total) if live else float32(0.0)  # stand-in holds block barriers, one per call)


@device_function
def _action_logp_q(logit, lse, support, lane, width, k, atoms, live, t):
    """The action's log-probabilities (``logit - lse``, written over ``logit`` at the lane's atoms) and its Q,
    the expectation over the support (returned to every lane)."""
    for j in range(HEAD_SLOTS):
        if j >= k:
            break
        z = lane + width * j
        t[j] = float32(0.0)
        if z < atoms and live:
            lp = logit[j] - lse
            logit[j] = lp
            t[j] = math.exp(lp) * support[U(z)]
    return warp_sum(_fold(t, k, 0))


# The head is bound by occupancy (with no cap ptxas gives it 72-80 registers a thread and it takes as long
# per agent with 16 agents at once as alone). Capped at 40 it spills nothing and ran, on the H200
# (bench/kernel_probe.py), 2048 rows 18.8 -> 14.4 us alone and 17.7 -> 11.1 us per agent with 16 agents.
# Built per shape (``head_kernel``) it needs 37 at the reference shape (ptxas 13.0, sm_90): the cap stays as
# a bound for other shapes.
HEAD_REGISTERS = 40


def _make_head(atoms: int, sizes: tuple[int, ...]):
    """The dueling head for one shape: ``atoms`` and the branch sizes are compile-time constants (see
    ``head_kernel``)."""
    max_actions, k, offs = max(sizes), _slot_count(atoms), _offsets(sizes)

    def dueling_head(head, B, support, logp, write_logp, q):
        """head: [B, atoms*(1+A)], the head layer's output, its bias added (by the head GEMM's epilogue);
        support: [atoms]; logp: out [B, A, atoms] where ``write_logp`` (acting and backtests read Q alone:
        then any array, never written); q: out [B, A].

        Block per row, warp per branch (``head_launch``): lane l owns atoms l, l + 32, ... (k of them),
        so a row is read with consecutive lanes on consecutive columns; the slots past k are never
        computed. Max, sum and expectation over atoms are trees in a fixed order, the lane's own atoms
        first (``_fold``), then warp shuffles (``warp_max``, ``warp_sum``): the additions of a
        shared-memory tree over a power-of-two width, in its order, with no block barrier
        (deterministic). Float32 throughout (logits, max, exponentials, logarithm): the logits are
        float32 GEMM outputs, and float64 here cost registers, so occupancy, for nothing the loss can
        see (float32 vs float64 outputs differed by about 2e-6 on the H200)."""
        grid_wait()
        b = cuda.blockIdx.x
        if b >= B:
            return
        lane, width, br = _warp_row()
        nA, off = int32(sizes[br]), int32(offs[br])  # int32, as read from an array
        hrow = head[b]  # the row's views: one-dimensional indexing from here on
        lrow = logp[b if write_logp else 0]
        v = cuda.local.array(HEAD_SLOTS, float32)
        mean = cuda.local.array(HEAD_SLOTS, float32)
        logit = cuda.local.array(HEAD_SLOTS, float32)
        t = cuda.local.array(HEAD_SLOTS, float32)
        _row_setup(hrow, lane, width, k, atoms, off, nA, max_actions, v, mean)
        for a in range(max_actions):  # the same trip count in every warp (the simulator's stand-in has barriers)
            live = a < nA
            lse = _action_lse(hrow, lane, width, k, atoms, off, a, live, v, mean, logit, t)
            qa = _action_logp_q(logit, lse, support, lane, width, k, atoms, live, t)
            for j in range(HEAD_SLOTS):
                if j >= k:
                    break
                z = lane + width * j
                if z < atoms and live and write_logp:
                    lrow[U(off + a), U(z)] = logit[j]
            if lane == 0 and live:
                q[b, off + a] = qa

    dueling_head.__name__ = dueling_head.__qualname__ = _shape_name("dueling_head", atoms, sizes)
    return dueling_head


def head_kernel(atoms: int, branch_sizes) -> Kernel:
    """The dueling head's kernel for ``atoms`` atoms and branches of ``branch_sizes`` actions, built once
    per shape like ``head_loss_kernel`` (its shape a compile-time constant: ptxas 13.0, sm_90, 51 atoms
    and 3 x 3 actions, capped at HEAD_REGISTERS: 864 SASS instructions, 40 registers and a 4-byte spill
    for the kernel that took the shape as arguments, 304, 37 and none for this one). Launch with
    ``head_launch(rows, atoms, len(branch_sizes))`` and (head, rows, support, logp, write_logp, q)."""
    return _head_kernel(int(atoms), tuple(int(n) for n in branch_sizes))


@functools.cache
def _head_kernel(atoms: int, sizes: tuple[int, ...]) -> Kernel:
    if not 1 <= atoms <= MAX_ATOMS or not sizes or min(sizes) < 1:
        raise ValueError(f"the dueling head holds 1..{MAX_ATOMS} atoms and branches of at least one action, "
                         f"not {atoms} atoms and branches {sizes}")
    return kernel(void(float32[:, ::1], int64, float32[::1], float32[:, :, ::1], int64, float32[:, ::1]),
                  max_registers=HEAD_REGISTERS)(_make_head(atoms, sizes))


@device_function
def _count_below(lo, row, target, atoms, top):
    """How many source atoms j in [0, atoms) have ``lo[row, j] < target`` (lo is monotone: the first j with
    ``lo >= target``): a binary search by halving steps from ``top``, the largest power of two <= atoms, so
    a fixed number of steps, each a load, a compare and a select (unrolled where atoms is a constant)."""
    pos = 0
    step = top
    while step > 0:
        if pos + step <= atoms and lo[U(row), U(pos + step - 1)] < target:
            pos += step
        step >>= 1
    return pos


@device_function
def _source_mass(lo_j, hi_j, b_j, p_j, br, z, atoms, top):
    """The projected target mass of atom z of branch ``br`` from the placed source atoms (shared rows).

    The source atoms that reach atom z have lo(j) in {z - 1, z}; lo(j) never decreases with j (every step
    of its float arithmetic is monotone), so they are the range from the first j with lo(j) >= z - 1
    (``_count_below``) up to the first with lo(j) > z, visited in ascending order as a loop over every j
    would: the same sum, bit for bit."""
    m = float32(0.0)
    j = _count_below(lo_j, br, z - 1, atoms, top)
    while j < atoms:
        lo = lo_j[U(br), U(j)]
        if lo > z:
            break
        hi, bj = hi_j[U(br), U(j)], b_j[U(br), U(j)]
        if lo == z or hi == z:
            pj = p_j[U(br), U(j)]
            if lo == hi:
                m += pj
            elif lo == z:
                m += pj * (hi - bj)
            else:
                m += pj * (bj - lo)
        j += 1
    return m


@device_function
def _atom_grad(lo_j, hi_j, b_j, p_j, sg, drow, br, z, atoms, top, lp_z, w, grad_scale, n_branch, nA, max_actions, at,
               off):
    """Atom z of branch ``br`` (past the atoms: nothing, 0 returned): its projected target mass, the
    gradient of its column of each of the branch's actions into the sample's ``drow`` (the taken action's
    column g, every column of the branch -g / nA, each rounded to float32 as a column's running value
    was when a loop added into it), g into ``sg`` (for the value stream); returns its share of the
    cross-entropy (float32). ``lp_z``: the taken action's online log-probability of atom z; ``w``: the
    sample's importance weight."""
    if z >= atoms:
        return float32(0.0)
    m = _source_mass(lo_j, hi_j, b_j, p_j, br, z, atoms, top)
    ce = -m * lp_z
    g = (math.exp(lp_z) - m) * w * grad_scale / n_branch
    for a in range(max_actions):
        if a >= nA:
            break
        drow[U(atoms * (1 + off + a) + z)] = (float32(g) if a == at else float32(0.0)) - g / nA
    sg[U(br), U(z)] = g
    return float32(ce)


def _slot_count(atoms: int) -> int:
    """Atoms a lane holds in a launch by ``head_launch`` or ``loss_launch``: the power of two >= atoms (the
    reduction tree's width) over the row's lanes, at least 1 (the same on a GPU, a warp wide, and in the
    simulator, as wide as the tree up to a warp)."""
    return max(1, _tree_width(atoms) // WARP)


def _make_head_loss(atoms: int, sizes: tuple[int, ...]):
    """The heads and C51 loss of an update for one shape: ``atoms`` and the branch sizes are compile-time
    constants of the kernel (see ``head_loss_kernel``)."""
    n_branch, max_actions, k, offs = len(sizes), max(sizes), _slot_count(atoms), _offsets(sizes)
    used = atoms * (1 + sum(sizes))  # the gradient row's columns; the rest are padding
    top = 1 << (atoms.bit_length() - 1)  # the largest power of two <= atoms (``_count_below``'s first step)

    def head_loss(head, head_t, actions, reward, done, gamma_n, v_min, v_max, is_w, support, grad_scale, q, dhead,
                  loss_out, B):
        """The dueling heads of an update and its loss in one launch. head: [2B, atoms*(1+A)], the online
        network's head layer output, its bias added (rows [0, B) of s, [B, 2B) of s'); head_t: [B, ...],
        the target network's of s'. q: out [B, A], the online Q of s' (the guard's |Q|); dhead: out
        [B, >= atoms*(1+A)] (every column written once, the padding columns zero); loss_out: out [B].

        Block per sample, warp per branch (``loss_launch``): the branches side by side, lane l holding
        atoms l, l + 32, ... of its branch (k of them). Each warp computes what ``dueling_head_kernel``
        would of its sample's three rows, with the same device functions in the same order (so the same
        bits), but only what the loss reads: the online Q of s' (the next action, argmax, and the guard's
        |Q|), the online log-probabilities of the taken action alone on s (the other actions'
        distributions on s enter the gradient only through the dueling mean, which needs none of them),
        the target's distribution of the next action alone: five of a branch's log-sum-exps where
        computing every action's on s took seven, and three expectations where it took six. Then it
        places its source atoms j on the support (shared rows, one per branch) before the block's first
        barrier, and for each of its atoms z the projected target mass (``_source_mass``: no float
        atomics), the cross-entropy share and the gradient of atom z's column of each of the branch's
        actions. The branch's cross-entropy is a tree over the tree's width in a fixed order (the lane's
        own atoms, ``_fold``, then warp shuffles): the additions of a shared-memory tree, in its order,
        with no block barrier. After the second barrier the first branch's warp writes the value
        stream's columns (the branches' gradients summed in branch order) and the loss (the branches'
        cross-entropies), as a loop over the branches would. Two block barriers in all."""
        grid_wait()
        b = cuda.blockIdx.x
        if b >= B:
            return
        lane, width, br = _warp_row()
        ce_br = cuda.shared.array(MAX_BRANCHES, float32)  # branch br's cross-entropy
        sg = cuda.shared.array(RED_SHAPE, float64)  # row br: branch br's gradient of atom z (for the value stream)
        lo_j = cuda.shared.array(RED_SHAPE, int32)    # row br: source atom j's lower and upper support atom,
        hi_j = cuda.shared.array(RED_SHAPE, int32)    # its position on the support and its target probability,
        b_j = cuda.shared.array(RED_SHAPE, float64)   # each computed once, by the lane holding atom j
        p_j = cuda.shared.array(RED_SHAPE, float32)
        lp = cuda.local.array(HEAD_SLOTS, float32)
        t = cuda.local.array(HEAD_SLOTS, float32)
        v = cuda.local.array(HEAD_SLOTS, float32)
        mean = cuda.local.array(HEAD_SLOTS, float32)
        logit = cuda.local.array(HEAD_SLOTS, float32)
        nA, off = int32(sizes[br]), int32(offs[br])  # int32, as read from an array: g / nA's type (float64)
        at = min(max(actions[U(b), U(br)], 0), nA - 1)
        hrow = head[U(B + b)]  # s' (online): every action's Q (the guard's), the next action: the first of the largest
        _row_setup(hrow, lane, width, k, atoms, off, nA, max_actions, v, mean)
        best, best_q = 0, float32(0.0)
        for a in range(max_actions):  # the same trip count in every warp (the simulator's stand-in has barriers)
            live = a < nA
            lse = _action_lse(hrow, lane, width, k, atoms, off, a, live, v, mean, logit, t)
            qa = _action_logp_q(logit, lse, support, lane, width, k, atoms, live, t)
            if live and (a == 0 or qa > best_q):
                best, best_q = a, qa
            if lane == 0 and live:
                q[U(b), U(off + a)] = qa
        hrow = head[U(b)]  # s (online): the taken action's log-probabilities alone (``_action_logp_q``'s subtraction)
        _row_setup(hrow, lane, width, k, atoms, off, nA, max_actions, v, mean)
        lse = _action_lse(hrow, lane, width, k, atoms, off, at, True, v, mean, logit, t)
        for i in range(HEAD_SLOTS):
            if i >= k:
                break
            lp[i] = logit[i] - lse if lane + width * i < atoms else float32(0.0)
        hrow = head_t[U(b)]  # s' (target): the next action's log-probabilities
        _row_setup(hrow, lane, width, k, atoms, off, nA, max_actions, v, mean)
        lse = _action_lse(hrow, lane, width, k, atoms, off, best, True, v, mean, logit, t)
        dz = (v_max - v_min) / (atoms - 1)
        w = is_w[U(b)]
        r = reward[U(b)]
        keep = float32(1.0) - done[U(b)]
        drow = dhead[U(b)]  # the sample's row: one index fewer from here on
        for i in range(HEAD_SLOTS):
            if i >= k:
                break
            j = lane + width * i
            if j < atoms:
                tz = min(max(r + keep * gamma_n * (v_min + j * dz), v_min), v_max)
                bj = (tz - v_min) / dz
                lo_j[U(br), U(j)] = min(max(int32(math.floor(bj)), 0), atoms - 1)
                hi_j[U(br), U(j)] = min(max(int32(math.ceil(bj)), 0), atoms - 1)
                b_j[U(br), U(j)] = bj
                p_j[U(br), U(j)] = math.exp(logit[i] - lse)  # the value dueling_head_kernel stores, exponentiated
        cuda.syncthreads()
        # each slot at a constant index: the slot arrays stay in registers (a loop over the slots, its body
        # holding the searches' loops, was not unrolled and kept them in local memory)
        t[0] = _atom_grad(lo_j, hi_j, b_j, p_j, sg, drow, br, lane, atoms, top, lp[0], w, grad_scale, n_branch, nA,
                          max_actions, at, off)
        t[1] = float32(0.0) if k < 2 else _atom_grad(lo_j, hi_j, b_j, p_j, sg, drow, br, lane + width, atoms, top,
                                                      lp[1], w, grad_scale, n_branch, nA, max_actions, at, off)
        t[2] = float32(0.0) if k < 3 else _atom_grad(lo_j, hi_j, b_j, p_j, sg, drow, br, lane + 2 * width, atoms, top,
                                                      lp[2], w, grad_scale, n_branch, nA, max_actions, at, off)
        t[3] = float32(0.0) if k < 4 else _atom_grad(lo_j, hi_j, b_j, p_j, sg, drow, br, lane + 3 * width, atoms, top,
                                                      lp[3], w, grad_scale, n_branch, nA, max_actions, at, off)
        total = warp_sum(_fold(t, k, 0))
        if lane == 0:
            ce_br[U(br)] = total
        cuda.syncthreads()
        if br == 0:
            for i in range(HEAD_SLOTS):
                if i >= k:
                    break
                z = lane + width * i
                if z < atoms:
                    vz = float32(0.0)
                    for c in range(n_branch):
                        vz = float32(vz + sg[U(c), U(z)])
                    drow[U(z)] = vz
            if lane == 0:
                loss = float32(0.0)
                for c in range(n_branch):
                    loss += ce_br[U(c)]
                loss_out[U(b)] = loss / n_branch
        for c in range(used + lane + width * br, dhead.shape[1], width * cuda.blockDim.y):  # the padding columns
            drow[U(c)] = 0.0

    head_loss.__name__ = head_loss.__qualname__ = _shape_name("c51_head_loss", atoms, sizes)
    return head_loss


def head_loss_kernel(atoms: int, branch_sizes) -> Kernel:
    """The kernel of an update's heads and C51 loss for ``atoms`` atoms and branches of ``branch_sizes``
    actions, built once per shape (a kernel of its own, named for its shape, compiled on its first launch
    and cached on disk like the others). The shape is a compile-time constant: the slot loops, the
    advantage means, the action loops and the projection's search steps unroll, its offsets become
    immediates (ptxas 13.0, sm_90, at 51 atoms and 3 x 3 actions: 4,096 SASS instructions and 64 registers
    for the kernel that took the shape as arguments, 2,064 and 50 for this one). Launch with
    ``loss_launch(B, atoms, len(branch_sizes))``."""
    return _head_loss_kernel(int(atoms), tuple(int(n) for n in branch_sizes))


@functools.cache
def _head_loss_kernel(atoms: int, sizes: tuple[int, ...]) -> Kernel:
    loss_launch(1, atoms, len(sizes))  # the shape's limits, checked where it is built
    if min(sizes) < 1:
        raise ValueError(f"the C51 loss needs at least one action a branch, not {sizes}")
    if atoms < 2:
        raise ValueError(f"the C51 loss needs at least 2 atoms, not {atoms}")
    return kernel(void(float32[:, ::1], float32[:, ::1], int32[:, ::1], float32[::1], float32[::1], float32, float32,
                       float32, float32[::1], float32[::1], float32, float32[:, ::1], float32[:, ::1], float32[::1],
                       int64))(_make_head_loss(atoms, sizes))


# ---- NumPy references ----

def _branch_head_ref(V, a, n, support, logp, q) -> None:
    """Branches of ``n`` actions each, side by side: ``a`` [..., n, atoms] advantages, ``V`` broadcast
    against them; log-probabilities into ``logp``, expected Q into ``q`` (views of the caller's arrays)."""
    z = V + a
    z -= np.add.reduce(a, axis=-2, keepdims=True) / n  # the advantages' mean over the branch's actions
    z -= np.maximum.reduce(z, axis=-1, keepdims=True)
    e = np.exp(z)
    s = np.add.reduce(e, axis=-1, keepdims=True)
    np.subtract(z, np.log(s, out=s), out=logp)
    np.exp(logp, out=e)
    e *= support
    np.add.reduce(e, axis=-1, out=q)


def dueling_head_ref(head, branch_sizes, atoms, support):
    """Per branch: logits = V + A - mean over the branch's actions of A, log-softmax over the atoms
    (max subtracted first), Q = sum over atoms of exp(logp) x support. Computes in float64 (the CPU
    backend's and the tests' heads are float64); returns (logp [B, actions, atoms], q [B, actions]).

    Written for the CPU backend's speed (its backtests run this on every (bar, held position) row of a
    range): in-place steps and, where every branch has as many actions (the default 3 x 3 x 3), all
    branches in one set of array operations. Each element goes through the same operations in the same
    order as the plain per-branch formula (tests/test_kernels.py keeps that formula and checks this
    against it bit for bit), so the CPU backend's results do not depend on this form."""
    head = np.asarray(head, np.float64)
    B = head.shape[0]
    A_tot = sum(branch_sizes)
    adv = head[:, atoms:].reshape(B, A_tot, atoms)
    logp = np.empty((B, A_tot, atoms), np.float64)
    q = np.empty((B, A_tot), np.float64)
    nb, n0 = len(branch_sizes), branch_sizes[0]
    if all(n == n0 for n in branch_sizes):
        _branch_head_ref(head[:, None, None, :atoms], adv.reshape(B, nb, n0, atoms), n0, support,
                         logp.reshape(B, nb, n0, atoms), q.reshape(B, nb, n0))
        return logp, q
    off = 0
    for n in branch_sizes:
        _branch_head_ref(head[:, None, :atoms], adv[:, off:off + n], n, support, logp[:, off:off + n],
                         q[:, off:off + n])
        off += n
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
