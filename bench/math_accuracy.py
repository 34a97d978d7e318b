"""The GEMM maths' accuracy in the update itself (#16): fp32 and TF32 at the reference shape.

For each math (``GpuProfile.math``) one agent as in ``bench/train_step.py`` (batch 1024, hidden 512, 51
atoms, 3x3 actions, replay of 1M transitions filled by 4096 envs x 256 steps with epsilon 1, so every
math trains on the same ring: checked by a checksum), seed 1, then ``--steps`` updates one graph replay
at a time:

- **update 1** starts from the same weights on the same batch in every math: its per-sample loss and
  its gradient against a float64 NumPy reference of the same update (``forward_ref``, ``c51_loss_ref``,
  ``backward_ref`` on the batch read back), relative error ``||x - ref|| / ||ref||``: what one update's
  GEMMs cost in accuracy, nothing else mixed in;
- **the trajectory**: the batch-mean loss of every update, each math against fp32's at the same update
  (median and largest relative difference), and the weights after the last update: their distance from
  fp32's relative to how far fp32's weights moved from the start. Past update 1 the maths sample
  different batches (priorities follow the losses), so this shows how rounding grows through training.

Usage (GPU): ``python bench/math_accuracy.py [--steps 300] [--maths fp32,tf32] [--json OUT]``.
The learning check's out-of-sample comparison over seeds is the other half (BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json

import numpy as np

from train_step import ATOMS, B, CAP, H, _window


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def reference(tr, params_host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Update 1 in float64 on the batch the GPU drew (read back): (gradient in the host layout, loss [B])."""
    from cuda_kernels import c51
    from workbench.agent.network import backward_ref, forward_ref

    S, cfg = tr.state, tr.cfg
    b, shape = S.batch, S.shape.host
    pair = b.obs_pair.copy_to_host()[:, :shape.obs_dim].astype(np.float64)  # the padding column dropped
    s, s2 = pair[:B], pair[B:]
    support = S.nets.online.support.copy_to_host().astype(np.float64)
    a_s, a_s2 = forward_ref(params_host, s, shape, support), forward_ref(params_host, s2, shape, support)
    # the target equals the weights before update 1, so its forward on s' is the online one's
    dhead, loss = c51.c51_loss_ref(a_s["logp"], a_s2["q"], a_s2["logp"], b.actions.copy_to_host(),
                                   b.ret.copy_to_host().astype(np.float64), b.terminal.copy_to_host().astype(np.float64),
                                   cfg.gamma ** cfg.n_step, cfg.v_min, cfg.v_max, shape.atoms,
                                   b.isw.copy_to_host().astype(np.float64), list(shape.branch_sizes), 1.0 / B)
    return backward_ref(params_host, s, a_s, dhead, shape), loss


def run(math: str, steps: int, n_envs: int = 4096) -> dict:
    from workbench.agent.gemm import make_gemm
    from workbench.agent.train_config import TrainConfig
    from workbench.agent.trainer import DeviceTrainer
    from workbench.device import Device
    from workbench.gpu_profile import GpuProfile
    from workbench.markets import load_market

    device = Device()
    prof = GpuProfile(name="bench", hidden=H, atoms=ATOMS, batch=B, n_envs=n_envs, replay_vram_fraction=0.5,
                      gemm="cublas", math=math)
    cfg = TrainConfig(replay_capacity=CAP, rollout_steps=CAP // n_envs, learning_starts=0)
    tr = DeviceTrainer(device, make_gemm(device, "cublas", math), prof, cfg, load_market("es"), 100_000.0, seed=1)
    g = tr.prepare(_window())
    tr.state.envs.eps_slot.value[0] = 1.0
    g.experience.launch()
    device.synchronize()
    rp, lr, b = tr.state.replay, tr.state.learner, tr.state.batch
    ring = hashlib.sha256(rp.int_store.copy_to_host().tobytes() + rp.float_store.copy_to_host().tobytes()).hexdigest()
    p0 = tr.host_layout(lr.params.copy_to_host())
    one = device.capture(tr.enqueue_update)
    losses = []
    for i in range(steps):
        one.replay(1)
        device.synchronize()
        loss = b.loss.copy_to_host()
        losses.append(float(np.mean(b.isw.copy_to_host() * loss)))
        if i == 0:
            grads = tr.host_layout(lr.grads.copy_to_host())
            g_ref, loss_ref = reference(tr, p0.astype(np.float64))
            first = {"grad_rel_err_vs_float64": _rel(grads, g_ref), "loss_rel_err_vs_float64": _rel(loss, loss_ref),
                     "grad": grads, "loss": loss}
    assert lr.guard.copy_to_host()[0] == 0, f"{math}: the guard tripped"
    out = {"math": math, "ring_sha256": ring, "first": first, "losses": np.array(losses),
           "params_start": p0, "params_end": tr.host_layout(lr.params.copy_to_host()),
           "gemm": getattr(tr.gemm, "name", "?"), "fused_forward": tr.state.nets.online.fused}
    del one, tr, g
    gc.collect()
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--maths", default="fp32,tf32")
    p.add_argument("--json")
    args = p.parse_args()
    runs = [run(m, args.steps) for m in args.maths.split(",")]
    base = next(r for r in runs if r["math"] == "fp32")
    moved = float(np.linalg.norm(base["params_end"] - base["params_start"]))
    rows = []
    print(f"update at batch {B}, hidden {H}, {ATOMS} atoms, replay {CAP}, seed 1, {args.steps} updates; "
          "relative errors ||x - ref|| / ||ref||")
    print(f"{'math':>5} {'same ring':>9} {'upd 1 grad vs f64':>17} {'upd 1 loss vs f64':>17} "
          f"{'upd 1 grad vs fp32':>18} {'loss vs fp32: median':>20} {'max':>8} {'weights vs fp32 / moved':>23}")
    for r in runs:
        rel_loss = np.abs(r["losses"] - base["losses"]) / np.abs(base["losses"])
        row = {"math": r["math"], "gemm": r["gemm"], "fused_forward": r["fused_forward"],
               "same_ring_as_fp32": r["ring_sha256"] == base["ring_sha256"],
               "update1_grad_rel_err_vs_float64": r["first"]["grad_rel_err_vs_float64"],
               "update1_loss_rel_err_vs_float64": r["first"]["loss_rel_err_vs_float64"],
               "update1_grad_rel_diff_vs_fp32": _rel(r["first"]["grad"], base["first"]["grad"]),
               "loss_rel_diff_vs_fp32_median": float(np.median(rel_loss)),
               "loss_rel_diff_vs_fp32_max": float(np.max(rel_loss)),
               "weights_diff_vs_fp32_over_fp32_moved": float(np.linalg.norm(r["params_end"] - base["params_end"])) / moved,
               "mean_loss_first_last": [float(r["losses"][0]), float(r["losses"][-1])],
               "steps": args.steps}
        rows.append(row)
        print(f"{r['math']:>5} {str(row['same_ring_as_fp32']):>9} {row['update1_grad_rel_err_vs_float64']:17.2e} "
              f"{row['update1_loss_rel_err_vs_float64']:17.2e} {row['update1_grad_rel_diff_vs_fp32']:18.2e} "
              f"{row['loss_rel_diff_vs_fp32_median']:20.2e} {row['loss_rel_diff_vs_fp32_max']:8.2e} "
              f"{row['weights_diff_vs_fp32_over_fp32_moved']:23.3f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
