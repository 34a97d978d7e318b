"""Micro-benchmarks of the GPU runtime and kernels (issue #3), on a real device.

Prints a table and writes JSON (``--json PATH``). Each figure is the median of several timed
repetitions after a warm-up, with CUDA events on the stream; graph replays are timed over many
launches so launch gaps are counted the way the trainer will see them.

1. launch overhead: 200 small kernels launched eagerly from Python vs one replayed graph of them;
2. GEMM TFLOP/s at the training shapes: Numba register-tiled vs cuBLAS fp32 vs cuBLAS TF32;
3. scan of 1M float32 priorities (one launch in a graph): effective bandwidth;
4. PER sample + weight normalisation + priority update, batch 1024 from 1M, in a graph;
5. env-step throughput at 4096 envs over 32K bars.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from numba import cuda

from cuda_kernels import dense, optim, per, scan
from workbench.cublas import Cublas
from workbench.device import Device


def timed(device, fn, reps=5, inner=1):
    """Median milliseconds of ``fn`` over ``reps`` event-timed runs, divided by ``inner``."""
    fn()
    device.synchronize()
    out = []
    for _ in range(reps):
        a = device.event().record()
        fn()
        b = device.event().record()
        out.append(a.elapsed_ms(b) / inner)
    return statistics.median(out)


def bench_launch(device, rows):
    s = device.stream
    t = cuda.to_device(np.zeros(1024, np.float32), stream=s)

    def many(st=s):
        for _ in range(200):
            optim.fill_kernel[4, 256, st](t, 0.5)

    many()
    device.synchronize()
    eager = []
    for _ in range(5):
        t0 = time.perf_counter()
        many()
        device.synchronize()
        eager.append((time.perf_counter() - t0) * 1e6 / 200)
    g = device.capture(many)
    graph_us = timed(device, lambda: g.replay(20), reps=5, inner=20 * 200) * 1e3
    host = []
    for _ in range(5):
        t0 = time.perf_counter()
        g.replay(20)
        host.append((time.perf_counter() - t0) * 1e6 / 20)
    device.synchronize()
    rows.append(("launch: eager Numba launch, per kernel (host wall)", statistics.median(eager), "us"))
    rows.append(("launch: graph replay, per kernel node (GPU)", graph_us, "us"))
    rows.append(("launch: cuGraphLaunch of a 200-node graph (host)", statistics.median(host), "us"))


def bench_gemm(device, rows):
    s = device.stream
    rng = np.random.default_rng(0)
    blas32, blas_tf = Cublas(device, math="fp32"), Cublas(device, math="tf32")
    shapes = [("trunk fwd 1024x512 @ 512x512", 1024, 512, 512, 0, 0),
              ("head fwd 1024x512 @ 512x510", 1024, 510, 512, 0, 0),
              ("dW 512x1024^T @ 1024x512", 512, 512, 1024, 1, 0),
              ("dX 1024x512 @ 512x512^T", 1024, 512, 512, 0, 1)]
    for name, M, N, K, ta, tb in shapes:
        A = cuda.to_device(rng.normal(size=(K, M) if ta else (M, K)).astype(np.float32), stream=s)
        B = cuda.to_device(rng.normal(size=(N, K) if tb else (K, N)).astype(np.float32), stream=s)
        C = cuda.device_array((M, N), np.float32, stream=s)
        flop = 2.0 * M * N * K
        for label, launch in (
            ("numba", lambda st: [dense.gemm_kernel[dense.gemm_grid(M, N), dense.THREADS, st](A, B, C, M, N, K, ta, tb, 1.0, 0.0) for _ in range(50)]),
            ("cublas fp32", lambda st: [blas32.gemm(A, B, C, ta, tb) for _ in range(50)]),
            ("cublas tf32", lambda st: [blas_tf.gemm(A, B, C, ta, tb) for _ in range(50)]),
        ):
            launch(s)
            g = device.capture(launch)
            ms = timed(device, lambda: g.replay(4), reps=5, inner=200)
            rows.append((f"gemm {name}: {label}", flop / (ms * 1e-3) / 1e12, "TFLOP/s"))


def bench_scan_per(device, rows):
    s = device.stream
    n, batch, threads = 1 << 20, 1024, min(1024, device.info.max_threads_per_block)
    rng = np.random.default_rng(1)
    prio = cuda.to_device(rng.uniform(0.1, 2.0, n).astype(np.float32), stream=s)
    totals = cuda.device_array(scan.n_subs(n, threads), np.float64, stream=s)
    subs = cuda.device_array(scan.n_subs(n, threads), np.float64, stream=s)
    tiles = cuda.device_array(scan.n_tiles(n, threads), np.float64, stream=s)
    arrivals = cuda.to_device(np.zeros(2, np.int32), stream=s)  # the scan's, the draw's
    full = cuda.to_device(np.array([n]), stream=s)  # a full ring
    g = device.capture(lambda st: scan.launch_scan(prio, totals, subs, tiles, n, threads, arrivals[0:1], full, st))
    ms = timed(device, lambda: g.replay(50), reps=5, inner=50)
    moved = n * 4 + n // scan.SUB * 16  # read priorities, write the sub-tile totals and level (the tile totals: 2 KB)
    rows.append(("scan 1M priorities (1 launch, three levels)", ms * 1e3, "us"))
    rows.append(("scan 1M effective bandwidth", moved / (ms * 1e-3) / 1e9, "GB/s"))
    idx, w = cuda.device_array(batch, np.int64, stream=s), cuda.device_array(batch, np.float32, stream=s)
    idx.copy_to_device(rng.integers(0, n, batch).astype(np.int64), stream=s)
    g = device.capture(lambda st: scan.launch_rescan(prio, idx, batch, totals, subs, tiles, n, threads, arrivals[0:1],
                                                     full, st))
    ms = timed(device, lambda: g.replay(50), reps=5, inner=50)
    rows.append(("rescan of 1M priorities after a batch of 1024 (an update's)", ms * 1e3, "us"))
    size = cuda.to_device(np.array([n]), stream=s)
    step = cuda.to_device(np.zeros(1, np.int64), stream=s)
    td = cuda.to_device(rng.normal(size=batch).astype(np.float32), stream=s)
    owner = cuda.to_device(np.full(n, -1, np.int32), stream=s)
    bad, mx = cuda.to_device(np.zeros(1, np.int32), stream=s), cuda.to_device(np.zeros(1, np.float32), stream=s)
    guard = cuda.to_device(np.zeros(1, np.int32), stream=s)

    def sample_update(st):  # as an update runs them
        scan.launch_rescan(prio, idx, batch, totals, subs, tiles, n, threads, arrivals[0:1], full, st)
        per.per_sample_kernel[per.sample_launch(batch) + (st,)](prio, subs, tiles, scan.subs_per_tile(threads), size,
                                                                batch, 0.4, 7, 11, step, guard, idx, w, arrivals[1:2])
        per.priority_update_kernel[1, 1024, st](prio, idx, td, owner, batch, n, 0.6, 1e-3, mx, guard, bad)

    sample_update(s)
    g2 = device.capture(sample_update)
    ms2 = timed(device, lambda: g2.replay(50), reps=5, inner=50)
    rows.append(("PER rescan + sample + update, batch 1024 of 1M", ms2 * 1e3, "us"))
    device.synchronize()
    assert bad.copy_to_host()[0] == 0


def bench_env(device, rows):
    from cuda_kernels.env import env_step_kernel

    s = device.stream
    T, N = 32_768, 4096
    rng = np.random.default_rng(2)
    close = 5000 + np.cumsum(rng.normal(0, 0.5, T))
    close = np.round(close / 0.25) * 0.25
    open_ = np.concatenate([[close[0]], close[:-1]])
    high, low = np.maximum(open_, close) + 0.25, np.minimum(open_, close) - 0.25
    dev = {k: cuda.to_device(v, stream=s) for k, v in dict(o=open_, h=high, l=low, c=close).items()}
    roll = cuda.to_device(np.zeros(T, np.int8), stream=s)
    t_arr = cuda.to_device(rng.integers(0, T // 2, N).astype(np.int64), stream=s)
    end = cuda.to_device(np.full(N, T), stream=s)
    pos = cuda.to_device(np.zeros(N, np.int32), stream=s)
    acts = cuda.to_device(rng.integers(0, 3, (N, 3)).astype(np.int32), stream=s)
    rew, done = cuda.device_array(N, np.float32, stream=s), cuda.device_array(N, np.float32, stream=s)
    pnl = cuda.device_array(N, np.float64, stream=s)

    def step(st):
        env_step_kernel[N // 256, 256, st](dev["o"], dev["h"], dev["l"], dev["c"], roll, t_arr, end, pos, acts,
                                           50.0, 0.25, 1.0, 2.15, 0.0, 1e-3, rew, done, pnl, N)

    step(s)
    g = device.capture(lambda st: [step(st) for _ in range(100)])
    ms = timed(device, lambda: g.replay(1), reps=5, inner=100)
    rows.append(("env step, 4096 envs (one launch)", ms * 1e3, "us"))
    rows.append(("env step throughput", N / (ms * 1e-3) / 1e6, "M transitions/s"))


def bench_backtest(device, rows):
    """The backtest's sequential part for 5 ranges x 32K bars: greedy table -> positions and PnL."""
    from cuda_kernels.actions import eps_greedy_kernel
    from cuda_kernels.backtest import greedy_backtest_kernel

    s = device.stream
    W, L, P = 5, 32_768, 7
    T = W * L
    rng = np.random.default_rng(3)
    close = np.round((5000 + np.cumsum(rng.normal(0, 0.5, T))) / 0.25) * 0.25
    open_ = np.concatenate([[close[0]], close[:-1]])
    cols = [cuda.to_device(x, stream=s) for x in (open_, np.maximum(open_, close) + 0.25, np.minimum(open_, close) - 0.25, close)]
    roll = cuda.to_device(np.zeros(T, np.int8), stream=s)
    q = cuda.to_device(rng.normal(size=(T * P, 9)).astype(np.float32), stream=s)
    br, off = cuda.to_device(np.array([3, 3, 3], np.int32), stream=s), cuda.to_device(np.array([0, 3, 6], np.int32), stream=s)
    eps0, step = cuda.to_device(np.zeros(1, np.float32), stream=s), cuda.to_device(np.zeros(1, np.int64), stream=s)
    greedy, joint = cuda.device_array((T * P, 3), np.int32, stream=s), cuda.device_array(T * P, np.int32, stream=s)
    starts = cuda.to_device(np.arange(W, dtype=np.int64) * L, stream=s)
    stops = cuda.to_device(np.arange(1, W + 1, dtype=np.int64) * L, stream=s)
    pos, pnl = cuda.device_array(T, np.int32, stream=s), cuda.device_array(T, np.float64, stream=s)

    def run(st):
        eps_greedy_kernel[(T * P + 255) // 256, 256, st](q, 3, br, off, eps0, 0, 0, step, greedy, joint, T * P)
        greedy_backtest_kernel[1, 32, st](*cols, roll, greedy, starts, stops, P, 3, 50.0, 0.25, 1.0, 2.15, 0.0, pos, pnl, W)

    run(s)
    g = device.capture(run)
    ms = timed(device, lambda: g.replay(1), reps=5)
    rows.append(("backtest 5 x 32K bars: greedy table + scan (Q given)", ms, "ms"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", help="write results here")
    args = p.parse_args()
    device = Device()
    rows: list[tuple[str, float, str]] = []
    for bench in (bench_launch, bench_gemm, bench_scan_per, bench_env, bench_backtest):
        bench(device, rows)
    print(f"device: {device.info.name}, {device.info.multiprocessors} SMs, "
          f"smem optin {device.info.shared_memory_per_block_optin} B")
    for name, value, unit in rows:
        print(f"{name:58s} {value:10.3f} {unit}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.info.__dict__, "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
