"""cuBLASLt GEMMs with fused epilogues (issue #16), through nvmath-python's low-level bindings
(``nvmath.bindings.cublasLt``: raw device pointers, an explicit workspace, our stream; its high-level
``Matmul`` allocates on every call and cannot be captured). Row-major, the contract of
:mod:`workbench.cublas`: ``C[M, N] = op(A) @ op(B)``, then

- ``relu_bias``: ``C = relu(C + bias)`` (``bias`` [N]), the ReLU's bit mask written to ``mask`` when one
  is given (cuBLASLt's ``RELU_AUX_BIAS``; ``RELU_BIAS`` without);
- ``bias``: ``C = C + bias`` (``BIAS``: the head layer, whose output the dueling head and the loss read);
- ``drelu_bgrad``: ``C = C * (forward output > 0)`` read from the forward's bit mask, and ``bias`` [N]
  receives ``C``'s column sums (``DRELU_BGRAD``): a ReLU layer's input gradient and its bias gradient;
- ``plain``: the GEMM alone (a population's GEMMs told how many SMs to count on, below).

``sm_target`` (cuBLASLt's ``SM_COUNT_TARGET``; 0: every SM): the number of SMs the heuristic chooses
the GEMM's algorithm for, when other streams share the GPU (a population's agents on their lanes). A
1024-row GEMM picked for 132 SMs is cut into small tiles (and split over K) to fill them alone; with
16 agents' lanes side by side the GPU is full already and those tiles are the slow choice
(:func:`sm_target`).

Measured on the H200 (``bench/cublaslt_probe.py``, ``bench/train_step.py``, 2026-12-04): the forward's
bias + ReLU fused into the GEMM equals SGEMM then our bias kernel bit for bit and takes 29 us instead
of 36 (fp32) and 9.5 us instead of 16.7 (TF32) at 2048 x 512 x 512; writing the ReLU mask as well
(``RELU_AUX_BIAS``) costs 17 us with TF32, and TF32's ``DRELU_BGRAD`` GEMM takes 14 us where the plain
one takes 7, so the backward fuses in fp32 only (``network.FUSED_BACKWARD_MATH``). cuBLASLt offers no
algorithm for an epilogue in pointer-array batch mode, so a population's batched GEMMs
(:class:`~workbench.agent.gemm.GemmMeeting`) keep their bias kernels.

cuBLASLt sees the row-major problem transposed (column-major ``D[N, M] = op(B^T) @ op(A^T)``): the bias
runs along D's rows (C's columns) and the ReLU mask holds, per row of C, ``mask_ld(N)`` bits, one per
column (``EPILOGUE_AUX_LD`` must be a multiple of 128). Descriptors and the heuristic's algorithm are
made at a call's first enqueue (host work only, safe inside a capture) and kept for the addresses it
names, so a graph captured again reuses them and they live as long as this object.
"""
from __future__ import annotations

import numpy as np

from .device import Device, DeviceError, device_pointer

R32F = 0  # cudaDataType CUDA_R_32F
R16BF = 14  # cudaDataType CUDA_R_16BF
# a matrix's cudaDataType by its array's dtype: uint16 arrays hold bfloat16 bits (cuda_kernels.bf16)
DATA_TYPES = {np.dtype(np.float32): R32F, np.dtype(np.uint16): R16BF}
RELU_BIAS, BIAS, DRELU_BGRAD, PLAIN = "relu_bias", "bias", "drelu_bgrad", "plain"


# Output tile area that sm_target counts an SM for: cuBLASLt's large TF32 tiles are 128 x 256, its fp32
# (SIMT) ones 128 x 128. bf16 takes TF32's: on the H100 (P = 32, sm_share, 2026-12-07) a population ran
# 14,862 agent-updates/s with it, 14,860 with 256 x 256 and 13,944 with 128 x 128 (twice the SMs a GEMM).
TILE_AREA = {"tf32": 128 * 256, "bf16": 128 * 256, "fp32": 128 * 128}


def sm_target(M: int, N: int, sms: int, math: str) -> int:
    """The SM count target of a ``[M, N]`` GEMM that runs beside other agents' (a population's lanes):
    as many SMs as its output has large tiles (0, every SM, where that is every SM anyway). It depends
    on the GEMM's shape alone, not on how many agents run, so an agent's GEMMs, and so its results, are
    the same in a population of any size. Measured on the H100 (``bench/lt_algo_probe.py``, 16 lanes,
    TF32, us per agent): 2048 x 512 x 512 10.4 -> 5.0 (target 33), 1024 x 512 x 512 5.0 -> 2.9 (16),
    512 x 512 x 1024 (a weight gradient) 7.7 -> 3.6 (8). A GEMM of one tile keeps cuBLAS's own choice
    too: asked for one SM, cuBLASLt's heuristic killed the process with SIGFPE for a TF32 GEMM of 24 x 512
    outputs (W1's gradient with 24-wide observations, K = 1024; H100, 2026-12-07; 23 x 512 and target 0
    ran: ``bench/results/cublaslt_shapes_sigfpe_h100.txt``), and at 20 x 512 too, the width of every real
    file without order flow (``bench/results/guard_h100_a0f6468.txt``: with this rule those files ran)."""
    tiles = -(-M * N // TILE_AREA.get(math, TILE_AREA["fp32"]))
    return 0 if tiles >= sms or tiles <= 1 else int(tiles)


def mask_ld(cols: int) -> int:
    """Bits per row of a ReLU mask over ``cols`` columns (cuBLASLt wants a multiple of 128)."""
    return (cols + 127) // 128 * 128


class EpilogueUnavailable(DeviceError):
    """cuBLASLt (nvmath-python) cannot be loaded, or offers no algorithm for an epilogue."""


_HEURISTICS: dict = {}  # problem -> the heuristic's algorithms (MatmulHeuristicResult), shared by every handle

# Experiments only (bench/population_step.py --pick; empty in every run): a GEMM problem's SM count target
# and which of the heuristic's algorithms it runs, by (math, M, N, K) -> (target or None: the caller's,
# index into the heuristic's list, 0 its first choice).
PICKS: dict = {}


class CublasLt:
    """One cuBLASLt handle on the device's stream, sharing a workspace with the stream's other GEMMs
    (stream order keeps them apart)."""

    def __init__(self, device: Device, workspace, math: str = "fp32"):
        try:
            from nvmath.bindings import cublas as B
            from nvmath.bindings import cublasLt as L

            self.handle = L.create()
        except Exception as exc:
            raise EpilogueUnavailable(f"cannot load cuBLASLt: {exc}", "pip install nvmath-python (the 'gpu' "
                                      "extra), or set gpu.fused_epilogues = 'off'") from exc
        self.L, self.device, self.workspace = L, device, workspace
        self.compute = {"fp32": int(B.ComputeType.COMPUTE_32F), "tf32": int(B.ComputeType.COMPUTE_32F_FAST_TF32),
                        "bf16": int(B.ComputeType.COMPUTE_32F)}  # bf16: float32 accumulation of bfloat16 operands
        self.math = math
        self.pref = L.matmul_preference_create()
        self._set(L.matmul_preference_set_attribute, L.get_matmul_preference_attribute_dtype, self.pref,
                  L.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, int(workspace.size))
        self.alpha, self.beta = np.ones(1, np.float32), np.zeros(1, np.float32)
        self.plans: dict = {}

    @staticmethod
    def _set(setter, dtype_of, obj, attr, value) -> None:
        buf = np.array([value], dtype=dtype_of(attr))
        setter(obj, attr, buf.ctypes.data, buf.nbytes)

    def _plan(self, key, M: int, N: int, K: int, ta: int, tb: int, kind: str, bias, mask, target: int,
              ab: int = R32F, c: int = R32F, index: int = 0):
        L = self.L
        # bfloat16 operands: tensor cores with float32 accumulation (COMPUTE_32F; the fast-TF32 mode is
        # for float32 operands)
        desc = L.matmul_desc_create(self.compute["fp32" if ab == R16BF else self.math], R32F)
        A = L.MatmulDescAttribute
        dset = lambda attr, v: self._set(L.matmul_desc_set_attribute, L.get_matmul_desc_attribute_dtype,  # noqa: E731
                                         desc, attr, v)
        dset(A.TRANSA, int(tb))  # cuBLASLt's A is our B (the transposed problem), and its B our A
        dset(A.TRANSB, int(ta))
        if kind == RELU_BIAS:
            epi = L.Epilogue.RELU_AUX_BIAS if mask is not None else L.Epilogue.RELU_BIAS
        elif kind == BIAS:
            epi = L.Epilogue.BIAS
        elif kind == DRELU_BGRAD:
            epi = L.Epilogue.DRELU_BGRAD
        elif kind == PLAIN:
            epi = L.Epilogue.DEFAULT
        else:
            raise ValueError(f"unknown epilogue {kind!r}")
        dset(A.EPILOGUE, int(epi))
        if bias is not None:
            dset(A.BIAS_POINTER, device_pointer(bias))
            if DATA_TYPES[bias.dtype] != c:  # a bias whose type is not the output's (the default is the output's)
                dset(A.BIAS_DATA_TYPE, DATA_TYPES[bias.dtype])
        if target:
            dset(A.SM_COUNT_TARGET, int(target))
        if mask is not None:
            dset(A.EPILOGUE_AUX_POINTER, device_pointer(mask))
            dset(A.EPILOGUE_AUX_LD, mask_ld(N))
        lay_a = L.matrix_layout_create(ab, *((K, N, K) if tb else (N, K, N)))
        lay_b = L.matrix_layout_create(ab, *((M, K, M) if ta else (K, M, K)))
        lay_c = L.matrix_layout_create(c, N, M, N)
        # the heuristic's choice depends on the problem, not on the buffers (it assumes the default 256-byte
        # alignment of every pointer): asked once per process for each problem, whatever the agent
        problem = (self.device.info.name, self.math, M, N, K, int(ta), int(tb), int(epi), bias is not None,
                   mask is not None, int(target), int(self.workspace.size), ab, c,
                   DATA_TYPES[bias.dtype] if bias is not None else -1, index)
        results = _HEURISTICS.get(problem)
        if results is None:
            results = L.MatmulHeuristicResult(index + 1)
            count = np.zeros(1, np.int32)
            try:
                L.matmul_algo_get_heuristic(self.handle, desc, lay_a, lay_b, lay_c, lay_c, self.pref, index + 1,
                                            results.ptr, count.ctypes.data)
            except Exception as exc:
                count[0] = 0
                why = str(exc).split(".")[0]
            else:
                why = "the heuristic returned none" if index == 0 else f"the heuristic returned {count[0]}"
            if count[0] < index + 1:
                maths = "bf16 operands" if ab == R16BF else self.math
                raise EpilogueUnavailable(f"cuBLASLt offers no {epi.name} algorithm for {M}x{N}x{K} "
                                          f"(trans {ta}{tb}, {maths}, SM target {target}): {why}",
                                          "set gpu.fused_epilogues = 'off'" if kind != PLAIN
                                          else "set gpu.sm_share = 'off'")
            _HEURISTICS[problem] = results
        # the algorithm: the index-th result (a cublasLtMatmulHeuristicResult_t starts with its algo)
        plan = (desc, lay_a, lay_b, lay_c, results, int(results.ptr) + index * L.matmul_heuristic_result_dtype.itemsize)
        self.plans[key] = plan
        return plan

    def matmul(self, A, B, C, ta: int, tb: int, kind: str, bias, mask=None, target: int = 0) -> None:
        """Row-major ``C = op(A) @ op(B)`` with the epilogue ``kind`` (``bias`` None for ``plain``), its
        algorithm chosen for ``target`` SMs (0: every SM), on the stream (module docstring). A and B are
        float32, or both bfloat16 (``uint16`` arrays of :mod:`cuda_kernels.bf16` bits: bf16 tensor cores,
        float32 accumulation); C float32 or bfloat16 (rounded once, from the float32 result and its
        epilogue); ``bias`` float32 either way."""
        M, N = C.shape
        K = A.shape[0] if ta else A.shape[1]
        for m in (A, B, C):
            item = m.dtype.itemsize
            if m.dtype not in DATA_TYPES or m.strides != (item * m.shape[1], item):
                raise ValueError("cuBLASLt GEMMs here take contiguous row-major float32 or bfloat16 (uint16) "
                                 "matrices")
        if A.dtype != B.dtype:
            raise ValueError(f"a GEMM's operands have one type: got {A.dtype} and {B.dtype}")
        ab, c = DATA_TYPES[A.dtype], DATA_TYPES[C.dtype]
        ptrs = (device_pointer(A), device_pointer(B), device_pointer(C),
                device_pointer(bias) if bias is not None else 0, device_pointer(mask) if mask is not None else 0)
        index = 0
        if PICKS:
            pick = PICKS.get(("bf16" if ab == R16BF else self.math, M, N, K))
            if pick is not None:
                target = target if pick[0] is None else pick[0]
                index = pick[1]
        key = (self.math, M, N, K, int(ta), int(tb), kind, int(target), ab, c, index) + ptrs
        desc, lay_a, lay_b, lay_c, _, algo = (self.plans.get(key)
                                              or self._plan(key, M, N, K, ta, tb, kind, bias, mask, target, ab, c, index))
        self.L.matmul(self.handle, desc, self.alpha.ctypes.data, ptrs[1], lay_a, ptrs[0], lay_b, self.beta.ctypes.data,
                      ptrs[2], lay_c, ptrs[2], lay_c, algo, device_pointer(self.workspace),
                      int(self.workspace.size), int(self.device.raw_stream))

    def __del__(self):
        try:
            for desc, lay_a, lay_b, lay_c, _, _ in self.plans.values():
                for lay in (lay_a, lay_b, lay_c):
                    self.L.matrix_layout_destroy(lay)
                self.L.matmul_desc_destroy(desc)
            self.L.matmul_preference_destroy(self.pref)
            self.L.destroy(self.handle)
        except Exception:  # shutdown
            pass
