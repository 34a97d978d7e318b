"""What bfloat16 GEMM operands would buy an update of a population (#16's tensor-core setting, #15's target).

A population's TF32 update spends ~57 of ~72 us per agent in its GEMMs (BENCHMARKS.md, H100, P = 32).
bf16 tensor cores run twice TF32's peak and read half the bytes, but only from bfloat16 operands in
memory (cuBLAS's ``FAST_16BF`` on float32 matrices ran TF32: BENCHMARKS.md), which the trainer would
have to write (weights copied by Adam and the EMA, activations by the epilogues, dhead by the loss).
Before that work, this measures what it could buy: every GEMM of one update at the reference shape
(batch 1024, hidden 512, head 512 wide, 23 inputs; row-major ``C[M, N] = op(A) @ op(B)``) through
``torch.mm`` (cuBLAS's own choice) on ``--lanes`` streams side by side in one CUDA graph, float32 with
TF32 against bfloat16 operands (bfloat16 outputs for the trunk's activations and d1/d2, float32 for the
head and the weight gradients, as the trainer would keep them), us per GEMM per agent; and the update's
GEMMs summed. Also each bf16 GEMM's error against float64, beside TF32's (inputs of unit scale).
Usage (GPU, PyTorch): ``python bench/bf16_probe.py [--lanes 16] [--json OUT]``.
"""
from __future__ import annotations

import argparse
import json

import torch

from gemm_probe import _us
from lt_algo_probe import _graph

# (name, M, N, K, trans_a, trans_b, bf16 output kept in bfloat16): one update's GEMMs at the reference shape
UPDATE = (("online first layer 23->512 (s and s')", 2048, 512, 23, 0, 0, True),
          ("online hidden 512->512 (s and s')", 2048, 512, 512, 0, 0, True),
          ("online head 512->512 (s and s')", 2048, 512, 512, 0, 0, False),
          ("target first layer", 1024, 512, 23, 0, 0, True),
          ("target hidden", 1024, 512, 512, 0, 0, True),
          ("target head", 1024, 512, 512, 0, 0, False),
          ("W3 gradient h2^T dhead", 512, 512, 1024, 1, 0, False),
          ("d2 = dhead W3^T", 1024, 512, 512, 0, 1, True),
          ("W2 gradient h1^T d2", 512, 512, 1024, 1, 0, False),
          ("d1 = d2 W2^T", 1024, 512, 512, 0, 1, True),
          ("W1 gradient x^T d1", 23, 512, 1024, 1, 0, False),
          # the observations padded to 24 columns (network.NetShape.obs_cols): the same three GEMMs
          ("online first layer, 24 wide", 2048, 512, 24, 0, 0, True),
          ("target first layer, 24 wide", 1024, 512, 24, 0, 0, True),
          ("W1 gradient, 24 rows", 24, 512, 1024, 1, 0, False))
UNPADDED = ("online first layer 23->512 (s and s')", "target first layer", "W1 gradient x^T d1")
PADDED = ("online first layer, 24 wide", "target first layer, 24 wide", "W1 gradient, 24 rows")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    P = args.lanes
    torch.manual_seed(0)
    lanes, s0 = [torch.cuda.Stream() for _ in range(P)], torch.cuda.Stream()
    out = {"device": torch.cuda.get_device_name(), "lanes": P, "torch": torch.__version__, "rows": []}
    print(f"{out['device']}, {P} lanes; us per GEMM per agent (alone | {P} lanes side by side)")
    total = {"tf32": 0.0, "bf16": 0.0}
    first = {"23": {"tf32": 0.0, "bf16": 0.0}, "24": {"tf32": 0.0, "bf16": 0.0}}
    for name, M, N, K, ta, tb, trunk in UPDATE:
        shape_a, shape_b = ((K, M) if ta else (M, K)), ((N, K) if tb else (K, N))
        A32 = [torch.randn(shape_a, device="cuda") for _ in range(P)]
        B32 = [torch.randn(shape_b, device="cuda") for _ in range(P)]
        op = lambda x, t: x.t() if t else x  # noqa: E731
        ref = (op(A32[0], ta).double() @ op(B32[0], tb).double())
        row = {"gemm": name, "M": M, "N": N, "K": K}
        for math in ("tf32", "bf16"):
            torch.backends.cuda.matmul.allow_tf32 = math == "tf32"
            if math == "tf32":
                A, Bm = A32, B32
                C = [torch.empty(M, N, device="cuda") for _ in range(P)]
            else:
                A, Bm = [a.bfloat16() for a in A32], [b.bfloat16() for b in B32]
                C = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16 if trunk else torch.float32)
                     for _ in range(P)]

            def call(i, st, A=A, Bm=Bm, C=C):
                if C[i].dtype == A[i].dtype:
                    torch.mm(op(A[i], ta), op(Bm[i], tb), out=C[i])
                else:  # bf16 operands, float32 result (PyTorch >= 2.8: one GEMM, float32 accumulation and output)
                    torch.mm(op(A[i], ta), op(Bm[i], tb), out_dtype=torch.float32, out=C[i])

            alone = _us(_graph(call, lanes[:1], s0), reps=20)
            many = _us(_graph(call, lanes, s0), reps=20) / P
            call(0, torch.cuda.current_stream())
            torch.cuda.synchronize()
            err = float((C[0].double() - ref).norm() / ref.norm())
            row[math] = {"alone_us": alone, "per_agent_us": many, "rel_err_vs_float64": err}
            if name not in PADDED:  # the update as it was measured before the padding
                total[math] += many
            for width, names in (("23", UNPADDED), ("24", PADDED)):
                if name in names:
                    first[width][math] += many
        out["rows"].append(row)
        print(f"{name:40s} tf32 {row['tf32']['alone_us']:6.2f} | {row['tf32']['per_agent_us']:6.2f} us "
              f"(err {row['tf32']['rel_err_vs_float64']:.1e});  bf16 {row['bf16']['alone_us']:6.2f} | "
              f"{row['bf16']['per_agent_us']:6.2f} us (err {row['bf16']['rel_err_vs_float64']:.1e})")
    out["update_gemms_per_agent_us"] = total
    out["first_layer_gemms_per_agent_us"] = first
    print(f"the first layer's three GEMMs per agent, 23 -> 24 wide: tf32 {first['23']['tf32']:.2f} -> "
          f"{first['24']['tf32']:.2f} us, bf16 {first['23']['bf16']:.2f} -> {first['24']['bf16']:.2f} us")
    print(f"an update's GEMMs per agent with {P} lanes: tf32 {total['tf32']:.1f} us, bf16 {total['bf16']:.1f} us "
          f"({total['tf32'] / max(total['bf16'], 1e-9):.2f}x)")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
