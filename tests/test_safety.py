"""Never lose a user's file, resume only what matches, one-line errors for bad paths and inputs (#13)."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from workbench.errors import UsageError
from workbench.rundir import LOCK, MARKER, RunDir
from workbench.walkforward import main

from conftest import ROOT, SAMPLE, simple_frame

MOMENTUM = ["--strategy", "momentum", "--progress", "none", "--set", "splits.max_folds=1"]
TINY_AGENT = ["--device", "cpu", "--epochs", "1", "--max-steps-per-epoch", "5", "--set", "splits.max_folds=1",
              "--set", "training.rollout_steps=8", "--set", "training.learning_starts=64", "--progress", "none"]


def _one_line_error(capsys, rc, code, text):
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert rc == code, err
    assert len(err) == 1 and err[0].startswith("workbench: error: ") and text in err[0], err
    assert "Traceback" not in err[0]


def _cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "workbench.walkforward", *args], cwd=kw.get("cwd", ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_force_empties_only_workbench_run_directories(tmp_path, capsys, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's own file")
    rc = main([str(SAMPLE), *MOMENTUM, "--out", str(mine), "--force"])
    _one_line_error(capsys, rc, 2, "holds files the workbench did not write")
    assert (mine / "notes.txt").read_text() == "a user's own file"
    monkeypatch.chdir(mine)  # --out . in a user's folder: refused the same way, nothing removed
    rc = main([str(SAMPLE), *MOMENTUM, "--out", ".", "--force"])
    _one_line_error(capsys, rc, 2, "did not write")
    assert (mine / "notes.txt").is_file()
    # a run directory is ours: --force empties it and runs again
    run = tmp_path / "run"
    assert main([str(SAMPLE), *MOMENTUM, "--out", str(run)]) == 0
    assert json.loads((run / MARKER).read_text())["kind"] == "walkforward" and not (run / LOCK).exists()
    (run / "stale.txt").write_text("left by that run")
    assert main([str(SAMPLE), *MOMENTUM, "--out", str(run), "--force"]) == 0
    assert not (run / "stale.txt").exists() and (run / "fold_001").is_dir()
    capsys.readouterr()
    # never the working directory, even when it is a run directory
    monkeypatch.chdir(run)
    rc = main([str(SAMPLE), *MOMENTUM, "--out", ".", "--force"])
    _one_line_error(capsys, rc, 2, "it is the working directory")
    assert (run / "fold_001").is_dir()


def test_a_second_run_into_a_locked_directory_is_refused_naming_the_pid(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from workbench.rundir import RunDir; "
                               f"d = RunDir({str(run)!r}); print('locked', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        rc = main([str(SAMPLE), *MOMENTUM, "--out", str(run), "--force"])
        _one_line_error(capsys, rc, 2, f"is in use by PID {holder.pid}")
        rc = main([str(SAMPLE), *MOMENTUM, "--resume", str(run)])
        _one_line_error(capsys, rc, 2, f"is in use by PID {holder.pid}")
    finally:
        holder.kill()  # SIGKILL: its lock is stale now
        holder.wait()
    assert main([str(SAMPLE), *MOMENTUM, "--out", str(run), "--force"]) == 0
    assert f"took over the lock of PID {holder.pid}" in capsys.readouterr().err


def test_a_run_refused_while_the_holder_writes_its_record_still_names_it(tmp_path):
    """The holder takes the lock, then writes its PID: a run refused in between (what two runs started
    together can meet) waits for the record instead of naming no process."""
    run = tmp_path / "run"
    RunDir(run).close()  # a finished run's directory (resumed below: both runs reach the lock)
    holder = subprocess.Popen([sys.executable, "-c", "import os, sys, time; real = os.ftruncate\n"
                               "def slow(fd, n):\n    print('locked', flush=True); time.sleep(0.5); return real(fd, n)\n"
                               "os.ftruncate = slow\n"
                               f"from workbench.rundir import RunDir; d = RunDir({str(run)!r}, resume=True); "
                               "time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"  # it holds the lock; its record is not written yet
        with pytest.raises(UsageError, match=f"in use by PID {holder.pid} "):
            RunDir(run, resume=True)
    finally:
        holder.kill()
        holder.wait()


def test_a_run_between_its_lock_and_its_marker_is_named_not_mistaken_for_user_files(tmp_path):
    """A new run takes the directory's lock before it writes its marker; a second run arriving in between
    (CI saw it: two runs started together) must name the first one's PID, not call its lock file one
    the workbench did not write."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from workbench.rundir import RunDir\n"
                               "def slow(self):\n    print('locked', flush=True); time.sleep(60)\n"
                               "RunDir._mark = slow\n"
                               f"RunDir({str(run)!r}, force=True)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert not (run / MARKER).exists() and (run / LOCK).exists()
        for force in (False, True):
            with pytest.raises(UsageError, match=f"in use by PID {holder.pid} "):
                RunDir(run, force=force)
    finally:
        holder.kill()
        holder.wait()
    # that run died there: only its lock is left, so the directory is as good as empty (no --force needed)
    d = RunDir(run)
    assert (run / MARKER).is_file()
    d.close()


def test_a_stale_lock_beside_user_files_still_protects_them(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text("{}")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds files the workbench did not write"):
        RunDir(run, force=True)
    assert (run / "notes.txt").read_text() == "mine" and (run / LOCK).exists() and not (run / MARKER).exists()


@pytest.mark.slow
def test_two_runs_started_together_one_wins(tmp_path):
    run = tmp_path / "run"
    procs = [_cli(str(SAMPLE), *TINY_AGENT, "--out", str(run), "--force") for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    rcs = [p.returncode for p in procs]
    assert sorted(rcs) == [0, 2], [o[1][-500:] for o in outs]
    loser, winner = (0, 1) if rcs[0] == 2 else (1, 0)
    assert f"in use by PID {procs[winner].pid}" in outs[loser][1]
    assert (run / "fold_001" / "metrics.json").is_file()


def test_resume_refuses_another_data_file(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([str(SAMPLE), *MOMENTUM, "--out", str(run)]) == 0
    other = tmp_path / "other.parquet"
    raw = pd.read_parquet(SAMPLE)
    raw.loc[raw.index[-1], "volume"] = raw["volume"].iloc[-1] + 1  # one number differs
    raw.to_parquet(other)
    capsys.readouterr()
    rc = main([str(other), "--resume", str(run), "--progress", "none"])
    _one_line_error(capsys, rc, 65, "its data differ: the run read es_sample.parquet")
    # the same data under another name is the same input
    same = tmp_path / "copy.parquet"
    same.write_bytes(SAMPLE.read_bytes())
    assert main([str(same), "--resume", str(run), "--progress", "none"]) == 0


def test_path_errors_are_one_line_with_sysexits_codes(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    rc = main([str(SAMPLE), *MOMENTUM, "--out", str(a_file)])
    _one_line_error(capsys, rc, 73, "it is a file")
    rc = main([str(SAMPLE), *MOMENTUM, "--out", str(tmp_path / ("r" * 300))])
    _one_line_error(capsys, rc, 73, "File name too long")
    rc = main([str(SAMPLE), *MOMENTUM, "--out", str(tmp_path / "/".join(["d" * 200] * 25))])
    _one_line_error(capsys, rc, 73, "cannot create")
    rc = main([str(tmp_path / ("x" * 300 + ".parquet")), *MOMENTUM, "--out", str(tmp_path / "r2")])
    _one_line_error(capsys, rc, 66, "File name too long")

    real_mkdir = os.mkdir

    def read_only(path, *a, **k):
        if "ro_parent" in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", read_only)
    rc = main([str(SAMPLE), *MOMENTUM, "--out", str(tmp_path / "ro_parent" / "run")])
    _one_line_error(capsys, rc, 73, "Permission denied")
    monkeypatch.setattr(os, "mkdir", real_mkdir)

    real_to_parquet = pd.DataFrame.to_parquet

    def disk_full(self, path, *a, **k):  # the disk fills up while a fold is written
        if ".fold_" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_to_parquet(self, path, *a, **k)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full)
    rc = main([str(SAMPLE), *MOMENTUM, "--out", str(tmp_path / "full")])
    _one_line_error(capsys, rc, 74, "No space left on device")
    assert not (tmp_path / "full" / LOCK).exists()  # the lock went with the failed run


@pytest.mark.parametrize("kind,code,text", [
    ("both_cases", 65, "columns named alike: 'Close', 'close'"),
    ("two_close", 65, "columns named alike: 'close'"),
    ("no_header", 65, "has no header row"),
    ("empty_dir", 66, "no parquet files in directory"),
])
def test_bad_files_name_the_real_problem(kind, code, text, tmp_path, capsys):
    df = simple_frame(50).reset_index()
    path = tmp_path / f"{kind}.csv"
    if kind == "both_cases":
        df.assign(Close=df["close"]).to_csv(path, index=False)
    elif kind == "two_close":
        path.write_text("ts,open,high,low,close,close,volume\n2024-03-04 14:30,1,2,0.5,1.5,1.6,10\n")
    elif kind == "no_header":
        df.to_csv(path, index=False, header=False)
    elif kind == "empty_dir":
        path = tmp_path / "empty"
        path.mkdir()
    rc = main([str(path), *MOMENTUM, "--out", str(tmp_path / "run")])
    _one_line_error(capsys, rc, code, text)


def test_semicolon_csv_is_read(tmp_path):
    df = simple_frame(60).reset_index()
    path = tmp_path / "semi.csv"
    df.to_csv(path, sep=";", index=False)
    from workbench.data import load_bars

    bars = load_bars(path)
    assert len(bars) == 60 and np.allclose(bars.column("close"), df["close"])


def test_non_finite_and_out_of_range_settings_are_refused(tmp_path, capsys):
    for setting, text in (("training.lr=inf", "'training.lr' must be a finite number"),
                          ("training.per_alpha=2.0", "per_alpha"), ("backtest.ruin_fraction=1.5", "ruin_fraction")):
        rc = main([str(SAMPLE), *MOMENTUM, "--out", str(tmp_path / "r"), "--set", setting])
        _one_line_error(capsys, rc, 78, text)
    assert not (tmp_path / "r" / "config.toml").exists()


def test_synthetic_errors_are_one_line(tmp_path, capsys):
    from workbench.synthetic import main as synthetic

    rc = synthetic([str(tmp_path / "x.parquet"), "--bars", "10", "--start", "not a time"])
    _one_line_error(capsys, rc, 2, "--start 'not a time' is not a time")
    rc = synthetic([str(tmp_path / "missing" / "x.parquet"), "--bars", "10"])
    _one_line_error(capsys, rc, 73, "does not exist")


@pytest.mark.slow
@pytest.mark.parametrize("sig,code,what", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signals_restore_the_terminal_keep_folds_and_say_how_to_resume(sig, code, what, tmp_path):
    import pty

    run = tmp_path / "run"
    master, slave = pty.openpty()  # stderr is a terminal: the live dashboard hides the cursor
    env = {**os.environ, "COLUMNS": "80", "LINES": "30"}
    p = subprocess.Popen([sys.executable, "-m", "workbench.walkforward", str(SAMPLE), "--device", "cpu", "--epochs", "3",
                          "--max-steps-per-epoch", "30", "--set", "training.rollout_steps=8", "--set",
                          "training.learning_starts=64", "--out", str(run), "--progress", "live"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    seen = b""
    deadline = time.time() + 120
    while not (run / "fold_001" / "metrics.json").is_file() and time.time() < deadline:
        try:
            seen += os.read(master, 65536)
        except OSError:
            break
    assert (run / "fold_001").is_dir(), seen[-500:]
    p.send_signal(sig)
    p.wait(timeout=60)
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    text = seen.decode(errors="replace")
    assert p.returncode == code, text[-800:]
    assert "\x1b[?25l" in text and text.rfind("\x1b[?25h") > text.rfind("\x1b[?25l")  # the cursor shown again
    assert f"workbench: error: {what}" in text and f"--resume {run}" in text
    assert (run / "fold_001" / "metrics.json").is_file() and not (run / LOCK).exists()


def test_dashboard_fits_80_columns_with_many_folds():
    from rich.console import Console

    from workbench.agent.trainer import EpochLog
    from workbench.dashboard import LiveDashboard
    from workbench.results import FoldResult

    console = Console(width=80, height=40, record=True, file=open(os.devnull, "w"), force_terminal=True)
    d = LiveDashboard(console=console)
    d.start(34, {"data": "es_lean_algoseek_2013_1min_all_contracts.parquet", "market": "ES", "strategy": "dqn",
                 "bars": 240000, "backend": "gpu NVIDIA H200 (140 GiB), profile h200, gemm cublas"})
    for k in range(34):
        d.fold_started(k, {"test": "2024-03-01 07:28 .. 2024-03-07 16:52"})
        if k < 30:
            m = {"net_pnl_usd": -1234567.8, "sharpe": -12.3456, "days": 5, "few_days": True, "trades": 12345,
                 "best_epoch": 7, "selected_by": "bar_t", "best_val_score": 2.1}
            d.fold_finished(FoldResult(k + 1, "dqn", pd.DataFrame(), pd.DataFrame(), m, {}), 12.34)
    for e in range(1, 9):
        ms = {"init": 6123.4 if e == 1 else 0.0, "experience": 15.6, "training": 197.8, "validation": 1.7,
              "total": 215.2}
        d.epoch(33, EpochLog(e, 0.05, 100000, 400, 3.1234, 1.2, 12.3, False, -20.95, -1491.0, 5, -2000.0, 2.34, 6000, ms),
                8)
    d.close()
    rec = Console(width=80, height=40, record=True, file=open(os.devnull, "w"))
    rec.print(d._render())
    text = rec.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and len(lines) <= 40
    assert "…" not in text  # columns dropped, numbers never cut
    assert "-1,234,568" in text and "-12.35 (5 d, few)" in text and "197.8" in text  # PnL, Sharpe, training ms
    assert "26 more folds not shown (26 finished)" in text and "34" in text  # the running folds stay in view
    assert "ETA" in text or "elapsed" in text
    assert "epoch" in text and " 7 " in text  # the chosen epoch per fold


def test_result_tables_fit_a_pipe(tmp_path):
    p = subprocess.run([sys.executable, "-m", "workbench.walkforward", str(SAMPLE), "--strategy", "momentum",
                        "--out", str(tmp_path / "run"), "--progress", "none"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert max(len(line) for line in p.stdout.splitlines()) <= 80 and "…" not in p.stdout
