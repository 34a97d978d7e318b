"""The dueling head and the C51 loss at the reference shape, alone and 16 at once (issue #16, #15).

Times ``cuda_kernels.c51``'s ``dueling_head_kernel`` (2048 rows: the online forward on s and s'; 1024
rows: the target's on s') and ``c51_loss_kernel`` (1024 samples), each launched ``--inner`` times in a
graph of its own, on one stream (``alone``: what one agent's update pays) and on 16 lanes side by side
(``x16``: what a saturated population pays per agent). With ``--old PATH`` (another tree's
``cuda_kernels/c51.py``) the same for that tree's kernels, and a check that both write the same outputs
bit for bit. ``head f32`` is an experiment kept here only: the head with float32 logits and exponentials
(the kernel forms them in float64), the kernel's layout otherwise, its largest difference from the kernel's outputs reported.
Usage (on the GPU machine): python bench/c51_probe.py [--old .before2/cuda_kernels/c51.py] [--json OUT]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math

import numpy as np

from train_step import ATOMS, B, BRANCHES, ms_per_step


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"cuda_kernels.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _f32_head(c51, **jit):
    """The experiment: ``dueling_head_kernel``'s layout with float32 arithmetic throughout."""
    from cuda_kernels.nb import cuda, float32, warp_max, warp_sum

    HS = c51.HEAD_SLOTS

    @cuda.jit(**jit)
    def head_f32(head, head_bias, B, n_branch, branch_size, branch_off, atoms, max_actions, support, logp, q):
        b = cuda.blockIdx.x
        if b >= B:
            return
        lane, width, br = cuda.threadIdx.x, cuda.blockDim.x, cuda.threadIdx.y
        nA, off = branch_size[br], branch_off[br]
        k = c51._slots(atoms, width)
        v = cuda.local.array(HS, float32)
        mean = cuda.local.array(HS, float32)
        logit = cuda.local.array(HS, float32)
        t = cuda.local.array(HS, float32)
        inv = float32(1.0) / float32(nA)
        for j in range(HS):
            if j >= k:
                break
            z = lane + width * j
            v[j] = head[b, z] + head_bias[z] if z < atoms else float32(0.0)
            mn = float32(0.0)
            if z < atoms:
                for a2 in range(nA):
                    c2 = atoms * (1 + off + a2) + z
                    mn += head[b, c2] + head_bias[c2]
            mean[j] = mn * inv
        for a in range(max_actions):
            live = a < nA
            for j in range(HS):
                if j >= k:
                    break
                z = lane + width * j
                c = atoms * (1 + off + a) + z
                logit[j] = v[j] + (head[b, c] + head_bias[c]) - mean[j] if z < atoms and live else float32(-3.4e38)
                t[j] = logit[j]
            mx = warp_max(c51._fold(t, k, 1))
            for j in range(HS):
                if j >= k:
                    break
                z = lane + width * j
                t[j] = float32(0.0)
                if z < atoms and live:
                    t[j] = math.exp(logit[j] - mx)
            lse = mx + math.log(warp_sum(c51._fold(t, k, 0))) if live else float32(0.0)
            for j in range(HS):
                if j >= k:
                    break
                z = lane + width * j
                t[j] = float32(0.0)
                if z < atoms and live:
                    lp = logit[j] - lse
                    logp[b, off + a, z] = lp
                    t[j] = math.exp(lp) * support[z]
            qa = warp_sum(c51._fold(t, k, 0))
            if lane == 0 and live:
                q[b, off + a] = qa

    return head_f32


def main() -> int:
    from numba import cuda

    from cuda_kernels import c51
    from workbench.device import Device

    a = argparse.ArgumentParser()
    a.add_argument("--old", help="another tree's cuda_kernels/c51.py, timed and compared")
    a.add_argument("--inner", type=int, default=50)
    a.add_argument("--json")
    args = a.parse_args()
    d = Device()
    rng = np.random.default_rng(0)
    nb, A = len(BRANCHES), sum(BRANCHES)
    W = ATOMS * (1 + A)
    cols = (W + 3) // 4 * 4
    sizes, offs = np.array(BRANCHES, np.int32), np.array(np.cumsum((0,) + BRANCHES)[:-1], np.int32)
    support = np.linspace(-10, 10, ATOMS).astype(np.float32)
    lanes = [d.lane() for _ in range(16)]
    P = len(lanes)

    def bufs(rows):
        h = np.zeros((rows, cols), np.float32)
        h[:, :W] = rng.normal(0, 0.7, (rows, W))
        return {"head": cuda.to_device(h), "bias": cuda.to_device(rng.normal(0, 0.2, cols).astype(np.float32)),
                "logp": cuda.device_array((rows, A, ATOMS), np.float32), "q": cuda.device_array((rows, A), np.float32)}

    consts = [cuda.to_device(x) for x in (sizes, offs, support)]

    def head_call(mod, kern, launch, buf, rows):
        return lambda st: kern[launch + (st,)](buf["head"], buf["bias"], rows, nb, consts[0], consts[1], ATOMS,
                                               max(BRANCHES), consts[2], buf["logp"], buf["q"])

    def loss_bufs():
        logp = np.log(rng.dirichlet(np.ones(ATOMS), (B, A))).astype(np.float32)
        return {"logp": cuda.to_device(logp), "qn": cuda.to_device(rng.normal(0, 1, (B, A)).astype(np.float32)),
                "lpt": cuda.to_device(logp[rng.permutation(B)]),
                "acts": cuda.to_device(rng.integers(0, 3, (B, nb)).astype(np.int32)),
                "rew": cuda.to_device(rng.normal(0, 2, B).astype(np.float32)),
                "done": cuda.to_device((rng.random(B) < 0.05).astype(np.float32)),
                "w": cuda.to_device(rng.uniform(0.3, 1, B).astype(np.float32)),
                "dhead": cuda.device_array((B, cols), np.float32), "loss": cuda.device_array(B, np.float32)}

    def loss_call(mod, launch, lb):
        return lambda st: mod.c51_loss_kernel[launch + (st,)](
            lb["logp"], lb["qn"], lb["lpt"], lb["acts"], lb["rew"], lb["done"], 0.99 ** 3, -10.0, 10.0, ATOMS, lb["w"],
            nb, consts[0], consts[1], 1.0 / B, lb["dhead"], lb["loss"], B)

    def timed(fns) -> float:
        """us per launch per agent: each of ``fns`` (one per lane; one alone) launched ``inner`` times."""
        inner = args.inner
        if len(fns) == 1:
            g = d.capture(lambda st: [fns[0](st) for _ in range(inner)])
        else:
            g = d.capture_lanes(lanes, [lambda st, f=f: [f(st) for _ in range(inner)] for f in fns])
        return 1e3 * ms_per_step(d, lambda: g.replay(4), 4 * inner * len(fns))

    mods = {"now": c51}
    if args.old:
        mods["old"] = _load(args.old, "c51_old")
    res: dict = {"device": d.info.name, "inner": args.inner, "rows": {}}
    f32 = _f32_head(c51)
    capped = {}
    for r in (40, 32):
        capped[("now", r)] = cuda.jit(c51.dueling_head_kernel.signature, max_registers=r)(
            c51.dueling_head_kernel.py_func)
        capped[("f32", r)] = _f32_head(c51, max_registers=r)
    outputs: dict = {}
    for rows in (2 * B, B):
        hb = [bufs(rows) for _ in range(P)]
        variants = []
        for name, mod in mods.items():
            launch = mod.head_launch(rows, ATOMS, nb)
            variants.append((f"head {name}", mod, mod.dueling_head_kernel, launch))
        variants.append(("head f32", c51, f32, c51.head_launch(rows, ATOMS, nb)))
        for r in (40, 32):  # occupancy against spills: the registers a thread may use capped
            variants.append((f"head r{r}", c51, capped[("now", r)], c51.head_launch(rows, ATOMS, nb)))
            variants.append((f"head f32 r{r}", c51, capped[("f32", r)], c51.head_launch(rows, ATOMS, nb)))
        for name, mod, kern, launch in variants:
            alone = timed([head_call(mod, kern, launch, hb[0], rows)])
            x16 = timed([head_call(mod, kern, launch, b, rows) for b in hb])
            d.synchronize()
            outputs[(name, rows)] = (hb[0]["logp"].copy_to_host(), hb[0]["q"].copy_to_host())
            disp = getattr(kern, "dispatcher", kern)
            regs = max(disp.get_regs_per_thread().values()) if isinstance(disp.get_regs_per_thread(), dict) \
                else disp.get_regs_per_thread()
            res["rows"][f"{name} {rows} rows"] = {"alone_us": alone, "x16_us_per_agent": x16, "regs": regs}
            print(f"{name:12s} {rows:5d} rows: alone {alone:7.2f} us, 16 lanes {x16:7.2f} us per agent, "
                  f"{regs} registers per thread", flush=True)
        now = outputs[("head now", rows)]
        if "old" in mods:
            same = all(np.array_equal(x, y) for x, y in zip(now, outputs[("head old", rows)]))
            res[f"head {rows} rows: now == old bit for bit"] = same
            print(f"head {rows} rows: now == old bit for bit: {same}")
        diff = [float(np.max(np.abs(x - y))) for x, y in zip(now, outputs[("head f32", rows)])]
        res[f"head {rows} rows: f32 max |diff| (logp, q)"] = diff
        print(f"head {rows} rows: f32 vs now max |diff| logp {diff[0]:.3g}, q {diff[1]:.3g}")
    lbs = [loss_bufs() for _ in range(P)]
    for name, mod in mods.items():
        launch = mod.loss_launch(B, ATOMS) if name == "old" else mod.loss_launch(B, ATOMS, nb)
        alone = timed([loss_call(mod, launch, lbs[0])])
        x16 = timed([loss_call(mod, launch, lb) for lb in lbs])
        d.synchronize()
        outputs[("loss", name)] = (lbs[0]["dhead"].copy_to_host(), lbs[0]["loss"].copy_to_host())
        regs = mod.c51_loss_kernel.dispatcher.get_regs_per_thread()
        regs = max(regs.values()) if isinstance(regs, dict) else regs
        res["rows"][f"loss {name} {B} samples"] = {"alone_us": alone, "x16_us_per_agent": x16, "regs": regs}
        print(f"loss {name}: {regs} registers per thread")
        print(f"loss {name:5s} {B} samples: alone {alone:7.2f} us, 16 lanes {x16:7.2f} us per agent", flush=True)
    if "old" in mods:
        same = all(np.array_equal(x, y) for x, y in zip(outputs[("loss", "now")], outputs[("loss", "old")]))
        res["loss: now == old bit for bit"] = same
        print(f"loss: now == old bit for bit: {same}")
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
