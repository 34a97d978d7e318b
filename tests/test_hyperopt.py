from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import ConfigError
from workbench.hyperopt.bounds import HyperoptProfile
from workbench.hyperopt.pso import ParticleSwarm


def _run(f, dims, iters, seed=0, **kw):
    pso = ParticleSwarm(dims, seed=seed, **kw)
    for _ in range(iters):
        pso.tell([f(x) for x in pso.ask()])
    return pso.best


@pytest.mark.parametrize("boundary", ["reflect", "clip"])
def test_sphere(boundary):
    target = np.array([0.3, 0.7, 0.55])
    x, fx = _run(lambda x: -np.sum((x - target) ** 2), 3, 60, particles=12, boundary=boundary)
    assert np.allclose(x, target, atol=0.02) and fx > -1e-3


def test_rosenbrock_3d():
    def rosen(u):  # optimum at (1, 1, 1) in [-2, 2]^3, i.e. u = 0.75
        z = 4 * u - 2
        return -np.sum(100 * (z[1:] - z[:-1] ** 2) ** 2 + (1 - z[:-1]) ** 2)

    x, fx = _run(rosen, 3, 300, particles=24, seed=1, inertia=0.6)
    assert np.allclose(4 * x - 2, 1.0, atol=0.1) and fx > -0.05


def test_seeded_and_resumable_from_told_scores():
    f = lambda x: -np.sum((x - 0.4) ** 2)  # noqa: E731
    a = ParticleSwarm(4, seed=7)
    log = []
    for _ in range(5):
        s = [f(x) for x in a.ask()]
        log.append(s)
        a.tell(s)
    b = ParticleSwarm(4, seed=7)  # a resumed search replays the logged scores
    for s in log:
        b.tell(s)
    assert np.array_equal(a.ask(), b.ask()) and a.best[1] == b.best[1]
    c = ParticleSwarm(4, seed=7)
    c.tell([np.nan] * 8)  # failed trials never become a best
    assert c.best[1] == -np.inf


def test_default_bounds_decode_inside_their_ranges():
    h = HyperoptProfile()
    for u in (0.0, 0.37, 1.0):
        vals = h.decode([u] * len(h.names))
        for name, v in vals.items():
            b = h.bound(name)
            if b.type == "choice":
                assert v in b.values
            else:
                assert b.low - 1e-9 <= v <= b.high + 1e-9
                assert isinstance(v, int) == (b.type == "int")
    assert h.bound("nope", None) is None and h.bound("lr").scale == "log"


@pytest.mark.parametrize("text,match", [
    ("[bounds.lrr]\ntype='float'\nlow=1\nhigh=2\n", "unknown parameter 'lrr'"),
    ("[bounds.lr]\ntype='float'\nlow=1\nhigh=2\nstep=3\n", "unknown key 'step'"),
    ("[bounds.lr]\ntype='float'\nlow=2\nhigh=1\n", "low .* must be below high"),
    ("[bounds.lr]\ntype='float'\nlow=0\nhigh=1\nscale='log'\n", "log scale needs low > 0"),
    ("[bounds.lr]\ntype='bogus'\nlow=0\nhigh=1\n", "type must be float, int or choice"),
    ("[bounds.episode_len]\ntype='choice'\nvalues=[]\n", "non-empty 'values'"),
    ("[swarm]\nparticle=3\n[bounds.lr]\nlow=1e-5\nhigh=1e-3\n", "unknown key 'swarm.particle'"),
    ("[swarm]\nboundary='wrap'\n[bounds.lr]\nlow=1e-5\nhigh=1e-3\n", "boundary must be reflect or clip"),
    ("[swarm]\nparticles=4\n", "no \\[bounds"),
])
def test_bad_bounds_files_name_the_key(tmp_path, text, match):
    p = tmp_path / "h.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        HyperoptProfile(p)


TINY = """
[swarm]
particles = 3
seed = 4
folds = [1]
[bounds.lr]
type = "float"
low = 1e-4
high = 1e-3
scale = "log"
[bounds.gamma]
type = "float"
low = 0.9
high = 0.99
[bounds.episode_len]
type = "choice"
values = [256, 512]
"""
BUDGET = ["--device", "cpu", "--progress", "plain", "--set", "training.epochs=1", "--set", "training.max_steps_per_epoch=4",
          "--set", "training.rollout_steps=8", "--set", "training.learning_starts=64", "--set", "splits.max_folds=2"]


def test_tiny_search_resume_and_best_config(tmp_path, capsys, monkeypatch):
    import json

    import pandas as pd

    from conftest import SAMPLE
    from workbench.agent import backend as B
    from workbench.hyperopt.__main__ import main
    from workbench.walkforward import main as walkforward

    bounds = tmp_path / "b.toml"
    bounds.write_text(TINY)
    calls = []
    real = B.Backend.trainer

    def spy(self, *a, **k):  # record whether anyone asked for a test backtest during the search
        t = real(self, *a, **k)
        orig = t.train_fold

        def train_fold(w, on_epoch=None, test=True):
            calls.append(test)
            return orig(w, on_epoch=on_epoch, test=test)

        t.train_fold = train_fold
        return t

    monkeypatch.setattr(B.Backend, "trainer", spy)
    out = tmp_path / "s"
    assert main([str(SAMPLE), "--trials", "5", "--bounds", str(bounds), "--out", str(out), "--no-test", *BUDGET]) == 0
    assert calls == [False] * 5  # five trials, one scored fold each, never the test range
    log = pd.read_parquet(out / "trials.parquet")
    assert len(log) == 5 and list(log["iteration"]) == [0, 0, 0, 1, 1]
    assert log["p_episode_len"].isin([256, 512]).all()
    # interrupted after trial 4: resume re-runs only what is missing and lands on the same log
    full = log.copy()
    log.iloc[:4].to_parquet(out / "trials.parquet")
    calls.clear()
    assert main([str(SAMPLE), "--trials", "5", "--bounds", str(bounds), "--resume", str(out), "--no-test", *BUDGET]) == 0
    again = pd.read_parquet(out / "trials.parquet")
    assert len(calls) == 1  # only the missing trial ran
    pd.testing.assert_frame_equal(again.drop(columns="seconds"), full.drop(columns="seconds"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_mean_val_sharpe"] == pytest.approx(full["mean_val_sharpe"].max())
    over = summary["overfitting"]
    assert over["trials_started"] == 5 and over["trials_finished"] == int(np.isfinite(full["mean_val_sharpe"]).sum())
    hourly = [json.loads(x) for x in full["val_pnl_hourly"]]
    assert len({len(h) for h in hourly}) == 1 and len(hourly[0]) > 4  # every trial: the same validation hours
    if over["trials_finished"] >= 2:
        assert 0.0 <= over["pbo"]["pbo"] <= 1.0 and over["pbo"]["trials"] == over["trials_finished"]
    assert "probability of backtest overfitting" in capsys.readouterr().err
    capsys.readouterr()
    # the best configuration is a run config that walkforward accepts as it is
    assert walkforward([str(SAMPLE), "--config", str(out / "best.toml"), "--out", str(tmp_path / "wf"),
                        "--progress", "none", "--json"]) == 0
    wf = json.loads(capsys.readouterr().out)
    assert wf["strategy"] == "dqn"


def test_search_cli_errors(tmp_path, capsys):
    from conftest import SAMPLE
    from workbench.hyperopt.__main__ import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[bounds.lrr]\nlow = 1\nhigh = 2\n")
    assert main([str(SAMPLE), "--trials", "2", "--bounds", str(bad), "--out", str(tmp_path / "x"), *BUDGET]) == 78
    assert "unknown parameter 'lrr'" in capsys.readouterr().err
    assert main([str(SAMPLE), "--trials", "2", "--resume", str(tmp_path / "none"), *BUDGET]) == 2
    assert main([str(tmp_path / "missing.parquet"), "--trials", "2", "--out", str(tmp_path / "y"), *BUDGET]) == 66


def test_a_set_of_a_searched_key_fixes_it(tmp_path, capsys):
    import json

    import pandas as pd

    from conftest import SAMPLE
    from workbench.hyperopt.__main__ import main

    bounds = tmp_path / "b.toml"
    bounds.write_text(TINY)
    out = tmp_path / "s"
    rc = main([str(SAMPLE), "--trials", "2", "--bounds", str(bounds), "--out", str(out), "--no-test", *BUDGET,
               "--set", "training.lr=0.0003"])
    err = capsys.readouterr().err
    assert rc == 0 and "fixed by --set, not searched: lr = 0.0003; 2 parameters searched" in err
    log = pd.read_parquet(out / "trials.parquet")
    assert "u_lr" not in log.columns and "p_lr" not in log.columns and "u_gamma" in log.columns
    assert json.loads((out / "summary.json").read_text())["trials"] == 2
    best = (out / "best.toml").read_text()
    assert "lr = 0.0003" in best
    # every searched key fixed: nothing to search, refused
    rc = main([str(SAMPLE), "--trials", "2", "--bounds", str(bounds), "--out", str(tmp_path / "t"), *BUDGET,
               "--set", "training.lr=0.0003", "--set", "training.gamma=0.95", "--set", "training.episode_len=256"])
    assert rc == 78 and "nothing left to search" in capsys.readouterr().err
