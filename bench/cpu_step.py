"""The CPU reference backend's update at the reference shape (batch 1024, hidden 512, 51 atoms), for the
side-by-side with bench/train_step.py (same work, float64 NumPy on this machine's cores)."""
from __future__ import annotations

import time

import numpy as np

from cuda_kernels.slots import RI
from workbench.agent.cpu_trainer import CpuTrainer
from workbench.agent.train_config import TrainConfig
from workbench.gpu_profile import GpuProfile
from workbench.markets import load_market

from train_step import B, CAP, H, ATOMS, N_POS, _window  # same shape and window as the GPU benchmark


def main() -> int:
    w = _window()
    prof = GpuProfile(hidden=H, atoms=ATOMS, batch=B, n_envs=4096)
    cfg = TrainConfig(replay_capacity=CAP)
    tr = CpuTrainer(prof, cfg, load_market("es"), 100_000.0, seed=1)
    tr.setup(w)  # named state at its start (weights, Adam, an empty ring); the ring is filled below
    rng = np.random.default_rng(0)
    rp = tr.replay
    rp.int_store[:] = rng.integers(0, 30_000, (rp.capacity, 7)).astype(np.int32)
    rp.int_store[:, [RI.POS, RI.POS_NEXT]] = rng.integers(0, N_POS, (rp.capacity, 2))
    rp.int_store[:, RI.DIR:RI.EXEC + 1] = rng.integers(0, 3, (rp.capacity, 3))
    rp.float_store[:] = np.stack([rng.normal(0, 0.1, rp.capacity), (rng.random(rp.capacity) < 0.01)], 1)
    rp.prio[:], rp.size = rng.uniform(0.1, 1.1, rp.capacity).astype(np.float32), rp.capacity
    tr.update()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        tr.update()
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"CPU reference update at batch {B}, hidden {H}, {ATOMS} atoms, replay {CAP}: "
          f"{np.median(times):.1f} ms/update (median of 5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
