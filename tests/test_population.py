"""Many agents in one graph (workbench.agent.population): each agent of a population computes exactly
what it computes alone (same kernels, same buffers, its own lane); in CI the branches run one after
another in the simulator, on a GPU side by side in one launch per phase."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cuda_kernels.nb import SIMULATOR
from workbench.agent.population import GpuPopulation, agent_bytes, train_population
from workbench.agent.train_config import TrainConfig
from workbench.agent.trainer import DeviceTrainer
from workbench.agent.window import make_window
from workbench.device import Device
from workbench.features import build_features
from workbench.gpu_profile import GpuProfile

PROF = GpuProfile(hidden=8, atoms=2, batch=4, n_envs=2)
# bit for bit alone: the default (batched GEMMs off), stated explicitly so these tests keep checking it;
# tests/test_trainer_gpu.py checks a batched run against one agent at a time
EXACT = replace(PROF, batched_gemm=False)
EXACT_RUN = ['gpu.batched_gemm="off"']
FOLDS = [dict(train_start=300, train_stop=600, val_start=610, val_stop=614, test_start=630, test_stop=634),
         dict(train_start=500, train_stop=800, val_start=810, val_stop=814, test_start=830, test_stop=834)]


def _cfg(**kw) -> TrainConfig:
    base = dict(epochs=1, rollout_steps=2, n_step=1, episode_len=20, learning_starts=0, max_steps_per_epoch=1,
                replay_capacity=1024, v_min=-2.0, v_max=2.0, lr=1e-3, eps_start=0.5, eps_end=0.5)
    return TrainConfig(**{**base, **kw})


def _same(a, b) -> None:
    assert a.best_epoch == b.best_epoch
    assert np.array_equal(a.params, b.params)  # bit for bit
    assert np.array_equal(a.test_position, b.test_position) and np.array_equal(a.test_pnl, b.test_pnl)
    for x, y in zip(a.epochs, b.epochs):
        np.testing.assert_equal((x.updates, x.replay_size, x.loss, x.val_pnl_usd, x.val_bar_t, x.guard_tripped),
                                (y.updates, y.replay_size, y.loss, y.val_pnl_usd, y.val_bar_t, y.guard_tripped))


@pytest.mark.slow
def test_each_agent_of_a_population_gets_what_it_gets_alone(bars, fold_gemm):
    feats = build_features(bars)
    windows = [make_window(bars, feats, f) for f in FOLDS]
    # agents with different folds, seeds, learning rates and schedules: the second trains two epochs of two
    # updates after three-step rollouts, the first one epoch of one update after two-step rollouts. The third
    # has the second's schedule, so the two share each phase's loop (which runs every pass), and a guard that
    # trips on its first update: its later updates must change nothing that lasts (weights, optimiser,
    # priorities, the PER draw's counter), as alone, where its loop stops
    plan = [(windows[0], 5, _cfg()), (windows[1], 7, _cfg(lr=3e-3, epochs=2, max_steps_per_epoch=2, rollout_steps=3)),
            (windows[0], 9, _cfg(epochs=2, max_steps_per_epoch=2, rollout_steps=3, q_limit=1e-6))]
    device = Device()
    solo = [DeviceTrainer(device, fold_gemm(device), EXACT, c, bars.market, 100_000.0, seed=s) for _, s, c in plan]
    alone = [t.train_fold(w) for t, (w, _, _) in zip(solo, plan)]
    lanes = [device.lane() for _ in plan]
    trainers = [DeviceTrainer(lane, fold_gemm(lane), EXACT, c, bars.market, 100_000.0, seed=s)
                for lane, (w, s, c) in zip(lanes, plan)]
    seen = []
    together = train_population(device, trainers, [w for w, _, _ in plan], on_epoch=lambda i, log: seen.append(i))
    assert sorted(seen) == [0, 1, 1, 2, 2]
    assert [e.guard_tripped for e in alone[2].epochs] == [True, True] and not alone[1].epochs[1].guard_tripped
    for a, b in zip(together, alone):
        _same(a, b)
    for t, u in zip(trainers, solo):
        assert np.array_equal(t.state.replay.prio.copy_to_host(), u.state.replay.prio.copy_to_host())
        assert np.array_equal(t.state.learner.step.copy_to_host(), u.state.learner.step.copy_to_host())
    assert not np.array_equal(together[0].params, together[1].params)  # the agents did differ
    # agents on one window read one upload of its bars (and still get what they get alone, above)
    assert trainers[2].state.window is trainers[0].state.window is not trainers[1].state.window
    assert [len(r.epochs) for r in together] == [1, 2, 2] and together[1].epochs[1].updates == 2
    assert together[0].epochs[0].ms["agents_per_launch"] == 3 and together[1].epochs[1].ms["agents_per_launch"] == 2
    assert agent_bytes(trainers[0]) > trainers[0].state.replay.capacity * 4  # counts the replay ring at least


def test_a_population_needs_one_window_per_trainer(bars, fold_gemm):
    device = Device()
    w = make_window(bars, build_features(bars), FOLDS[0])
    t = DeviceTrainer(device.lane(), fold_gemm(device), PROF, _cfg(), bars.market, 1e5, seed=1)
    with pytest.raises(ValueError, match="one window per trainer"):
        GpuPopulation(device, [t], [w, w])


def _tiny_gpu_run(monkeypatch, module, max_folds: int):
    """A GPU backend (the simulator in CI, with the NumPy GEMM: its Numba GEMM costs ~0.6 s a launch)
    handed to ``module``'s make_backend, and a run config of tiny sizes on it."""
    from conftest import HostGemm

    from cuda_kernels.nb import SIMULATOR
    from workbench.agent import backend as BK
    from workbench.agent import gemm as G
    from workbench.config import load_config

    if SIMULATOR:
        monkeypatch.setattr(G, "make_gemm", lambda *a, **k: HostGemm())
    gpu = BK.Backend("gpu")
    if SIMULATOR:
        gpu.gemm = HostGemm()
    monkeypatch.setattr(module, "make_backend", lambda choice: gpu)
    return load_config(None, ["training.epochs=1", "training.max_steps_per_epoch=1", "training.rollout_steps=2",
                              "training.n_step=1", "training.learning_starts=0", "training.episode_len=20",
                              "training.replay_capacity=1024", "splits.train=400", "splits.val=4", "splits.test=4",
                              f"splits.max_folds={max_folds}", "gpu.hidden=8", "gpu.atoms=2", "gpu.batch=4",
                              "gpu.n_envs=2", 'device="gpu"', *EXACT_RUN])


@pytest.mark.slow
def test_walkforward_trains_its_folds_and_seeds_as_one_population(bars, monkeypatch, tmp_path):
    """The engine's GPU path (here the simulator, a NumPy GEMM): a fold's two seeds train side by side
    (folds of different windows side by side: the test above); the fold is checked against simulate() and
    written as it would be alone, a seed trains exactly as it does alone, and summary.json states the plan."""
    import dataclasses
    import json

    import workbench.engine as E
    from workbench.agent.fold import train_fold
    from workbench.rundir import RunDir

    import threading

    from workbench.agent.population import GpuPopulation

    cfg = _tiny_gpu_run(monkeypatch, E, max_folds=1)
    cfg = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, seeds=2))
    where, rule_fold, ends, end_epoch = [], E.rule_fold, [], GpuPopulation.end_epoch
    monkeypatch.setattr(E, "rule_fold", lambda *a: where.append((threading.current_thread().name, len(ends)))
                        or rule_fold(*a))
    monkeypatch.setattr(GpuPopulation, "end_epoch", lambda self, *a: ends.append(1) or end_epoch(self, *a))
    with RunDir(tmp_path / "run") as run_dir:
        result = E.WalkForward(cfg).run(bars, progress=None, run_dir=run_dir)
    assert [f.ok for f in result.fold_results] == [True]
    # the rule baselines were computed on their thread once the agents' first epoch had ended (the GPU then
    # busy, the host waiting), and are what they are computed alone
    assert where and {name for name, _ in where} == {"workbench-baselines"} and where[0][1] >= 1
    for name, base in E.WalkForward(cfg)._baselines(list(result.baselines), E.WalkForward(cfg).prepare(bars)).items():
        alone = E.WalkForwardResult(name, result.folds, base, result.market, result.capital, account=result.account)
        assert json.dumps(result.baselines[name], sort_keys=True, default=str) == json.dumps(
            alone.metrics, sort_keys=True, default=str)  # NaN (a one-day test range's Sharpe) equal to NaN
    assert all(e["ms"]["agents_per_launch"] == 2 for f in result.fold_results for e in f.epochs)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["population"]["agents_per_graph"] == 2 and summary["population"]["groups"] == 1
    assert summary["population"]["batched_gemm"].startswith("off")
    assert summary["seeds"]["seeds"] == 2
    assert (tmp_path / "run" / "fold_001" / "seed_01_bars.parquet").is_file()
    prep = E.WalkForward(cfg).prepare(bars)
    alone = train_fold(0, prep, cfg, E.make_backend("gpu"), s=1)  # the second seed, one agent
    assert np.array_equal(result.fold_results[0].params[1], alone.params)
    assert np.array_equal(result.fold_results[0].members[1].bars["position"].to_numpy(), alone.test_position)


def _pop_bounds() -> str:
    """The hyperopt tests' tiny bounds (test_hyperopt.TINY) cut to two particles and the lr bound."""
    from test_hyperopt import TINY

    text = TINY.split("[bounds.gamma]")[0].replace("particles = 3", "particles = 2")
    assert "particles = 2" in text and "[bounds.lr]" in text and "[bounds.gamma]" not in text
    return text


@pytest.mark.slow
def test_a_swarm_iteration_trains_as_one_population(bars, monkeypatch, tmp_path):
    """The search's GPU path (here the simulator): an iteration's particles train side by side and each
    trial's score is exactly the one the particle gets alone."""
    import json

    from workbench.hyperopt import search as HS
    from workbench.hyperopt.bounds import HyperoptProfile

    cfg = _tiny_gpu_run(monkeypatch, HS, max_folds=1)
    path = tmp_path / "b.toml"
    path.write_text(_pop_bounds())
    (tmp_path / "s").mkdir()
    search = HS.Search(cfg, HyperoptProfile(path), bars, tmp_path / "s")
    log = search.run(2)
    assert list(log["status"]) == ["ok", "ok"] and list(log["trial"]) == [1, 2]
    assert log.loc[0, "seconds"] == log.loc[1, "seconds"]  # one population: one wall time for both
    alone, status, hourly = search.evaluate({"lr": float(log.loc[0, "p_lr"])})  # particle 1, one fold alone
    assert status == "ok" and json.loads(log.loc[0, "val_sharpes"]) == pytest.approx(alone, abs=0, rel=0, nan_ok=True)
    assert json.loads(log.loc[0, "val_pnl_hourly"]) == hourly


def test_agents_group_by_size_not_schedule():
    """Particles that differ in schedule share a population; a different size starts another group."""
    import dataclasses

    from workbench.agent.backend import Backend
    from workbench.agent.population import group_key
    from workbench.config import load_config

    backend = Backend("cpu")  # group_key reads sizes only: any backend with a profile
    base = load_config(None, ["gpu.hidden=8"])
    other_schedule = dataclasses.replace(base, training=dataclasses.replace(
        base.training, epochs=3, max_steps_per_epoch=7, rollout_steps=5, learning_starts=0))
    other_size = dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, hidden=16))
    assert group_key(base, backend) == group_key(other_schedule, backend)
    assert group_key(base, backend) != group_key(other_size, backend)
