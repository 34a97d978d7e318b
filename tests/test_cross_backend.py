"""GPU path (kernels; the simulator in CI) against the CPU reference backend.

- One update at a time: same weights, same replay, same Philox streams -> the same batch, loss,
  gradients and updated weights over consecutive updates.
- A whole fold through the one epoch loop (``DeviceTrainer.train_fold``, every captured phase in the
  simulator at tiny sizes) against ``CpuTrainer.train_fold`` with the same seed: the same replay fill,
  update counts, guard, validation statistics, kept epoch, test positions and PnL; weights within
  float32-against-float64 tolerance.
"""
from __future__ import annotations

import numpy as np
import pytest

from cuda_kernels.slots import RF
from workbench.agent.cpu_trainer import CpuTrainer
from workbench.agent.network import views
from workbench.agent.train_config import TrainConfig
from workbench.agent.trainer import DeviceTrainer, Side
from workbench.agent.window import make_window
from workbench.device import Device
from workbench.features import build_features
from workbench.gpu_profile import GpuProfile


@pytest.mark.slow
@pytest.mark.parametrize("beside", [False, True], ids=["one-stream", "side-stream"])
def test_update_steps_agree(bars, fold_gemm, beside):
    """One update at a time against the CPU backend, on one stream and with the update's independent
    work on a side stream (``DeviceTrainer.update_beside``: the same kernels and GEMMs, reordered)."""
    feats = build_features(bars)
    fold = dict(train_start=200, train_stop=700, val_start=720, val_stop=740, test_start=760, test_stop=780)
    w = make_window(bars, feats, fold)
    prof = GpuProfile(hidden=8, atoms=3, batch=8, n_envs=4)
    cfg = TrainConfig(rollout_steps=6, n_step=2, episode_len=30, learning_starts=0, replay_capacity=1024,
                      v_min=-2.0, v_max=2.0, lr=1e-3)
    device = Device()
    lane = device.lane()
    side = (lambda: Side(lane, fold_gemm(lane))) if beside else None
    gpu = DeviceTrainer(device, fold_gemm(device), prof, cfg, bars.market, 100_000.0, seed=11, side=side)
    graphs = gpu.prepare(w)
    assert (gpu.side is not None) == beside
    S = gpu.state
    S.envs.eps_slot.value[0] = 1.0
    graphs.experience.launch()  # real experience from the GPU envs fills the replay
    one_update = device.capture(gpu.enqueue_update)
    cpu = CpuTrainer(prof, cfg, bars.market, 100_000.0, seed=11)
    cpu.setup(w)
    lr, rp = cpu.learner, cpu.replay
    host = gpu.host_layout  # the device pads W3's rows (NetShape.head_cols); the CPU backend does not
    assert np.array_equal(lr.params, host(S.learner.params.copy_to_host()))  # the same starting weights
    size = int(S.replay.size.copy_to_host()[0])
    assert size == prof.n_envs * cfg.rollout_steps
    rp.int_store, rp.float_store = S.replay.int_store.copy_to_host(), S.replay.float_store.copy_to_host()
    rp.prio, rp.size = S.replay.prio.copy_to_host(), size
    assert (rp.prio[:size] == 1.0).all() and rp.float_store[:size, RF.TERMINAL].max() <= 1.0
    for step in range(2):
        one_update.replay(1)
        r = cpu.update()
        assert not r.tripped and S.learner.guard.copy_to_host()[0] == 0
        assert np.array_equal(S.batch.idx.copy_to_host(), r.idx), f"step {step}: different batch"
        np.testing.assert_allclose(S.batch.isw.copy_to_host(), r.isw, rtol=1e-5)
        np.testing.assert_allclose(S.batch.loss.copy_to_host(), r.loss, rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(host(S.learner.grads.copy_to_host()), r.grads, rtol=2e-3, atol=2e-6)
        np.testing.assert_allclose(host(S.learner.params.copy_to_host()), lr.params, rtol=1e-4, atol=2e-6)
        np.testing.assert_allclose(host(S.learner.target.copy_to_host()), lr.target, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(S.replay.prio.copy_to_host(), rp.prio, rtol=1e-4, atol=1e-6)
    assert not np.array_equal(lr.params, lr.target)  # the updates did move the weights
    W3 = views(S.learner.params.copy_to_host(), S.shape)["W3"]
    assert S.shape.head_cols > S.shape.head_width and (W3[:, S.shape.head_width:] == 0).all()  # padding stays 0


@pytest.mark.slow
def test_train_fold_agrees_with_the_cpu_backend(bars, fold_gemm):
    """DeviceTrainer.train_fold end to end (in CI: the simulator) against the CPU backend's fold."""
    feats = build_features(bars)
    fold = dict(train_start=300, train_stop=600, val_start=610, val_stop=618, test_start=630, test_stop=638)
    w = make_window(bars, feats, fold)
    prof = GpuProfile(hidden=8, atoms=3, batch=4, n_envs=2)
    cfg = TrainConfig(epochs=2, rollout_steps=2, n_step=1, episode_len=20, learning_starts=0, max_steps_per_epoch=1,
                      replay_capacity=1024, v_min=-2.0, v_max=2.0, lr=1e-3, eps_start=0.5, eps_end=0.5)
    device = Device()
    logs_gpu, logs_cpu = [], []
    gpu = DeviceTrainer(device, fold_gemm(device), prof, cfg, bars.market, 100_000.0, seed=5).train_fold(
        w, on_epoch=logs_gpu.append)
    cpu = CpuTrainer(prof, cfg, bars.market, 100_000.0, seed=5).train_fold(w, on_epoch=logs_cpu.append)
    assert len(logs_gpu) == len(logs_cpu) == cfg.epochs
    for g, c in zip(gpu.epochs, cpu.epochs):
        for key in ("epoch", "replay_size", "updates", "guard_tripped", "val_days", "val_bars"):
            assert getattr(g, key) == getattr(c, key), (key, getattr(g, key), getattr(c, key))
        np.testing.assert_allclose(g.loss, c.loss, rtol=1e-3, atol=1e-6)
        for key in ("val_pnl_usd", "val_sharpe", "val_bar_t", "val_max_drawdown_usd"):
            np.testing.assert_allclose(getattr(g, key), getattr(c, key), rtol=1e-9, atol=1e-6, err_msg=key)
    assert gpu.epochs[-1].updates == cfg.max_steps_per_epoch
    assert gpu.best_epoch == cpu.best_epoch
    np.testing.assert_allclose(gpu.params, cpu.params, rtol=1e-4, atol=2e-6)
    assert np.array_equal(gpu.test_position, cpu.test_position)
    np.testing.assert_allclose(gpu.test_pnl, cpu.test_pnl, rtol=1e-12, atol=1e-9)
    assert gpu.backend.startswith("gpu") and cpu.backend == "cpu"


@pytest.mark.slow
def test_a_tripping_guard_ends_the_epoch_alike_on_both_backends(bars, fold_gemm):
    """|Q| over q_limit on the first update of every epoch: both backends stop the epoch's updates there,
    write no priority for the tripping update, restore the epoch's starting weights and report it."""
    feats = build_features(bars)
    fold = dict(train_start=300, train_stop=600, val_start=610, val_stop=614, test_start=630, test_stop=634)
    w = make_window(bars, feats, fold)
    prof = GpuProfile(hidden=8, atoms=3, batch=4, n_envs=2)
    cfg = TrainConfig(epochs=2, rollout_steps=2, n_step=1, episode_len=20, learning_starts=0, max_steps_per_epoch=3,
                      replay_capacity=1024, v_min=-2.0, v_max=2.0, lr=1e-3, q_limit=1e-6)
    device = Device()
    gpu_t = DeviceTrainer(device, fold_gemm(device), prof, cfg, bars.market, 100_000.0, seed=5)
    cpu_t = CpuTrainer(prof, cfg, bars.market, 100_000.0, seed=5)
    gpu = gpu_t.train_fold(w)
    cpu = cpu_t.train_fold(w)
    for g, c in zip(gpu.epochs, cpu.epochs):
        assert (g.guard_tripped, g.updates) == (c.guard_tripped, c.updates) == (True, 0)
    np.testing.assert_allclose(gpu.params, cpu.params, rtol=1e-6, atol=1e-7)  # both back at the start
    size = int(gpu_t.state.replay.size.copy_to_host()[0])
    assert size == cpu_t.replay.size
    np.testing.assert_array_equal(gpu_t.state.replay.prio.copy_to_host()[:size], cpu_t.replay.prio[:size])
    assert np.array_equal(gpu.test_position, cpu.test_position)


def _update_against_cpu(bars, fold_gemm, math: str) -> tuple[float, float]:
    """One update of the GPU path with ``gpu.math = math`` against the CPU backend's float32 update from the
    same weights and replay: the loss's and the gradients' relative L2 differences."""
    feats = build_features(bars)
    fold = dict(train_start=200, train_stop=700, val_start=720, val_stop=740, test_start=760, test_stop=780)
    w = make_window(bars, feats, fold)
    prof = GpuProfile(hidden=16, atoms=5, batch=16, n_envs=4, math=math)
    cfg = TrainConfig(rollout_steps=6, n_step=2, episode_len=30, learning_starts=0, replay_capacity=1024,
                      v_min=-2.0, v_max=2.0, lr=1e-3)
    device = Device()
    gpu = DeviceTrainer(device, fold_gemm(device), prof, cfg, bars.market, 100_000.0, seed=11)
    graphs = gpu.prepare(w)
    S = gpu.state
    assert all(n.bf16 == (math == "bf16") for n in S.nets)
    S.envs.eps_slot.value[0] = 1.0
    graphs.experience.launch()
    one_update = device.capture(gpu.enqueue_update)
    cpu = CpuTrainer(prof, cfg, bars.market, 100_000.0, seed=11)
    cpu.setup(w)
    rp = cpu.replay
    size = int(S.replay.size.copy_to_host()[0])
    rp.int_store, rp.float_store = S.replay.int_store.copy_to_host(), S.replay.float_store.copy_to_host()
    rp.prio, rp.size = S.replay.prio.copy_to_host(), size
    one_update.replay(1)
    r = cpu.update()
    assert np.array_equal(S.batch.idx.copy_to_host(), r.idx)
    assert np.isfinite(S.learner.params.copy_to_host()).all()
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
    return rel(S.batch.loss.copy_to_host(), r.loss), rel(gpu.host_layout(S.learner.grads.copy_to_host()), r.grads)


@pytest.mark.slow
def test_a_bf16_update_is_the_fp32_update_within_bfloat16_rounding(bars, fold_gemm):
    """``gpu.math = "bf16"``: every network of the fold computes on bfloat16 operands (weights,
    observations, activations, the backward's gradients; float32 accumulation, master weights and Adam).
    One update against the CPU backend's float32 one from the same weights and replay: the same batch,
    the loss and gradients within bfloat16's rounding (~2^-9 per operand) and ten times further from it
    than the fp32 path (the operands really were rounded)."""
    l32, g32 = _update_against_cpu(bars, fold_gemm, "fp32")
    l16, g16 = _update_against_cpu(bars, fold_gemm, "bf16")
    print(f"against the CPU's float32 update (relative L2): fp32 loss {l32:.1e} gradients {g32:.1e}; "
          f"bf16 loss {l16:.1e} gradients {g16:.1e}")
    assert l16 < 2e-3 and g16 < 2e-2
    assert g16 > 10 * g32 and l16 > 10 * l32


@pytest.mark.slow
def test_bf16_weights_written_by_adam_train_what_converting_before_each_forward_trains(bars, fold_gemm, monkeypatch):
    """``gpu.math = "bf16"``: the update's and the envs' networks read the learner's bfloat16 weights, which
    Adam and the EMA write beside the float32 ones (``optim.adam_bf16_kernel``) and a restore converts
    again, and the update's two networks read the batch's bfloat16 observations, converted once per
    update after the draw (``Batch.obs_pair16``). A fold trained so equals, bit for bit, the same fold
    whose networks convert the float32 weights and observations before each forward (the copies are the
    same rounding of the same values); the copies end equal to the weights rounded; after updates and a
    restore they are the restored weights rounded; a forward on other observations than the batch's is
    refused."""
    from cuda_kernels import bf16
    from workbench.agent import network

    feats = build_features(bars)
    fold = dict(train_start=300, train_stop=600, val_start=610, val_stop=618, test_start=630, test_stop=638)
    w = make_window(bars, feats, fold)
    prof = GpuProfile(hidden=8, atoms=3, batch=4, n_envs=2, math="bf16")
    cfg = TrainConfig(epochs=2, rollout_steps=2, n_step=1, episode_len=20, learning_starts=0, max_steps_per_epoch=2,
                      replay_capacity=1024, v_min=-2.0, v_max=2.0, lr=1e-3, eps_start=0.5, eps_end=0.5)
    device = Device()
    runs = {}
    for mode in ("adam writes them", "each forward converts"):
        if mode == "each forward converts":
            make = network.DeviceNetwork.__init__
            monkeypatch.setattr(network.DeviceNetwork, "__init__",
                                lambda self, *a, weights16=None, obs16=None, **kw: make(self, *a, **kw))
        t = DeviceTrainer(device, fold_gemm(device), prof, cfg, bars.market, 100_000.0, seed=5)
        runs[mode] = (t, t.train_fold(w))
        nets = t.state.nets
        assert all(n.converts_weights == (mode == "each forward converts" or n is nets.backtest) for n in nets)
        assert all(n.converts_obs == (mode == "each forward converts" or n in (nets.env, nets.backtest)) for n in nets)
    (t, a), (_, b) = runs["adam writes them"], runs["each forward converts"]
    assert [e.loss for e in a.epochs] == [e.loss for e in b.epochs] and a.epochs[-1].updates == 2
    assert np.array_equal(a.params, b.params) and np.array_equal(a.test_pnl, b.test_pnl)
    lr = t.state.learner
    r16 = lambda x: bf16.to_bf16_ref(x.copy_to_host())  # noqa: E731
    assert np.array_equal(lr.params16.copy_to_host(), r16(lr.params))
    assert np.array_equal(lr.target16.copy_to_host(), r16(lr.target))
    batch = t.state.batch
    assert np.array_equal(batch.obs_pair16.copy_to_host(), r16(batch.obs_pair))  # the last update's batch, rounded
    with pytest.raises(ValueError, match="observations' bfloat16 copy"):
        t.state.nets.t2.forward(lr.target, batch.obs, head=False)  # s, not s': the copy would be stale
    t.snapshot()
    before = r16(lr.params)
    t.graphs.update.launch()  # more updates move the weights and their copies
    assert not np.array_equal(lr.params16.copy_to_host(), before)
    t.restore()
    device.synchronize()
    assert np.array_equal(lr.params16.copy_to_host(), before) and np.array_equal(before, r16(lr.params))
    assert np.array_equal(lr.target16.copy_to_host(), r16(lr.target))
