"""cuBLASLt fused epilogues at the update's shapes (#16), to decide what to build before building it.

Written on 2026-12-03 without a GPU (the session's device time was spent); its first run is the next
session's first device call. It needs nvmath-python, which the device image lacks: fetch its wheel
with ``../shared/tools/device-wheels.sh nvmath-python`` and carry ``.whl``.

For fp32 and TF32 (``COMPUTE_32F`` / ``COMPUTE_32F_FAST_TF32``) it asks cuBLASLt's heuristic, through
``nvmath.bindings.cublasLt`` (raw device pointers, an explicit workspace, our stream), for:

- the forward GEMMs with ``RELU_BIAS`` (h = relu(x @ W + b): the trunk's two layers, 2048 and 1024
  rows) and ``BIAS`` (the head), against what runs today: cuBLAS SGEMM then our bias/ReLU kernel;
- the backward input-gradient GEMM with ``DRELU_BGRAD`` (needs the forward's ReLU mask as the
  ``RELU_AUX_BIAS`` epilogue's bit mask) and the weight-gradient GEMM with ``BGRADB`` (the bias
  gradient from the B operand's columns), against SGEMM + our bias-gradient kernel;
- the same forward epilogue in ``POINTER_ARRAY`` batch mode over P agents (what a population's GEMM
  meeting would need).

Row-major ``C[M, N] = A[M, K] @ W[K, N]`` is cuBLASLt's column-major ``D[N, M] = W^T[N, K] @ A^T[K, M]``
(no transposes; the bias runs along D's rows, i.e. C's columns). For each case: how many algorithms
the heuristic returns (0: not offered), GPU us per call in a CUDA graph of 20 calls (median of 5),
and the largest difference from the unfused path. Usage: ``python bench/cublaslt_probe.py OUT.json``.
"""
from __future__ import annotations

import json
import statistics
import sys

import numpy as np

R32F = 0  # cudaDataType CUDA_R_32F
WORKSPACE = 32 << 20


def _attr(setter, dtype_of, obj, attr, value) -> None:
    """Set one cuBLASLt attribute from a Python value (its C type from the bindings' dtype table)."""
    buf = np.array([value], dtype=dtype_of(attr))
    setter(obj, attr, buf.ctypes.data, buf.nbytes)


class Lt:
    """One cuBLASLt handle and workspace on the device's stream."""

    def __init__(self, device):
        from nvmath.bindings import cublasLt as L

        from cuda_kernels.nb import cuda

        self.L, self.device = L, device
        self.handle = L.create()
        self.workspace = cuda.device_array(WORKSPACE, np.uint8)
        self.pref = L.matmul_preference_create()
        _attr(L.matmul_preference_set_attribute, L.get_matmul_preference_attribute_dtype, self.pref,
              L.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, WORKSPACE)
        self.alpha, self.beta = np.ones(1, np.float32), np.zeros(1, np.float32)

    def plan(self, compute, M: int, N: int, K: int, epilogue, bias=None, aux=None, aux_ld: int = 0,
             trans_w: bool = False, batch: int = 0) -> dict:
        """A matmul descriptor, layouts and the heuristic's first algorithm for D[N, M] = op(W^T) @ A^T
        (row-major C = A @ W, or A @ W^T with ``trans_w``), with ``epilogue``; ``batch`` > 0: pointer
        arrays of ``batch`` matrices."""
        L = self.L
        desc = L.matmul_desc_create(compute, R32F)
        dset = lambda a, v: _attr(L.matmul_desc_set_attribute, L.get_matmul_desc_attribute_dtype, desc, a, v)  # noqa: E731
        A = L.MatmulDescAttribute
        dset(A.TRANSA, 1 if trans_w else 0)
        dset(A.TRANSB, 0)
        dset(A.EPILOGUE, int(epilogue))
        if bias is not None:
            dset(A.BIAS_POINTER, _ptr(bias))
        if aux is not None:
            dset(A.EPILOGUE_AUX_POINTER, _ptr(aux))
            dset(A.EPILOGUE_AUX_LD, aux_ld)
        w_rows, w_cols = (K, N) if trans_w else (N, K)  # the stored W^T as cuBLASLt sees it
        lay = [L.matrix_layout_create(R32F, w_rows, w_cols, w_rows), L.matrix_layout_create(R32F, K, M, K),
               L.matrix_layout_create(R32F, N, M, N), L.matrix_layout_create(R32F, N, M, N)]
        if batch:
            for lo in lay:
                _attr(L.matrix_layout_set_attribute, L.get_matrix_layout_attribute_dtype, lo,
                      L.MatrixLayoutAttribute.BATCH_MODE, int(L.BatchMode.POINTER_ARRAY))
                _attr(L.matrix_layout_set_attribute, L.get_matrix_layout_attribute_dtype, lo,
                      L.MatrixLayoutAttribute.BATCH_COUNT, batch)
        results = L.MatmulHeuristicResult(4)
        count = np.zeros(1, np.int32)
        try:
            L.matmul_algo_get_heuristic(self.handle, desc, lay[0], lay[1], lay[2], lay[3], self.pref, 4, results.ptr,
                                        count.ctypes.data)
        except Exception as exc:  # not supported: the heuristic says so by an error status
            return {"desc": desc, "layouts": lay, "algos": 0, "error": str(exc)}
        return {"desc": desc, "layouts": lay, "algos": int(count[0]), "results": results}

    def run(self, p: dict, W, X, D) -> None:
        L = self.L
        a, b, c, d = p["layouts"]
        L.matmul(self.handle, p["desc"], self.alpha.ctypes.data, _ptr(W), a, _ptr(X), b, self.beta.ctypes.data,
                 _ptr(D), c, _ptr(D), d, p["results"].ptr, _ptr(self.workspace), WORKSPACE,
                 int(self.device.raw_stream))


def _ptr(arr) -> int:
    return int(arr.__cuda_array_interface__["data"][0])


def _graph_us(device, fn, calls: int = 20) -> float:
    g = device.capture(lambda st: [fn(st) for _ in range(calls)])
    g.replay(1)
    device.synchronize()
    out = []
    for _ in range(5):
        a = device.event().record()
        g.replay(10)
        b = device.event().record()
        out.append(a.elapsed_ms(b) * 1e3 / 10 / calls)
    return statistics.median(out)


def main(out_path: str) -> int:
    from nvmath.bindings import cublas as B
    from nvmath.bindings import cublasLt as L

    from cuda_kernels import dense
    from cuda_kernels.nb import cuda, load_kernels
    from workbench.cublas import Cublas
    from workbench.device import Device

    device = Device()
    load_kernels()
    rng = np.random.default_rng(0)
    up = lambda *shape: cuda.to_device(rng.normal(size=shape).astype(np.float32))  # noqa: E731
    lt = Lt(device)
    rows_out: dict = {"device": device.info.name, "cublasLt_version": int(L.get_version())}
    for math, compute in (("fp32", int(B.ComputeType.COMPUTE_32F)), ("tf32", int(B.ComputeType.COMPUTE_32F_FAST_TF32))):
        blas = Cublas(device, math=math)
        for M, K, N, name in ((2048, 512, 512, "trunk 2048 rows"), (1024, 512, 512, "trunk 1024 rows"),
                              (2048, 23, 512, "first layer 2048 rows")):
            X, W, bias = up(M, K), up(K, N), up(N)
            fused, plain = cuda.device_array((M, N), np.float32), cuda.device_array((M, N), np.float32)
            p = lt.plan(compute, M, N, K, L.Epilogue.RELU_BIAS, bias=bias)
            row = {"algos": p["algos"], "error": p.get("error")}
            gh, th = dense.bias_act_launch(M, N, False)

            def unfused(st, X=X, W=W, bias=bias, plain=plain, M=M, N=N, gh=gh, th=th):
                blas.gemm(X, W, plain)
                dense.bias_act_kernel[gh, th, st](plain, bias, M, N, dense.ACT_RELU)

            row["unfused_us"] = _graph_us(device, unfused)
            if p["algos"]:
                row["fused_us"] = _graph_us(device, lambda st, p=p, W=W, X=X, D=fused: lt.run(p, W, X, D))
                device.synchronize()
                row["max_abs_diff"] = float(np.max(np.abs(fused.copy_to_host() - plain.copy_to_host())))
            for P in (16,):
                q = lt.plan(compute, M, N, K, L.Epilogue.RELU_BIAS, bias=bias, batch=P)
                row[f"pointer_array_P{P}_algos"] = q["algos"]
                row[f"pointer_array_P{P}_error"] = q.get("error")
            rows_out[f"{math} RELU_BIAS {name} {M}x{K}x{N}"] = row
            print(math, "RELU_BIAS", name, row, flush=True)
        # backward: d = dY @ W^T with the ReLU mask from the forward, and the bias gradient
        M, K, N = 1024, 512, 512
        W, aux = up(N, K), cuda.device_array(((N + 127) // 128 * 128 // 8) * M, np.uint8)  # heuristic only
        dbias = cuda.device_array(N, np.float32)
        p = lt.plan(compute, M, N, K, L.Epilogue.DRELU_BGRAD, bias=dbias, aux=aux, aux_ld=(N + 127) // 128 * 128,
                    trans_w=True)
        rows_out[f"{math} DRELU_BGRAD {M}x{K}x{N}"] = {"algos": p["algos"], "error": p.get("error")}
        print(math, "DRELU_BGRAD", rows_out[f"{math} DRELU_BGRAD {M}x{K}x{N}"], flush=True)
    with open(out_path, "w") as f:
        json.dump(rows_out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
