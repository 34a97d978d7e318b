"""Agents of different schedules in one population (issue #15): wall time and bit-for-bit check.

A swarm iteration whose particles search the schedule has agents that differ in epochs, updates per
epoch and rollout length. ``GpuPopulation`` runs each phase as one launch of a loop graph in which
every agent's WHILE loop runs its own number of passes. This script trains the same P agents three ways on one
GPU and reports the wall time of each:

1. one population of all P agents (mixed schedules);
2. the agents grouped by schedule, one population per group (what the search did before);
3. one agent at a time (``gpu.population = 1``).

and checks that every agent's kept weights, test positions and test PnL are the same bit for bit in
all three (each agent computes exactly what it computes alone). Sizes: the h200 profile's hidden,
atoms and batch, a smaller replay and env count so many agents fit quickly (``--capacity``,
``--envs``). Usage (on the GPU machine):
    python bench/population_schedules.py [--agents 16] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np

from train_step import ATOMS, B, H, _window


def _trainers(device, gemm_for, prof, cfgs, seeds, spec, lanes: bool = True):
    from workbench.agent.trainer import DeviceTrainer

    out = []
    for cfg, seed in zip(cfgs, seeds):
        d = device.lane() if lanes else device
        out.append(DeviceTrainer(d, gemm_for(d), prof, cfg, spec, 100_000.0, seed=seed))
    return out


def main() -> int:
    from workbench.agent.gemm import make_gemm
    from workbench.agent.population import train_population
    from workbench.agent.train_config import TrainConfig
    from workbench.device import Device
    from workbench.gpu_profile import GpuProfile
    from workbench.markets import load_market

    a = argparse.ArgumentParser()
    a.add_argument("--agents", type=int, default=16)
    a.add_argument("--capacity", type=int, default=1 << 18)
    a.add_argument("--envs", type=int, default=1024)
    a.add_argument("--math", default="tf32")
    a.add_argument("--tiny", action="store_true", help="tiny sizes and schedules (a smoke run, e.g. in the simulator)")
    a.add_argument("--json")
    args = a.parse_args()
    device = Device()
    spec = load_market("es")
    sizes = (dict(hidden=8, atoms=3, batch=8, n_envs=2) if args.tiny
             else dict(hidden=H, atoms=ATOMS, batch=B, n_envs=args.envs))
    prof = GpuProfile(name="bench", replay_vram_fraction=0.5, gemm="cublas", math=args.math, **sizes)
    scale = 100 if args.tiny else 1
    schedules = [dict(epochs=2, max_steps_per_epoch=400 // scale, rollout_steps=max(2, 64 // scale)),
                 dict(epochs=3, max_steps_per_epoch=200 // scale, rollout_steps=max(3, 32 // scale)),
                 dict(epochs=2, max_steps_per_epoch=100 // scale, rollout_steps=max(2, 64 // scale)),
                 dict(epochs=1, max_steps_per_epoch=300 // scale, rollout_steps=max(4, 16 // scale))]
    cfgs = [TrainConfig(replay_capacity=1024 if args.tiny else args.capacity, learning_starts=sizes["batch"],
                        lr=1e-4 * (1 + i % 3), episode_len=64 if args.tiny else 1024, **schedules[i % len(schedules)])
            for i in range(args.agents)]
    seeds = [100 + i for i in range(args.agents)]
    w = _window(T=2_000) if args.tiny else _window()
    if args.tiny:
        w.train, w.val, w.test = (0, 1_500), (1_510, 1_520), (1_530, 1_540)
    gemm_for = lambda d: make_gemm(d, "cublas", args.math)  # noqa: E731
    runs, walls = {}, {}

    t0 = time.perf_counter()
    runs["one population"] = train_population(device, _trainers(device, gemm_for, prof, cfgs, seeds, spec),
                                              [w] * len(cfgs))
    walls["one population"] = time.perf_counter() - t0
    gc.collect()

    t0 = time.perf_counter()
    grouped = [None] * len(cfgs)
    for s in range(len(schedules)):
        idx = [i for i in range(len(cfgs)) if i % len(schedules) == s]
        ts = _trainers(device, gemm_for, prof, [cfgs[i] for i in idx], [seeds[i] for i in idx], spec)
        for i, r in zip(idx, train_population(device, ts, [w] * len(idx))):
            grouped[i] = r
        gc.collect()
    runs["grouped by schedule"] = grouped
    walls["grouped by schedule"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    alone = []
    for cfg, seed in zip(cfgs, seeds):
        alone.append(_trainers(device, gemm_for, prof, [cfg], [seed], spec, lanes=False)[0].train_fold(w))
        gc.collect()
    runs["one at a time"] = alone
    walls["one at a time"] = time.perf_counter() - t0

    same = {name: all(np.array_equal(x.params, y.params) and np.array_equal(x.test_position, y.test_position)
                      and np.array_equal(x.test_pnl, y.test_pnl) for x, y in zip(rs, alone))
            for name, rs in runs.items()}
    updates = sum(c.epochs * c.max_steps_per_epoch for c in cfgs)
    print(f"{args.agents} agents, 4 schedules (epochs x updates x rollout: "
          + ", ".join(f"{s['epochs']}x{s['max_steps_per_epoch']}x{s['rollout_steps']}" for s in schedules)
          + f"), batch {prof.batch}, hidden {prof.hidden}, {prof.atoms} atoms, replay {cfgs[0].replay_capacity}, "
          f"{prof.n_envs} envs, {args.math}; "
          f"{updates} agent-updates in all")
    for name in runs:
        print(f"  {name:22s} wall {walls[name]:7.2f} s   every agent equal to alone: {same[name]}")
    if args.json:
        json.dump({"agents": args.agents, "schedules": schedules, "walls_s": walls, "equal_to_alone": same,
                   "agent_updates": updates, "math": args.math}, open(args.json, "w"), indent=1)
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
