"""Each of the first layer's cuBLASLt GEMMs, and bf16's epilogues, planned and run in a process of its own,
so that one that kills the process (a SIGFPE inside cuBLASLt's heuristic: seen for a TF32 GEMM of 24 x 512
outputs planned for one SM, 2026-12-07) is reported and the rest still run.

Cases: for each observation width (``--widths``) and arithmetic (``--maths``): W1's gradient ``x^T d1``
(``[width, 512]`` outputs, K = 1024) and the first layer's forward ``x W1`` with bias + ReLU (1,024,
2,048 and 4,096 rows), each at the SM target :func:`workbench.cublaslt.sm_target` gives it with
``gpu.sm_share`` and at the targets a population could ask for; then bf16's epilogues (bias + ReLU and
bias, 2048 x 512 x 512) with a bfloat16 or float32 output and a bias of either type. Prints one line per
case: ``ok`` (with the error against float64 for bf16's epilogues), ``refused`` (cuBLASLt offers no
algorithm: the library's reason) or ``killed by signal N``. GPU only.

``python bench/cublaslt_shapes.py [--widths 20,23,24] [--maths tf32,fp32,bf16] [--no-epilogues]``
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys

import numpy as np


def cases(widths, maths, epilogues: bool = True) -> list[tuple]:
    out = []
    for math in maths:
        for K in widths:
            for tgt in (1, 0):
                out.append(("W1 gradient", math, K, 1024, tgt))
            for rows, tgt in ((2048, 32), (1024, 16), (4096, 64), (2048, 0)):
                out.append(("first layer", math, K, rows, tgt))
    for out_t in (("bf16", "f32") if epilogues else ()):
        for bias_t in ("bf16", "f32"):
            for kind in ("relu_bias", "bias"):
                for tgt in ((0, 16, 33) if kind == "relu_bias" else (0,)):
                    out.append(("bf16 epilogue", kind, out_t, bias_t, tgt))
    return out


def run(case) -> str:
    from numba import cuda

    from cuda_kernels import bf16
    from workbench.cublas import Cublas
    from workbench.device import Device

    dev = Device()
    st = dev.stream
    rng = np.random.default_rng(0)
    dv = lambda x: cuda.to_device(x, stream=st)  # noqa: E731

    def to16(x):
        out = cuda.device_array(x.shape, np.uint16, stream=st)
        bf16.to_bf16_kernel[64, 256, st](dv(x.ravel()), out.reshape(x.size), x.size)
        return out

    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    if case[0] == "bf16 epilogue":
        _, kind, out_t, bias_t, tgt = case
        lt = Cublas(dev, math="tf32").lt
        A, B, b = normal(2048, 512), normal(512, 512), normal(512)
        C = cuda.device_array((2048, 512), np.uint16 if out_t == "bf16" else np.float32, stream=st)
        lt.matmul(to16(A), to16(B), C, 0, 0, kind, to16(b) if bias_t == "bf16" else dv(b), None, target=tgt)
        dev.synchronize()
        r16 = lambda z: bf16.from_bf16_ref(bf16.to_bf16_ref(z)).astype(np.float64)  # noqa: E731
        ref = r16(A) @ r16(B) + (r16(b) if bias_t == "bf16" else b.astype(np.float64))
        ref = np.maximum(ref, 0) if kind == "relu_bias" else ref
        c = C.copy_to_host()
        c = bf16.from_bf16_ref(c) if out_t == "bf16" else c
        return f"ok, error {np.linalg.norm(c - ref) / np.linalg.norm(ref):.1e} against float64 of the rounded inputs"
    name, math, K, rows, tgt = case
    lt = Cublas(dev, math="fp32" if math == "bf16" else math).lt
    cv = to16 if math == "bf16" else dv
    if name == "W1 gradient":
        C = cuda.device_array((K, 512), np.float32, stream=st)
        lt.matmul(cv(normal(rows, K)), cv(normal(rows, 512)), C, 1, 0, "plain", None, target=tgt)
    else:
        C = cuda.device_array((rows, 512), np.float32, stream=st)
        lt.matmul(cv(normal(rows, K)), cv(normal(K, 512)), C, 0, 0, "relu_bias", dv(normal(512)), None, target=tgt)
    dev.synchronize()
    return "ok"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="24,23,20")
    ap.add_argument("--maths", default="tf32,fp32,bf16")
    ap.add_argument("--no-epilogues", action="store_true", help="only the first layer's GEMMs, not bf16's epilogues")
    args = ap.parse_args()
    from numba import cuda  # noqa: F401  (imported in the parent; each case forks before any CUDA call)

    import cuda_kernels.bf16  # noqa: F401
    import workbench.cublas  # noqa: F401
    from workbench.cublaslt import EpilogueUnavailable

    todo = cases([int(w) for w in args.widths.split(",")], args.maths.split(","), not args.no_epilogues)
    killed = 0
    for case in todo:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            faulthandler.enable()
            try:
                msg = run(case)
            except EpilogueUnavailable as exc:
                msg = "refused: " + str(exc).split(": ", 1)[-1]
            except Exception as exc:  # reported, not raised: the next case still runs
                msg = f"failed: {type(exc).__name__}: {exc}"
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            msg = f.read()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            killed += 1
            msg = f"killed by signal {os.WTERMSIG(status)}"
        what = (f"{case[0]}, {case[1]}, out {case[2]}, bias {case[3]}, SM target {case[4]}" if case[0] == "bf16 epilogue"
                else f"{case[0]}, {case[1]}, width {case[2]}, rows {case[3]}, SM target {case[4]}")
        print(f"{what}: {msg}", flush=True)
    print(f"{len(todo)} cases, {killed} killed the process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
