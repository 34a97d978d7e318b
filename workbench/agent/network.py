"""The agent's network over one flat float32 parameter buffer, on the device and in NumPy.

Architecture (DESIGN.md): observation ``[features ++ one-hot position]`` -> Linear(D, H) -> ReLU ->
Linear(H, H) -> ReLU -> Linear(H, atoms * (1 + A)) -> dueling branching C51 head. Parameters live in
one flat buffer (``W1, b1, W2, b2, W3, b3`` in that order, row-major ``W[in, out]``) so Adam, the
gradient norm and the EMA target update are one launch each; gradients share the layout.

:class:`DeviceNetwork` enqueues forward and backward on the device's stream with preallocated
activations (nothing allocates after construction, so it can be captured into a graph).
:func:`forward_ref` / :func:`backward_ref` are the NumPy (float64) reference and the CPU backend.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuda_kernels import c51, dense
from cuda_kernels.nb import cuda


@dataclass(frozen=True)
class NetShape:
    obs_dim: int
    hidden: int
    atoms: int
    branch_sizes: tuple[int, ...] = (3, 3, 3)

    @property
    def n_actions(self) -> int:
        return int(sum(self.branch_sizes))

    @property
    def head_width(self) -> int:
        return self.atoms * (1 + self.n_actions)

    @property
    def branch_offsets(self) -> tuple[int, ...]:
        return tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.branch_sizes)[:-1]]))

    def layout(self) -> list[tuple[str, tuple[int, ...]]]:
        D, H, W = self.obs_dim, self.hidden, self.head_width
        return [("W1", (D, H)), ("b1", (H,)), ("W2", (H, H)), ("b2", (H,)), ("W3", (H, W)), ("b3", (W,))]

    def offsets(self) -> dict[str, tuple[int, int, tuple[int, ...]]]:
        out, pos = {}, 0
        for name, shape in self.layout():
            n = int(np.prod(shape))
            out[name] = (pos, pos + n, shape)
            pos += n
        return out

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s)) for _, s in self.layout())


def init_params(shape: NetShape, seed: int) -> np.ndarray:
    """He-uniform trunk, small head (so initial distributions are near uniform), zero biases."""
    rng = np.random.default_rng(seed)
    flat = np.zeros(shape.n_params, np.float32)
    for name, (a, b, shp) in shape.offsets().items():
        if name.startswith("W"):
            fan_in = shp[0]
            bound = np.sqrt(6.0 / fan_in) * (0.1 if name == "W3" else 1.0)
            flat[a:b] = rng.uniform(-bound, bound, b - a).astype(np.float32)
    return flat


def views(flat, shape: NetShape) -> dict:
    """Named views into a flat (host or device) buffer."""
    return {name: flat[a:b].reshape(shp) for name, (a, b, shp) in shape.offsets().items()}


# ---- NumPy reference (float64) ----

def forward_ref(params: np.ndarray, x: np.ndarray, shape: NetShape, support: np.ndarray):
    p = {k: v.astype(np.float64) for k, v in views(params, shape).items()}
    h1 = np.maximum(x @ p["W1"] + p["b1"], 0)
    h2 = np.maximum(h1 @ p["W2"] + p["b2"], 0)
    head = h2 @ p["W3"] + p["b3"]
    logp, q = c51.dueling_head_ref(head, list(shape.branch_sizes), shape.atoms, support)
    return {"h1": h1, "h2": h2, "head": head, "logp": logp, "q": q}


def backward_ref(params: np.ndarray, x: np.ndarray, acts: dict, dhead: np.ndarray, shape: NetShape) -> np.ndarray:
    p = {k: v.astype(np.float64) for k, v in views(params, shape).items()}
    g = {}
    g["W3"] = acts["h2"].T @ dhead
    g["b3"] = dhead.sum(axis=0)
    d2 = (dhead @ p["W3"].T) * (acts["h2"] > 0)
    g["W2"] = acts["h1"].T @ d2
    g["b2"] = d2.sum(axis=0)
    d1 = (d2 @ p["W2"].T) * (acts["h1"] > 0)
    g["W1"] = x.T @ d1
    g["b1"] = d1.sum(axis=0)
    return np.concatenate([g[name].reshape(-1) for name, _ in shape.layout()])


# ---- device ----

class DeviceNetwork:
    """Forward/backward for a fixed row count on preallocated device buffers."""

    def __init__(self, device, gemm, shape: NetShape, rows: int, support_dev, branch_sizes_dev, branch_offsets_dev):
        self.device, self.gemm, self.shape, self.rows = device, gemm, shape, rows
        s = device.stream
        H, W, A = shape.hidden, shape.head_width, shape.n_actions
        self.h1 = cuda.device_array((rows, H), np.float32, stream=s)
        self.h2 = cuda.device_array((rows, H), np.float32, stream=s)
        self.head = cuda.device_array((rows, W), np.float32, stream=s)
        self.logp = cuda.device_array((rows, A, shape.atoms), np.float32, stream=s)
        self.q = cuda.device_array((rows, A), np.float32, stream=s)
        self.d2 = cuda.device_array((rows, H), np.float32, stream=s)
        self.d1 = cuda.device_array((rows, H), np.float32, stream=s)
        self.support, self.bsz, self.boff = support_dev, branch_sizes_dev, branch_offsets_dev

    @property
    def nbytes(self) -> int:
        """Device memory of the activation workspaces."""
        return sum(int(a.size) * int(a.dtype.itemsize) for a in (self.h1, self.h2, self.head, self.logp, self.q,
                                                                  self.d2, self.d1))

    def forward(self, params_flat, x) -> None:
        """x: float32 [rows, obs_dim]; fills h1, h2, head (before its bias), logp, q."""
        p = views(params_flat, self.shape)
        st, sh = self.device.stream, self.shape
        sim = self.device.simulator
        gh, th = dense.bias_act_launch(self.rows, sh.hidden, sim)
        self.gemm.gemm(x, p["W1"], self.h1)
        dense.bias_act_kernel[gh, th, st](self.h1, p["b1"], self.rows, sh.hidden, dense.ACT_RELU)
        self.gemm.gemm(self.h1, p["W2"], self.h2)
        dense.bias_act_kernel[gh, th, st](self.h2, p["b2"], self.rows, sh.hidden, dense.ACT_RELU)
        self.gemm.gemm(self.h2, p["W3"], self.head)  # its bias is added by the dueling head as it reads
        nb = len(sh.branch_sizes)
        grid, block = c51.head_launch(self.rows, sh.atoms, nb)
        c51.dueling_head_kernel[grid, block, st](self.head, p["b3"], self.rows, nb, self.bsz, self.boff, sh.atoms,
                                                max(sh.branch_sizes), self.support, self.logp, self.q)

    def backward(self, params_flat, grads_flat, x, dhead) -> None:
        """dhead: float32 [rows, head_width] (overwritten); writes every gradient into grads_flat."""
        p, g = views(params_flat, self.shape), views(grads_flat, self.shape)
        st, sh = self.device.stream, self.shape
        sim = self.device.simulator
        gw, bw = dense.bias_backward_launch(sh.head_width, sim)
        gh, bh = dense.bias_backward_launch(sh.hidden, sim)
        dense.bias_act_backward_kernel[gw, bw, st](dhead, self.head, g["b3"], self.rows, sh.head_width,
                                                  dense.ACT_IDENTITY)
        self.gemm.gemm(self.h2, dhead, g["W3"], 1, 0)
        self.gemm.gemm(dhead, p["W3"], self.d2, 0, 1)
        dense.bias_act_backward_kernel[gh, bh, st](self.d2, self.h2, g["b2"], self.rows, sh.hidden, dense.ACT_RELU)
        self.gemm.gemm(self.h1, self.d2, g["W2"], 1, 0)
        self.gemm.gemm(self.d2, p["W2"], self.d1, 0, 1)
        dense.bias_act_backward_kernel[gh, bh, st](self.d1, self.h1, g["b1"], self.rows, sh.hidden, dense.ACT_RELU)
        self.gemm.gemm(x, self.d1, g["W1"], 1, 0)
