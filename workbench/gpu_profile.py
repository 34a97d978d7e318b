"""GPU profiles (``config/gpu/*.toml``): sizes scaled to the card, chosen by device name.

``WORKBENCH_GPU_PROFILE`` (a profile name or a TOML path) overrides the choice; a device that no
profile matches gets ``default``. Limits that matter to kernels (shared memory per block, threads per
block) are never in a profile: they are queried from the device (:class:`workbench.device.DeviceInfo`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import settings as _config
from .settings import _f
from .errors import ConfigError
from .graph_edges import PORTS as PDL_MODES
from .resources import config_dir

MATHS = ("fp32", "tf32", "bf16")  # the GEMMs' arithmetic (workbench/cublas.py)


@dataclass(frozen=True)
class GpuProfile:
    name: str = _f("default", "profile name")
    match: tuple[str, ...] = _f((), "device-name substrings that select this profile")
    hidden: int = _f(256, "MLP trunk width")
    atoms: int = _f(51, "C51 atoms")
    batch: int = _f(256, "replay batch per training step")
    n_envs: int = _f(256, "parallel environments")
    replay_vram_fraction: float = _f(0.05, "share of free device memory for the replay ring")
    gemm: str = _f("numba", "'cublas' or 'numba'")
    math: str = _f("fp32", "the GEMMs' arithmetic: 'fp32', 'tf32' (tensor cores, inputs rounded to TF32, float32 "
                           "accumulation; weights and every other kernel float32; cuBLAS only, the Numba GEMM "
                           "computes fp32) or 'bf16' (the GEMMs' operands rounded to bfloat16 in memory: weights, "
                           "observations, the trunk's activations and the backward's gradients; float32 "
                           "accumulation, float32 master weights, Adam, loss and heads; both GEMM backends)")
    population: int = _f(0, "agents trained side by side in one graph: 0 = as many as fit in free device memory, "
                            "1 = one at a time")
    batched_gemm: bool = _f(False, "from 8 agents on, a population's agents' same GEMM of an update as one batched "
                                   "cuBLAS GEMM: ~8 % more agent-updates/s, but each agent's results then differ from "
                                   "its results alone by rounding, which training amplifies (false, the default: each "
                                   "agent's GEMMs on its own stream, bit for bit what it computes alone)")
    sm_share: bool = _f(False, "every agent's GEMMs through cuBLASLt with the algorithm chosen for the SMs its "
                               "output fills rather than for the whole GPU, as fits a population whose lanes fill "
                               "it together (an agent alone uses the same algorithms, so its results are the same "
                               "alone and in a population; they differ by rounding from those with this off)")
    branches: bool = _f(True, "an update's work that does not wait on its main chain (the target forward, weight "
                              "gradients, priority update) on a second stream beside it, for an agent training "
                              "alone (false: one stream; the same results bit for bit either way)")
    pdl: str = _f("off", "programmatic dependent launch between the kernels of a captured graph (sm_90 and later): "
                         "'off', 'programmatic' (a kernel launches when the one before it has let its blocks go) or "
                         "'order' (once every block of the one before it has started); each kernel waits inside for "
                         "the one before to finish, so the results are the same bit for bit")
    fused_epilogues: bool = _f(True, "the trunk's bias + ReLU (and their gradients) inside cuBLASLt's GEMMs where "
                                     "nvmath-python loads (false: our kernels after each GEMM)")


    @property
    def batches_gemms(self) -> bool:
        """Whether a population's same GEMM runs as one batched cuBLAS GEMM (``batched_gemm``): cuBLAS and
        float32 operands (the batched SGEMM; bf16 operands keep each agent's GEMMs on its lane)."""
        return self.batched_gemm and self.gemm == "cublas" and self.math != "bf16"


def load_profile(name_or_path: str) -> GpuProfile:
    path = Path(name_or_path) if name_or_path.endswith(".toml") else config_dir() / "gpu" / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in (config_dir() / "gpu").glob("*.toml")))
        raise ConfigError(f"unknown GPU profile '{name_or_path}'", f"known profiles: {known}")
    prof = _config.build(GpuProfile, _config.read_toml(path), prefix="gpu.")
    if prof.gemm not in ("cublas", "numba") or prof.math not in MATHS:
        raise ConfigError(f"GPU profile {path}: gemm must be cublas|numba and math {'|'.join(MATHS)}")
    if prof.pdl not in PDL_MODES:
        raise ConfigError(f"GPU profile {path}: pdl must be one of {', '.join(PDL_MODES)}")
    if not (0 < prof.replay_vram_fraction < 1) or prof.atoms < 2 or prof.atoms > 128 or prof.population < 0:
        raise ConfigError(f"GPU profile {path}: replay_vram_fraction in (0, 1), atoms in [2, 128], population >= 0")
    return prof


def select_profile(device_name: str) -> GpuProfile:
    override = os.environ.get("WORKBENCH_GPU_PROFILE")
    if override:
        return load_profile(override)
    for path in sorted((config_dir() / "gpu").glob("*.toml")):
        prof = load_profile(path.stem)
        if any(m.lower() in device_name.lower() for m in prof.match):
            return prof
    return load_profile("default")
