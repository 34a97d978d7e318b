"""Independent jobs (walk-forward folds, search trials) on several GPUs, processes or hosts.

One small interface, three implementations:

- :class:`InlineExecutor` -- in this process, one job after another (the default; live epoch progress).
- :class:`ProcessExecutor` -- ``--workers N``: N spawned processes on this host, each pinned to one GPU
  by ``CUDA_VISIBLE_DEVICES`` set in the child before its first CUDA call (on the CPU backend, N CPU
  processes with no GPU visible). A worker that dies is restarted on its GPU and its job run again;
  results come back through a file, so a worker killed while handing one over cannot hang the run.
- :class:`DaskExecutor` -- ``--scheduler ADDRESS``: Dask's distributed scheduler across hosts. Workers
  are started on each host with one GPU each (``dask-cuda-worker ADDRESS`` pins them, or
  ``CUDA_VISIBLE_DEVICES=i dask worker ADDRESS --nthreads 1 --resources GPU=1``); each job asks for one
  ``GPU`` resource when the workers advertise it. The scheduler re-runs the job of a lost worker.
  ``--scheduler local`` starts such a cluster on this host (dask-cuda's ``LocalCUDACluster`` where
  installed, else one pinned nanny per GPU).

``imap_unordered(fn, jobs)`` yields ``(index, result)`` as jobs finish, with at most ``slots`` jobs in
flight; a job whose worker was lost more than ``retries`` times yields a :class:`WorkerLost`. The caller
(the engine, the search) writes every result as it arrives, so a finished fold or trial is on disk
before the next one is awaited, and resume works exactly as in one process. Jobs are top-level
functions of picklable arguments; their seeds come from the config and the fold or trial number,
never from the worker, so the results do not depend on which worker ran what.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import pickle
import tempfile
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

from .errors import ConfigError


class WorkerLost(RuntimeError):
    """The process running a job died (killed, out of memory, driver fault) more often than allowed."""


class Shared:
    """A large read-only argument (the bars) sent to each worker once, not with every job."""

    def __init__(self, path: str):
        self.path = path


_SHARED_CACHE: dict[str, object] = {}


def resolve(obj):
    """In a job: the object behind a :class:`Shared` handle (loaded once per process), else ``obj``."""
    if isinstance(obj, Shared):
        if obj.path not in _SHARED_CACHE:
            _SHARED_CACHE[obj.path] = _read(obj.path)
        return _SHARED_CACHE[obj.path]
    return obj


class InlineExecutor:
    slots = 1
    live_progress = True  # jobs run here, so the epoch table can follow them
    gpu_workers = False  # (this process trains its folds as populations itself where it has a GPU)

    def share(self, obj):
        return obj

    def imap_unordered(self, fn: Callable, jobs: list[tuple], on_start=None) -> Iterator[tuple[int, object]]:
        for i, args in enumerate(jobs):
            if on_start:
                on_start(i)
            yield i, fn(*args)

    def describe(self) -> str:
        return "in process"

    def close(self) -> None:
        pass


def _pin(visible: str) -> None:
    """Worker initializer: runs in the child before any job, so before its first CUDA call."""
    os.environ["CUDA_VISIBLE_DEVICES"] = visible


def _write(obj, path: str) -> None:
    """``obj`` pickled to ``path``, whole (written beside it, then renamed): :class:`ProcessExecutor`'s
    shared arguments and its jobs' results."""
    with open(path + ".part", "wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(path + ".part", path)


def _read(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)


def _job_to_file(fn: Callable, args: tuple, path: str) -> str:
    """Worker side of :class:`ProcessExecutor`: run the job and write its result to ``path``, returning
    only the path. A result sent through the pool's pipe is written in pieces when it is large, and a
    worker killed between two pieces leaves the parent's reader waiting forever for the rest (CPython's
    ``ProcessPoolExecutor`` keeps the pipe's write end open in the parent, so no end of file comes). The
    path is one short message: a pipe write that small is atomic (POSIX, PIPE_BUF)."""
    _write(fn(*args), path)
    return path


def _load_result(path: str):
    """A job's result written by :func:`_job_to_file`, its file removed."""
    result = _read(path)
    os.unlink(path)
    return result


def visible_gpus() -> list[str]:
    """GPU ids this process may hand out: ``CUDA_VISIBLE_DEVICES`` if set, else every device the driver sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    from cuda_kernels.nb import gpu_available

    if not gpu_available():
        return []
    from .device import device_count

    return [str(i) for i in range(device_count())]


class ProcessExecutor:
    """``n`` spawned worker processes on this host, one per GPU (``gpus``) or, with no GPU, CPU-only."""

    live_progress = False

    def __init__(self, n: int, gpus: list[str] | None = None, retries: int = 2):
        if n < 1:
            raise ConfigError(f"--workers must be >= 1, got {n}")
        self.gpus = list(gpus or [])
        if self.gpus and n > len(self.gpus):
            raise ConfigError(f"--workers {n} but only {len(self.gpus)} GPU(s) visible ({','.join(self.gpus)})",
                              "one worker per GPU: use fewer workers, or --device cpu")
        self.slots, self.retries = n, retries
        self.gpu_workers = bool(self.gpus)  # each worker holds one GPU: it trains a share of the folds as populations
        self.visible = [self.gpus[i] if self.gpus else "" for i in range(n)]  # "" hides every GPU
        self._ctx = mp.get_context("spawn")
        self._pools: list[cf.ProcessPoolExecutor | None] = [None] * n
        self._tmp = tempfile.TemporaryDirectory(prefix="workbench-shared-")
        self._shared = 0
        self._busy: set[int] = set()

    def _pool(self, slot: int) -> cf.ProcessPoolExecutor:
        if self._pools[slot] is None:
            self._pools[slot] = cf.ProcessPoolExecutor(1, mp_context=self._ctx, initializer=_pin,
                                                       initargs=(self.visible[slot],))
        return self._pools[slot]

    def busy_pids(self) -> list[int]:
        """Pids of the worker processes running a job now (for tests that kill one mid-job)."""
        pools = [self._pools[slot] for slot in self._busy]
        return [pid for p in pools if p is not None for pid in (getattr(p, "_processes", None) or {})]

    def _submit(self, slot: int, fn, args) -> cf.Future:
        try:
            return self._pool(slot).submit(fn, *args)
        except cf.process.BrokenProcessPool:  # its process died while idle: start a fresh one
            self._reset(slot)
            return self._pool(slot).submit(fn, *args)

    def _reset(self, slot: int) -> None:
        self._pools[slot].shutdown(wait=False, cancel_futures=True)
        self._pools[slot] = None

    def share(self, obj) -> Shared:
        path = Path(self._tmp.name) / f"shared_{self._shared}.pkl"
        self._shared += 1
        _write(obj, str(path))
        return Shared(str(path))

    def imap_unordered(self, fn: Callable, jobs: list[tuple], on_start=None) -> Iterator[tuple[int, object]]:
        todo = deque(range(len(jobs)))
        attempts = [0] * len(jobs)
        running: dict[cf.Future, tuple[int, int]] = {}  # future -> (job, slot)
        free = deque(range(self.slots))
        while todo or running:
            while todo and free:
                i, slot = todo.popleft(), free.popleft()
                if on_start and attempts[i] == 0:
                    on_start(i)
                path = str(Path(self._tmp.name) / f"result_{i}_{attempts[i]}.pkl")
                running[self._submit(slot, _job_to_file, (fn, jobs[i], path))] = (i, slot)
                self._busy.add(slot)
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                i, slot = running.pop(fut)
                free.append(slot)
                self._busy.discard(slot)
                try:
                    result = _load_result(fut.result())
                except cf.process.BrokenProcessPool:  # the worker died: a fresh one on the same GPU
                    self._reset(slot)
                    attempts[i] += 1
                    if attempts[i] <= self.retries:
                        todo.appendleft(i)
                        continue
                    result = WorkerLost(f"job {i}: its worker process died {attempts[i]} times")
                yield i, result

    def describe(self) -> str:
        where = f"GPUs {','.join(self.gpus)}" if self.gpus else "CPU only"
        return f"{self.slots} spawned worker processes ({where})"

    def close(self) -> None:
        for p in self._pools:
            if p is not None:
                p.shutdown(wait=True, cancel_futures=True)
        self._pools = [None] * self.slots
        self._tmp.cleanup()


class DaskExecutor:
    """Jobs on a Dask distributed cluster (``address`` of its scheduler, or a ``distributed.Client``)."""

    live_progress = False

    def __init__(self, address, retries: int = 2, timeout: str = "15s", workers: int = 0, gpus=None):
        try:
            from distributed import Client
        except ImportError as exc:
            raise ConfigError("--scheduler needs Dask's distributed scheduler",
                              'pip install "workbench[dist]" (or dask[distributed])') from exc
        self._cluster = None
        if isinstance(address, Client):
            self.client, self._own = address, False
        elif address == "local":
            self._cluster = local_cluster(workers, gpus)
            self.client, self._own = Client(self._cluster), True
        else:
            try:
                self.client, self._own = Client(address, timeout=timeout), True
            except OSError as exc:
                raise ConfigError(f"cannot reach the Dask scheduler at {address}: {exc}",
                                  "start one with 'dask scheduler' and workers with 'dask-cuda-worker ADDRESS'") from exc
        self.retries = retries
        workers = self.client.scheduler_info(n_workers=-1)["workers"] if _takes_n_workers(self.client) \
            else self.client.scheduler_info()["workers"]
        if not workers:
            raise ConfigError(f"the Dask scheduler at {self.address} has no workers")
        gpus = sum(int(w.get("resources", {}).get("GPU", 0)) for w in workers.values())
        self.resources = {"GPU": 1} if gpus else None
        self.gpu_workers = bool(gpus)
        self.slots = gpus or sum(int(w.get("nthreads", 1)) for w in workers.values())

    @property
    def address(self) -> str:
        return self.client.scheduler.address

    def share(self, obj):
        """The bars as a task that unpickles them, not as scattered data: a scattered object lives only on
        the workers that hold it and is lost with them, while a task's result is recomputed from the
        graph wherever it is needed (no shared file system needed either way)."""
        import warnings

        blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        with warnings.catch_warnings():  # "large graph": intended, it is sent once
            warnings.simplefilter("ignore", UserWarning)
            return self.client.submit(pickle.loads, blob, pure=False)

    def imap_unordered(self, fn: Callable, jobs: list[tuple], on_start=None) -> Iterator[tuple[int, object]]:
        from distributed import as_completed
        from distributed.scheduler import KilledWorker

        from distributed.client import FutureCancelledError

        todo = deque(range(len(jobs)))
        attempts = [0] * len(jobs)
        index: dict = {}
        ac = as_completed()

        def submit():
            i = todo.popleft()
            if on_start and attempts[i] == 0:
                on_start(i)
            fut = self.client.submit(fn, *jobs[i], resources=self.resources, pure=False, retries=0)
            index[fut.key] = i
            ac.add(fut)

        while todo and len(index) < self.slots:
            submit()
        for fut in ac:
            i = index.pop(fut.key)
            try:
                result = fut.result()
            except KilledWorker as exc:  # the scheduler gave up after allowed-failures lost workers
                result = WorkerLost(f"job {i}: {exc}")
            except FutureCancelledError as exc:  # lost with its inputs: submit it again
                attempts[i] += 1
                if attempts[i] <= self.retries:
                    todo.appendleft(i)
                    submit()
                    continue
                result = WorkerLost(f"job {i}: {exc}")
            yield i, result
            if todo:
                submit()

    def describe(self) -> str:
        unit = "GPU" if self.resources else "worker thread"
        return f"Dask scheduler {self.address}: {self.slots} {unit}(s)"

    def close(self) -> None:
        if self._own:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def local_cluster(workers: int, gpus: list[str] | None, prefer_dask_cuda: bool = True):
    """A Dask cluster on this host, one single-threaded worker per GPU with ``CUDA_VISIBLE_DEVICES``
    pinned in its environment: dask-cuda's ``LocalCUDACluster`` where installed, else a ``SpecCluster``
    of nannies (each worker advertises one ``GPU`` resource). With no GPU: ``workers`` CPU workers."""
    from distributed import Nanny, Scheduler, SpecCluster

    gpus = list(gpus or [])
    n = workers or len(gpus) or 1
    if gpus and n > len(gpus):
        raise ConfigError(f"--workers {n} but only {len(gpus)} GPU(s) visible", "one worker per GPU")
    if gpus and prefer_dask_cuda:
        try:
            from dask_cuda import LocalCUDACluster

            return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(gpus[:n]), threads_per_worker=1,
                                    resources={"GPU": 1}, dashboard_address=None)
        except ImportError:
            pass
    spec = {i: {"cls": Nanny, "options": {"nthreads": 1, "resources": {"GPU": 1},
                                          "env": {"CUDA_VISIBLE_DEVICES": gpus[i] if gpus else ""}}}
            for i in range(n)}
    return SpecCluster(workers=spec, scheduler={"cls": Scheduler, "options": {"dashboard": False}})


def _takes_n_workers(client) -> bool:
    import inspect

    return "n_workers" in inspect.signature(client.scheduler_info).parameters


def runs_in_process(workers: int = 1, scheduler: str | None = None) -> bool:
    """Whether ``--workers N`` / ``--scheduler ADDRESS`` leave the jobs in this process (:func:`make_executor`
    then gives the :class:`InlineExecutor`)."""
    return workers == 1 and not scheduler


def make_executor(workers: int = 1, scheduler: str | None = None, device: str = "auto"):
    """What the CLIs' ``--workers N`` / ``--scheduler ADDRESS`` ask for."""
    if runs_in_process(workers, scheduler):
        return InlineExecutor()
    if scheduler == "local":  # a Dask cluster on this host, one worker per GPU (or --workers CPU workers)
        gpus = [] if device == "cpu" else visible_gpus()
        return DaskExecutor("local", workers=workers if workers > 1 else 0, gpus=gpus)
    if scheduler:
        if workers != 1:
            raise ConfigError("--workers goes with --scheduler local only",
                              "a remote scheduler's workers are started on their own hosts")
        return DaskExecutor(scheduler)
    gpus = [] if device == "cpu" else visible_gpus()
    if device == "gpu" and not gpus:
        raise ConfigError("device 'gpu' asked for, but no CUDA device is available", "use --device cpu or auto")
    return ProcessExecutor(workers, gpus)
