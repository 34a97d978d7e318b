"""The GPU trainer on a real device: a fold trains, is deterministic bit for bit, and agrees with simulate()."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _run(bars, seed):
    from workbench.agent.backend import make_backend
    from workbench.agent.fold import run_dqn_fold
    from workbench.config import load_config
    from workbench.engine import WalkForward

    cfg = load_config(None, ["training.epochs=3", "training.max_steps_per_epoch=50", "training.rollout_steps=16",
                             "training.learning_starts=1024", f"seed={seed}", "splits.train=6000", "splits.val=2000",
                             "splits.test=2000", 'device="gpu"'])
    return run_dqn_fold(0, WalkForward(cfg).prepare(bars), cfg, make_backend("gpu"), {})


def test_fold_trains_deterministically(bars):
    a, b = _run(bars, 5), _run(bars, 5)
    assert [e["updates"] for e in a.epochs] == [50, 50, 50]
    assert np.array_equal(a.params, b.params)  # same seed and device: the same weights, bit for bit
    assert np.array_equal(a.bars["pnl_usd"].to_numpy(), b.bars["pnl_usd"].to_numpy())
    assert all(np.isfinite(e["loss"]) for e in a.epochs)
    assert a.epochs[-1]["ms"]["training"] > 0 and a.epochs[0]["ms"]["init"] > 0
    c = _run(bars, 6)
    assert not np.array_equal(a.params, c.params)


def test_walkforward_in_populations_equals_one_fold_at_a_time(bars):
    """The GPU walk-forward trains its folds side by side by default; every fold's result is the one it
    gets alone (gpu.population = 1), bit for bit, and the plan is stated in summary.json."""
    from workbench.config import load_config
    from workbench.engine import WalkForward
    args = ["training.epochs=2", "training.max_steps_per_epoch=30", "training.rollout_steps=16",
            "training.learning_starts=1024", "splits.train=3000", "splits.val=1000", "splits.test=1000",
            "splits.max_folds=3", 'device="gpu"']
    runs = {}
    for pop in (0, 1):
        cfg = load_config(None, [*args, f"gpu.population={pop}"])
        runs[pop] = WalkForward(cfg).run(bars, progress=None)
    a, b = runs[0], runs[1]
    assert len(a.fold_results) == 3 and all(f.ok for f in a.fold_results)
    for x, y in zip(a.fold_results, b.fold_results):
        assert np.array_equal(x.params, y.params)
        assert np.array_equal(x.bars["pnl_usd"].to_numpy(), y.bars["pnl_usd"].to_numpy())
        assert [e["val_bar_t"] for e in x.epochs] == [e["val_bar_t"] for e in y.epochs]
    assert a.fold_results[0].epochs[0]["ms"]["agents_per_launch"] == 3
