"""GEMM backends with one contract: ``gemm(A, B, C, trans_a, trans_b, alpha, beta)`` on row-major
float32 device arrays, enqueued on the device's stream (capturable). cuBLAS where it loads, the
register-tiled Numba kernel otherwise (and always in the simulator)."""
from __future__ import annotations

from cuda_kernels import dense

from ..device import Device


class NumbaGemm:
    name = "numba"

    def __init__(self, device: Device):
        self.device = device

    def gemm(self, A, B, C, trans_a: int = 0, trans_b: int = 0, alpha: float = 1.0, beta: float = 0.0) -> None:
        M, N = C.shape
        K = A.shape[0] if trans_a else A.shape[1]
        dense.gemm_kernel[dense.gemm_grid(M, N), dense.THREADS, self.device.stream](A, B, C, M, N, K, trans_a, trans_b,
                                                                                   alpha, beta)


def make_gemm(device: Device, prefer: str = "cublas", math: str = "fp32"):
    """cuBLAS when asked for and available, else the Numba GEMM."""
    if prefer == "cublas" and not device.simulator:
        from ..cublas import Cublas, CublasUnavailable

        try:
            g = Cublas(device, math=math)
            g.name = f"cublas-{math}"
            return g
        except CublasUnavailable:
            pass
    return NumbaGemm(device)
