"""Where a GPU process's fixed start-up and exit go (#15's wall targets): imports, the CUDA context, each
kernel's load from the on-disk cache (the dispatcher made from its signature, then its module loaded),
and the exit of a process that holds a population's device memory.

Each part runs in a fresh process (as a walk-forward starts), after one process has filled the kernel
cache (``WORKBENCH_KERNEL_CACHE`` is set to a temporary directory unless it is set already):

- ``imports``: ``import workbench.walkforward`` (numba.cuda, pandas and our modules);
- ``context``: the CUDA context's creation;
- per kernel: ``dispatcher_ms`` (Numba's dispatcher from the signature: the cache index and entry read,
  the kernel rebuilt) and ``bind_ms`` (its module loaded into the context), and whether the cached
  entry held a cubin (``cubin_cached``: False means the PTX is linked again on every load);
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
    """In a fresh process: imports, context, then every declared kernel's dispatcher and module load."""
    t0 = time.perf_counter()
    import workbench.walkforward  # noqa: F401  (what the CLI imports first)
    t1 = time.perf_counter()
    import importlib
    import pkgutil

    import cuda_kernels
    from cuda_kernels.nb import KERNELS
    from numba import cuda

    for mod in pkgutil.iter_modules(cuda_kernels.__path__):
        if mod.name not in ("nb", "ptx_check"):
            importlib.import_module(f"cuda_kernels.{mod.name}")
    t2 = time.perf_counter()
    cuda.current_context()
    t3 = time.perf_counter()
    rows = []
    for k in KERNELS:
        a = time.perf_counter()
        disp = k.dispatcher
        b = time.perf_counter()
        libs = [o._codelibrary for o in disp.overloads.values()]
        cubin = all(bool(getattr(lib, "_cubin_cache", None)) for lib in libs)
        k.load()
        c = time.perf_counter()
        rows.append({"kernel": k.__name__, "dispatcher_ms": 1e3 * (b - a), "bind_ms": 1e3 * (c - b),
                     "cubin_cached": cubin})
    return {"imports_s": t1 - t0, "kernel_modules_s": t2 - t1, "context_s": t3 - t2, "kernels": rows}


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
           "kernels_dispatcher_s": sum(k["dispatcher_ms"] for k in ks) / 1e3,
           "kernels_bind_s": sum(k["bind_ms"] for k in ks) / 1e3,
           "kernels_with_cubin_cached": sum(k["cubin_cached"] for k in ks), "kernels": ks, "process_wall_s": wall,
           "exit": {"agents": args.agents, "mib_per_agent": args.mib, "buffers_per_agent": args.buffers,
                    "alloc_s": held["alloc_s"], "free_in_process_s": freed["free_s"],
                    "wall_holding_s": held_wall, "wall_nothing_s": none_wall, "wall_after_free_s": freed_wall}}
    print(f"imports {res['imports_s']:.2f} s, kernel modules {res['kernel_modules_s']:.2f} s, context "
          f"{res['context_s']:.2f} s; {len(ks)} kernels: dispatchers {res['kernels_dispatcher_s']:.2f} s, module "
          f"loads {res['kernels_bind_s']:.2f} s, {res['kernels_with_cubin_cached']} with a cached cubin")
    for k in sorted(ks, key=lambda k: -(k["dispatcher_ms"] + k["bind_ms"]))[:8]:
        print(f"  {k['kernel']:34s} dispatcher {k['dispatcher_ms']:6.1f} ms, bind {k['bind_ms']:6.1f} ms, "
              f"cubin cached {k['cubin_cached']}")
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
