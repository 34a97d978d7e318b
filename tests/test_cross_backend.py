"""GPU path (kernels; the simulator in CI) against the CPU reference backend: same weights, same replay,
same Philox streams -> the same batch, loss, gradients and updated weights over consecutive updates."""
from __future__ import annotations

import numpy as np
from cuda_kernels.slots import RF
import pytest

from workbench.agent.cpu_trainer import CpuTrainer
from workbench.agent.gemm import make_gemm
from workbench.agent.network import NetShape
from workbench.agent.train_config import TrainConfig
from workbench.agent.trainer import DeviceTrainer
from workbench.agent.window import N_POS, make_window
from workbench.device import Device
from workbench.features import build_features
from workbench.gpu_profile import GpuProfile


@pytest.mark.slow
def test_update_steps_agree(bars):
    feats = build_features(bars)
    fold = dict(train_start=200, train_stop=700, val_start=720, val_stop=740, test_start=760, test_stop=780)
    w = make_window(bars, feats, fold)
    prof = GpuProfile(hidden=8, atoms=5, batch=8, n_envs=4)
    cfg = TrainConfig(rollout_steps=6, n_step=2, episode_len=30, learning_starts=0, replay_capacity=1024,
                      v_min=-2.0, v_max=2.0, lr=1e-3)
    device = Device()
    gpu = DeviceTrainer(device, make_gemm(device), prof, cfg, bars.market, 100_000.0, seed=11)
    graphs = gpu.prepare(w)
    graphs["experience"].replay(gpu.K_hist)  # real experience from the GPU envs fills the replay
    graphs["finish_rollout"].replay(1)
    cpu = CpuTrainer(prof, cfg, bars.market, 100_000.0, seed=11)
    shape = NetShape(obs_dim=w.n_features + N_POS, hidden=prof.hidden, atoms=prof.atoms)
    support = np.linspace(cfg.v_min, cfg.v_max, shape.atoms).astype(np.float32).astype(np.float64)
    cpu.params, cpu.target = gpu.params.copy_to_host(), gpu.target.copy_to_host()
    cpu.m, cpu.v = np.zeros_like(cpu.params), np.zeros_like(cpu.params)
    size = int(gpu.size.copy_to_host()[0])
    assert size == prof.n_envs * cfg.rollout_steps
    cpu.int_store, cpu.float_store = gpu.int_store.copy_to_host(), gpu.float_store.copy_to_host()
    cpu.prio, cpu.size, cpu.step, cpu.max_prio = gpu.prio.copy_to_host(), size, 0, 1.0
    assert (cpu.prio[:size] == 1.0).all() and cpu.float_store[:size, RF.TERMINAL].max() <= 1.0
    for step in range(2):
        graphs["update"].replay(1)
        _, _, _, tripped = cpu._update(w, shape, support)
        assert not tripped and gpu.guard.copy_to_host()[0] == 0
        last = cpu.last
        assert np.array_equal(gpu.idx.copy_to_host(), last["idx"]), f"step {step}: different batch"
        np.testing.assert_allclose(gpu.isw.copy_to_host(), last["isw"], rtol=1e-5)
        np.testing.assert_allclose(gpu.loss_b.copy_to_host(), last["loss"], rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(gpu.grads.copy_to_host(), last["grads"], rtol=2e-3, atol=2e-6)
        np.testing.assert_allclose(gpu.params.copy_to_host(), cpu.params, rtol=1e-4, atol=2e-6)
        np.testing.assert_allclose(gpu.target.copy_to_host(), cpu.target, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(gpu.prio.copy_to_host(), cpu.prio, rtol=1e-4, atol=1e-6)
    assert not np.array_equal(cpu.params, cpu.target)  # the updates did move the weights
