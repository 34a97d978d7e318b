"""Kernel compilation on process start: cold (empty on-disk cache) against warm (the cache a previous
process filled), each in a fresh process, as a worker or a notebook kernel would start.

For each: the first fold's init phase (upload, allocation, kernel compilation or cache load, graph
capture; ``init_ms`` of fold 1) and the wall time of the whole command; then the sample walk-forward
(default settings) with the warm cache. Usage (on the GPU machine):
    python bench/kernel_cache.py [--data data/es_sample.parquet] [--json OUT.json]
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


def _run(data: str, cache: str, out: Path, extra: list[str]) -> dict:
    env = {**os.environ, "WORKBENCH_KERNEL_CACHE": cache}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "workbench.walkforward", data, "--out", str(out), "--force", "--json",
                        "--progress", "none", *extra], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"walkforward failed ({p.returncode}): {p.stderr[-2000:]}")
    m = json.loads((out / "fold_001" / "metrics.json").read_text())
    return {"wall_s": wall, "fold1_init_ms": m.get("init_ms"), "backend": m.get("backend")}


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--data", default=str(ROOT / "data" / "es_sample.parquet"))
    a.add_argument("--json")
    args = a.parse_args()
    one_fold = ["--set", "splits.max_folds=1", "--epochs", "1", "--device", "gpu"]
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "kernels")
        rows = {"cold": _run(args.data, cache, Path(tmp) / "cold", one_fold),
                "warm": _run(args.data, cache, Path(tmp) / "warm", one_fold),
                "off": _run(args.data, "off", Path(tmp) / "off", one_fold),
                "sample_warm": _run(args.data, cache, Path(tmp) / "full", ["--device", "gpu"])}
    print(f"{'case':<12} {'fold-1 init (ms)':>16} {'wall (s)':>9}  backend")
    for k, r in rows.items():
        print(f"{k:<12} {r['fold1_init_ms']:16.0f} {r['wall_s']:9.1f}  {r['backend']}")
    print("cold: empty cache; warm: the cache the cold process wrote; off: WORKBENCH_KERNEL_CACHE=off; "
          "sample_warm: the sample walk-forward with default settings and the warm cache")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
