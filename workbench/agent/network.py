"""The agent's network over one flat float32 parameter buffer, on the device and in NumPy.

Architecture (DESIGN.md): observation ``[features ++ one-hot position]`` -> Linear(D, H) -> ReLU ->
Linear(H, H) -> ReLU -> Linear(H, atoms * (1 + A)) -> dueling branching C51 head. Parameters live in
one flat buffer (``W1, b1, W2, b2, W3, b3`` in that order, row-major ``W[in, out]``) so Adam, the
gradient norm and the EMA target update are one launch each; gradients share the layout.

The host layout (weights.npy, the CPU backend, :func:`init_params`) is exactly that. The GPU keeps
rows of ``align`` floats at least where the head's GEMMs read or write them: ``W3``'s rows, and the
head's activations and gradients (:attr:`NetShape.head_cols`: 510 -> 512 at the reference shape), the
extra columns zero: rows of 510 floats are not 16-byte aligned, and cuBLAS then runs the head's GEMMs
without its vectorised and tensor-core kernels (TF32 1024 x 512 x 510: 21 us against 7.6 us at 512
wide, measured on the H200). The observations' rows, so ``W1``'s rows, can be padded alike
(``obs_align``, :attr:`NetShape.obs_cols`: 23 -> 24 at 4), which PyTorch's GEMMs measured 5.6 -> 4.8 us
per agent for the first layer's three TF32 GEMMs (H200, 16 lanes); the device layout does not pad them
for now (``device_state.OBS_ALIGN``): with 24-wide observations our TF32 runs died of SIGFPE inside
cuBLASLt's heuristic (2026-12-07: W1's gradient planned for one SM, which ``cublaslt.sm_target`` no
longer asks for; with that rule the padded sample ran on the H100, but a population of 32 gained
1.7 % with it, inside run-to-run noise: BENCHMARKS.md, "TF32 and bf16 side by side").
``b3`` is padded alike, so the head GEMM adds the head's bias in its epilogue (a bias of the GEMM's
width) and the dueling head and the loss read one array. The observation's padding column is written
zero once, when its buffer is allocated, and never again (the kernels that fill observations write their
``obs_dim`` columns). The padding stays exactly zero (its gradients are sums of zeros, or products with a
zero input; Adam, weight decay and the EMA keep a zero zero), so it changes no result but the order in
which cuBLAS adds. :func:`relayout` converts between the two layouts.

:class:`DeviceNetwork` enqueues forward and backward on the device's stream with preallocated
activations (nothing allocates after construction, so it can be captured into a graph).
:func:`forward_ref` / :func:`backward_ref` are the NumPy (float64) reference and the CPU backend.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from cuda_kernels import bf16 as K_bf16
from cuda_kernels import c51, dense
from cuda_kernels.nb import SIMULATOR, cuda

from ..cublaslt import BIAS, DRELU_BGRAD, RELU_BIAS, mask_ld
from ..device import device_pointer


@dataclass(frozen=True)
class NetShape:
    obs_dim: int
    hidden: int
    atoms: int
    branch_sizes: tuple[int, ...] = (3, 3, 3)
    align: int = 1  # the device layout: W3's and the head's columns padded to a multiple of this many floats
    #                 (module docstring); 1, the host layout
    obs_align: int = 1  # the observations' columns (so W1's rows) padded alike

    @property
    def n_actions(self) -> int:
        return int(sum(self.branch_sizes))

    @property
    def head_width(self) -> int:
        return self.atoms * (1 + self.n_actions)

    @property
    def head_cols(self) -> int:
        """Columns of W3 and of the head's activations in this layout (``head_width`` rounded up)."""
        return _round_up(self.head_width, self.align)

    @property
    def obs_cols(self) -> int:
        """Columns of the observations and rows of W1 in this layout (``obs_dim`` rounded up)."""
        return _round_up(self.obs_dim, self.obs_align)

    @property
    def host(self) -> "NetShape":
        """This network in the host layout (no padding)."""
        return replace(self, align=1, obs_align=1)

    @property
    def branch_offsets(self) -> tuple[int, ...]:
        return tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.branch_sizes)[:-1]]))

    def layout(self) -> list[tuple[str, tuple[int, ...]]]:
        H = self.hidden
        return [("W1", (self.obs_cols, H)), ("b1", (H,)), ("W2", (H, H)), ("b2", (H,)), ("W3", (H, self.head_cols)),
                ("b3", (self.head_cols,))]

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
    """He-uniform trunk, small head (so initial distributions are near uniform), zero biases; the same
    weights in every layout (drawn in the host layout, then :func:`relayout`)."""
    host = shape.host
    rng = np.random.default_rng(seed)
    flat = np.zeros(host.n_params, np.float32)
    for name, (a, b, shp) in host.offsets().items():
        if name.startswith("W"):
            fan_in = shp[0]
            bound = np.sqrt(6.0 / fan_in) * (0.1 if name == "W3" else 1.0)
            flat[a:b] = rng.uniform(-bound, bound, b - a).astype(np.float32)
    return relayout(flat, host, shape)


def relayout(flat: np.ndarray, src: NetShape, dst: NetShape) -> np.ndarray:
    """Host parameters (or gradients) of layout ``src`` in layout ``dst`` (the same network, another
    ``align``): each named block copied, W1's padding rows and W3's padding columns zero."""
    if src == dst:
        return flat
    out = np.zeros(dst.n_params, flat.dtype)
    v_dst = views(out, dst)
    for name, block in views(flat, src).items():
        target = v_dst[name]
        if block.ndim == 1:
            w = min(len(block), len(target))  # b3: padded as W3's columns
            target[:w] = block[:w]
        else:
            h, w = min(block.shape[0], target.shape[0]), min(block.shape[1], target.shape[1])
            target[:h, :w] = block[:h, :w]
    return out


def device_obs(x: np.ndarray, shape: NetShape) -> np.ndarray:
    """Host observations ``[rows, obs_dim]`` in ``shape``'s layout: ``[rows, obs_cols]``, the padding zero."""
    out = np.zeros((x.shape[0], shape.obs_cols), x.dtype)
    out[:, :shape.obs_dim] = x
    return out


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def views(flat, shape: NetShape) -> dict:
    """Named views into a flat (host or device) buffer."""
    return {name: flat[a:b].reshape(shp) for name, (a, b, shp) in shape.offsets().items()}


# ---- NumPy reference (float64) ----

def forward_ref(params: np.ndarray, x: np.ndarray, shape: NetShape, support: np.ndarray):
    p = views(np.asarray(params, np.float64), shape)  # one conversion of the flat buffer, float64 views of it
    h1 = np.maximum(x @ p["W1"] + p["b1"], 0)
    h2 = np.maximum(h1 @ p["W2"] + p["b2"], 0)
    head = h2 @ p["W3"] + p["b3"]
    logp, q = c51.dueling_head_ref(head, list(shape.branch_sizes), shape.atoms, support)
    return {"h1": h1, "h2": h2, "head": head, "logp": logp, "q": q}


def backward_ref(params: np.ndarray, x: np.ndarray, acts: dict, dhead: np.ndarray, shape: NetShape) -> np.ndarray:
    p = views(np.asarray(params, np.float64), shape)
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

    def __init__(self, device, gemm, shape: NetShape, rows: int, support_dev, fused: bool = False,
                 masks: bool = False, head: bool = True, logp: bool = True, backward: bool = True,
                 bf16: bool = False, weights16=None, obs16=None):
        """``head``: whether this network runs its own dueling head (``q``, and with ``logp`` the
        log-probabilities); an update's networks leave it to their loss (``c51.head_loss_kernel``, which
        writes the online Q of s' into ``q``). Acting and backtesting read ``q`` alone (``logp=False``: no
        ``[rows, actions, atoms]`` buffer written) and never backpropagate (``backward=False``: no gradient
        workspaces): at the reference shape a backtest chunk's network (16,384 rows) holds ~97 MiB instead
        of ~190. ``bf16``: the GEMMs' operands in bfloat16 (:mod:`cuda_kernels.bf16`; float32 accumulation):
        each forward converts the weights it is given and its observations, the trunk's activations are
        kept in bfloat16, the head's output and every gradient in float32, and the backward converts
        dhead, d2 and d1 for the GEMMs that read them; its backward reads the weights and observations its
        forward converted, so it must follow a forward on the same weights and observations (as an
        update's does). ``weights16``: the bfloat16 copy of the weights this network is always given,
        kept current by their owner (the learner's, which Adam and the EMA write:
        ``optim.adam_bf16_kernel``); ``obs16``: ``(x, x16)``, the float32 observations this network's forward
        is always given and their bfloat16 copy, kept current by their owner (the batch's, converted once
        per update after its draw: ``Batch.obs_pair16``; a forward given other observations is refused).
        With both its forward converts nothing. No ReLU masks and no fused backward: our ReLU-gradient
        kernels, as with TF32, where the fused backward measured slower (bf16's not yet measured)."""
        self.device, self.gemm, self.shape, self.rows = device, gemm, shape, rows
        s = device.stream
        H, W, A = shape.hidden, shape.head_cols, shape.n_actions
        self.bf16 = bool(bf16)
        act = np.uint16 if bf16 else np.float32  # the trunk's activations: a bf16 network's next GEMM reads them
        self.h1 = cuda.device_array((rows, H), act, stream=s)
        self.h2 = cuda.device_array((rows, H), act, stream=s)
        self.head = cuda.device_array((rows, W), np.float32, stream=s)
        self.logp = cuda.device_array((rows, A, shape.atoms), np.float32, stream=s) if head and logp else None
        # the head kernel's log-probabilities parameter where none are kept (it writes nothing there)
        self.no_logp = cuda.device_array((1, 1, 1), np.float32, stream=s) if head and not logp else None
        self.q = cuda.device_array((rows, A), np.float32, stream=s)
        self.d2 = cuda.device_array((rows, H), np.float32, stream=s) if backward else None
        self.d1 = cuda.device_array((rows, H), np.float32, stream=s) if backward else None
        # a bf16 network's operand copies (None otherwise): the weights, the observations, dhead, d2, d1
        u16 = lambda shp, keep=True: (cuda.device_array(shp, np.uint16, stream=s)  # noqa: E731
                                      if bf16 and keep else None)
        self.p16 = weights16 if weights16 is not None else u16(shape.n_params)
        self.obs_source, self.x16 = obs16 if obs16 is not None else (None, u16((rows, shape.obs_cols)))
        self.converts_weights = bf16 and weights16 is None
        self.converts_obs = bf16 and obs16 is None
        self.dhead16, self.d2_16, self.d1_16 = (u16((rows, W), backward), u16((rows, H), backward),
                                                u16((rows, H), backward))
        self.support = support_dev  # the C51 support (the head's kernel is built for the shape's branches)
        # this shape's head kernel, loaded now: never first compiled or loaded inside a graph's capture
        self.head_kernel = c51.head_kernel(shape.atoms, shape.branch_sizes) if head else None
        if self.head_kernel is not None and not SIMULATOR:
            self.head_kernel.load()
        # fused epilogues (cuBLASLt) where asked for and the GEMM backend has them; then the trunk's ReLU
        # masks, one bit per (row, column), for the backward's fused ReLU gradient (masks: only a network
        # that backpropagates needs them)
        self.fused = bool(fused and getattr(gemm, "fuses_epilogues", False))
        # a bf16 network's trunk biases as its forward reads them: bfloat16 (the weights' copy) where
        # cuBLASLt's epilogue writes the bfloat16 activations (a bias of the output's type, its default),
        # float32 where our epilogue does
        self.bias16 = self.bf16 and self.fused
        nbytes = mask_ld(H) // 8
        self.mask1, self.mask2 = ((cuda.device_array((rows, nbytes), np.uint8, stream=s),
                                   cuda.device_array((rows, nbytes), np.uint8, stream=s))
                                  if self.fused and masks and backward and not bf16 else (None, None))
        # a bf16 network whose epilogues are our kernels: the trunk GEMMs' float32 outputs, from which the
        # epilogue writes the bfloat16 activations
        self.h1f, self.h2f = ((cuda.device_array((rows, H), np.float32, stream=s),
                               cuda.device_array((rows, H), np.float32, stream=s))
                              if bf16 and not self.fused else (None, None))
        # the bias-gradient kernel's scratch (its row slices' sums, and its per-tile arrival counts, which
        # every launch leaves at zero): one for this network's backward launches, which run in turn
        part_shape, tiles = dense.bias_backward_scratch_shapes(max(H, W), device.simulator)
        scratch = lambda: (cuda.device_array(part_shape, np.float32, stream=s),  # noqa: E731
                           cuda.to_device(np.zeros(tiles, np.int32), stream=s))
        self.bwd_scratch = scratch() if backward else ()
        # the head's bias gradient's (_head_bias_grad), which may run beside the others
        self.head_scratch = scratch() if backward else ()
        self.view_of = None

    @property
    def nbytes(self) -> int:
        """Device memory of the activation workspaces (0 for a view: its buffers are another's)."""
        if self.view_of is not None:
            return 0
        return sum(int(a.size) * int(a.dtype.itemsize) for a in (self.h1, self.h2, self.head, self.logp, self.no_logp,
                                                                  self.q, self.d2, self.d1, self.mask1, self.mask2,
                                                                  *self.bwd_scratch, *self.head_scratch,
                                                                  *self._bf16_buffers)
                   if a is not None)

    @property
    def _bf16_buffers(self) -> tuple:
        # the weights' copy where this network keeps its own (an owner's ``weights16`` is the owner's memory)
        return (self.p16 if self.converts_weights else None, self.x16 if self.converts_obs else None, self.dhead16,
                self.d2_16, self.d1_16, self.h1f, self.h2f)

    @property
    def fuses_backward(self) -> bool:
        """Whether this network's backward fuses the ReLU gradient and bias gradient into its GEMMs
        (``DRELU_BGRAD``, reading the masks its forward then writes): where it keeps masks and the GEMMs
        run in a math listed in :data:`FUSED_BACKWARD_MATH` (read as the passes are enqueued, so forward
        and backward of one update agree)."""
        return self.mask1 is not None and getattr(self.gemm, "math", "") in FUSED_BACKWARD_MATH

    def row_range(self, a: int, b: int) -> "DeviceNetwork":
        """This workspace's rows [a, b) as a network of their own (the same buffers): a stacked forward's
        parts, e.g. the rows whose loss the backward pass differentiates."""
        v = object.__new__(DeviceNetwork)
        v.__dict__.update(self.__dict__)
        v.rows, v.view_of = b - a, self
        for k in ("h1", "h2", "head", "logp", "q", "d2", "d1", "mask1", "mask2", "x16", "obs_source", "dhead16",
                  "d2_16", "d1_16", "h1f", "h2f"):
            if getattr(self, k) is not None:
                setattr(v, k, getattr(self, k)[a:b])
        return v

    def on(self, device, gemm) -> "DeviceNetwork":
        """This network (the same buffers) enqueued on another stream of the same device with a GEMM
        backend bound to that stream: a side branch of an update (:meth:`backward_beside`,
        :meth:`~workbench.agent.trainer.DeviceTrainer.update_beside`)."""
        v = object.__new__(DeviceNetwork)
        v.__dict__.update(self.__dict__)
        v.device, v.gemm, v.view_of = device, gemm, self.view_of or self
        return v

    def forward(self, params_flat, x, head: bool = True) -> None:
        """x: float32 [rows, obs_cols] (its padding columns zero); fills h1, h2, head (its bias added) and,
        with ``head``, q and logp where kept (the dueling head; a training update leaves it to its loss,
        ``c51.head_loss_kernel``)."""
        run_steps(self.forward_steps(params_flat, x, head))

    def backward(self, params_flat, grads_flat, x, dhead) -> None:
        """dhead: float32 [rows, head_cols] (overwritten; its padding columns zero); writes every gradient
        into grads_flat."""
        run_steps(self.backward_steps(params_flat, grads_flat, x, dhead))

    # the passes as steps: kernels enqueued on the device's stream, each GEMM yielded to whoever drives
    # them (run_steps: the network's GEMM; a population: one batched GEMM over its agents' same GEMM)
    def forward_steps(self, params_flat, x, head: bool = True):
        p, w = views(params_flat, self.shape), self._gemm_weights(params_flat)
        st, sh, f, d = self.device.stream, self.shape, self.fused, self.device
        m1, m2 = (self.mask1, self.mask2) if self.fuses_backward else (None, None)
        if self.bf16:
            yield from self._forward_bf16_trunk(params_flat, x, p, w)
        else:
            yield Gemm(x, w["W1"], self.h1, 0, 0, self.gemm, Epilogue(RELU_BIAS, p["b1"], self.h1, m1, f, d))
            yield Gemm(self.h1, w["W2"], self.h2, 0, 0, self.gemm, Epilogue(RELU_BIAS, p["b2"], self.h2, m2, f, d))
        yield Gemm(self.h2, w["W3"], self.head, 0, 0, self.gemm, Epilogue(BIAS, p["b3"], self.head, None, f, d))
        if not head:
            return
        if self.logp is None and self.no_logp is None:
            raise ValueError("this network's dueling head runs in its loss's launch (DeviceNetwork(head=False))")
        nb = len(sh.branch_sizes)
        grid, block = c51.head_launch(self.rows, sh.atoms, nb)
        keep = self.logp is not None
        self.head_kernel[grid, block, st](self.head, self.rows, self.support, self.logp if keep else self.no_logp,
                                          int(keep), self.q)

    def _gemm_weights(self, params_flat) -> dict:
        """The weights as the GEMMs read them: a bf16 network's bfloat16 copy (its forward converts it),
        else the parameters themselves (the biases are always read from the parameters)."""
        return views(self.p16 if self.bf16 else params_flat, self.shape)

    def _dhead_operand(self, dhead):
        """dhead as the backward's GEMMs read it: a bf16 network's bfloat16 copy, converted here on this
        network's stream (so before a side stream forks from it), else dhead itself."""
        if not self.bf16:
            return dhead
        to_bf16_copy(dhead, self.dhead16, self.device.stream, self.device.simulator)
        return self.dhead16

    def _forward_bf16_trunk(self, params_flat, x, p, w):
        """A bf16 forward's first steps: the weights (into ``w``'s buffer, unless their owner keeps them:
        ``weights16``) and observations (unless their owner keeps them: ``obs16``) converted, then the
        trunk's two layers writing bfloat16 activations (inside cuBLASLt's GEMMs, with the biases'
        bfloat16 copies, or our epilogue from a float32 output, with the float32 biases: :attr:`bias16`)."""
        st, sim, f, d = self.device.stream, self.device.simulator, self.fused, self.device
        if self.converts_weights:
            to_bf16_copy(params_flat, self.p16, st, sim)
        if self.converts_obs:
            to_bf16_copy(x, self.x16, st, sim)
        elif not _same_array(x, self.obs_source):
            raise ValueError("this network reads its observations' bfloat16 copy (DeviceNetwork(obs16=)): "
                             "its forward takes only the observations that copy is made from")
        b = w if self.bias16 else p
        for a, W, b, h, hf in ((self.x16, w["W1"], b["b1"], self.h1, self.h1f),
                               (self.h1, w["W2"], b["b2"], self.h2, self.h2f)):
            yield (Gemm(a, W, h, 0, 0, self.gemm, Epilogue(RELU_BIAS, b, h, None, True, d)) if f else
                   Gemm(a, W, hf, 0, 0, self.gemm, Epilogue(RELU_BIAS, b, hf, None, False, d, dst16=h)))

    def backward_steps(self, params_flat, grads_flat, x, dhead):
        if self.d1 is None:
            raise ValueError("this network keeps no gradient workspaces (DeviceNetwork(backward=False))")
        g = views(grads_flat, self.shape)
        dh = self._dhead_operand(dhead)
        self._head_bias_grad(g, dhead, self.device.stream)
        yield from self._backward_gemms(self._gemm_weights(params_flat), g, x, dh, self.gemm)

    def backward_beside(self, params_flat, grads_flat, x, dhead, side: "DeviceNetwork", fork, d2_ready,
                        join) -> None:
        """:meth:`backward` with the head's bias and weight gradients and W2's weight gradient on ``side``
        (this network on another stream, :meth:`on`) beside the chain d2 -> d1 -> W1's gradient on this
        network's stream: the same kernels and GEMMs on the same buffers, so the same results bit for bit.
        The :class:`~workbench.device.Handoff` ``fork``: ``side`` starts after the work enqueued here so
        far (the loss that wrote ``dhead``); ``d2_ready``: it reads d2 once d2's epilogue is done;
        ``join``: what is enqueued here after this call runs after ``side``'s work."""
        g = views(grads_flat, self.shape)
        d, sd = self.device, side.device
        dh = self._dhead_operand(dhead)  # before the fork: the side stream's first GEMM reads it
        fork.give(d).take(sd)
        self._head_bias_grad(g, dhead, sd.stream)
        w3, d2, w2, d1, w1 = self._backward_gemms(self._gemm_weights(params_flat), g, x, dh, side.gemm)
        w3.run()
        d2.run()
        d2_ready.give(d).take(sd)
        w2.run()
        join.give(sd)
        d1.run()
        w1.run()
        join.take(d)

    def _head_bias_grad(self, g, dhead, stream) -> None:
        """b3's gradient: ``dhead``'s column sums (dhead only read), on ``stream``, with the head's own
        scratch (so it may run beside the trunk's bias gradients, which share ``bwd_scratch``)."""
        sh = self.shape
        gw, bw = dense.bias_backward_launch(sh.head_cols, self.device.simulator)  # the padding's: sums of zeros
        dense.bias_act_backward_kernel[gw, bw, stream](dhead, self.head, g["b3"], self.rows, sh.head_cols,
                                                      dense.ACT_IDENTITY, *self.head_scratch)

    def _backward_gemms(self, w, g, x, dh, weights_by) -> tuple["Gemm", ...]:
        """The backward's five GEMMs in order: W3's gradient, d2 (with the ReLU gradient and b2's gradient),
        W2's gradient, d1 (with b1's), W1's gradient. ``w``: the weights as the GEMMs read them
        (:meth:`_gemm_weights`), ``dh``: dhead as they read it (:meth:`_dhead_operand`); a bf16 network's
        read its observations' and d2's and d1's bfloat16 copies. ``weights_by``: the GEMM backend of W3's
        and W2's gradients (this network's own, or a side stream's: :meth:`backward_beside`)."""
        fb, d = self.fuses_backward, self.device
        d2, d1, x = (self.d2_16, self.d1_16, self.x16) if self.bf16 else (self.d2, self.d1, x)
        return (Gemm(self.h2, dh, g["W3"], 1, 0, weights_by),
                Gemm(dh, w["W3"], self.d2, 0, 1, self.gemm,
                     Epilogue(DRELU_BGRAD, g["b2"], self.h2, self.mask2, fb, d, self.bwd_scratch, self.d2_16)),
                Gemm(self.h1, d2, g["W2"], 1, 0, weights_by),
                Gemm(d2, w["W2"], self.d1, 0, 1, self.gemm,
                     Epilogue(DRELU_BGRAD, g["b1"], self.h1, self.mask1, fb, d, self.bwd_scratch, self.d1_16)),
                Gemm(x, d1, g["W1"], 1, 0, self.gemm))


# Where cuBLASLt's DRELU_BGRAD backward beats a plain GEMM and our ReLU-gradient/bias-gradient kernel
# (H200, reference shape, 2026-12-04): fp32 yes (update 0.3847 -> 0.3788 ms); TF32 no (its GEMM takes
# 14 us where the plain one takes 7, and writing the forward's mask slows the forward's GEMMs: update
# 0.2743 ms forward-only against 0.2837 with the backward fused too).
FUSED_BACKWARD_MATH = ("fp32",)


class Epilogue(NamedTuple):
    """What a layer does to its GEMM's output ``C`` right after it: ``relu_bias`` (a trunk layer's forward:
    ``C = relu(C + bias)``), ``bias`` (the head layer's forward: ``C = C + bias``) or ``drelu_bgrad`` (a trunk
    layer's backward: ``C`` times the ReLU's gradient, ``C *= out > 0`` with ``out`` the layer's forward
    output, and ``bias`` receives ``C``'s column sums, the bias gradient).
    ``fused``: inside the GEMM (cuBLASLt, :mod:`workbench.cublaslt`), the ReLU passing from forward to
    backward as the bit ``mask`` (None where nothing backpropagates through this forward); else our
    bias kernel after the GEMM, on the network's ``device`` stream (:meth:`unfused`), reading ``out``;
    ``scratch``: the network's bias-gradient scratch (``drelu_bgrad`` only)."""

    kind: str
    bias: object
    out: object
    mask: object
    fused: bool
    device: object
    scratch: tuple | None = None
    dst16: object = None

    def unfused(self, C) -> None:
        """Our kernel for this epilogue on ``C``, enqueued on the network's stream. A bf16 network's:
        ``dst16`` receives the result as bfloat16 (the forward's activations from the float32 ``C``; the
        backward's d2, d1 after the ReLU gradient in place), and ``out`` may be bfloat16 activations."""
        M, N = C.shape
        st, sim = self.device.stream, self.device.simulator
        if self.kind in (RELU_BIAS, BIAS):
            gh, th = dense.bias_act_launch(M, N, sim)
            act = dense.ACT_RELU if self.kind == RELU_BIAS else dense.ACT_IDENTITY
            if self.dst16 is not None:
                dense.bias_act_bf16_kernel[gh, th, st](C, self.bias, self.dst16, M, N, act)
            else:
                dense.bias_act_kernel[gh, th, st](C, self.bias, M, N, act)
        else:
            gh, bh = dense.bias_backward_launch(N, sim)
            k = dense.bias_act_backward_bf16_kernel if self.out.dtype == np.uint16 else dense.bias_act_backward_kernel
            k[gh, bh, st](C, self.out, self.bias, M, N, dense.ACT_RELU, *self.scratch)
            if self.dst16 is not None:
                to_bf16_copy(C, self.dst16, st, sim)


class Gemm(NamedTuple):
    """One GEMM of a pass written as steps: row-major ``C = op(A) @ op(B)`` (the GEMM contract of
    :mod:`workbench.agent.gemm`, alpha 1, beta 0), ``by``, the GEMM backend of the network that
    yields it (bound to its stream), and the layer's :class:`Epilogue` (None: the GEMM alone)."""

    A: object
    B: object
    C: object
    trans_a: int
    trans_b: int
    by: object
    epi: Epilogue | None = None

    def run(self) -> None:
        """On the network's own GEMM backend, where the pass stands, with its epilogue."""
        e = self.epi
        if e is not None and e.fused:
            self.by.gemm_epilogue(self.A, self.B, self.C, self.trans_a, self.trans_b, e.kind, e.bias, e.mask)
            return
        self.by.gemm(self.A, self.B, self.C, self.trans_a, self.trans_b)
        self.finish()

    def finish(self) -> None:
        """The epilogue as our kernel after a GEMM that did not fuse it (a batched GEMM's, or an
        unfused one's)."""
        if self.epi is not None:
            self.epi.unfused(self.C)


def _same_array(a, b) -> bool:
    """Whether two device arrays are the same memory (the same start and shape)."""
    return a.shape == b.shape and device_pointer(a) == device_pointer(b)


def to_bf16_copy(src, dst, stream, simulator: bool) -> None:
    """``dst`` (uint16, the shape of ``src``) = ``src`` (float32, contiguous) rounded to bfloat16, on ``stream``."""
    n = int(src.size)
    blocks = 4 if simulator else min(1024, (n + 255) // 256)
    K_bf16.to_bf16_kernel[blocks, 32 if simulator else 256, stream](src.reshape(n), dst.reshape(n), n)


def run_steps(steps) -> None:
    """Drive a pass written as steps alone: each GEMM it yields runs on its network's GEMM backend."""
    for g in steps:
        g.run()
