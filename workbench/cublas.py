"""cuBLAS SGEMM through ctypes, bound to the device's stream, with a user workspace so nothing is
allocated under graph capture (seen working on the H200: captures into the same graph as Numba
kernels). Row-major matrices, the same contract as ``cuda_kernels.dense.gemm_kernel``:
``C = alpha * op(A) @ op(B) + beta * C``.

Math modes (what a GPU profile's ``math`` and ``gpu.math`` name): ``fp32`` (default, CUBLAS_DEFAULT_MATH
with TF32 disallowed), ``tf32`` (CUBLAS_TF32_TENSOR_OP_MATH: SGEMM on tensor cores, inputs rounded to
TF32, float32 accumulation) and ``bf16``. Asked for bf16 arithmetic on float32 matrices (``cublasGemmEx``
and cuBLASLt with ``CUBLAS_COMPUTE_32F_FAST_16BF``), cuBLAS ran TF32 kernels on the H200 (2026-12-05: a
512x384x256 GEMM's error 2.9e-4, TF32's, where rounding the inputs to bfloat16 gives ~1.3e-3; 300 updates
bit for bit TF32's), so bf16 tensor cores need bfloat16 operands in memory: a ``bf16`` network
(:class:`workbench.agent.network.DeviceNetwork`) keeps bfloat16 copies of its weights, observations,
activations and gradients (:mod:`cuda_kernels.bf16`), and :meth:`gemm` sends bfloat16 operands to
cuBLASLt (float32 accumulation). A float32 GEMM under ``bf16`` computes fp32.
"""
from __future__ import annotations

import ctypes

import numpy as np

from cuda_kernels.nb import cuda

from .cublaslt import PLAIN, CublasLt, EpilogueUnavailable, sm_target
from .device import Device, DeviceError, device_pointer

OP_N, OP_T = 0, 1
# CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION; TF32; bf16: its float32 GEMMs as fp32's
MATH = {"fp32": 0 | 16, "tf32": 3, "bf16": 0 | 16}


class CublasUnavailable(DeviceError):
    """No cuBLAS library could be loaded (use the Numba GEMM fallback)."""


class Cublas:
    def __init__(self, device: Device, workspace_bytes: int = 32 << 20, math: str = "fp32", epilogues: bool = True):
        if device.simulator:
            raise CublasUnavailable("cuBLAS needs a real GPU")
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            self.lib = ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
        except Exception as exc:
            raise CublasUnavailable(f"cannot load cuBLAS: {exc}", "pip install nvidia-cublas (the 'gpu' extra)") from exc
        self.device = device
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(int(device.raw_stream))), "cublasSetStream_v2")
        self.workspace = cuda.device_array(workspace_bytes, dtype="uint8")
        self._check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(device_pointer(self.workspace)),
                                                   ctypes.c_size_t(workspace_bytes)), "cublasSetWorkspace_v2")
        self.shared = False  # GEMMs planned for the SMs they fill beside other agents' (share_gpu)
        self.lt, self.lt_error = None, ""
        if epilogues:  # fused epilogues (workbench.cublaslt) on the same stream and workspace, where they load
            try:
                self.lt = CublasLt(device, self.workspace, math)
            except EpilogueUnavailable as exc:
                self.lt_error = str(exc)
        self.set_math(math)
        self.lib.cublasSgemm_v2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                            ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_int,
                                            ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float),
                                            ctypes.c_void_p, ctypes.c_int]
        self.lib.cublasSgemmBatched.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p,
                                                ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                                ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_int,
                                                ctypes.c_int]

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status != 0:
            raise DeviceError(f"{call} failed: cublasStatus {status}")

    def set_math(self, math: str) -> None:
        if math not in MATH:
            raise DeviceError(f"unknown cuBLAS math mode {math!r}", f"choose one of {', '.join(MATH)}")
        self._check(self.lib.cublasSetMathMode(self.handle, MATH[math]), "cublasSetMathMode")
        self.math = math
        if self.lt is not None:
            self.lt.math = math

    @property
    def name(self) -> str:
        return f"cublas-{self.math}"

    @property
    def fuses_epilogues(self) -> bool:
        """Whether :meth:`gemm_epilogue` runs (cuBLASLt loaded)."""
        return self.lt is not None

    def share_gpu(self, on: bool) -> None:
        """``gpu.sm_share`` for the GEMMs enqueued (captured) from now on: on, each runs through cuBLASLt
        with the algorithm chosen for the SMs its output fills (:func:`workbench.cublaslt.sm_target`), as
        fits a GPU shared with other agents' lanes, not for the whole GPU; off: cuBLAS's own choice. The
        same choice for an agent alone, so its results are the same alone and in a population of any size.
        Without cuBLASLt (nvmath-python) every GEMM keeps cuBLAS's choice."""
        self.shared = bool(on) and self.lt is not None

    def _target(self, C, A) -> int:
        """The SM target of ``C = op(A) @ op(B)`` (0: every SM): by the tiles of bf16's tensor-core kernels
        where the operands are bfloat16, else of this handle's math."""
        M, N = C.shape
        math = "bf16" if A.dtype == np.uint16 else self.math
        return sm_target(M, N, self.device.info.multiprocessors, math) if self.shared else 0

    def gemm_epilogue(self, A, B, C, trans_a: int, trans_b: int, kind: str, bias, mask=None) -> None:
        """Row-major ``C = op(A) @ op(B)`` with a fused epilogue (:meth:`workbench.cublaslt.CublasLt.matmul`)."""
        self.lt.matmul(A, B, C, trans_a, trans_b, kind, bias, mask, target=self._target(C, A))

    def gemm(self, A, B, C, trans_a: int = 0, trans_b: int = 0, alpha: float = 1.0, beta: float = 0.0) -> None:
        """Row-major ``C[M, N] = alpha * op(A) @ op(B) + beta * C`` (cuBLAS sees the transposed problem;
        cuBLASLt, with its algorithm chosen for fewer SMs, where the GPU is shared: :meth:`share_gpu`)."""
        target = self._target(C, A) if alpha == 1.0 and beta == 0.0 else 0
        if A.dtype != np.float32:  # bfloat16 operands: cuBLASLt alone takes them (SGEMM is float32)
            if self.lt is None or alpha != 1.0 or beta != 0.0:
                raise EpilogueUnavailable(f"a GEMM on bfloat16 operands needs cuBLASLt, alpha 1 and beta 0"
                                          f"{': ' + self.lt_error if self.lt is None else ''}")
            self.lt.matmul(A, B, C, trans_a, trans_b, PLAIN, None, target=target)
            return
        if target:
            self.lt.matmul(A, B, C, trans_a, trans_b, PLAIN, None, target=target)
            return
        M, N = C.shape
        K = A.shape[0] if trans_a else A.shape[1]
        lda = M if trans_a else K
        ldb = K if trans_b else N
        a, b = ctypes.c_float(alpha), ctypes.c_float(beta)
        self._check(self.lib.cublasSgemm_v2(self.handle, OP_T if trans_b else OP_N, OP_T if trans_a else OP_N,
                                            N, M, K, ctypes.byref(a), ctypes.c_void_p(device_pointer(B)), ldb,
                                            ctypes.c_void_p(device_pointer(A)), lda, ctypes.byref(b),
                                            ctypes.c_void_p(device_pointer(C)), N), "cublasSgemm_v2")

    def gemm_batched(self, ptrs, M: int, N: int, K: int, trans_a: int, trans_b: int, count: int) -> None:
        """``count`` row-major GEMMs of one shape, ``C_i[M, N] = op(A_i) @ op(B_i)``, as one
        ``cublasSgemmBatched`` (the handle's math mode applies, as for :meth:`gemm`); ``ptrs`` is a uint64
        device array ``[3, count]`` of the A, B and C device addresses (read by the GPU when it runs)."""
        lda = M if trans_a else K
        ldb = K if trans_b else N
        a, b = ctypes.c_float(1.0), ctypes.c_float(0.0)
        base = device_pointer(ptrs)
        row = 8 * ptrs.shape[1]
        self._check(self.lib.cublasSgemmBatched(self.handle, OP_T if trans_b else OP_N, OP_T if trans_a else OP_N,
                                                N, M, K, ctypes.byref(a), ctypes.c_void_p(base + row), ldb,
                                                ctypes.c_void_p(base), lda, ctypes.byref(b),
                                                ctypes.c_void_p(base + 2 * row), N, count), "cublasSgemmBatched")

    def __del__(self):
        try:
            self.lib.cublasDestroy_v2(self.handle)
        except Exception:  # shutdown
            pass
