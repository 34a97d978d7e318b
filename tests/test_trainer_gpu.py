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
