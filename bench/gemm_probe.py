"""GEMM shapes of the update on the GPU through PyTorch (cuBLAS underneath), to choose what to build:

- P agents' GEMMs as P concurrent streams in one CUDA graph (what a population runs today) against one
  batched GEMM (``torch.bmm``) over the P agents, at the update's shapes (1024 x 512 x 512, the head's
  1024 x 512 x 510 whose rows are not 16-byte aligned, the first layer's k = 23, a weight gradient's
  512 x 1024 x 512);
- the online forwards on s and s' as two 1024-row GEMMs against one 2048-row GEMM.

Each figure: median of 5 timed blocks of 50 graph replays of 10 GEMMs. fp32 and TF32.
Usage: ``python bench/gemm_probe.py OUT.json``.
"""
from __future__ import annotations

import json
import statistics
import sys

import torch


def _us(graph, reps: int = 50, inner: int = 10) -> float:
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            graph.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / reps / inner * 1e3)
    return statistics.median(out)


def _streams_vs_batched(A, B, C) -> tuple[float, float]:
    P = A.shape[0]
    lanes, s0 = [torch.cuda.Stream() for _ in range(P)], torch.cuda.Stream()
    streams, batched = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.stream(s0):
        for i in range(P):
            torch.mm(A[i], B[i], out=C[i])
        torch.bmm(A, B, out=C)
        torch.cuda.synchronize()
        with torch.cuda.graph(streams, stream=s0):
            cur = torch.cuda.current_stream()
            for i in range(P):
                lanes[i].wait_stream(cur)
                with torch.cuda.stream(lanes[i]):
                    for _ in range(10):
                        torch.mm(A[i], B[i], out=C[i])
            for i in range(P):
                cur.wait_stream(lanes[i])
        with torch.cuda.graph(batched, stream=s0):
            for _ in range(10):
                torch.bmm(A, B, out=C)
    return _us(streams), _us(batched)


def _two_vs_one(K: int, N: int) -> tuple[float, float]:
    A, W, C = torch.randn(2048, K, device="cuda"), torch.randn(K, N, device="cuda"), torch.empty(2048, N, device="cuda")
    two, one, s0 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(s0):
        torch.mm(A, W, out=C)
        torch.cuda.synchronize()
        with torch.cuda.graph(two, stream=s0):
            for _ in range(10):
                torch.mm(A[:1024], W, out=C[:1024])
                torch.mm(A[1024:], W, out=C[1024:])
        with torch.cuda.graph(one, stream=s0):
            for _ in range(10):
                torch.mm(A, W, out=C)
    return _us(two), _us(one)


def main(out_path: str) -> None:
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        math = "tf32" if tf32 else "fp32"
        for M, K, N in ((1024, 512, 512), (1024, 512, 510), (1024, 23, 512), (512, 1024, 512)):
            for P in (1, 4, 16, 32):
                A, B = torch.randn(P, M, K, device="cuda"), torch.randn(P, K, N, device="cuda")
                t_s, t_b = _streams_vs_batched(A, B, torch.empty(P, M, N, device="cuda"))
                fl = 2 * P * M * K * N
                key = f"{math} {M}x{K}x{N} P={P}"
                res[key] = {"streams_us": t_s, "bmm_us": t_b, "streams_tflops": fl / t_s / 1e6, "bmm_tflops": fl / t_b / 1e6}
                print(f"{key:32s} streams {t_s:8.1f} us ({fl / t_s / 1e6:6.1f} TF/s)  batched {t_b:8.1f} us "
                      f"({fl / t_b / 1e6:6.1f} TF/s)", flush=True)
        for K, N in ((23, 512), (512, 512), (512, 510)):
            two, one = _two_vs_one(K, N)
            print(f"{math} rows 2 x 1024 vs 2048, {K}x{N}: {two:.1f} us vs {one:.1f} us", flush=True)
            res[f"{math} stacked {K}x{N}"] = {"two_us": two, "one_us": one}
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
