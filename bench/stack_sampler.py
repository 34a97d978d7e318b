"""Where a Python program's wall time goes, from samples of its main thread's stack (#15's wall targets).

cProfile slows Python-heavy code several-fold and so misstates a process whose time is split between
Python (imports, data preparation, allocation calls) and waiting on the GPU. This samples the main
thread's stack every ``--interval`` seconds from a second thread (``sys._current_frames``; the GIL is
released while the main thread waits on the driver, and otherwise handed over every switch interval)
and runs the program with ``runpy``, as ``python -m`` would. It reports, per function, the seconds in
which it was on the stack (inclusive: samples x interval, each function counted once per sample), its
first and last sample (seconds from the start: a timeline of the phases) and the seconds it was the
innermost frame of our code (``workbench``, ``cuda_kernels``, ``bench``), and each module's import.

Usage (the GPU machine; compile the bytecode first, or imports include compiling it):
    python bench/stack_sampler.py [--interval 0.005] [--top 60] [--json OUT] -m workbench.walkforward DATA ...
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys
import threading
import time
from collections import Counter

OURS = ("/workbench/", "/cuda_kernels/", "/bench/")


def _key(code) -> str:
    path = code.co_filename
    for mark in OURS:
        if mark in path:
            path = mark.strip("/") + "/" + path.split(mark, 1)[1]
            break
    else:
        path = "/".join(path.rsplit("/", 2)[-2:])
    return f"{path}:{code.co_firstlineno}({code.co_name})"


def sample(module: str, argv: list[str], interval: float) -> dict:
    main_id = threading.get_ident()
    stop = threading.Event()
    samples: list[tuple[float, tuple]] = []
    t0 = time.perf_counter()

    def run() -> None:
        while not stop.is_set():
            f = sys._current_frames().get(main_id)
            stack = []
            while f is not None:
                stack.append(f.f_code)
                f = f.f_back
            samples.append((time.perf_counter() - t0, tuple(reversed(stack))))
            time.sleep(interval)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    sys.argv = [module] + argv
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    return {"wall_s": wall, "exit": code, "samples": samples}


def report(res: dict, top: int) -> dict:
    samples, wall = res["samples"], res["wall_s"]
    dt = wall / max(len(samples), 1)
    incl, first, last, leaf, imports = Counter(), {}, {}, Counter(), Counter()
    for t, stack in samples:
        seen = set()
        for code in stack:
            k = _key(code)
            if k in seen:
                continue
            seen.add(k)
            incl[k] += 1
            first.setdefault(k, t)
            last[k] = t
            if code.co_name == "<module>":
                imports[k] += 1
        ours = [c for c in stack if any(m in c.co_filename for m in OURS)]
        leaf[_key(ours[-1]) if ours else "(outside our code)"] += 1
    rows = [{"function": k, "inclusive_s": n * dt, "first_s": first[k], "last_s": last[k]}
            for k, n in incl.most_common(top)]
    return {"wall_s": wall, "exit": res["exit"], "samples": len(samples), "seconds_per_sample": dt,
            "inclusive": rows, "innermost_of_ours": [{"function": k, "s": n * dt} for k, n in leaf.most_common(top)],
            "imports": [{"module": k, "s": n * dt} for k, n in imports.most_common(top)]}


def main() -> None:
    if "-m" not in sys.argv:
        sys.exit("usage: python bench/stack_sampler.py [--interval S] [--top N] [--json OUT] -m MODULE ARGS...")
    cut = sys.argv.index("-m")
    a = argparse.ArgumentParser()
    a.add_argument("--interval", type=float, default=0.005)
    a.add_argument("--top", type=int, default=60)
    a.add_argument("--json")
    args = a.parse_args(sys.argv[1:cut])
    module, argv = sys.argv[cut + 1], sys.argv[cut + 2:]
    out = report(sample(module, argv, args.interval), args.top)
    print(f"\n# {module} {' '.join(argv)}: wall {out['wall_s']:.2f} s, exit {out['exit']}, {out['samples']} samples "
          f"({out['seconds_per_sample'] * 1e3:.1f} ms each)", file=sys.stderr)
    print(f"{'inclusive s':>11} {'first s':>8} {'last s':>8}  function", file=sys.stderr)
    for r in out["inclusive"]:
        print(f"{r['inclusive_s']:11.3f} {r['first_s']:8.2f} {r['last_s']:8.2f}  {r['function']}", file=sys.stderr)
    print("\ninnermost frame of our code:", file=sys.stderr)
    for r in out["innermost_of_ours"][:25]:
        print(f"{r['s']:11.3f}  {r['function']}", file=sys.stderr)
    print("\nmodule bodies (imports, inclusive):", file=sys.stderr)
    for r in out["imports"][:20]:
        print(f"{r['s']:11.3f}  {r['module']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
