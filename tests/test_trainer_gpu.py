"""The GPU trainer on a real device: a fold trains, is deterministic bit for bit, and agrees with simulate()."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _run(bars, seed, *extra):
    from workbench.agent.backend import make_backend
    from workbench.agent.fold import run_dqn_fold
    from workbench.config import load_config
    from workbench.engine import WalkForward

    cfg = load_config(None, ["training.epochs=3", "training.max_steps_per_epoch=50", "training.rollout_steps=16",
                             "training.learning_starts=1024", f"seed={seed}", "splits.train=6000", "splits.val=2000",
                             "splits.test=2000", 'device="gpu"', *extra])
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


def test_an_update_beside_a_side_stream_is_bit_for_bit_one_stream(bars):
    """``gpu.branches`` (on by default): the update's target forward, weight gradients and priority
    update on a second stream beside its main chain compute what one stream computes, bit for bit."""
    a, b = _run(bars, 5), _run(bars, 5, 'gpu.branches="off"')
    assert [e["updates"] for e in a.epochs] == [50, 50, 50]
    assert np.array_equal(a.params, b.params)
    assert [e["loss"] for e in a.epochs] == [e["loss"] for e in b.epochs]
    assert np.array_equal(a.bars["pnl_usd"].to_numpy(), b.bars["pnl_usd"].to_numpy())


@pytest.mark.parametrize("mode", ["programmatic", "order"])
def test_programmatic_edges_are_bit_for_bit_plain_edges(bars, mode):
    """``gpu.pdl``: the graphs' kernel-to-kernel edges made programmatic (each kernel launched early and
    waiting inside for the one before) train the same weights, losses and PnL as plain edges, bit for
    bit; a race (a kernel touching memory before its wait) would show here as a difference."""
    from workbench.agent.backend import make_backend

    if make_backend("gpu").device.info.compute_capability < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    a, b = _run(bars, 5), _run(bars, 5, f'gpu.pdl="{mode}"')
    assert [e["updates"] for e in b.epochs] == [50, 50, 50]
    assert np.array_equal(a.params, b.params)
    assert [e["loss"] for e in a.epochs] == [e["loss"] for e in b.epochs]
    assert np.array_equal(a.bars["pnl_usd"].to_numpy(), b.bars["pnl_usd"].to_numpy())


def test_fused_epilogues_train_within_rounding_of_our_kernels(bars):
    """cuBLASLt's fused bias + ReLU epilogues (the default where nvmath-python loads) against our bias
    kernels after each GEMM (``gpu.fused_epilogues = "off"``): the forward's outputs agree to rounding
    (bit for bit at the reference shape), a fused backward (fp32) sums the bias gradients in another
    order, so after 150 updates the weights may differ by rounding that Adam amplifies (the stated
    tolerance of the batched GEMMs' test below)."""
    pytest.importorskip("nvmath", reason="fused epilogues need nvmath-python")
    from workbench.agent.backend import make_backend

    assert make_backend("gpu").gemm.fuses_epilogues
    a, b = _run(bars, 5), _run(bars, 5, 'gpu.fused_epilogues="off"')
    dev = np.max(np.abs(a.params - b.params)) / np.max(np.abs(b.params))
    la, lb = [e["loss"] for e in a.epochs], [e["loss"] for e in b.epochs]
    print(f"fused vs our kernels: max |params difference| / max |param| = {dev:.2e}; losses {la} vs {lb}")
    assert dev < 2e-2
    np.testing.assert_allclose(la, lb, rtol=1e-3)


def test_walkforward_in_populations_equals_one_fold_at_a_time(bars):
    """The GPU walk-forward trains its folds (here 3 folds x 3 seeds) side by side by default, every
    agent's result the one it gets alone (gpu.population = 1), bit for bit; with ``gpu.batched_gemm =
    "on"`` (9 agents: batched; cuBLAS's batched kernels add in another order) a population run is
    reproducible bit for bit and within a stated tolerance of one agent at a time; with ``gpu.sm_share``
    the other way round from the profile's (each agent's GEMMs planned for the SMs they fill beside the
    others, or for the whole GPU: other algorithms) every agent's result is again the one it gets alone
    with that setting, bit for bit, and within the same tolerance of the profile's; the plan is stated
    in summary.json."""
    from workbench.agent.backend import make_backend
    from workbench.config import load_config
    from workbench.engine import WalkForward
    args = ["training.epochs=2", "training.max_steps_per_epoch=30", "training.rollout_steps=16",
            "training.learning_starts=1024", "training.seeds=3", "splits.train=3000", "splits.val=1000",
            "splits.test=1000", "splits.max_folds=3", 'device="gpu"']
    runs = {}
    on = ['gpu.batched_gemm="on"']
    flip = f'gpu.sm_share="{"off" if make_backend("gpu").profile.sm_share else "on"}"'  # the profile's other setting
    for key, extra in (("alone", ["gpu.population=1"]), ("exact", []), ("batched", on), ("batched again", on),
                       ("other sm_share", [flip]), ("other sm_share alone", [flip, "gpu.population=1"])):
        runs[key] = WalkForward(load_config(None, [*args, *extra])).run(bars, progress=None)
    a, b = runs["exact"], runs["alone"]
    assert len(a.fold_results) == 3 and all(f.ok for f in a.fold_results)
    for x, y in [*zip(a.fold_results, b.fold_results),
                 *zip(runs["other sm_share"].fold_results, runs["other sm_share alone"].fold_results)]:
        assert np.array_equal(x.params, y.params)  # [seeds, n_params]
        assert np.array_equal(x.bars["pnl_usd"].to_numpy(), y.bars["pnl_usd"].to_numpy())
    assert a.fold_results[0].members[0].epochs[0]["ms"]["agents_per_launch"] == 9
    for x, y, z in [*zip(runs["batched"].fold_results, runs["batched again"].fold_results, b.fold_results),
                    *zip(runs["other sm_share"].fold_results, runs["other sm_share"].fold_results, b.fold_results)]:
        assert np.array_equal(x.params, y.params)  # reproducible
        assert np.array_equal(x.bars["pnl_usd"].to_numpy(), y.bars["pnl_usd"].to_numpy())
        for xs, zs, k in zip(x.members, z.members, range(3)):
            dev = np.max(np.abs(x.params[k] - z.params[k])) / np.max(np.abs(z.params[k]))
            lx, lz = [e["loss"] for e in xs.epochs], [e["loss"] for e in zs.epochs]
            print(f"population vs alone: max |params difference| / max |param| = {dev:.2e}; losses {lx} vs {lz}")
            # the stated tolerance: TF32 products added in another order move the loss by ~1e-4 (relative);
            # Adam turns such differences in near-zero gradients into steps of the learning rate's size, so
            # after 60 updates the weights differ by up to ~5e-3 of the largest weight and the second
            # epoch's mean loss by up to 2.4e-3 (relative) (measured on the H200): bounds ~4x those
            assert dev < 2e-2
            np.testing.assert_allclose(lx, lz, rtol=1e-2)


def test_test_q_is_the_kept_weights_q_and_a_one_seed_ensemble_is_the_agent(bars):
    """The expected Q a trained fold returns for its test range (what a seed ensemble averages) is the kept
    weights' Q at every test bar and position (NumPy forward in float64), and the ensemble rule over that
    one seed, or over the seed twice, walks exactly the agent's own device backtest."""
    from workbench.agent.backend import make_backend
    from workbench.agent.ensemble import ensemble_test
    from workbench.agent.fold import fold_window, train_fold
    from workbench.agent.network import NetShape, forward_ref
    from workbench.agent.window import N_POS
    from workbench.config import load_config
    from workbench.engine import WalkForward
    from cuda_kernels.backtest import enumerate_positions_ref

    cfg = load_config(None, ["training.epochs=2", "training.max_steps_per_epoch=50", "training.rollout_steps=16",
                             "training.learning_starts=1024", "splits.train=6000", "splits.val=2000",
                             "splits.test=2000", 'device="gpu"'])
    prep = WalkForward(cfg).prepare(bars)
    backend = make_backend("gpu")
    res = train_fold(0, prep, cfg, backend)
    w = fold_window(0, prep)
    a, b = w.test
    prof = backend.sized(cfg.gpu)
    shape = NetShape(obs_dim=w.n_features + N_POS, hidden=prof.hidden, atoms=prof.atoms)
    support = np.linspace(cfg.training.v_min, cfg.training.v_max, prof.atoms).astype(np.float32).astype(np.float64)
    want = forward_ref(res.params, enumerate_positions_ref(w.features[a:b], N_POS), shape, support)["q"]
    assert res.test_q.shape == (b - a, N_POS, 9)
    tol = 1e-3 if prof.math == "fp32" else 3e-2  # TF32 GEMMs carry ~1e-3 relative error per layer
    assert np.abs(res.test_q.reshape(-1, 9) - want).max() <= tol * max(1.0, np.abs(want).max())
    ta, tb = int(prep.folds.loc[0, "test_start"]), int(prep.folds.loc[0, "test_stop"])
    for seeds in ([res], [res, res]):
        ens = ensemble_test(seeds, prep.bars, prep.spec, ta, tb)
        assert np.array_equal(ens.test_position, res.test_position)
        assert np.allclose(ens.test_pnl, res.test_pnl, atol=1e-9, rtol=0)
