"""The network's part of an update with bfloat16 operands against TF32 and fp32 (#16's bf16 setting, #15's
target), through our own code path: ``DeviceNetwork(bf16=True)`` converts its weights and observations
each forward, keeps bfloat16 activations and converts dhead, d2 and d1 for the backward's GEMMs.

P agents (``--lanes``), each on its own stream with its own cuBLAS/cuBLASLt handle (``gpu.sm_share``: its
GEMMs planned for the SMs they fill, as the h100 and h200 profiles run a population), each running what
an update asks of its networks at the reference shape of ``bench/train_step.py`` (batch 1024, hidden
512, 51 atoms, 3x3 branches, observations of 16 features + 7 positions, padded to 24): the online
network's stacked forward on s and s' (2048 rows, no head: the loss runs it), the target network's
forward on s' (1024 rows) and the backward through the s rows. One CUDA graph of every agent's branch;
us per agent per update (median of event-timed replays), and a bf16 network's head output and
gradients against the TF32 network's on the same inputs (relative difference, for scale).
Usage (GPU): ``python bench/network_step.py [--lanes 16] [--steps 50] [--json OUT]``; ``--eager`` (and in
the simulator, at a tiny shape) runs every branch once without a graph, a smoke test of the script.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from train_step import ATOMS, B, BRANCHES, F, H, N_POS, ms_per_step


def main() -> int:
    from numba import cuda

    from workbench.agent.device_state import LAYOUT_ALIGN, OBS_ALIGN
    from workbench.agent.gemm import make_gemm
    from workbench.agent.network import DeviceNetwork, NetShape, init_params, views
    from workbench.device import Device

    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--maths", default="fp32,tf32,bf16")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    device = Device()
    sim = device.simulator
    rows, hidden, atoms = (8, 16, 5) if sim else (B, H, ATOMS)
    shape = NetShape(obs_dim=F + N_POS, hidden=hidden, atoms=atoms, branch_sizes=BRANCHES, align=LAYOUT_ALIGN,
                     obs_align=OBS_ALIGN)  # the device layout
    rng = np.random.default_rng(0)
    consts = (cuda.to_device(np.linspace(-10, 10, atoms).astype(np.float32)),)
    x = np.zeros((2 * rows, shape.obs_cols), np.float32)
    x[:, :shape.obs_dim] = rng.normal(size=(2 * rows, shape.obs_dim))
    dhead = np.zeros((rows, shape.head_cols), np.float32)
    dhead[:, :shape.head_width] = rng.normal(0, 1e-3, size=(rows, shape.head_width))
    out = {"device": device.info.name, "lanes": args.lanes, "rows": rows, "hidden": hidden, "results": {}}
    results = {}
    for math in args.maths.split(","):
        agents = []
        for i in range(args.lanes):
            lane = device.lane()
            gemm = make_gemm(lane, "cublas", "fp32" if math == "bf16" else math)
            if hasattr(gemm, "share_gpu"):
                gemm.share_gpu(args.lanes > 1)
            bf = math == "bf16"
            online = DeviceNetwork(lane, gemm, shape, 2 * rows, *consts, fused=True, head=False, bf16=bf)
            target = DeviceNetwork(lane, gemm, shape, rows, *consts, fused=True, head=False, backward=False, bf16=bf)
            params = cuda.to_device(init_params(shape, seed=1 + i), stream=lane.stream)
            agents.append((lane, online, target, params, cuda.to_device(params.copy_to_host(), stream=lane.stream),
                           cuda.device_array(shape.n_params, np.float32, stream=lane.stream),
                           cuda.to_device(x, stream=lane.stream), cuda.to_device(dhead, stream=lane.stream)))
        device.wait_for([a[0] for a in agents])

        def branch(a):
            lane, online, target, p, tp, g, xd, dh = a

            def run(_st):
                online.forward(p, xd, head=False)
                target.forward(tp, xd[rows:], head=False)
                online.row_range(0, rows).backward(p, g, xd[:rows], dh)
            return run

        fns = [branch(a) for a in agents]
        lanes = [a[0] for a in agents]
        if args.eager or sim:
            for f, lane in zip(fns, lanes):
                f(lane.stream)
            device.wait_for(lanes)
            device.synchronize()
            us = float("nan")
        else:
            g = device.capture_lanes(lanes, fns)
            us = ms_per_step(device, lambda: g.replay(args.steps), args.steps) * 1e3 / args.lanes
        lane, online, target, p, tp, grads, xd, dh = agents[0]
        results[math] = {"head": online.head.copy_to_host(), "grads": grads.copy_to_host()}
        out["results"][math] = {"us_per_agent": us}
        print(f"{math}: {us:.2f} us per agent (online forward 2 x {rows} rows, target forward, backward), "
              f"{args.lanes} lanes", flush=True)
        del agents, fns
    if "bf16" in results and "tf32" in results:
        for k in ("head", "grads"):
            a, b = results["bf16"][k], results["tf32"][k]
            rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
            out["results"]["bf16"][f"{k}_rel_diff_vs_tf32"] = rel
            print(f"bf16 against tf32, {k}: relative difference {rel:.2e}")
        W1 = views(results["bf16"]["grads"], shape)["W1"]
        assert not W1[shape.obs_dim:].any(), "the observations' padding columns' weight gradient must stay zero"
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
