"""Smoke tests of the real entry point on the shipped sample."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from workbench.walkforward import main

from conftest import ROOT, SAMPLE


@pytest.mark.parametrize("strategy", ["buy-and-hold", "momentum"])
def test_walkforward_on_shipped_sample(strategy, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main([str(SAMPLE), "--strategy", strategy, "--out", str(out), "--progress", "plain"])
    cap = capsys.readouterr()
    assert rc == 0
    assert cap.out.strip().splitlines()[-1] == str(out)
    assert "stitched out-of-sample" in cap.out and "252 trading days" in cap.out
    assert "fold 5/5 done" in cap.err
    folds = pd.read_parquet(out / "folds.parquet")
    assert len(folds) == 5
    assert list(folds["fold"]) == [1, 2, 3, 4, 5]  # one numbering: from 1, as on screen
    for k in range(5):
        m = json.loads((out / f"fold_{k + 1:03d}" / "metrics.json").read_text())
        assert m["strategy"] == strategy and m["commission_usd"] > 0 and m["fold"] == k + 1
        assert m["annualization"].startswith("daily returns, 252") and m["days"] > 0 and "sharpe_ci95_low" in m
        assert len(pd.read_parquet(out / f"fold_{k + 1:03d}" / "bars.parquet")) == folds.loc[k, "test_stop"] - folds.loc[k, "test_start"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stitched_oos"]["annualization"].startswith("daily returns, 252")
    assert summary["annualization"].startswith("daily returns") and summary["account"].startswith("capital base $")
    assert [r["fold"] for r in summary["folds"]] == [1, 2, 3, 4, 5]
    assert all(r["annualization"].startswith("daily returns") for r in summary["folds"])
    assert "config.toml" in {p.name for p in out.iterdir()}
    # the saved config reproduces the run exactly
    rc = main([str(SAMPLE), "--config", str(out / "config.toml"), "--out", str(tmp_path / "again"), "--json",
               "--progress", "none"])
    again = json.loads(capsys.readouterr().out)
    assert rc == 0 and again["stitched_oos"]["net_pnl_usd"] == summary["stitched_oos"]["net_pnl_usd"]


def test_run_dir_exists_and_usage_errors(tmp_path, capsys):
    out = tmp_path / "run"
    bh = ["--strategy", "buy-and-hold"]
    assert main([str(SAMPLE), *bh, "--out", str(out), "--progress", "none", "--set", "splits.max_folds=1"]) == 0
    capsys.readouterr()
    assert main([str(SAMPLE), *bh, "--out", str(out), "--progress", "none"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main([str(SAMPLE), *bh, "--out", str(out), "--force", "--progress", "none", "--set", "splits.max_folds=1"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([str(SAMPLE), "--strategy", "astrology"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("workbench: error: argument --strategy")
    assert main(["--out", str(tmp_path / "x")]) == 2


def test_too_short_data_exit_65(tmp_path, capsys):
    rc = main([str(SAMPLE), "--strategy", "momentum", "--set", "splits.train=100000", "--out", str(tmp_path / "r"),
               "--progress", "none"])
    assert rc == 65 and "data too short for one fold" in capsys.readouterr().err


def test_module_entry_point_subprocess(tmp_path):
    """`python -m workbench.walkforward` as a user runs it: stdout ends with the run directory."""
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "workbench.walkforward", str(SAMPLE), "--out", str(out),
                        "--strategy", "buy-and-hold", "--set", "splits.max_folds=2"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == str(out)
    assert "fold 2/2 done" in p.stderr  # not a terminal: plain progress lines


def test_live_dashboard_renders(tmp_path):
    from rich.console import Console

    from workbench.dashboard import LiveDashboard
    from workbench.engine import WalkForward
    from workbench.config import load_config

    console = Console(file=open(tmp_path / "screen.txt", "w"), force_terminal=True, width=120)
    WalkForward(load_config(None, ["splits.max_folds=2", 'strategy.name="buy-and-hold"'])).run(
        str(SAMPLE), progress=LiveDashboard(console))
    console.file.close()
    screen = (tmp_path / "screen.txt").read_text()
    assert "workbench walk-forward" in screen and "folds 2/2" in screen and "done" in screen


def test_dqn_main_command_on_the_cpu_backend(tmp_path, capsys):
    """The default strategy trains the agent per fold (CPU reference backend here), with a tiny budget."""
    out = tmp_path / "run"
    rc = main([str(SAMPLE), "--device", "cpu", "--epochs", "2", "--max-steps-per-epoch", "20", "--out", str(out),
               "--progress", "plain", "--set", "splits.max_folds=2", "--set", "training.rollout_steps=16",
               "--set", "training.learning_starts=256"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "epoch 2/2: init=0.0 experience=" in cap.err and "training=" in cap.err and "validation=" in cap.err
    assert "agent against the rule baselines" in cap.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"].startswith("cpu reference backend")
    assert set(summary["baselines"]) == {"buy-and-hold", "momentum"}
    log = json.loads((out / "fold_001" / "epochs.json").read_text())
    assert log["annualization"].startswith("daily returns") and log["selected_by"] == "bar_t"
    assert log["chosen_epoch"] in (1, 2)
    epochs = log["epochs"]
    assert len(epochs) == 2 and epochs[1]["updates"] == 20 and epochs[0]["ms"]["init"] > 0
    assert [e["epoch"] for e in epochs] == [1, 2] and all("val_bar_t" in e for e in epochs)
    import numpy as np

    w = np.load(out / "fold_001" / "weights.npy")
    assert w.dtype == np.float32 and np.isfinite(w).all()
    m = json.loads((out / "fold_002" / "metrics.json").read_text())
    assert m["strategy"] == "dqn" and m["best_epoch"] in (1, 2) and m["commission_usd"] >= 0
    assert m["selected_by"] == "bar_t" and "chosen epoch" in cap.err


def test_resume_keeps_finished_folds(tmp_path, capsys):
    out = tmp_path / "run"
    args = [str(SAMPLE), "--strategy", "momentum", "--out", str(out), "--progress", "none", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    # an interrupted run: the last two folds never finished
    import shutil

    for k in (4, 5):
        shutil.rmtree(out / f"fold_{k:03d}")
    stamp = (out / "fold_001" / "metrics.json").stat().st_mtime_ns
    assert main([str(SAMPLE), "--resume", str(out), "--progress", "none", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (out / "fold_001" / "metrics.json").stat().st_mtime_ns == stamp  # not recomputed
    assert (out / "fold_005").is_dir()
    assert again["stitched_oos"]["net_pnl_usd"] == pytest.approx(first["stitched_oos"]["net_pnl_usd"])
    rc = main([str(SAMPLE), "--resume", str(out), "--set", "splits.embargo=10", "--progress", "none"])
    err = capsys.readouterr().err
    assert rc == 78 and "the config differs from the run's: splits.embargo: 60 -> 10" in err
    assert err.count("workbench: error") == 1 and "workbench: data:" not in err  # refused before reading the data
    # how folds are scheduled never changes results: a resume may change it
    assert main([str(SAMPLE), "--resume", str(out), "--set", "gpu.population=1", "--progress", "none"]) == 0
    assert main([str(SAMPLE), "--resume", str(tmp_path / "nowhere"), "--progress", "none"]) == 2


def test_gpu_size_overrides_reach_the_trainer(tmp_path, capsys):
    import numpy as np

    from workbench.agent.network import NetShape

    out = tmp_path / "run"
    rc = main([str(SAMPLE), "--device", "cpu", "--epochs", "1", "--max-steps-per-epoch", "2", "--out", str(out),
               "--progress", "none", "--set", "splits.max_folds=1", "--set", "training.rollout_steps=8",
               "--set", "training.learning_starts=64", "--set", "gpu.hidden=16", "--set", "gpu.atoms=11",
               "--set", "gpu.batch=32", "--set", "gpu.n_envs=8"])
    assert rc == 0, capsys.readouterr().err
    w = np.load(out / "fold_001" / "weights.npy")
    n_features = 16  # the sample's feature count (with order flow)
    assert w.size == NetShape(obs_dim=n_features + 7, hidden=16, atoms=11).n_params
    assert main([str(SAMPLE), "--set", "gpu.atoms=1", "--out", str(tmp_path / "bad"), "--progress", "none"]) == 78


GOLDEN_ARGS = ["--device", "cpu", "--epochs", "2", "--max-steps-per-epoch", "20", "--set", "splits.max_folds=2",
               "--set", "training.rollout_steps=16", "--set", "training.learning_starts=256", "--progress", "none"]


def test_cpu_walkforward_summary_is_byte_identical_to_the_golden_file(tmp_path, capsys):
    """Refactors keep behaviour: the agent's CPU walk-forward on the sample writes the same summary.json,
    byte for byte, as tests/data/golden_cpu_summary.json (written before the #14 renovation at 7d75f10).
    A deliberate change of results regenerates it: python -m workbench.walkforward data/es_sample.parquet
    <GOLDEN_ARGS> --out RUN, then copy RUN/summary.json, and say why in the commit."""
    out = tmp_path / "run"
    assert main([str(SAMPLE), *GOLDEN_ARGS, "--out", str(out)]) == 0, capsys.readouterr().err
    golden = ROOT / "tests" / "data" / "golden_cpu_summary.json"
    assert (out / "summary.json").read_bytes() == golden.read_bytes()
