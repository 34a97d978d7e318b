"""Which cuBLASLt algorithm a GEMM of the update should run when 16 agents' lanes run it at once.

A population runs each agent's GEMMs on the agent's own lane (stream) of one graph. cuBLAS picks each
GEMM's kernel as if the GEMM had the whole GPU (small tiles, split-K, to fill 132 SMs with a 1024-row
problem); with 16 lanes side by side the GPU is already full, and bench/gemm_probe.py measured such
lanes at half a batched GEMM's rate (TF32, 16 agents: 109 against 221 TFLOP/s). cuBLASLt can be told
how many SMs a GEMM may count on (``MatmulDescAttribute.SM_COUNT_TARGET``, for work sharing the GPU
with concurrent streams), and its heuristic returns several algorithms, not only its first choice.

For each GEMM shape of the update (row-major ``C[M, N] = op(A) @ op(B)``), fp32 and TF32, this times:
cuBLAS through PyTorch (``torch.mm``: the library's own choice, our baseline), and cuBLASLt with SM
count targets 0 (all), 64, 33, 16 and 8, and each of the heuristic's first ``--algos`` algorithms at target 0
-- each alone (one stream) and as 16 lanes side by side in one CUDA graph (us per GEMM per agent) --
and ``torch.bmm`` over the 16 agents. Every cuBLASLt result is checked against ``torch.mm``'s, and
whether it is bit for bit the output of the heuristic's first choice for every SM (what an agent alone
runs) is stated, with the algorithm's configuration (tile, stages, split-K).
Each figure: median of 5 blocks of 20 replays of a graph of 10 GEMMs per lane (``gemm_probe._us``).
Usage: ``python bench/lt_algo_probe.py [--lanes 16] [--algos 6] [--layouts] [--json OUT]`` (GPU, PyTorch, nvmath-python).
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from nvmath.bindings import cublas as B
from nvmath.bindings import cublasLt as L

from gemm_probe import _us  # median of timed blocks of graph replays, us per GEMM of a lane's 10

R32F = 0
# (name, M, N, K, trans_a, trans_b): the reference shape's GEMMs (batch 1024, hidden 512, head 512 wide, 23 inputs)
TARGETS = (0, 64, 33, 16, 8)  # SM count targets (0: every SM)
SHAPES = (("online forward 512->512 (s and s')", 2048, 512, 512, 0, 0),
          ("target forward 512->512 (s')", 1024, 512, 512, 0, 0),
          ("first layer 23->512 (s and s')", 2048, 512, 23, 0, 0),
          ("backward d2 = dhead W3^T", 1024, 512, 512, 0, 1),
          ("weight gradient h^T d", 512, 512, 1024, 1, 0))
# --layouts: the same products with one or both of the backward's operands stored feature-major (transposed).
# Hopper's warp-group MMA reads TF32 operands K-major only (CUTLASS's SM90 TF32 atoms are "TN"), and a weight
# gradient's two operands are batch-major today (K = the batch is their strided dimension), so its TF32 GEMM
# runs an Ampere kernel (BENCHMARKS.md, session 14): which of these layouts get the fast kernels, and what
# the GEMMs that would write them (the forward and the d GEMMs, transposed) cost in their turn.
LAYOUT_SHAPES = (("weight gradient, h feature-major (h^T stored)", 512, 512, 1024, 0, 0),
                 ("weight gradient, d feature-major (d^T stored)", 512, 512, 1024, 1, 1),
                 ("weight gradient, both feature-major", 512, 512, 1024, 0, 1),
                 ("forward writing h^T = W^T x^T (x batch-major)", 512, 1024, 512, 1, 1),
                 ("forward writing h^T = W^T h_prev^T (h_prev feature-major)", 512, 1024, 512, 1, 0),
                 ("d GEMM writing d2^T = W3 dhead^T (dhead batch-major)", 512, 1024, 512, 0, 1),
                 ("d GEMM writing d2^T = W3 dhead^T (dhead feature-major)", 512, 1024, 512, 0, 0))


def _graph(calls_for_lane, lanes: list, s0) -> torch.cuda.CUDAGraph:
    """A graph where each lane runs its calls 10 times, forked from and joined back into ``s0``."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s0):
        for i, st in enumerate(lanes):  # warm-up outside the capture (cuBLAS's own lazy set-up)
            with torch.cuda.stream(st):
                calls_for_lane(i, st)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s0):
            cur = torch.cuda.current_stream()
            for i, st in enumerate(lanes):
                st.wait_stream(cur)
                with torch.cuda.stream(st):
                    for _ in range(10):
                        calls_for_lane(i, st)
            for st in lanes:
                cur.wait_stream(st)
    return g


class Lt:
    def __init__(self, math: str, workspace_bytes: int = 32 << 20):
        self.h = L.create()
        self.compute = int(B.ComputeType.COMPUTE_32F_FAST_TF32 if math == "tf32" else B.ComputeType.COMPUTE_32F)
        self.pref = L.matmul_preference_create()
        self.ws_bytes = workspace_bytes
        self._set(L.matmul_preference_set_attribute, L.get_matmul_preference_attribute_dtype, self.pref,
                  L.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, workspace_bytes)
        self.one, self.zero = np.ones(1, np.float32), np.zeros(1, np.float32)

    @staticmethod
    def _set(setter, dtype_of, obj, attr, value) -> None:
        buf = np.array([value], dtype=dtype_of(attr))
        setter(obj, attr, buf.ctypes.data, buf.nbytes)

    def plan(self, M, N, K, ta, tb, sm_target: int, n_algos: int):
        """(desc, layouts, heuristic results, count) of row-major C[M, N] = op(A) op(B) (cuBLASLt sees it
        transposed, as workbench/cublaslt.py)."""
        desc = L.matmul_desc_create(self.compute, R32F)
        dset = lambda a, v: self._set(L.matmul_desc_set_attribute, L.get_matmul_desc_attribute_dtype,  # noqa: E731
                                      desc, a, v)
        dset(L.MatmulDescAttribute.TRANSA, int(tb))
        dset(L.MatmulDescAttribute.TRANSB, int(ta))
        if sm_target:
            dset(L.MatmulDescAttribute.SM_COUNT_TARGET, int(sm_target))
        lay_a = L.matrix_layout_create(R32F, *((K, N, K) if tb else (N, K, N)))
        lay_b = L.matrix_layout_create(R32F, *((M, K, M) if ta else (K, M, K)))
        lay_c = L.matrix_layout_create(R32F, N, M, N)
        res = L.MatmulHeuristicResult(n_algos)
        count = np.zeros(1, np.int32)
        L.matmul_algo_get_heuristic(self.h, desc, lay_a, lay_b, lay_c, lay_c, self.pref, n_algos, res.ptr,
                                    count.ctypes.data)
        return desc, (lay_a, lay_b, lay_c), res, int(count[0])


def _algo_config(algo: int) -> dict:
    """The algorithm's configuration (cuBLASLt's ids: tile, stages, split-K, reduction scheme, ...)."""
    out = {}
    for attr in ("ID", "TILE_ID", "STAGES_ID", "SPLITK_NUM", "REDUCTION_SCHEME", "CTA_SWIZZLING", "CLUSTER_SHAPE_ID"):
        a = getattr(L.MatmulAlgoConfigAttribute, attr)
        buf = np.zeros(1, dtype=L.get_matmul_algo_config_attribute_dtype(a))
        written = np.zeros(1, np.uint64)
        try:
            L.matmul_algo_config_get_attribute(algo, a, buf.ctypes.data, buf.nbytes, written.ctypes.data)
            out[attr.lower()] = int(buf[0])
        except Exception as exc:  # an attribute this cuBLASLt does not report
            out[attr.lower()] = f"? {exc}"
    return out


def _result_at(res, i: int) -> int:
    """Address of the i-th ``cublasLtMatmulHeuristicResult_t`` of an nvmath result array (its ``algo``
    comes first in the struct, so this is also the algorithm's address)."""
    return int(res.ptr) + i * L.matmul_heuristic_result_dtype.itemsize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--algos", type=int, default=6)
    ap.add_argument("--maths", default="tf32,fp32")
    ap.add_argument("--json", default="")
    ap.add_argument("--layouts", action="store_true",
                    help="only the backward's products with feature-major operands (LAYOUT_SHAPES) and today's weight "
                         "gradient beside them")
    args = ap.parse_args()
    shapes = (SHAPES[-1],) + LAYOUT_SHAPES if args.layouts else SHAPES
    P = args.lanes
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {"device": torch.cuda.get_device_name(), "sms": sms, "lanes": P, "torch": torch.__version__, "rows": []}
    print(f"{out['device']}: {sms} SMs, {P} lanes; us per GEMM (alone | per agent with {P} lanes side by side)")
    lanes, s0 = [torch.cuda.Stream() for _ in range(P)], torch.cuda.Stream()
    torch.manual_seed(0)
    for math in args.maths.split(","):
        torch.backends.cuda.matmul.allow_tf32 = math == "tf32"
        lt = Lt(math)
        ws = [torch.empty(lt.ws_bytes, dtype=torch.uint8, device="cuda") for _ in range(P)]
        for name, M, N, K, ta, tb in shapes:
            A = torch.randn(P, *((K, M) if ta else (M, K)), device="cuda")
            Bm = torch.randn(P, *((N, K) if tb else (K, N)), device="cuda")
            C = torch.empty(P, M, N, device="cuda")
            ref = torch.empty(P, M, N, device="cuda")
            op = lambda X, t: X.t() if t else X  # noqa: E731
            flops = 2 * M * N * K

            def row(label, fn):
                alone = _us(_graph(fn, lanes[:1], s0), reps=20)
                many = _us(_graph(fn, lanes, s0), reps=20) / P
                r = {"math": math, "gemm": name, "M": M, "N": N, "K": K, "how": label, "alone_us": alone,
                     "per_agent_us": many, "tflops_lanes": flops / many / 1e6}
                out["rows"].append(r)
                print(f"  {label:34s} {alone:7.2f} | {many:6.2f} us ({flops / many / 1e6:5.1f} TFLOP/s)", flush=True)
                return r

            print(f"{math} {name}: {M} x {N} x {K} (trans {ta}{tb})", flush=True)
            for i in range(P):
                torch.mm(op(A[i], ta), op(Bm[i], tb), out=ref[i])
            row("torch.mm (cuBLAS's choice)", lambda i, st: torch.mm(op(A[i], ta), op(Bm[i], tb), out=C[i]))
            plans, first = {}, None
            for target in TARGETS:
                plans[target] = lt.plan(M, N, K, ta, tb, target, args.algos)
            for target in TARGETS:
                plan = plans[target]
                res, n = plan[2], plan[3]
                if n < 1:
                    print(f"  SM target {target}: no algorithm")
                    continue
                for a in range(n if target == 0 else 1):
                    algo = _result_at(res, a)

                    def fn(i, st, plan=plan, algo=algo):
                        L.matmul(lt.h, plan[0], lt.one.ctypes.data, Bm[i].data_ptr(), plan[1][0], A[i].data_ptr(),
                                 plan[1][1], lt.zero.ctypes.data, C[i].data_ptr(), plan[1][2], C[i].data_ptr(),
                                 plan[1][2], algo, ws[i].data_ptr(), lt.ws_bytes, st.cuda_stream)

                    C.fill_(float("nan"))
                    r = row(f"cuBLASLt SM target {target}, algo {a}", fn)
                    torch.cuda.synchronize()
                    err = float(((C - ref).norm() / ref.norm()).item())
                    r["rel_err_vs_torch"] = err
                    r["config"] = _algo_config(algo)
                    if first is None:  # the heuristic's first choice with every SM: what a GEMM alone runs
                        first = C.clone()
                    r["same_bits_as_target0_algo0"] = bool(torch.equal(C, first))
                    print(f"    {r['config']}  same bits as target 0 algo 0: {r['same_bits_as_target0_algo0']}")
                    if not err < (1e-2 if math == "tf32" else 1e-5):
                        print(f"    ! differs from torch.mm: relative error {err:.2e}")
            if not ta and not tb:
                g = _graph(lambda i, st: torch.bmm(A, Bm, out=C) if i == 0 else None, lanes[:1], s0)
                t = _us(g, reps=20) / P
                out["rows"].append({"math": math, "gemm": name, "how": "torch.bmm over the agents", "per_agent_us": t,
                                    "tflops_lanes": flops / t / 1e6})
                print(f"  {'torch.bmm over the agents':34s} {'':7s} | {t:6.2f} us ({flops / t / 1e6:5.1f} TFLOP/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
