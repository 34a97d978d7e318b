"""Where a GPU process's fixed start-up and exit go (#15's wall targets): imports, the CUDA context, each
kernel's load from the on-disk cache (its cubin loaded raw, or Numba's dispatcher on a miss),
and the exit of a process that holds a population's device memory.

Each part runs in a fresh process (as a walk-forward starts), after one process has filled the kernel
cache (``WORKBENCH_KERNEL_CACHE`` is set to a temporary directory unless it is set already):

- ``imports``: ``import workbench.walkforward`` (numba.cuda, pandas and our modules);
- ``context``: the CUDA context's creation;
- per kernel: ``load_ms`` (its cubin read from the kernel cache and loaded into the context, or on a miss
  Numba's dispatcher built) and ``dispatcher_built``; then one launch (``first_launch_ms``), and how long
  Numba's CUDA typing took to initialise if anything initialised it (``numba_typing_refreshes_s``, empty
  when nothing did: what the raw launch of ``cuda_kernels.launch`` avoids);
- ``exit``: the wall time of a process that allocates ``--agents`` x ``--mib`` MiB in ``--buffers``
  buffers each and exits, less the same process allocating nothing (freeing at interpreter exit), and
  the time to free the same buffers explicitly inside the process.

Usage (on the GPU machine): python bench/startup_probe.py [--agents 35] [--mib 678] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_HELD: list = []  # the device buffers a child keeps until its exit (or frees first)


def _child_kernels() -> dict:
    """In a fresh process: imports, context, then every declared kernel's load into the context (raw from
    its cached cubin, ``cuda_kernels.launch``; through Numba's dispatcher on a miss), and one launch.
    Whether Numba's CUDA typing was initialised (what the first dispatcher costs) is recorded."""
    t0 = time.perf_counter()
    import workbench.walkforward  # noqa: F401  (what the CLI imports first)
    t1 = time.perf_counter()
    import numpy as np

    from cuda_kernels.nb import all_kernels
    from numba import cuda
    from numba.cuda.descriptor import cuda_target

    typing = cuda_target.typing_context
    refreshes = []
    orig_refresh = typing.refresh

    def refresh():
        a = time.perf_counter()
        orig_refresh()
        refreshes.append(time.perf_counter() - a)

    typing.refresh = refresh
    kernels = all_kernels()
    t2 = time.perf_counter()
    cuda.current_context()
    t3 = time.perf_counter()
    rows = []
    for k in kernels:
        a = time.perf_counter()
        k.load()
        rows.append({"kernel": k.__name__, "load_ms": 1e3 * (time.perf_counter() - a),
                     "dispatcher_built": k._dispatcher is not None})
    from cuda_kernels import optim

    arr = cuda.device_array(1024, np.float32)
    t4 = time.perf_counter()
    optim.fill_kernel[4, 256](arr, 1.0)
    cuda.synchronize()
    t5 = time.perf_counter()
    return {"imports_s": t1 - t0, "kernel_modules_s": t2 - t1, "context_s": t3 - t2, "kernels": rows,
            "first_launch_ms": 1e3 * (t5 - t4), "numba_typing_refreshes_s": refreshes}


def _child_alloc(agents: int, mib: int, buffers: int, free: bool) -> dict:
    """In a fresh process: allocate agents x mib MiB in ``buffers`` buffers each; with ``free``, time their
    release inside the process (the deallocation queue flushed, the device synchronized)."""
    import numpy as np
    from numba import cuda

    cuda.current_context()
    each = max(1, mib * 2**20 // buffers // 4)
    t0 = time.perf_counter()
    _HELD.extend(cuda.device_array(each, np.float32) for _ in range(agents * buffers))
    cuda.synchronize()
    out = {"alloc_s": time.perf_counter() - t0}
    if free:
        t1 = time.perf_counter()
        _HELD.clear()
        cuda.current_context().deallocations.clear()
        cuda.synchronize()
        out["free_s"] = time.perf_counter() - t1
    return out


def _run_child(args: list[str], env: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"child {args} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1]), wall


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--agents", type=int, default=35)
    a.add_argument("--mib", type=int, default=678, help="device memory per agent (population_step's MB/agent)")
    a.add_argument("--buffers", type=int, default=50, help="buffers per agent")
    a.add_argument("--json")
    a.add_argument("--child", choices=["kernels", "alloc", "alloc-free", "none"])
    args = a.parse_args()
    if args.child == "kernels":
        print(json.dumps(_child_kernels()))
        return 0
    if args.child in ("alloc", "alloc-free"):
        print(json.dumps(_child_alloc(args.agents, args.mib, args.buffers, args.child == "alloc-free")))
        return 0
    if args.child == "none":
        from numba import cuda

        cuda.current_context()
        print(json.dumps({}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ}
        env.setdefault("WORKBENCH_KERNEL_CACHE", str(Path(tmp) / "kernels"))
        _run_child(["--child", "kernels"], env)  # fills the cache (or finds it filled)
        warm, wall = _run_child(["--child", "kernels"], env)
        sizes = ["--agents", str(args.agents), "--mib", str(args.mib), "--buffers", str(args.buffers)]
        _, none_wall = _run_child(["--child", "none"], env)
        held, held_wall = _run_child(["--child", "alloc", *sizes], env)
        freed, freed_wall = _run_child(["--child", "alloc-free", *sizes], env)
    ks = warm["kernels"]
    res = {"imports_s": warm["imports_s"], "kernel_modules_s": warm["kernel_modules_s"], "context_s": warm["context_s"],
           "kernels_load_s": sum(k["load_ms"] for k in ks) / 1e3,
           "dispatchers_built": sum(k["dispatcher_built"] for k in ks), "first_launch_ms": warm["first_launch_ms"],
           "numba_typing_refreshes_s": warm["numba_typing_refreshes_s"], "kernels": ks, "process_wall_s": wall,
           "exit": {"agents": args.agents, "mib_per_agent": args.mib, "buffers_per_agent": args.buffers,
                    "alloc_s": held["alloc_s"], "free_in_process_s": freed["free_s"],
                    "wall_holding_s": held_wall, "wall_nothing_s": none_wall, "wall_after_free_s": freed_wall}}
    print(f"imports {res['imports_s']:.2f} s, kernel modules {res['kernel_modules_s']:.2f} s, context "
          f"{res['context_s']:.2f} s; {len(ks)} kernels loaded in {res['kernels_load_s']:.3f} s, "
          f"{res['dispatchers_built']} Numba dispatchers built, Numba typing refreshed "
          f"{len(res['numba_typing_refreshes_s'])} times ({sum(res['numba_typing_refreshes_s']):.2f} s); first launch {res['first_launch_ms']:.1f} ms")
    for k in sorted(ks, key=lambda k: -k["load_ms"])[:5]:
        print(f"  {k['kernel']:34s} load {k['load_ms']:6.1f} ms, dispatcher built {k['dispatcher_built']}")
    e = res["exit"]
    print(f"{args.agents} agents x {args.mib} MiB in {args.buffers} buffers each: allocated in {e['alloc_s']:.2f} s, "
          f"freed in the process in {e['free_in_process_s']:.2f} s; process wall holding them "
          f"{e['wall_holding_s']:.2f} s against {e['wall_nothing_s']:.2f} s allocating nothing "
          f"({e['wall_after_free_s']:.2f} s freeing them first)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
