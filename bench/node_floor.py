"""How fast a population's graph runs kernel nodes at all, whatever they compute (#15, #16).

An agent's update is ~23 kernel nodes (a population of 32's update graph: 736 nodes); at P = 32 an
agent-update takes ~61 us (TF32, H100), ~2.7 us per node per agent. If the GPU's front end cannot
dispatch the nodes of 32 side-by-side branches much faster than that, the update is bound by its node
count, and fusing kernels (fewer nodes) is the lever; if it dispatches them several times faster, the
nodes' own work is. This captures the population's loop structure (``Device.capture_loops``: one WHILE
node whose body forks every agent's pass onto its lane) with each pass a chain of ``--nodes`` launches
of a kernel that does almost nothing (``optim.fill_kernel`` writing ``--blocks`` x 256 floats), and
times it at each P: us per pass (the floor of an update's chain of that many nodes with P agents side by
side) and us per node per agent (against the update's ~2.7).
Usage (on the GPU machine): python bench/node_floor.py [--sizes 1,16,32,64] [--nodes 23]
    [--blocks 1,16,132] [--steps 200] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from train_step import ms_per_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,16,32,64", help="agents (lanes) side by side")
    ap.add_argument("--nodes", type=int, default=23, help="kernel launches in one agent's pass")
    ap.add_argument("--blocks", default="1,16,132", help="each launch's blocks of 256 threads")
    ap.add_argument("--steps", type=int, default=200, help="passes in one launch of the loop graph")
    ap.add_argument("--json")
    args = ap.parse_args()
    from numba import cuda

    from cuda_kernels import optim as K_opt
    from workbench.device import Device, Loop

    sizes = [int(s) for s in args.sizes.split(",")]
    blocks_list = [int(b) for b in args.blocks.split(",")]
    device = Device()
    lanes = [device.lane() for _ in range(max(sizes))]
    bufs = [cuda.device_array(max(blocks_list) * 256, np.float32) for _ in lanes]

    def chain(st, buf, blocks):
        for _ in range(args.nodes):
            K_opt.fill_kernel[blocks, 256, st](buf, 0.0)

    rows = []
    print(f"{device.info.name}: a WHILE node over P lanes, each pass {args.nodes} kernel nodes, {args.steps} passes")
    print(f"{'P':>4s} {'blocks':>6s} {'us/pass':>9s} {'us/node/agent':>14s}")
    for P in sizes:
        for blocks in blocks_list:
            g = device.capture_loops([Loop(lanes[i], lambda st, b=bufs[i], n=blocks: chain(st, b, n), args.steps)
                                      for i in range(P)])
            us = 1e3 * ms_per_step(device, g.launch, args.steps)
            rows.append({"P": P, "blocks": blocks, "us_per_pass": us, "us_per_node_per_agent": us / (P * args.nodes)})
            print(f"{P:4d} {blocks:6d} {us:9.2f} {us / (P * args.nodes):14.3f}", flush=True)
            del g
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.info.name, "nodes": args.nodes, "steps": args.steps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
