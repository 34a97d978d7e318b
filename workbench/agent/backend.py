"""Choosing the backend: the GPU trainer when a device is there (or asked for), the CPU reference otherwise."""
from __future__ import annotations

from cuda_kernels.nb import gpu_available

from ..errors import ConfigError
from ..gpu_profile import MATHS, PDL_MODES, load_profile, select_profile
from .gemm import set_math, set_sharing


class Backend:
    """What trains a fold: ``kind`` is 'gpu' or 'cpu'; ``profile`` its sizes; ``describe()`` for reports."""

    def __init__(self, kind: str):
        import os

        self.kind = kind
        self.device = self.gemm = None
        self.lanes: list = []  # (lane, gemm) of population agents, made on first use and reused
        self.sides: dict = {}  # the trainers' side streams (trainer.Side), made on first use and reused
        if kind == "gpu":
            from ..device import Device
            from .gemm import make_gemm

            self.device = Device()
            self.profile = select_profile(self.device.info.name)
            self.gemm = make_gemm(self.device, self.profile.gemm, self.profile.math)
        else:
            override = os.environ.get("WORKBENCH_GPU_PROFILE")
            self.profile = load_profile(override) if override else load_profile("cpu")

    def sized(self, overrides=None):
        """The profile with a run's non-zero ``[gpu]`` overrides applied."""
        import dataclasses

        if overrides is None:
            return self.profile
        changes = {k: v for k, v in dataclasses.asdict(overrides).items() if v}
        for switch in ("batched_gemm", "sm_share", "branches", "fused_epilogues"):
            if switch in changes:
                if changes[switch] not in ("on", "off"):
                    raise ConfigError(f"gpu.{switch} must be 'on' or 'off', got {changes[switch]!r}")
                changes[switch] = changes[switch] == "on"
        if "pdl" in changes and changes["pdl"] not in PDL_MODES:
            raise ConfigError(f"gpu.pdl must be one of {', '.join(PDL_MODES)}, got {changes['pdl']!r}")
        if "math" in changes and changes["math"] not in MATHS:
            raise ConfigError(f"gpu.math must be one of {', '.join(MATHS)}, got {changes['math']!r}")
        return dataclasses.replace(self.profile, **changes) if changes else self.profile

    def trainer(self, cfg, spec, capital: float, seed: int, overrides=None):
        profile = self.sized(overrides)
        if self.kind == "gpu":
            from .trainer import DeviceTrainer

            self._graph_edges(profile)
            set_math(self.gemm, profile.math)
            set_sharing(self.gemm, profile.sm_share)
            return DeviceTrainer(self.device, self.gemm, profile, cfg, spec, capital, seed,
                                 side=self._side_maker("main", self.device, profile))
        from .cpu_trainer import CpuTrainer

        return CpuTrainer(profile, cfg, spec, capital, seed)

    def lane_trainer(self, i: int, cfg, spec, capital: float, seed: int, overrides=None):
        """A GPU trainer on lane ``i`` (its own stream and cuBLAS handle): agent i of a population."""
        from ..device import Device
        from .gemm import make_gemm
        from .trainer import DeviceTrainer

        profile = self.sized(overrides)
        while len(self.lanes) <= i:
            lane: Device = self.device.lane()
            self.lanes.append((lane, make_gemm(lane, profile.gemm, profile.math)))
        lane, gemm = self.lanes[i]
        set_math(gemm, profile.math)
        set_sharing(gemm, profile.sm_share)
        self._graph_edges(profile)
        return DeviceTrainer(lane, gemm, profile, cfg, spec, capital, seed, side=self._side_maker(i, lane, profile))

    def _graph_edges(self, profile) -> None:
        """What the device and its lanes capture from now on gets ``profile.pdl``'s edges (a run's setting)."""
        for d in (self.device, *(lane for lane, _ in self.lanes)):
            d.pdl = profile.pdl

    def _side_maker(self, key, device, profile):
        """What makes (once, on first use) the side stream of the trainer on ``device``
        (:class:`~workbench.agent.trainer.Side`: another stream with its own GEMM backend), or None where
        ``gpu.branches`` is off."""
        if not profile.branches:
            return None

        def make():
            from .gemm import make_gemm
            from .trainer import Side

            k = (key, profile.gemm, profile.math)
            if k not in self.sides:
                lane = device.lane()
                self.sides[k] = Side(lane, make_gemm(lane, profile.gemm, profile.math))
            set_sharing(self.sides[k].gemm, profile.sm_share)
            return self.sides[k]

        return make

    def describe(self, overrides=None) -> str:
        """The backend with a run's ``[gpu]`` overrides applied (its GEMM math, epilogues)."""
        if self.kind == "gpu":
            i, prof = self.device.info, self.sized(overrides)
            fused = getattr(self.gemm, "fuses_epilogues", False)
            epi = ("bias+ReLU fused in cuBLASLt" if fused and prof.fused_epilogues else
                   "bias+ReLU kernels" + ("" if fused or not getattr(self.gemm, "lt_error", "") else
                                          f" ({self.gemm.lt_error.split(':')[0]})"))
            gemm = f"cublas-{prof.math}" if hasattr(self.gemm, "set_math") else self.gemm.name
            share = ", GEMMs planned for the SMs they fill (sm_share)" if prof.sm_share and fused else ""
            return f"gpu {i.name} ({i.total_memory / 2**30:.0f} GiB), profile {prof.name}, gemm {gemm}, {epi}{share}"
        return f"cpu reference backend, profile {self.profile.name}"


def make_backend(choice: str) -> Backend:
    """The backend for ``device = choice``: the one :func:`start_backend` began for the same choice (waited
    for; what making it raised is raised here), else made now."""
    pending = _started.pop(choice, None)
    if pending is None:
        return _make(choice)
    backend = pending()
    if backend.kind == "gpu":
        from cuda_kernels.nb import cuda

        cuda.current_context()  # made current on this thread too: its driver calls need it
    return backend


def start_backend(choice: str) -> None:
    """Begin making the backend for ``device = choice`` on a thread, so that the CUDA context's creation and
    the GEMM libraries' loading (a few tenths of a second, mostly inside the driver with the GIL
    released) overlap what the caller does next (the CLIs: reading and preparing the bars);
    :func:`make_backend` takes it. Nothing for ``cpu``, for an unknown choice (``make_backend`` refuses
    it) or under the simulator."""
    from cuda_kernels.nb import SIMULATOR

    from ..background import in_background

    if choice not in ("auto", "gpu") or choice in _started or SIMULATOR:
        return
    if not _started:
        import atexit

        atexit.register(_settle)
    _started[choice] = in_background(lambda: _make(choice), "workbench-backend")


_started: dict = {}  # choice -> the waiter of start_backend's thread


def _settle() -> None:
    """At exit: wait for a backend still being made that nothing took (a run refused its data first), so
    the driver is never torn down while that thread is inside it; its errors no longer matter."""
    for wait in list(_started.values()):
        try:
            wait()
        except BaseException:  # noqa: BLE001 - exiting anyway
            pass
    _started.clear()


def _make(choice: str) -> Backend:
    if choice not in ("auto", "gpu", "cpu"):
        raise ConfigError(f"device must be 'auto', 'gpu' or 'cpu', got {choice!r}")
    if choice == "gpu" and not gpu_available():
        raise ConfigError("device 'gpu' asked for, but no CUDA device is available", "use --device cpu or auto")
    return Backend("gpu" if choice == "gpu" or (choice == "auto" and gpu_available()) else "cpu")
