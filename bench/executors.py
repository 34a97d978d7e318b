"""Folds and search trials through each executor on this machine's GPUs: wall time, and whether the
results are bit-equal to the in-process run (same device, same seeds -> they must be).

    python bench/executors.py [--gpus N] [--trials T] [--out results.json]

Rows: in process; N spawned workers (--workers N); a local Dask cluster of N pinned workers
(--scheduler local). With N GPUs the speed-up over one GPU is the scaling figure; with one GPU the
rows measure each executor's own overhead (process start, kernel compilation per worker, transfers).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench import WalkForward, load_bars, load_config  # noqa: E402
from workbench.executor import DaskExecutor, InlineExecutor, ProcessExecutor, visible_gpus  # noqa: E402


def walkforward(bars, executor, overrides):
    cfg = load_config(None, overrides)
    t0 = time.perf_counter()
    res = WalkForward(cfg).run(bars, progress=None, executor=executor)
    return time.perf_counter() - t0, res


def search(bars, executor, trials: int, overrides):
    from workbench.hyperopt.bounds import HyperoptProfile
    from workbench.hyperopt.search import Search
    import tempfile

    base = load_config(None, overrides)
    with tempfile.TemporaryDirectory() as d:
        s = Search(base, HyperoptProfile(None), bars, Path(d), None, executor)
        t0 = time.perf_counter()
        log = s.run(trials)
        return time.perf_counter() - t0, log


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=0, help="workers (default: every visible GPU)")
    p.add_argument("--trials", type=int, default=0, help="search trials per executor (0: skip the search)")
    p.add_argument("--out", default="bench/results/executors.json")
    p.add_argument("--set", action="append", default=[], help="config override (tiny runs on a CPU)")
    a = p.parse_args()
    gpus = [] if 'device="cpu"' in a.set else visible_gpus()
    n = a.gpus or len(gpus) or 1
    bars = load_bars(ROOT / "data" / "es_sample.parquet")
    makers = {"in process": lambda: InlineExecutor(),
              f"--workers {n}": lambda: ProcessExecutor(n, gpus[:n]),
              f"--scheduler local ({n} workers)": lambda: DaskExecutor("local", workers=n, gpus=gpus[:n])}
    rows, ref, ref_log = [], None, None
    for name, make in makers.items():
        t0 = time.perf_counter()
        ex = make()
        start_s = time.perf_counter() - t0
        try:
            wall, res = walkforward(bars, ex, a.set)
            same = None
            if ref is None:
                ref = res
            else:
                same = all(np.array_equal(x.params, y.params) and x.metrics["net_pnl_usd"] == y.metrics["net_pnl_usd"]
                           for x, y in zip(ref.fold_results, res.fold_results))
            row = {"executor": name, "start_s": round(start_s, 2), "walkforward_s": round(wall, 2),
                   "folds": len(res.fold_results), "ok": sum(f.ok for f in res.fold_results),
                   "bit_equal_to_in_process": same, "sharpe": res.metrics.get("sharpe")}
            if a.trials:
                swall, log = search(bars, ex, a.trials, a.set)
                row["search_s"] = round(swall, 2)
                row["trials"] = len(log)
                if ref_log is None:
                    ref_log = log
                else:
                    row["search_equal"] = bool(np.array_equal(ref_log["mean_val_sharpe"].to_numpy(),
                                                              log["mean_val_sharpe"].to_numpy(), equal_nan=True))
        finally:
            ex.close()
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["walkforward_s"]
    for r in rows:
        r["walkforward_speedup"] = round(base / r["walkforward_s"], 3)
        r["walkforward_efficiency"] = round(base / r["walkforward_s"] / (1 if r is rows[0] else n), 3)
    out = {"gpus": gpus[:n], "workers": n, "rows": rows, "date": time.strftime("%Y-%m-%d")}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
