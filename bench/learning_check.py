"""Learning check: does the agent find the planted predictable component (and only then), and does the
epoch-selection rule pick well, across several seeds?

Synthetic ES-like data (``workbench.synthetic``) with the planted order-flow component at several
strengths (``signal``: next-bar log return gets ``signal * sigma * OFI`` of this bar; 0 = no edge),
60K bars each (5 folds). For every signal and training seed the walk-forward runs once per selection
rule (``training.select_by``; the training is the same, only the epoch kept differs): the agent's
stitched out-of-sample result after costs, with buy-and-hold and momentum on the same folds, PSR, and
the deflated Sharpe given every configuration tried here. The comparison table pairs the rules on the
same data and seed: mean out-of-sample Sharpe and PnL per rule and how often one beats the other.
With ``--ensemble K`` every run trains K seeds per fold (``training.seeds``) and a second table gives
each seed's stitched Sharpe, their mean and sd, and the seeds' ensemble; with ``--maths fp32,tf32`` (GEMM
arithmetics, ``gpu.math``) every run is repeated per arithmetic on the same data and seeds, and that
table says whether each arithmetic's mean lies within one fp32 sd of fp32's mean: #16's rule for a
tensor-core default (BENCHMARKS.md, "TF32 against fp32"). E.g. on a GPU:
``python bench/learning_check.py --signals 0.5,0 --ensemble 8 --maths fp32,tf32``; ``--data-seed``
repeats it on an independent synthetic series.
Prints tables; ``--json`` writes every number.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from workbench import metrics as M
from workbench.config import load_config
from workbench.data import load_bars
from workbench.engine import WalkForward
from workbench.synthetic import generate_bars


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--signals", default="0,0.25,0.5")
    p.add_argument("--seeds", default="0", help="training seeds (comma list)")
    p.add_argument("--select", default="bar_t", help="selection rules to compare (comma list of training.select_by)")
    p.add_argument("--bars", type=int, default=60_000)
    p.add_argument("--data-seed", type=int, default=100,
                   help="the synthetic series' seed for the first signal (the next signals': +1, +2, ...); another "
                        "value repeats a check on an independent series")
    p.add_argument("--device", default="auto")
    p.add_argument("--ensemble", type=int, default=1, help="seeds per fold in each run (training.seeds)")
    p.add_argument("--maths", default="", help="GEMM arithmetics to compare (comma list of gpu.math; '' = the profile's)")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--json")
    args = p.parse_args()
    rules = args.select.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    maths = args.maths.split(",")
    extra = [f"training.seeds={args.ensemble}"] if args.ensemble > 1 else []
    runs = []
    for i, signal in enumerate(float(x) for x in args.signals.split(",")):
        data_seed = args.data_seed + i
        bars = load_bars(generate_bars(args.bars, seed=data_seed, signal=signal))
        for seed in seeds:
            for rule in rules:
                for math in maths:
                    cfg = load_config(None, [f'device="{args.device}"', f"seed={seed}", f'training.select_by="{rule}"',
                                             *([f'gpu.math="{math}"'] if math else []), *extra, *args.set])
                    t0 = time.perf_counter()
                    res = WalkForward(cfg).run(bars)
                    runs.append({"signal": signal, "data_seed": data_seed, "seed": seed, "rule": rule,
                                 "math": math or "profile",
                                 "seconds": time.perf_counter() - t0, "agent": res.metrics,
                                 "returns": res.daily_returns().to_numpy(),
                                 "chosen_epochs": [f.metrics.get("best_epoch") for f in res.fold_results],
                                 "baselines": res.baselines, "failed_folds": sum(not f.ok for f in res.fold_results),
                                 "seeds": res.seed_summary()})
    # deflated Sharpe: every configuration tried here counts as a trial
    per_day_sr = [np.mean(x["returns"]) / np.std(x["returns"], ddof=1) for x in runs if len(x["returns"]) > 2]
    var = float(np.var(per_day_sr, ddof=1)) if len(per_day_sr) > 1 else 0.0
    print(f"{'signal':>6} {'seed':>4} {'rule':>12} {'math':>7} {'Sharpe':>7} {'95% interval':>16} {'PSR':>6} {'DSR':>6} "
          f"{'net PnL':>9} {'B&H':>6} {'mom':>7} {'trades':>6} {'epochs chosen':>15} {'s':>5}")
    for x in runs:
        x["dsr"] = M.deflated_sharpe(x["returns"], n_trials=len(runs), sr_variance=var)
        a, b = x["agent"], x["baselines"]
        ci = f"{a['sharpe_ci95_low']:.1f} .. {a['sharpe_ci95_high']:.1f}"
        print(f"{x['signal']:6.2f} {x['seed']:4d} {x['rule']:>12} {x['math']:>7} {a['sharpe']:7.2f} {ci:>16} {a['psr']:6.3f} "
              f"{x['dsr']:6.3f} {a['net_pnl_usd']:9.0f} {b['buy-and-hold']['sharpe']:6.2f} {b['momentum']['sharpe']:7.2f} "
              f"{a['trades']:6d} {','.join(str(e) for e in x['chosen_epochs']):>15} {x['seconds']:5.1f}")
        x.pop("returns")
    if len(rules) > 1:
        base, alt = rules[0], rules[1]
        print(f"\npaired by signal and seed: {base} against {alt} (stitched out-of-sample, after costs)")
        print(f"{'signal':>6} {'runs':>4} {'mean Sharpe ' + base:>20} {'mean Sharpe ' + alt:>26} "
              f"{'mean PnL ' + base:>16} {'mean PnL ' + alt:>22} {base + ' >= ' + alt:>20}")
        for signal in sorted({x["signal"] for x in runs}):
            pairs = [(a, b) for a in runs for b in runs if a["signal"] == b["signal"] == signal
                     and a["seed"] == b["seed"] and a["rule"] == base and b["rule"] == alt]
            sa = [a["agent"]["sharpe"] for a, _ in pairs]
            sb = [b["agent"]["sharpe"] for _, b in pairs]
            pa = [a["agent"]["net_pnl_usd"] for a, _ in pairs]
            pb = [b["agent"]["net_pnl_usd"] for _, b in pairs]
            wins = sum(x >= y for x, y in zip(pa, pb))
            print(f"{signal:6.2f} {len(pairs):4d} {np.mean(sa):20.2f} {np.mean(sb):26.2f} {np.mean(pa):16.0f} "
                  f"{np.mean(pb):22.0f} {f'{wins}/{len(pairs)} by PnL':>20}")
    if args.ensemble > 1:
        seed_table(runs)
    print(f"annualisation: {M.ANNUALIZATION_NOTE}; DSR over {len(runs)} runs")
    if args.json:
        json.dump(runs, open(args.json, "w"), indent=1, default=str)
    return 0


def seed_table(runs: list) -> None:
    """Each run's seeds (stitched out-of-sample Sharpe of each seed's own kept weights), their mean and sd,
    the ensemble's Sharpe; per signal, seed and rule, each arithmetic's mean against fp32's spread."""
    print(f"\n{'signal':>6} {'seed':>4} {'rule':>12} {'math':>7} {'mean (sd)':>13} {'ensemble':>9}  each seed's Sharpe")
    stats = {}
    for x in runs:
        per = [p["sharpe"] for p in x["seeds"].get("per_seed", []) if p.get("sharpe") is not None]
        mean, sd = (float(np.mean(per)), float(np.std(per, ddof=1))) if len(per) > 1 else (float("nan"),) * 2
        stats[(x["signal"], x["seed"], x["rule"], x["math"])] = (mean, sd)
        ens = x["agent"].get("sharpe")
        print(f"{x['signal']:6.2f} {x['seed']:4d} {x['rule']:>12} {x['math']:>7} {f'{mean:.1f} ({sd:.1f})':>13} "
              f"{'n/a' if ens is None else f'{ens:.1f}':>9}  {', '.join(f'{v:.1f}' for v in per)}")
    for (signal, seed, rule, math), (mean, _) in stats.items():
        base = stats.get((signal, seed, rule, "fp32"))
        if math != "fp32" and base is not None:
            inside = abs(mean - base[0]) <= base[1]
            print(f"signal {signal:.2f}, seed {seed}, {rule}: {math}'s mean {mean:.1f} is "
                  f"{'within' if inside else 'outside'} one fp32 sd ({base[1]:.1f}) of fp32's {base[0]:.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
