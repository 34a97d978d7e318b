"""GEMM backends with one contract: ``gemm(A, B, C, trans_a, trans_b, alpha, beta)`` on row-major
float32 device arrays, enqueued on the device's stream (capturable). cuBLAS where it loads, the
register-tiled Numba kernel otherwise (and always in the simulator). Both also take bfloat16 operands
(``uint16`` arrays of :mod:`cuda_kernels.bf16` bits, A and B alike) with a float32 C: float32
accumulation of the operands' exact values."""
from __future__ import annotations

import numpy as np

from cuda_kernels import dense

from ..device import Device, device_pointer


class NumbaGemm:
    name = "numba"

    def __init__(self, device: Device):
        self.device = device

    def gemm(self, A, B, C, trans_a: int = 0, trans_b: int = 0, alpha: float = 1.0, beta: float = 0.0) -> None:
        M, N = C.shape
        K = A.shape[0] if trans_a else A.shape[1]
        k = dense.gemm_bf16_kernel if A.dtype == np.uint16 else dense.gemm_kernel
        k[dense.gemm_grid(M, N), dense.THREADS, self.device.stream](A, B, C, M, N, K, trans_a, trans_b, alpha, beta)


def make_gemm(device: Device, prefer: str = "cublas", math: str = "fp32"):
    """cuBLAS when asked for and available, else the Numba GEMM."""
    if prefer == "cublas" and not device.simulator:
        from ..cublas import Cublas, CublasUnavailable

        try:
            return Cublas(device, math=math)
        except CublasUnavailable:
            pass
    return NumbaGemm(device)


def set_math(gemm, math: str) -> None:
    """A run's GEMM math (``gpu.math``) on a GEMM backend made for another run: cuBLAS applies it to
    what is enqueued (captured) from now on; the Numba GEMM computes fp32 whatever is asked."""
    if hasattr(gemm, "set_math") and gemm.math != math:
        gemm.set_math(math)


def set_sharing(gemm, on: bool) -> None:
    """A run's ``gpu.sm_share`` on a GEMM backend (possibly made for another run): cuBLAS plans what is
    enqueued (captured) from now on for the SMs each GEMM fills (:meth:`workbench.cublas.Cublas.share_gpu`);
    the Numba GEMM has no such choice."""
    if hasattr(gemm, "share_gpu"):
        gemm.share_gpu(on)


BATCH_MIN_AGENTS = 8  # a GEMM meeting batches from this many agents on (measured: GemmMeeting's docstring)


class GemmMeeting:
    """Where a population's agents meet at each GEMM of a pass (``meet`` of
    :meth:`~workbench.device.Device.capture_loops`): their same GEMM (one shape, one pair of transposes,
    each agent its own matrices) as one batched cuBLAS GEMM on the population's stream, so the GPU runs
    P GEMMs as one larger launch instead of P small ones side by side (`bench/gemm_probe.py`: 2x with
    TF32 at 16 agents). A meeting joins every agent's lane to the population's stream and forks them
    again, which costs more than batching buys for a few agents (measured on the H200 at the reference
    shape: 5 agents lose 1 % TF32 and 7 % fp32, 16 agents gain 20 % and 12 %), so only meetings of at
    least ``min_agents`` agents batch; smaller ones, and every meeting where ``gemm`` cannot batch (the
    Numba GEMM, the simulator), run each agent's GEMM on its own backend where its pass stands, unjoined:
    what the agent runs alone.

    A batched GEMM fuses no epilogue: the agents' bias and ReLU kernels follow it on their own lanes
    (:meth:`after`). The batched GEMM reads its matrices' addresses from device memory: :meth:`plan`
    sees every meeting first (in a capture that is thrown away), :meth:`prepare` uploads one ``[3, P]``
    address array per batched meeting, and each call then takes the next one, checking that the
    addresses are those planned."""

    def __init__(self, device: Device, gemm, min_agents: int = BATCH_MIN_AGENTS):
        self.device, self.gemm, self.min_agents = device, gemm, min_agents
        self.can_batch = hasattr(gemm, "gemm_batched")
        self.planned: list[np.ndarray] = []
        self.arrays: list = []
        self.cursor = 0

    @staticmethod
    def _shape(call) -> tuple[int, int, int, int, int]:
        M, N = call.C.shape
        K = call.A.shape[0] if call.trans_a else call.A.shape[1]
        return M, N, K, int(call.trans_a), int(call.trans_b)

    def batches(self, n_agents: int) -> bool:
        """Whether a meeting of ``n_agents`` batches: cuBLAS, and ``min_agents`` agents or more."""
        return self.can_batch and n_agents >= max(2, self.min_agents)

    def joins(self, calls) -> bool:
        """Whether this meeting batches (and so joins the agents): :meth:`batches` for its calls, on float32
        operands (the batched GEMM is an SGEMM; bfloat16 operands run on each agent's lane)."""
        return self.batches(len(calls)) and calls[0].A.dtype == np.float32

    def _addresses(self, calls) -> np.ndarray:
        shapes = {self._shape(c) for c in calls}
        if len(shapes) != 1:
            raise ValueError(f"agents met at GEMMs of different shapes: {sorted(shapes)}")
        return np.array([[device_pointer(getattr(c, m)) for c in calls] for m in "ABC"], np.uint64)

    def plan(self, calls) -> None:
        if self.joins(calls):
            self.planned.append(self._addresses(calls))

    def prepare(self) -> None:
        from cuda_kernels.nb import cuda

        self.arrays = [cuda.to_device(a, stream=self.device.stream) for a in self.planned]
        self.cursor = 0
        self.device.synchronize()

    def __call__(self, calls) -> None:
        if not self.joins(calls):
            for c in calls:
                c.run()  # with its epilogue, fused where its backend fuses
            return
        i = self.cursor
        self.cursor += 1
        if i >= len(self.arrays) or not np.array_equal(self.planned[i], self._addresses(calls)):
            raise RuntimeError(f"GEMM meeting {i} differs from its plan (the capture did not repeat the planning pass)")
        M, N, K, ta, tb = self._shape(calls[0])
        self.gemm.gemm_batched(self.arrays[i], M, N, K, ta, tb, len(calls))

    def after(self, calls) -> None:
        """Once the agents are forked again: each batched GEMM's epilogue as the agent's own kernel on its
        own lane (cuBLASLt has no epilogue for batched GEMMs; the agents' forward and backward then both
        take the unfused path, so the backward never reads a ReLU mask that the forward did not write)."""
        if self.joins(calls):
            for c in calls:
                c.finish()
