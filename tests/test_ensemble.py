"""Seed ensembles (training.seeds, workbench.agent.ensemble): the rule, each seed equal to itself alone,
the ensemble's accounting, the run directory and resume, the search's score over seeds."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from workbench.agent.backend import make_backend
from workbench.agent.ensemble import ensemble_test
from workbench.agent.fold import agent_seed, finish_dqn_fold, fold_seed, train_fold
from workbench.agent.records import FoldTrainResult
from workbench.agent.window import N_POS
from workbench.config import load_config
from workbench.engine import WalkForward
from workbench.rundir import RunDir

TINY = ["training.epochs=2", "training.max_steps_per_epoch=2", "training.rollout_steps=4", "training.n_step=1",
        "training.learning_starts=0", "training.episode_len=20", "training.replay_capacity=1024", "splits.train=400",
        "splits.val=30", "splits.test=40", "splits.max_folds=2", "gpu.hidden=8", "gpu.atoms=3", "gpu.batch=8",
        "gpu.n_envs=2", 'device="cpu"']


def _result(q: np.ndarray) -> FoldTrainResult:
    T = len(q)
    return FoldTrainResult([], 1, 0.0, np.zeros(4, np.float32), np.zeros(T, np.int32), np.zeros(T),
                           np.zeros((T, 3), np.int32), 1.0, "cpu", test_q=q.astype(np.float32))


def test_agent_seeds_keep_seed_zero_and_differ():
    assert agent_seed(7, 3, 0) == fold_seed(7, 3)  # one seed trains exactly as before
    seeds = {agent_seed(s, k, i) for s in range(3) for k in range(40) for i in range(8)}
    assert len(seeds) == 3 * 40 * 8


def test_the_ensemble_acts_on_the_mean_of_the_seeds_q(bars):
    """Seed A prefers long (direction action 2) by 1.0, seed B flat-to-short (action 0) by 0.3: the mean
    prefers long; scaling B's preference above A's turns the ensemble short. Q is the same at every bar
    and position, so the action taken is that choice at every bar."""
    a, b = 1000, 1060
    T = b - a
    base = np.zeros((T, N_POS, 9))
    qa, qb = base.copy(), base.copy()
    qa[:, :, 2], qb[:, :, 0] = 1.0, 0.3
    qa[:, :, 3 + 2] = qb[:, :, 3 + 2] = 1.0  # size branch: the largest, in both
    long_ = ensemble_test([_result(qa), _result(qb)], bars, bars.market, a, b)
    assert (long_.test_actions[:-1, 0] == 2).all() and (long_.test_position[1:-1] == 3).all()
    qb[:, :, 0] = 3.0
    short = ensemble_test([_result(qa), _result(qb)], bars, bars.market, a, b)
    assert (short.test_actions[:-1, 0] == 0).all() and (short.test_position[1:-1] == -3).all()
    assert short.params.shape == (2, 4)  # the seeds' weights, stacked
    with pytest.raises(ValueError, match="differ in shape"):
        ensemble_test([_result(qa), _result(qb[:-1])], bars, bars.market, a, b)


@pytest.mark.slow
def test_seed_ensemble_walkforward_resume_and_each_seed_alone(tmp_path, capsys):
    """training.seeds = 2 on the CPU backend: seed 0 is the one-seed run's agent, seed 1 the agent trained
    alone with its own seed; an ensemble of one seed walks exactly as the agent's own backtest; the run
    directory holds every seed and a resume reads them back."""
    cfg2 = load_config(None, TINY + ["training.seeds=2"])
    cfg1 = load_config(None, TINY)
    with RunDir(tmp_path / "two") as rd:
        two = WalkForward(cfg2).run("data/es_sample.parquet", progress="plain", run_dir=rd)
    one = WalkForward(cfg1).run("data/es_sample.parquet", progress=None)
    out = capsys.readouterr().err
    assert "ensemble of 2 seeds" in out and "seeds alone: sharpe mean" in out
    assert "fold 2/2 epoch 4/4" in out  # seeds one after another: progress counts both seeds' epochs
    assert all(f.ok for f in two.fold_results) and all(len(f.members) == 2 for f in two.fold_results)
    prep = WalkForward(cfg2).prepare("data/es_sample.parquet")
    backend = make_backend("cpu")
    for k, (f2, f1) in enumerate(zip(two.fold_results, one.fold_results)):
        assert f2.members[0].bars["pnl_usd"].equals(f1.bars["pnl_usd"])  # seed 0 = the single agent
        assert f2.members[0].metrics["best_epoch"] == f1.metrics["best_epoch"]
        alone = train_fold(k, prep, cfg2, backend, s=1)
        fr = finish_dqn_fold(k, prep, cfg2, alone, f2.ranges)
        assert f2.members[1].bars["pnl_usd"].equals(fr.bars["pnl_usd"])
        assert np.array_equal(f2.params[1], alone.params)
        a, b = int(prep.folds.loc[k, "test_start"]), int(prep.folds.loc[k, "test_stop"])
        solo = ensemble_test([alone], prep.bars, prep.spec, a, b)  # the rule with one seed is the agent
        assert np.array_equal(solo.test_position, alone.test_position)
        assert np.allclose(solo.test_pnl, alone.test_pnl, atol=1e-9, rtol=0)
        assert f2.metrics["seeds"] == 2 and f2.metrics["seed_best_epochs"] == [m.metrics["best_epoch"]
                                                                              for m in f2.members]
        assert {e["seed"] for e in f2.epochs} == {0, 1} and sum(e["chosen"] for e in f2.epochs) == 2
    seeds = two.seed_summary()
    assert seeds["seeds"] == 2 and len(seeds["per_seed"]) == 2
    assert seeds["per_seed"][0]["net_pnl_usd"] == pytest.approx(one.metrics["net_pnl_usd"], abs=1e-6)
    assert seeds["seed_spread"]["net_pnl_usd_mean"] == pytest.approx(
        np.mean([p["net_pnl_usd"] for p in seeds["per_seed"]]))
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["seeds"]["seeds"] == 2 and "ensemble" in summary["seeds"]
    assert (tmp_path / "two" / "fold_002" / "seed_01_bars.parquet").is_file()
    assert np.load(tmp_path / "two" / "fold_001" / "weights.npy").shape[0] == 2
    with RunDir(tmp_path / "two", resume=True) as rd:  # every fold finished: read back, members included
        again = WalkForward(cfg2).run("data/es_sample.parquet", progress=None, run_dir=rd)
    assert json.dumps(again.seed_summary(), default=str) == json.dumps(seeds, default=str)
    assert "ensemble of 2 seeds" in two._repr_html_()
    two.fold_results[0].plot()
    two.plot()


def test_seeds_config_is_checked():
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="seeds must be in"):
        load_config(None, ["training.seeds=0"])


@pytest.mark.slow
def test_a_search_trial_with_seeds_scores_the_mean_of_its_seeds():
    from workbench.hyperopt.search import evaluate_candidate, fold_score

    cfg = load_config(None, TINY + ["training.seeds=2", "splits.max_folds=1"])
    prep = WalkForward(cfg).prepare("data/es_sample.parquet")
    backend = make_backend("cpu")
    seen = []
    sharpes, status, hourly = evaluate_candidate(cfg, {}, None, [1], backend, prep,
                                                 on_epoch=lambda f, log, n: seen.append((f, log.epoch, n)))
    E = cfg.training.epochs  # progress counts on across the seeds: seed 1's epoch e is E + e of 2E
    assert seen == [(1, e, 2 * E) for e in range(1, 2 * E + 1)]
    runs = [train_fold(0, prep, cfg, backend, test=False, s=s) for s in range(2)]
    alone = [fold_score(prep, 0, [r]) for r in runs]
    assert status == "ok"
    want = np.mean([s for s, _ in alone])
    assert sharpes[0] == pytest.approx(want, nan_ok=True) or (math.isnan(sharpes[0]) and math.isnan(want))
    assert hourly == pytest.approx(list(np.mean([h for _, h in alone], axis=0)))


@pytest.mark.slow
def test_the_command_prints_and_writes_the_seeds(tmp_path, capsys):
    from workbench.walkforward import main

    sets = [x for kv in TINY + ["training.seeds=2", "splits.max_folds=1"] for x in ("--set", kv)]
    assert main(["data/es_sample.parquet", *sets, "--out", str(tmp_path / "a"), "--progress", "none"]) == 0
    out = capsys.readouterr().out
    assert "ensemble of 2 seeds" in out and "seed 1" in out and "seeds: mean" in out
    assert main(["data/es_sample.parquet", *sets, "--out", str(tmp_path / "b"), "--progress", "none", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["seeds"]["seeds"] == 2 and len(doc["seeds"]["per_seed"]) == 2


def test_a_run_saved_before_training_seeds_existed_resumes_with_one_seed(tmp_path):
    """A key added after a run was saved counts as its default (the run's behaviour): one seed resumes,
    two are refused by name."""
    from workbench.config import to_toml
    from workbench.errors import ConfigError
    from workbench.resume import check_config

    cfg = load_config(None, TINY)
    saved = "\n".join(line for line in to_toml(cfg).splitlines() if not line.startswith("seeds ="))
    assert "seeds =" not in saved and saved != to_toml(cfg)
    check_config(saved, cfg, tmp_path)
    with pytest.raises(ConfigError, match=r"training\.seeds: 1 -> 2"):
        check_config(saved, load_config(None, TINY + ["training.seeds=2"]), tmp_path)


def test_a_ruined_agent_fold_is_checked_against_the_accounting_without_the_ruin_rule():
    """The trainer's backtest never stops trading, so a fold is checked bar for bar against simulate()
    without the ruin rule, and its account (metrics, bars) is the one with it: a fold held at three
    contracts on a $200 base is ruined and still checks; a backtest PnL off by a dollar on any bar, before
    the ruin or after it, is refused."""
    from workbench.agent.fold import AccountingMismatch

    cfg = load_config(None, TINY + ["backtest.capital=200"])
    prep = WalkForward(cfg).prepare("data/es_sample.parquet")
    a, b = int(prep.folds.loc[0, "test_start"]), int(prep.folds.loc[0, "test_stop"])
    ranges = {p: "" for p in ("train", "val", "test")}
    for direction in (2, 0):  # long, then short: one of them loses the $200 (entry costs alone are ~$44)
        q = np.zeros((b - a, N_POS, 9))
        q[:, :, direction], q[:, :, 3 + 2] = 1.0, 1.0
        walked = ensemble_test([_result(q)], prep.bars, prep.spec, a, b)  # the trainer's walk of the range
        fold = finish_dqn_fold(0, prep, cfg, walked, ranges)
        if fold.metrics["ruined"]:
            break
    assert fold.metrics["ruined"]
    ruined_at = int(np.flatnonzero(fold.bars["equity_usd"].to_numpy() <= 0)[0])
    assert (fold.bars["position"].to_numpy()[ruined_at + 1:] == 0).all()  # the account stopped
    assert (walked.test_position[ruined_at + 2:] != 0).any()  # the trainer's walk did not
    for bar in (ruined_at, len(walked.test_pnl) - 1):
        bad = walked.test_pnl.copy()
        bad[bar] += 1.0
        with pytest.raises(AccountingMismatch, match=f"at test bar {bar}"):
            finish_dqn_fold(0, prep, cfg, dataclasses.replace(walked, test_pnl=bad), ranges)
