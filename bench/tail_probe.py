"""The update's small kernels at the reference shape, alone and 16 at once, at other launch shapes (#15, #16).

The population breakdown (``bench/population_step.py``) gives the gradient norm with the guard ~7 us per
agent, the PER scan with its draw ~10 us and Adam ~7 us in a saturated population of 16, far above what
their bytes cost (2 MB, 4 MB and 19 MB per agent: ~0.7, ~1.3 and ~6 us at 3 TB/s). This probe times each
at its launch shape today and at others (fewer, fatter blocks), on one stream (``alone``) and on 16
lanes side by side (``x16``, us per agent), and checks every shape's result against today's (the norm:
float64 partial sums in another order, so within 1e-12 relative; the scan's prefix sums the same; Adam
the same bits). Run it with ``CUDA_DEVICE_MAX_CONNECTIONS`` set to see whether the branches of a graph
were held back by the driver's default of 8 hardware queues. A variant that is not the package's kernel,
Adam in float32 arithmetic (PyTorch's form of the step), is timed beside ``adam_kernel`` with the largest
difference in a weight's step between the two.
Usage (on the GPU machine): python bench/tail_probe.py [--inner 50] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
from numba import cuda

from train_step import B, BRANCHES, us_per_launch

N_PARAMS = 535_000  # about the reference network's (hidden 512, 51 atoms, 3x3 branches)
CAP, FILL = 2_000_000, 1_000_000  # the reference ring: 2M slots holding 1M transitions


def _adam_float32_variant():
    """Adam with the target's EMA (``optim.adam_kernel``'s signature and semantics) in float32 arithmetic."""
    import math

    from numba import float32, float64

    from cuda_kernels import optim

    @cuda.jit(optim.adam_kernel.signature)  # cuda: the module's global (the simulator swaps a kernel's globals)
    def adam32(p, g, m, v, n, lr_arr, beta1, beta2, eps, weight_decay, step_arr, clip, guard, target, tau):
        if guard[0] != 0:
            return
        sh = cuda.shared.array(3, float32)
        if cuda.threadIdx.x == 0:
            t = float64(step_arr[0])
            lr = float64(lr_arr[0])
            sh[0] = float32(lr / (1.0 - float64(beta1) ** t))
            sh[1] = float32(1.0 / math.sqrt(1.0 - float64(beta2) ** t))
            sh[2] = float32(lr * weight_decay)
        cuda.syncthreads()
        step_size, inv_sq, lr_wd, scale = sh[0], sh[1], sh[2], clip[1]
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            gi = g[i] * scale
            mi = beta1 * m[i] + (float32(1.0) - beta1) * gi
            vi = beta2 * v[i] + (float32(1.0) - beta2) * gi * gi
            m[i] = mi
            v[i] = vi
            p0 = p[i]
            pi = p0 - lr_wd * p0 - step_size * mi / (math.sqrt(vi) * inv_sq + eps)
            p[i] = pi
            target[i] = (float32(1.0) - tau) * target[i] + tau * pi
    return adam32


def main() -> int:
    from cuda_kernels import optim, scan
    from workbench.device import Device

    a = argparse.ArgumentParser()
    a.add_argument("--inner", type=int, default=50)
    a.add_argument("--json")
    args = a.parse_args()
    d = Device()
    lanes = [d.lane() for _ in range(16)]
    rng = np.random.default_rng(0)
    sms = d.info.multiprocessors
    res = {"device": d.info.name, "CUDA_DEVICE_MAX_CONNECTIONS": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "default"),
           "inner": args.inner, "kernels": {}}

    def timed(fns) -> float:
        return us_per_launch(d, lanes, fns, args.inner)

    def record(label, make, bufs):
        make(bufs[0])(d.stream)
        d.synchronize()
        alone, x16 = timed([make(bufs[0])]), timed([make(b) for b in bufs])
        res["kernels"][label] = {"alone_us": alone, "x16_us_per_agent": x16}
        print(f"{label:44s} alone {alone:7.2f} us, 16 lanes {x16:7.2f} us per agent", flush=True)

    # ---- gradient norm + clip + guard ----
    nb_ = len(BRANCHES) * max(BRANCHES)
    gb = []
    for _ in range(16):
        gb.append({"g": cuda.to_device(rng.normal(0, 1e-3, N_PARAMS).astype(np.float32)),
                   "part": cuda.device_array(1024, np.float64), "arr": cuda.to_device(np.zeros(1, np.int32)),
                   "clip": cuda.device_array(2, np.float32), "loss": cuda.to_device(rng.random(B).astype(np.float32)),
                   "w": cuda.to_device(rng.random(B).astype(np.float32)),
                   "q": cuda.to_device(rng.normal(0, 1, (B, nb_)).astype(np.float32)),
                   "guard": cuda.to_device(np.zeros(1, np.int32)), "stats": cuda.to_device(np.zeros(4, np.float32))})
    norms = {}
    for blocks, threads in ((256, 1024), (256, 256), (128, 256), (64, 256), (sms, 256), (32, 512), (16, 1024)):
        def make(b, blocks=blocks, threads=threads):
            return lambda st: optim.grad_norm_guard_kernel[blocks, threads, st](
                b["g"], N_PARAMS, b["part"], b["arr"], 1.0, b["clip"], b["loss"], b["w"], B, b["q"], B, 1e6,
                b["guard"], b["stats"])
        record(f"grad norm + guard {blocks}x{threads}", make, gb)
        norms[(blocks, threads)] = gb[0]["clip"].copy_to_host()[0]
    ref = norms[(256, 1024)]
    res["grad_norm_max_rel_diff"] = max(abs(float(v) - float(ref)) / float(ref) for v in norms.values())
    print(f"grad norm: largest relative difference between shapes {res['grad_norm_max_rel_diff']:.3g}")

    # ---- the PER scan of a 2M ring holding 1M ----
    sb = []
    for _ in range(16):
        p = np.zeros(CAP, np.float32)
        p[:FILL] = rng.random(FILL).astype(np.float32) + 0.01
        sb.append({"x": cuda.to_device(p), "fill": cuda.to_device(np.array([FILL], np.int64)),
                   "arr": cuda.to_device(np.zeros(1, np.int32))})
    totals = {}
    for threads in (128, 256, 512, 1024):  # 1024 last: the trainer's block, the rescan's below starts from its totals
        for b in sb:
            b["totals"] = cuda.device_array(scan.n_subs(CAP, threads), np.float64)
            b["sub"] = cuda.device_array(scan.n_subs(CAP, threads), np.float64)
            b["tiles"] = cuda.device_array(scan.n_tiles(CAP, threads), np.float64)

        def make(b, threads=threads):
            return lambda st: scan.launch_scan(b["x"], b["totals"], b["sub"], b["tiles"], CAP, threads, b["arr"],
                                               b["fill"], st)
        record(f"scan {threads} threads ({scan.n_tiles(CAP, threads)} tiles)", make, sb)
        totals[threads] = float(sb[0]["tiles"].copy_to_host()[-1])
    res["scan_totals"] = {str(k): v for k, v in totals.items()}
    print(f"scan totals by threads: {totals}")
    # an update's rescan (what the trainer runs): the sub-tiles of a batch of 1024 drawn slots, then the levels
    for b in sb:
        b["idx"] = cuda.to_device(rng.integers(0, FILL, 1024).astype(np.int64))

    def make_rescan(b, threads=threads):
        return lambda st: scan.launch_rescan(b["x"], b["idx"], 1024, b["totals"], b["sub"], b["tiles"], CAP, threads,
                                             b["arr"], b["fill"], st)
    record(f"rescan {threads} threads ({scan.rescan_blocks(CAP, threads)} blocks), batch 1024", make_rescan, sb)
    res["rescan_total"] = float(sb[0]["tiles"].copy_to_host()[-1])
    print(f"rescan total {res['rescan_total']} (the full scan's at {threads} threads: {totals[threads]})")

    # ---- Adam with the target's EMA ----
    ab = []
    for _ in range(16):
        ab.append({k: cuda.to_device(rng.normal(0, 1e-2, N_PARAMS).astype(np.float32)) for k in ("p", "g", "m", "t")}
                  | {"v": cuda.to_device(rng.random(N_PARAMS).astype(np.float32) * 1e-4),
                     "lr": cuda.to_device(np.array([1e-4], np.float32)), "step": cuda.to_device(np.array([5], np.int64)),
                     "clip": cuda.to_device(np.array([1.0, 1.0], np.float32)), "guard": cuda.to_device(np.zeros(1, np.int32))})
    for per_sm, threads in ((4, 256), (2, 256), (1, 256), (8, 256), (2, 512), (1, 1024)):
        blocks = min(per_sm * sms, (N_PARAMS + threads - 1) // threads)

        def make(b, blocks=blocks, threads=threads):
            return lambda st: optim.adam_kernel[blocks, threads, st](
                b["p"], b["g"], b["m"], b["v"], N_PARAMS, b["lr"], 0.9, 0.999, 1e-8, 0.0, b["step"], b["clip"],
                b["guard"], b["t"], 0.005)
        record(f"adam {blocks}x{threads} ({per_sm} a multiprocessor)", make, ab)
    # a variant, not the package's kernel: Adam's arithmetic in float32 as PyTorch's Adam does it (the bias
    # corrections folded into a step size and 1 / sqrt(bc2) once a block), against the float64 divisions and
    # square root a thread does now; its results beside adam_kernel's from the same inputs
    blocks = min(4 * sms, (N_PARAMS + 255) // 256)
    adam32 = _adam_float32_variant()
    fresh = {k: ab[0][k].copy_to_host() for k in ("p", "m", "v", "t")}
    outs = {}
    for name, kern in (("adam_kernel", optim.adam_kernel), ("float32 variant", adam32)):
        for k, x in fresh.items():
            ab[0][k].copy_to_device(x)
        b = ab[0]
        kern[blocks, 256](b["p"], b["g"], b["m"], b["v"], N_PARAMS, b["lr"], 0.9, 0.999, 1e-8, 0.0, b["step"],
                          b["clip"], b["guard"], b["t"], 0.005)
        outs[name] = b["p"].copy_to_host()
        for k, x in fresh.items():
            ab[0][k].copy_to_device(x)
    dp = np.abs(outs["float32 variant"].astype(np.float64) - outs["adam_kernel"]) / np.abs(fresh["p"] - outs["adam_kernel"])
    res["adam_float32_variant_max_rel_diff_of_step"] = float(np.nanmax(dp))
    print(f"adam float32 variant: largest difference in a weight's step, relative to the step: {np.nanmax(dp):.3g}")

    def make32(b, blocks=blocks):
        return lambda st: adam32[blocks, 256, st](b["p"], b["g"], b["m"], b["v"], N_PARAMS, b["lr"], 0.9, 0.999,
                                                   1e-8, 0.0, b["step"], b["clip"], b["guard"], b["t"], 0.005)
    record(f"adam float32 arithmetic {blocks}x256 (variant)", make32, ab)
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
