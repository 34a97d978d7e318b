"""The CPU reference backend's update at the reference shape (batch 1024, hidden 512, 51 atoms), for the
side-by-side with bench/train_step.py (same work, float64 NumPy on this machine's cores)."""
from __future__ import annotations

import time

import numpy as np

from workbench.agent.cpu_trainer import CpuTrainer
from workbench.agent.network import NetShape, init_params
from workbench.agent.train_config import TrainConfig
from workbench.gpu_profile import GpuProfile
from workbench.markets import load_market

from train_step import B, CAP, F, H, ATOMS, N_POS, _window  # same shape and window as the GPU benchmark


def main() -> int:
    w = _window()
    prof = GpuProfile(hidden=H, atoms=ATOMS, batch=B, n_envs=4096)
    cfg = TrainConfig(replay_capacity=CAP)
    tr = CpuTrainer(prof, cfg, load_market("es"), 100_000.0, seed=1)
    shape = NetShape(obs_dim=F + N_POS, hidden=H, atoms=ATOMS)
    support = np.linspace(cfg.v_min, cfg.v_max, ATOMS)
    rng = np.random.default_rng(0)
    tr.params = init_params(shape, 1)
    tr.target, tr.m, tr.v = tr.params.copy(), np.zeros_like(tr.params), np.zeros_like(tr.params)
    tr.int_store = rng.integers(0, 30_000, (CAP, 7)).astype(np.int32)
    tr.int_store[:, [1, 6]] = rng.integers(0, N_POS, (CAP, 2))
    tr.int_store[:, 2:5] = rng.integers(0, 3, (CAP, 3))
    tr.float_store = np.stack([rng.normal(0, 0.1, CAP), (rng.random(CAP) < 0.01)], 1).astype(np.float32)
    tr.prio, tr.size, tr.step, tr.max_prio = rng.uniform(0.1, 1.1, CAP).astype(np.float32), CAP, 0, 1.0
    tr._update(w, shape, support)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        tr._update(w, shape, support)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"CPU reference update at batch {B}, hidden {H}, {ATOMS} atoms, replay {CAP}: "
          f"{np.median(times):.1f} ms/update (median of 5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
