"""Many agents on one GPU: each agent's phase of an epoch is one branch of one graph launch.

Each agent is a :class:`~workbench.agent.trainer.DeviceTrainer` on its own lane (a non-blocking
stream of the same device, :meth:`Device.lane`) with its own named state, window, seed and
hyper-parameters. A phase of an epoch is one graph of independent branches, one per agent, so one
``cuGraphLaunch`` runs the phase for every agent and the GPU overlaps the branches (one agent's update
at the reference shape leaves most of the H200 idle): the experience steps and the updates as graph
loops (:meth:`Device.capture_loops`: agents with the same number of passes share one WHILE node whose
body forks their passes onto their lanes), validation as branches forked from and joined back into
the population's stream (:meth:`Device.capture_lanes`).
Kernels and buffers are the single agent's, unchanged, so every agent computes bit for bit what it
computes alone. With ``gpu.sm_share`` (the h100 and h200 profiles) every GEMM runs the algorithm cuBLASLt
chooses for the SMs its output fills, not for the whole GPU (:func:`workbench.cublaslt.sm_target`: ~1.3x
the TF32 agent-updates per second at 16 agents on the H100); the choice depends on the GEMM's shape
alone and an agent alone makes it too, so that still holds. The update's GEMMs can be the exception from 8 agents on (``gpu.batched_gemm = "on"``,
off by default): agents whose update loops share a WHILE node then run their passes in lockstep and
meet at each GEMM, which runs for all of them as one batched cuBLAS GEMM
(:class:`~workbench.agent.gemm.GemmMeeting`; ~1.08x the agent-updates per second at 16 and 32 agents
with TF32 on the H200): the same products added in the batched kernels' order, so an agent's results
differ from its results alone by rounding, which training amplifies (on the shipped sample's search,
mean validation Sharpes moved by up to 8). With fewer agents, with the Numba GEMM (and in the
simulator) the agents never batch. The
epoch's statistics of every agent come back in one readback (one host
sync per epoch for the whole population); guard restore, epoch selection and logs are per agent
(:func:`workbench.agent.loop.run_agents`).

Agents trained together may differ in their schedule (epochs, experience steps per epoch, updates per
epoch, when learning starts): each agent's loop in a phase's graph runs its own number of passes.
:func:`train_jobs` groups agents by size (hidden, atoms, batch, envs, replay
capacity) so one agent's measured memory holds for its group. Memory: :func:`agent_bytes` per agent.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..device import Device, Readback
from ..errors import ConfigError
from .gemm import GemmMeeting, make_gemm, set_math
from .loop import EpochStats, run_agents
from .network import DeviceNetwork
from .records import FoldTrainResult
from .trainer import DeviceTrainer, epoch_stats
from .window import Window


class GpuPopulation:
    """P device trainers driven together (the phases :func:`run_agents` drives).

    The experience and training phases of every agent are one launch each: a loop graph
    (:meth:`Device.capture_loops`) in which each agent runs its own number of passes (its rollout's
    steps, its updates), agents of one count sharing a WHILE node; an agent whose guard trips runs its
    remaining passes as no-ops (its kernels skip every lasting write). Agents may differ in their
    schedule (epochs, steps and updates per epoch, when learning starts): every (phase, agents) graph an
    epoch will need is captured in :meth:`setup`, before any work runs. Validation is one graph of
    every agent's backtest as a branch (:meth:`Device.capture_lanes`)."""

    def __init__(self, device: Device, trainers: list[DeviceTrainer], windows: list[Window]):
        if not trainers or len(trainers) != len(windows):
            raise ValueError("a population needs one window per trainer")
        self.device, self.trainers, self.windows = device, trainers, windows
        self.lanes = [t.device for t in trainers]
        self.epochs = [t.cfg.epochs for t in trainers]
        self.joint: dict[tuple, object] = {}
        self.gemm = None  # the population stream's GEMM for the agents' meetings, made on first use

    def _meeting(self, ts) -> GemmMeeting | None:
        """The update loops' GEMM meeting (:class:`~workbench.agent.gemm.GemmMeeting`), unless the profile
        turns it off, the agents' GEMMs differ (cuBLAS math modes, a Numba GEMM beside cuBLAS, network
        or batch sizes: :func:`train_jobs` groups by size, a population built by hand need not), or none
        of its meetings would batch (fewer agents than it batches from, or a GEMM that cannot batch):
        then each agent's passes run on its lane as they are."""
        prof = ts[0].profile
        if not prof.batches_gemms or len({(getattr(t.gemm, "name", ""), t.state.shape, t.state.batch.size)
                                         for t in ts}) != 1:
            return None
        if self.gemm is None:
            self.gemm = make_gemm(self.device, prof.gemm, prof.math)
        set_math(self.gemm, prof.math)
        meet = GemmMeeting(self.device, self.gemm)
        return meet if meet.batches(len(ts)) else None

    def _learners(self, epoch: int, active) -> tuple[int, ...]:
        """The agents of ``active`` that train in ``epoch`` (their replay holds ``learning_starts``)."""
        return tuple(i for i in active if self.trainers[i].updates_in(epoch))

    def _graph(self, phase: str, agents: tuple[int, ...]):
        """The joint graph of ``phase`` over ``agents``, captured once: ``experience`` and ``update`` are
        loop graphs of the trainers' loops, ``validate`` a graph of their validation branches."""
        key = (phase, agents)
        if key not in self.joint:
            ts = [self.trainers[i] for i in agents]
            if phase == "validate":
                self.joint[key] = self.device.capture_lanes([t.device for t in ts], [t._validate for t in ts])
            else:
                meet = self._meeting(ts) if phase == "update" else None
                if phase == "update" and meet is None and len(ts) == 1:
                    # an agent alone: its update beside its side stream where it has one (with 5, 16 and 32
                    # agents the GPU is already full: measured on the H200, the side streams bought nothing)
                    ts[0].use_side()
                self.joint[key] = self.device.capture_loops([getattr(t, f"{phase}_loop")() for t in ts], meet=meet)
        return self.joint[key]

    # ---------------------------------------------------------------- the phases run_agents drives
    def setup(self) -> None:
        d, ts = self.device, self.trainers
        uploaded: dict = {}  # a window's bars on the device, uploaded by its first agent (a fold's seeds, a swarm's particles)
        for t, w in zip(ts, self.windows):
            if t.state is None:  # a population planner may have allocated the first agent to measure it
                t.allocate(w, uploaded.get(id(w)))
            uploaded.setdefault(id(w), t.state.window)
        d.wait_for(self.lanes)  # allocation, uploads and first resets before the first launch (and capture)
        for epoch in range(max(self.epochs)):
            active = tuple(i for i, n in enumerate(self.epochs) if epoch < n)
            self._graph("experience", active)
            if self._learners(epoch, active):
                self._graph("update", self._learners(epoch, active))
            self._graph("validate", active)
        self.readback = Readback(d, {f"{i}:{k}": v for i, t in enumerate(ts) for k, v in t.readback_sources().items()})
        d.synchronize()

    def snapshot(self, active) -> None:
        for i in active:
            self.trainers[i].snapshot()  # on each lane; the next launch waits for the lanes

    def experience(self, active, eps: list[float]) -> None:
        d = self.device
        for i, e in zip(active, eps):
            self.trainers[i].state.envs.eps_slot.value[0] = e  # copied in by each loop's head
        d.wait_for(self.lanes)
        self.ev = [d.event().record()]
        self._graph("experience", tuple(active)).launch()
        self.ev.append(d.event().record())

    def train(self, epoch: int, active) -> None:
        learners = self._learners(epoch, active)
        if learners:
            self._graph("update", learners).launch()
        self.ev.append(self.device.event().record())

    def validate(self, active) -> None:
        self._graph("validate", tuple(active)).replay(1)
        self.ev.append(self.device.event().record())

    def end_epoch(self, epoch: int, active) -> list[EpochStats]:
        r = self.readback.read()  # the population's one host sync of the epoch
        for lane in self.lanes:
            lane.wait_for([self.device])  # restores and copies on a lane come after the epoch's graphs
        ev = self.ev
        ms = {"experience": ev[0].elapsed_ms(ev[1]), "training": ev[1].elapsed_ms(ev[2]),
              "validation": ev[2].elapsed_ms(ev[3])}
        extra = {"agents_per_launch": len(active)}  # the phase times are the whole population's
        out = []
        for i in active:
            t = self.trainers[i]
            mine = {k.split(":", 1)[1]: v for k, v in r.items() if k.startswith(f"{i}:")}
            t.last = mine
            out.append(epoch_stats(mine, dict(ms), dict(extra)))
        return out

    def restore(self, i: int) -> None:
        self.trainers[i].restore()

    def keep(self, i: int) -> None:
        self.trainers[i].keep()

    def kept(self, i: int) -> np.ndarray:
        return self.trainers[i].kept()

    def val_pnl(self, i: int) -> np.ndarray:
        return self.trainers[i].val_pnl()

    def test(self, i: int):
        return self.trainers[i].test()

    def counters(self, i: int) -> dict:
        return self.trainers[i].counters()

    def backend_name(self, test: bool) -> str:
        return self.trainers[0].backend_name(test)


def train_population(device: Device, trainers: list[DeviceTrainer], windows: list[Window], on_epoch=None,
                     test: bool = True) -> list[FoldTrainResult]:
    """Train every trainer on its window side by side; one result per trainer, in order."""
    return run_agents(GpuPopulation(device, trainers, windows), [t.cfg for t in trainers], on_epoch, test)


def agent_bytes(trainer: DeviceTrainer) -> int:
    """Device memory one allocated agent holds (every buffer of its named state), in bytes."""
    return _nbytes(tuple(trainer.state))


def _nbytes(v) -> int:
    if isinstance(v, tuple):
        return sum(_nbytes(x) for x in v)
    if isinstance(v, DeviceNetwork):
        return v.nbytes
    if hasattr(v, "copy_to_host"):  # a device array
        return int(v.size) * int(v.dtype.itemsize)
    return 0


def side_by_side(backend, gpu_overrides, in_process: bool, n_jobs: int) -> bool:
    """Whether ``n_jobs`` trainings (folds of a walk-forward, agents of a swarm iteration) run as
    populations: in this process, on a GPU backend, more than one, and ``gpu.population`` (or the
    profile's) not 1."""
    return (in_process and backend is not None and backend.kind == "gpu" and n_jobs > 1
            and backend.sized(gpu_overrides).population != 1)


def plan_size(device: Device, bytes_per_agent: int, requested: int, n: int) -> int:
    """Agents per population for ``n`` agents when one agent (already allocated) holds ``bytes_per_agent``:
    ``requested`` (refused with the figures when free memory cannot hold it), or with 0 as many as fit
    in 90 % of the free device memory. The simulator has no memory figure: every agent at once."""
    free = device.free_memory()
    if device.simulator or bytes_per_agent <= 0:
        return max(1, min(n, requested or n))
    fit = 1 + int(0.9 * free // bytes_per_agent)  # the allocated agent plus those the free memory holds
    if requested > fit:
        raise ConfigError(f"gpu.population = {requested} needs ~{requested * bytes_per_agent / 2**30:.1f} GiB "
                          f"({bytes_per_agent / 2**20:.0f} MiB per agent) but {(free + bytes_per_agent) / 2**30:.1f} "
                          f"GiB is free for agents", f"use gpu.population <= {fit}, or 0 to choose from memory")
    return max(1, min(n, requested or fit))


class Job(NamedTuple):
    """One agent to train: fold ``k`` (from 0) of the prepared data with run config ``cfg``, seed index
    ``s`` of the fold's ensemble (:func:`workbench.agent.fold.agent_seed`)."""

    k: int
    cfg: object
    s: int = 0


def train_folds(ks: list[int], prep, cfg, backend, on_epoch=None, on_group=None):
    """Train the folds ``ks`` of ``prep``, each with its ``training.seeds`` seeds, as populations on the
    GPU: yields ``(k, seed index, FoldTrainResult)`` group by group (see :func:`train_jobs`; a fold's
    seeds are neighbours, so they train in the same population where it holds them);
    ``on_epoch(k, seed index, log)``; ``on_group(folds, size, bytes per agent)``."""
    jobs = [Job(k, cfg, s) for k in ks for s in range(cfg.training.seeds)]
    cb = (lambda j, log: on_epoch(jobs[j].k, jobs[j].s, log)) if on_epoch else None
    grp = (lambda js, size, per_agent: on_group([jobs[j].k for j in js], size, per_agent)) if on_group else None
    for j, res in train_jobs(jobs, prep, backend, on_epoch=cb, on_group=grp):
        yield jobs[j].k, jobs[j].s, res


def group_key(cfg, backend) -> tuple:
    """Agents that can share a population: the same sizes (every buffer the same shape but the rollout's,
    so one agent's measured memory holds for every agent of the group); schedules may differ."""
    prof = backend.sized(cfg.gpu)
    return (prof.hidden, prof.atoms, prof.batch, prof.n_envs, cfg.training.replay_capacity)


def train_jobs(jobs: list[Job], prep, backend, test: bool = True, on_epoch=None, on_group=None):
    """Train ``jobs`` (:class:`Job`: fold, run config, seed index) as populations on the GPU: jobs
    of one :func:`group_key` (their sizes) train together, as many per population as ``gpu.population`` says or free
    memory holds (:func:`plan_size`). Fold seeds and windows are those of the one-fold path
    (:func:`workbench.agent.fold.train_fold`), so each job's result is what it gets alone. Yields
    ``(job index, FoldTrainResult)`` group by group; ``on_group(job indices, size, bytes per agent)``
    before each population trains; ``on_epoch(job index, log)``; ``test=False`` (the search) never
    backtests the test ranges."""
    from .fold import agent_seed, fold_window

    def make(i: int, j: int):
        k, cfg, s = jobs[j]
        return backend.lane_trainer(i, cfg.training, prep.spec, prep.account.capital, agent_seed(cfg.seed, k, s),
                                    overrides=cfg.gpu)

    groups: dict[tuple, list[int]] = {}
    for j, job in enumerate(jobs):
        groups.setdefault(group_key(job.cfg, backend), []).append(j)
    for members in groups.values():
        first = make(0, members[0])
        w0 = fold_window(jobs[members[0]].k, prep)
        first.allocate(w0)
        per_agent = agent_bytes(first)
        size = plan_size(backend.device, per_agent, backend.sized(jobs[members[0]].cfg.gpu).population, len(members))
        pending = [(first, w0)]
        for g0 in range(0, len(members), size):
            group = members[g0:g0 + size]
            trainers, windows, by_fold = [], [], {jobs[members[0]].k: w0} if g0 == 0 else {}
            for i, j in enumerate(group):
                if pending:
                    t, w = pending.pop()
                else:  # a fold's seeds (and a swarm's particles on one fold) share its host window
                    t = make(i, j)
                    w = by_fold.get(jobs[j].k) or by_fold.setdefault(jobs[j].k, fold_window(jobs[j].k, prep))
                trainers.append(t)
                windows.append(w)
            if on_group:
                on_group(group, size, per_agent)
            cb = (lambda i, log, group=group: on_epoch(group[i], log)) if on_epoch else None
            results = train_population(backend.device, trainers, windows, on_epoch=cb, test=test)
            del trainers, windows, by_fold
            _release(backend.device)
            yield from zip(group, results)


def _release(device: Device) -> None:
    """Free a finished group's buffers before the next group allocates."""
    import gc

    gc.collect()
    if not device.simulator:
        from cuda_kernels.nb import cuda

        cuda.current_context().deallocations.clear()
