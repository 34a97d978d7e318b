"""Folds and search trials on several workers: spawned processes (--workers) and a Dask cluster
(--scheduler, here a LocalCluster whose workers advertise one logical GPU each). Results and resume
are the same as in one process, and a worker killed mid-run loses no finished fold."""
from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np
import pandas as pd
import pytest

from conftest import SAMPLE
from workbench.config import load_config
from workbench.dashboard import PlainProgress
from workbench.engine import WalkForward
from workbench.executor import DaskExecutor, ProcessExecutor, make_executor
from workbench.errors import ConfigError
from workbench.rundir import RunDir

distributed = pytest.importorskip("distributed")

TINY = ["--device", "cpu", "--epochs", "1", "--max-steps-per-epoch", "3", "--set", "splits.max_folds=3",
        "--progress", "none", "--json"]
TINY_CFG = ['device="cpu"', "training.epochs=1", "training.max_steps_per_epoch=3", "splits.max_folds=3"]

pytestmark = pytest.mark.slow  # several spawned processes and clusters; CI still runs it


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"GPU": 1},
                      dashboard_address=None) as c:
        yield c


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The tiny walk-forward in one process: what every executor must reproduce."""
    from workbench.walkforward import main

    out = tmp_path_factory.mktemp("ref") / "run"
    assert main([str(SAMPLE), *TINY, "--out", str(out)]) == 0
    return out


def _fold_files(run) -> dict:
    """Per fold: metrics (without timing), trades and the selected weights."""
    out = {}
    for d in sorted(run.glob("fold_*")):
        if not d.is_dir():
            continue
        m = json.loads((d / "metrics.json").read_text())
        m = {k: v for k, v in m.items() if not k.endswith("_ms")}
        out[d.name] = (m, pd.read_parquet(d / "trades.parquet"), np.load(d / "weights.npy"))
    return out


def _same_run(a, b) -> None:
    fa, fb = _fold_files(a), _fold_files(b)
    assert list(fa) == list(fb) == ["fold_001", "fold_002", "fold_003"]
    for k in fa:
        assert fa[k][0] == fb[k][0], k
        pd.testing.assert_frame_equal(fa[k][1], fb[k][1])
        assert np.array_equal(fa[k][2], fb[k][2]), k
    sa, sb = (json.loads((r / "summary.json").read_text())["stitched_oos"] for r in (a, b))
    assert sa == sb


def test_process_workers_reproduce_the_run_and_resume(tmp_path, reference, capsys):
    import shutil

    from workbench.walkforward import main

    out = tmp_path / "run"
    assert main([str(SAMPLE), *TINY, "--workers", "2", "--out", str(out)]) == 0
    _same_run(reference, out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "2 spawned worker processes (CPU only)"
    # a fold lost from the run directory: --resume with workers runs only that one, to the same result
    kept = (out / "fold_001" / "metrics.json").stat().st_mtime_ns
    shutil.rmtree(out / "fold_002")
    assert main([str(SAMPLE), "--resume", str(out), "--workers", "2", "--progress", "none", "--json"]) == 0
    assert (out / "fold_001" / "metrics.json").stat().st_mtime_ns == kept
    _same_run(reference, out)


class StartOrder(PlainProgress):
    def __init__(self):
        super().__init__(open(os.devnull, "w"))
        self.order = []

    def fold_started(self, k, ranges):
        self.order.append(k)


def test_gpu_workers_each_train_a_share_of_the_folds(tmp_path, reference):
    """Workers that hold a GPU each get a share of the folds at once (every n-th fold) and train it as
    populations there; here the plumbing runs on CPU workers, which train their share one fold after
    another: the same run as in one process, and the shares start together."""
    cfg = load_config(None, TINY_CFG)
    ex = ProcessExecutor(2)
    ex.gpu_workers = True
    progress = StartOrder()
    try:
        WalkForward(cfg).run(str(SAMPLE), progress=progress, run_dir=RunDir(tmp_path / "run"), executor=ex)
    finally:
        ex.close()
    _same_run(reference, tmp_path / "run")
    assert progress.order == [0, 2, 1]  # shares [fold 1, fold 3] and [fold 2], each started whole


class KillWorkers(PlainProgress):
    """When the first fold finishes, kill (SIGKILL) the workers ``pick()`` names (running other folds)."""

    def __init__(self, pick):
        super().__init__(open(os.devnull, "w"))
        self.pick, self.killed, self.finished_before_kill = pick, [], []

    def fold_finished(self, res, seconds):
        if not self.killed:
            self.finished_before_kill.append(res.fold)
            for pid in self.pick():
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)


def _kill_test(tmp_path, reference, executor, pick):
    cfg = load_config(None, TINY_CFG)
    progress = KillWorkers(pick)
    out = tmp_path / "run"
    res = WalkForward(cfg).run(str(SAMPLE), progress=progress, run_dir=RunDir(out), executor=executor)
    assert progress.killed, "no worker was busy when the first fold finished"
    assert all(f.ok for f in res.fold_results), [f.error for f in res.fold_results]
    first = progress.finished_before_kill[0]
    assert (out / f"fold_{first:03d}" / "metrics.json").is_file()
    assert (out / "summary.json").is_file()  # written at the end: the run completed
    _same_run(reference, out)  # the killed worker's fold ran again, to the same result


def test_killed_process_worker_loses_no_fold(tmp_path, reference):
    ex = ProcessExecutor(2)
    try:
        _kill_test(tmp_path, reference, ex, lambda: ex.busy_pids()[:1])  # one worker, mid-fold
    finally:
        ex.close()


def test_dask_cluster_runs_walkforward_and_survives_a_killed_worker(tmp_path, reference, cluster):
    from distributed import Client

    from workbench.walkforward import main

    out = tmp_path / "cli"
    assert main([str(SAMPLE), *TINY, "--scheduler", cluster.scheduler_address, "--out", str(out)]) == 0
    _same_run(reference, out)
    assert "2 GPU(s)" in json.loads((out / "summary.json").read_text())["backend"]

    client = Client(cluster.scheduler_address)
    ex = DaskExecutor(client)

    def busy_and_holding_the_bars():
        """A worker running a fold, and every worker holding a copy of the bars: the job must be rerun and
        the bars rebuilt from the task graph (scattered data would be lost with them)."""
        busy = [w for w, keys in client.processing().items() if keys][:1]
        holders = [w for w, keys in client.has_what().items() if any(str(k).startswith("loads-") for k in keys)]
        assert holders, "no worker holds the bars"
        pids = client.run(os.getpid, workers=sorted(set(busy + holders)))
        return list(pids.values())

    try:
        _kill_test(tmp_path / "kill", reference, ex, busy_and_holding_the_bars)
    finally:
        client.close()


def test_search_on_workers_matches_in_process(tmp_path, cluster, capsys):
    from test_hyperopt import BUDGET, TINY as BOUNDS

    from workbench.hyperopt.__main__ import main

    bounds = tmp_path / "b.toml"
    bounds.write_text(BOUNDS)
    logs = {}
    for name, extra in (("inline", []), ("workers", ["--workers", "2"]),
                        ("dask", ["--scheduler", cluster.scheduler_address])):
        out = tmp_path / name
        assert main([str(SAMPLE), "--trials", "5", "--bounds", str(bounds), "--out", str(out), "--no-test",
                     *BUDGET, *extra]) == 0
        logs[name] = pd.read_parquet(out / "trials.parquet").drop(columns="seconds")
    assert list(logs["inline"]["trial"]) == [1, 2, 3, 4, 5]  # counted from 1
    pd.testing.assert_frame_equal(logs["workers"], logs["inline"])
    pd.testing.assert_frame_equal(logs["dask"], logs["inline"])
    # resume a search stopped while an iteration's particles ran side by side: particle 1 of
    # iteration 1 (trial 4) finished, particle 0 (trial 3) did not
    out = tmp_path / "workers"
    logs["workers"].drop(index=3).assign(seconds=1.0).to_parquet(out / "trials.parquet")
    assert main([str(SAMPLE), "--trials", "5", "--bounds", str(bounds), "--resume", str(out), "--no-test",
                 *BUDGET, "--workers", "2"]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "trials.parquet").drop(columns="seconds"), logs["inline"])


def test_local_dask_cluster(tmp_path, reference):
    from workbench.walkforward import main

    out = tmp_path / "run"
    assert main([str(SAMPLE), *TINY, "--scheduler", "local", "--workers", "2", "--out", str(out)]) == 0
    _same_run(reference, out)


def test_executor_errors_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="--workers must be >= 1"):
        make_executor(0, None, "cpu")
    with pytest.raises(ConfigError, match="only 1 GPU"):
        ProcessExecutor(2, ["0"])
    with pytest.raises(ConfigError, match="--workers goes with --scheduler local only"):
        make_executor(2, "tcp://x:1", "cpu")
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        DaskExecutor("tcp://127.0.0.1:9", timeout="1s")


def visible_devices(_job: int) -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "unset")


def test_workers_are_pinned_to_one_gpu_each():
    """Each worker sees only its own GPU. Without a GPU the ids are labels nothing touches; on a GPU
    machine they must be real (Dask's worker monitor asks NVML about its visible device)."""
    from distributed import Client

    from cuda_kernels.nb import gpu_available
    from workbench.executor import local_cluster, visible_gpus

    labels = visible_gpus()[:2] if gpu_available() else ["3", "5"]
    ex = ProcessExecutor(len(labels), labels)
    try:
        seen = dict(ex.imap_unordered(visible_devices, [(i,) for i in range(4)]))
    finally:
        ex.close()
    assert sorted(set(seen.values())) == sorted(labels)
    with local_cluster(len(labels), labels, prefer_dask_cuda=False) as cluster, Client(cluster) as client:
        pinned = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        assert sorted(pinned.values()) == sorted(labels)
        assert all(w["resources"] == {"GPU": 1} for w in client.scheduler_info()["workers"].values())


def cut_mid_send(marker: str, nbytes: int) -> bytes:
    """A job whose worker dies while a large result leaves it: on the first run, every pipe write of more
    than 64 KiB from this process stops halfway and the process is SIGKILLed (what an OOM kill or a crash
    at that moment does)."""
    from multiprocessing.connection import Connection

    if not os.path.exists(marker):
        open(marker, "w").close()
        send = Connection._send

        def cut(self, buf):
            if len(buf) > 1 << 16:
                send(self, memoryview(buf)[: len(buf) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            send(self, buf)

        Connection._send = cut
    return b"x" * nbytes


def test_a_worker_killed_while_handing_over_a_large_result_does_not_hang_the_run(tmp_path):
    """CPython's process pool waits forever for the rest of a result its dead worker was writing (the
    parent holds the pipe's write end, so no end of file comes): results come back through a file."""
    ex = ProcessExecutor(1)
    out = []
    job = threading.Thread(target=lambda: out.extend(ex.imap_unordered(cut_mid_send, [(str(tmp_path / "m"), 8 << 20)])),
                           daemon=True)
    job.start()
    job.join(120)
    if job.is_alive():  # unblock the pool's reader so that this process can still exit
        ex._pools[0]._result_queue._writer.close()
        pytest.fail("the run still waits, 120 s on, for a result its killed worker was sending")
    ex.close()
    assert out == [(0, b"x" * (8 << 20))]
