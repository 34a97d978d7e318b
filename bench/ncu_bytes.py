"""What one agent's update moves through DRAM and how long each kernel takes alone, from Nsight Compute:
the memory floor of an agent-update in a saturated population.

In a population of 32 the agents' activations, gradients and optimiser state cannot stay in the 50 MB L2,
so every agent's update streams its bytes from DRAM: from the buffers' sizes, about 104 MB an update
(BENCHMARKS.md, session 13), ~35 us at 3 TB/s, of the ~61 us an agent-update took at P = 32 (TF32,
H100). This runs ``bench/train_step.py --only-sm-share`` (one agent's update with the GEMM algorithms a
population runs, fused forward epilogues, the side stream) under ``ncu``, caches flushed before each
kernel (ncu's default: the population's regime), profiling the graph replays train_step times (its NVTX
range "update"); it reads each kernel's duration, DRAM bytes read and written and instructions (all and
tensor-pipe), and prints them per kernel of one update and in total: MB an update, what they take at
3.0 TB/s (about what an H100's HBM3 streams), and the sum of the kernels' durations alone.
Usage (on the GPU machine):
    python bench/ncu_bytes.py [--maths tf32] [--skip 30] [--count 120] [--json OUT] [--raw OUT.csv]
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "sm__inst_executed_pipe_tensor.sum", "smsp__inst_executed.sum")


def _ncu() -> str:
    for path in (shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if path and os.path.exists(path):
            return path
    raise SystemExit("ncu (Nsight Compute) not found: run this on the GPU machine")


def _short(name: str) -> str:
    """A kernel's name without its template arguments and Numba's ABI suffix."""
    name = re.sub(r"\[abi:.*$|\(.*$", "", name)
    return name.split("::")[-1][:60]


def _profile(cmd: list[str], raw: str | None) -> list[dict] | None:
    """Run ``cmd`` (ncu with ``--csv --page raw``) and read its report: the header row (the first that
    starts with "ID", after the program's own output), a units row, then one row a profiled workload (a
    kernel launch, or a graph). ncu's raw CSV written to ``raw`` where given; None (its output's tail
    printed) where ncu failed or profiled nothing."""
    print(" ".join(cmd), flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True)
    if raw:
        with open(raw, "w") as f:
            f.write(run.stdout)
    lines = run.stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if run.returncode != 0 or start is None:
        print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
        return None
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))[1:]  # [1:]: the units row


def _write_json(path: str | None, out: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


def _num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--maths", default="tf32")
    ap.add_argument("--skip", type=int, default=30, help="launches in the timed replays skipped first (warm-up)")
    ap.add_argument("--count", type=int, default=120, help="kernel launches profiled (several updates)")
    ap.add_argument("--population", type=int, metavar="P",
                    help="instead: P agents' update loop (population_step's sm_share graph, TF32) profiled as one "
                         "graph, caches flushed once before it: the DRAM bytes a population really moves an "
                         "agent-update, with whatever L2 keeps between an agent's kernels")
    ap.add_argument("--steps", type=int, default=20, help="updates in the loop graph profiled (--population)")
    ap.add_argument("--json")
    ap.add_argument("--raw", help="write ncu's raw CSV here too")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    if args.population:
        return _population(args, here)
    cmd = [_ncu(), "--csv", "--page", "raw", "--metrics", ",".join(METRICS), "--nvtx", "--nvtx-include", "update/",
           "--launch-skip", str(args.skip),
           "--launch-count", str(args.count), sys.executable, os.path.join(here, "train_step.py"), "--maths",
           args.maths, "--pdl", "", "--steps", "5", "--only-sm-share"]
    rows = _profile(cmd, args.raw)
    if rows is None:
        return 1
    per = defaultdict(lambda: defaultdict(float))
    for r in rows:
        k = per[_short(r["Kernel Name"])]
        k["launches"] += 1
        for m in METRICS:
            k[m] += _num(r.get(m, "nan"))
    # one update: the launches of the kernel launched least often among those of every update (Adam: once)
    updates = min(k["launches"] for name, k in per.items() if "adam" in name) if any("adam" in n for n in per) else 1
    out = {"maths": args.maths, "launches": len(rows), "updates": updates, "kernels": {}}
    print(f"{len(rows)} launches profiled, ~{updates:.0f} updates; per update (caches flushed before each kernel):")
    print(f"{'kernel':60s} {'x':>4s} {'us':>8s} {'MB read':>8s} {'MB write':>8s} {'GB/s':>6s} {'tensor k-inst':>13s}")
    tot_us = tot_mb = 0.0
    for name, k in sorted(per.items(), key=lambda kv: -kv[1]["gpu__time_duration.sum"]):
        us = k["gpu__time_duration.sum"] / 1e3 / updates  # ns -> us
        rd, wr = k["dram__bytes_read.sum"] / 1e6 / updates, k["dram__bytes_write.sum"] / 1e6 / updates
        tens = k["sm__inst_executed_pipe_tensor.sum"] / 1e3 / updates
        tot_us, tot_mb = tot_us + us, tot_mb + rd + wr
        out["kernels"][name] = {"launches_per_update": k["launches"] / updates, "us": us, "mb_read": rd,
                                "mb_write": wr, "tensor_kinst": tens,
                                "warp_inst_k": k["smsp__inst_executed.sum"] / 1e3 / updates}
        print(f"{name:60s} {k['launches'] / updates:4.1f} {us:8.2f} {rd:8.2f} {wr:8.2f} "
              f"{(rd + wr) / us * 1e3 if us else 0:6.0f} {tens:13.1f}")
    out.update({"sum_us": tot_us, "dram_mb": tot_mb})
    print(f"{'total':60s} {'':4s} {tot_us:8.2f} {tot_mb:17.2f} MB an update "
          f"(~{tot_mb / 3.0e3 * 1e3:.1f} us at 3.0 TB/s)")
    _write_json(args.json, out)
    return 0


def _population(args, here: str) -> int:
    """The population's loop graph as one profiled workload (its first launch in the NVTX range
    "population": the warm call of ``ms_per_step``): DRAM bytes and duration per agent-update."""
    P, steps = args.population, args.steps
    cmd = [_ncu(), "--csv", "--page", "raw", "--metrics", ",".join(METRICS[:3]), "--graph-profiling", "graph",
           "--nvtx", "--nvtx-include", "population/", "--launch-count", "1", sys.executable,
           os.path.join(here, "population_step.py"), "--sizes", str(P), "--maths", args.maths, "--pdl", "",
           "--steps", str(steps)]
    rows = _profile(cmd, args.raw)
    if not rows:
        return 1
    row, n = rows[0], P * steps
    us = _num(row["gpu__time_duration.sum"]) / 1e3 / n
    rd, wr = _num(row["dram__bytes_read.sum"]) / 1e6 / n, _num(row["dram__bytes_write.sum"]) / 1e6 / n
    out = {"maths": args.maths, "P": P, "steps": steps, "us_per_agent_update": us, "dram_mb_per_agent_update": rd + wr,
           "read_mb": rd, "write_mb": wr}
    print(f"P = {P}, {steps} updates in one graph launch (under ncu, clocks as ncu sets them): {us:.2f} us and "
          f"{rd + wr:.2f} MB of DRAM traffic an agent-update ({(rd + wr) / us * 1e3:.0f} GB/s)")
    _write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
