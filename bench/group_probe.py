"""Would a population's GEMMs run faster if agents met in small groups, G agents' same GEMM as one
batched cuBLASLt call on one lane, instead of each agent's GEMM on its own lane?

Measured in session 13 (``bench/population_step.py``'s GEMM pieces, H100, TF32, P = 16, one GEMM a lane
in each replayed graph): the update's 2048-row GEMMs ran at ~190 TFLOP/s per agent, its 1024-row ones and
the weight gradients (K = 1024) at ~110-120; ``bench/lt_algo_probe.py`` (ten GEMMs a lane) found a smaller
gap (1024 rows: 2.85 us per agent in 16 targeted lanes, 2.67 as one ``torch.bmm`` over 16 agents). A
batched GEMM of G = 2 agents has the tiles of a 2048-row one. This probe times, for P agents (default 32)
and each GEMM shape of the update (row-major ``C[M, N] = op(A) @ op(B)``, fp32 operands), P / G lanes
side by side in one CUDA graph, each running batched GEMMs of G agents with SM count target G x the
GEMM's large tiles (``workbench.cublaslt.sm_target``'s rule for the group's output), for G = 1, 2, 4, in
two batch modes: strided (the G agents' matrices at a constant stride: one allocation) and pointer
arrays (``BatchMode.POINTER_ARRAY``: any allocations, what separately allocated agents would need).
For the forward shapes also with the bias + ReLU epilogue (``BIAS_BATCH_STRIDE``; with pointer arrays
too, the biases then one pointer and a stride, which for G = 2 any two allocations can be: their
distance). Reports us per agent, TFLOP/s, the algorithm's configuration, and whether each agent's output
is bit for bit its output at G = 1 (the same-result-in-any-population rule). Usage (GPU, PyTorch, nvmath-python):
    python bench/group_probe.py [--agents 32] [--groups 1,2,4] [--maths tf32] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from nvmath.bindings import cublasLt as L

from gemm_probe import _us  # median of timed blocks of graph replays, us per GEMM of a lane's 10
from lt_algo_probe import Lt, _algo_config, _graph, _result_at

TILE_AREA = {"tf32": 128 * 256, "fp32": 128 * 128}  # workbench.cublaslt.TILE_AREA
SHAPES = (("online forward (s and s')", 2048, 512, 512, 0, 0, True),
          ("target forward (s')", 1024, 512, 512, 0, 0, True),
          ("first layer, target (s')", 1024, 512, 23, 0, 0, True),
          ("backward d2 = dhead W3^T", 1024, 512, 512, 0, 1, False),
          ("weight gradient h^T d", 512, 512, 1024, 1, 0, False),
          ("W1's gradient x^T d1", 23, 512, 1024, 1, 0, False))


def _target(M: int, N: int, G: int, sms: int, math: str) -> int:
    tiles = -(-G * M * N // TILE_AREA[math])
    return 0 if tiles >= sms or tiles <= 1 else int(tiles)


def _set(setter, dtype_of, obj, attr, value) -> None:
    buf = np.array([value], dtype=dtype_of(attr))
    setter(obj, attr, buf.ctypes.data, buf.nbytes)


def plan(lt: Lt, M, N, K, ta, tb, G: int, mode: str, sm_target: int, relu_bias: bool):
    """(desc, layouts, heuristic result, count): ``G`` row-major ``C[M, N] = op(A) op(B)`` at once."""
    desc = L.matmul_desc_create(lt.compute, 0)
    dset = lambda a, v: _set(L.matmul_desc_set_attribute, L.get_matmul_desc_attribute_dtype, desc, a, v)  # noqa: E731
    dset(L.MatmulDescAttribute.TRANSA, int(tb))
    dset(L.MatmulDescAttribute.TRANSB, int(ta))
    if sm_target:
        dset(L.MatmulDescAttribute.SM_COUNT_TARGET, int(sm_target))
    if relu_bias:
        dset(L.MatmulDescAttribute.EPILOGUE, int(L.Epilogue.RELU_BIAS))
        if G > 1:
            dset(L.MatmulDescAttribute.BIAS_BATCH_STRIDE, N)
    dims = ((K, N, K) if tb else (N, K, N), (M, K, M) if ta else (K, M, K), (N, M, N))
    lays = []
    for rows, cols, ld in dims:
        lay = L.matrix_layout_create(0, rows, cols, ld)
        if G > 1:
            lset = lambda a, v, lay=lay: _set(L.matrix_layout_set_attribute,  # noqa: E731
                                              L.get_matrix_layout_attribute_dtype, lay, a, v)
            lset(L.MatrixLayoutAttribute.BATCH_COUNT, G)
            if mode == "pointers":
                lset(L.MatrixLayoutAttribute.BATCH_MODE, int(L.BatchMode.POINTER_ARRAY))
            else:
                lset(L.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, rows * cols)
        lays.append(lay)
    res = L.MatmulHeuristicResult(1)
    count = np.zeros(1, np.int32)
    try:
        L.matmul_algo_get_heuristic(lt.h, desc, lays[0], lays[1], lays[2], lays[2], lt.pref, 1, res.ptr,
                                    count.ctypes.data)
    except Exception as exc:  # no algorithm for this combination
        print(f"    heuristic: {exc}")
        return desc, lays, res, 0
    return desc, lays, res, int(count[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--groups", default="1,2,4")
    ap.add_argument("--maths", default="tf32")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    P = args.agents
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {"device": torch.cuda.get_device_name(), "sms": sms, "agents": P, "rows": []}
    print(f"{out['device']}: {sms} SMs, {P} agents; us per agent with every group's lane side by side")
    s0 = torch.cuda.Stream()
    torch.manual_seed(0)
    groups = [int(g) for g in args.groups.split(",")]
    for math in args.maths.split(","):
        lt = Lt(math)
        ws = [torch.empty(lt.ws_bytes, dtype=torch.uint8, device="cuda") for _ in range(P)]
        for name, M, N, K, ta, tb, fwd in SHAPES:
            A = torch.randn(P, *((K, M) if ta else (M, K)), device="cuda")
            Bm = torch.randn(P, *((N, K) if tb else (K, N)), device="cuda")
            bias = torch.randn(P, N, device="cuda")
            C = torch.empty(P, M, N, device="cuda")
            flops = 2 * M * N * K
            for epi in ((False, True) if fwd else (False,)):
                alone = None
                print(f"{math} {name}: {M} x {N} x {K} (trans {ta}{tb}){', bias + ReLU' if epi else ''}", flush=True)
                for G in groups:
                    for mode in (("strided",) if G == 1 else ("strided", "pointers")):
                        lanes = [torch.cuda.Stream() for _ in range(P // G)]
                        target = _target(M, N, G, sms, math)
                        desc, lays, res, n = plan(lt, M, N, K, ta, tb, G, mode, target, epi)
                        label = f"G={G} {mode}, SM target {target}"
                        if n < 1:
                            print(f"  {label}: no algorithm")
                            continue
                        algo = _result_at(res, 0)
                        ptrs = None
                        if mode == "pointers":  # [lane][A, B, C] arrays of G device addresses
                            ptrs = [[torch.tensor([X[i * G + j].data_ptr() for j in range(G)], dtype=torch.int64,
                                                  device="cuda") for X in (Bm, A, C)] for i in range(P // G)]

                        def fn(i, st, desc=desc, lays=lays, algo=algo, ptrs=ptrs, G=G, epi=epi):
                            if epi:
                                _set(L.matmul_desc_set_attribute, L.get_matmul_desc_attribute_dtype, desc,
                                     L.MatmulDescAttribute.BIAS_POINTER, bias[i * G].data_ptr())
                            a, b, c = ((p.data_ptr() for p in ptrs[i]) if ptrs is not None else
                                       (Bm[i * G].data_ptr(), A[i * G].data_ptr(), C[i * G].data_ptr()))
                            L.matmul(lt.h, desc, lt.one.ctypes.data, a, lays[0], b, lays[1], lt.zero.ctypes.data,
                                     c, lays[2], c, lays[2], algo, ws[i].data_ptr(), lt.ws_bytes, st.cuda_stream)

                        C.fill_(float("nan"))
                        try:
                            t = _us(_graph(fn, lanes, s0), reps=20) / P
                            torch.cuda.synchronize()
                        except Exception as exc:  # an algorithm the heuristic offered that will not run here
                            print(f"  {label}: failed: {type(exc).__name__}: {exc}")
                            out["rows"].append({"math": math, "gemm": name, "G": G, "mode": mode,
                                                "epilogue": "relu_bias" if epi else "", "failed": str(exc)})
                            continue
                        if G == 1:
                            alone = C.clone()
                        same = bool(torch.equal(C, alone)) if alone is not None else None  # G = 1 failed
                        r = {"math": math, "gemm": name, "M": M, "N": N, "K": K, "epilogue": "relu_bias" if epi else "",
                             "G": G, "mode": mode, "sm_target": target, "per_agent_us": t,
                             "tflops": flops / t / 1e6, "same_bits_as_G1": same, "config": _algo_config(algo)}
                        out["rows"].append(r)
                        print(f"  {label:38s} {t:6.2f} us per agent ({flops / t / 1e6:5.1f} TFLOP/s), "
                              f"same bits as G=1: {same}, {r['config']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
