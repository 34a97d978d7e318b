"""Our kernels of the update at the reference shape, alone and 16 at once, against another tree's (#16, #15).

Times ``cuda_kernels.c51``'s ``head_kernel(51, (3, 3, 3))`` (2048 rows: the online forward on s and s'; 1024
rows: the target's on s'; what acting runs), ``head_loss_kernel(51, (3, 3, 3))`` (1024 samples: an update's heads and
loss; an old tree's three launches for the same) and ``dense.bias_act_backward_kernel``
(1024 rows of 512 hidden units with the ReLU's gradient; 510 head columns without), each launched
``--inner`` times in a graph of its own, on one stream (``alone``: what one agent's update pays) and on
16 lanes side by side (``x16``: what a saturated population pays per agent), with the registers a thread
uses. With ``--old DIR`` (another tree's ``cuda_kernels``) the same for that tree's kernels and the
largest difference between both trees' outputs (0 when they agree bit for bit). Variants that are not
the kernels' own launch (other register caps, other block shapes) are marked as such.
Usage (on the GPU machine): python bench/kernel_probe.py [--old .before2/cuda_kernels] [--json OUT]
"""
from __future__ import annotations

import argparse
import importlib.util
import json

import numpy as np

from train_step import ATOMS, BRANCHES, B, H, us_per_launch


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"cuda_kernels.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _regs(kern) -> int:
    disp = getattr(kern, "dispatcher", kern)
    regs = disp.get_regs_per_thread()
    return max(regs.values()) if isinstance(regs, dict) else regs


def _params(kern) -> tuple[str, ...]:
    code = kern.py_func.__code__
    return code.co_varnames[:code.co_argcount]


def _reads_bias(kern) -> bool:
    """Whether a head or loss kernel adds the head layer's bias itself (trees before the head GEMM's epilogue
    added it: their kernels take the bias arrays)."""
    return "head_bias" in _params(kern)


def _maxdiff(x: tuple, y: tuple) -> float:
    return max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(x, y))


def main() -> int:
    from numba import cuda

    from cuda_kernels import c51, dense
    from workbench.device import Device

    a = argparse.ArgumentParser()
    a.add_argument("--old", help="another tree's cuda_kernels directory, timed and compared")
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
    consts = [cuda.to_device(x) for x in (sizes, offs, support)]
    res: dict = {"device": d.info.name, "inner": args.inner, "kernels": {}, "max_abs_diff_vs_old": {}}

    def timed(fns) -> float:
        return us_per_launch(d, lanes, fns, args.inner)

    def run(label, make, bufs, kern, outputs_of, reset=None):
        """One launch of ``make(buf)`` on bufs[0] on the device's stream (``reset`` first puts its inputs
        back), its outputs read back (``outputs_of``); then ``make`` timed on bufs[0] alone and on 16 lanes."""
        if reset is not None:
            reset(bufs[0])
        make(bufs[0])(d.stream)  # also loads the kernel before any capture
        d.synchronize()
        out = outputs_of(bufs[0])
        alone = timed([make(bufs[0])])
        x16 = timed([make(b) for b in bufs])
        d.synchronize()
        regs = _regs(kern)
        res["kernels"][label] = {"alone_us": alone, "x16_us_per_agent": x16, "regs": regs}
        print(f"{label:34s} alone {alone:7.2f} us, 16 lanes {x16:7.2f} us per agent, {regs} registers", flush=True)
        return out

    kmods = {"now": (c51, dense)}
    if args.old:
        kmods["old"] = (_load(f"{args.old}/c51.py", "c51_old"), _load(f"{args.old}/dense.py", "dense_old"))

    # ---- the dueling head (its inputs are only read) ----
    for rows in (2 * B, B):
        hb = []
        for _ in range(P):
            h = np.zeros((rows, cols), np.float32)
            h[:, :W] = rng.normal(0, 0.7, (rows, W))
            bias = rng.normal(0, 0.2, cols).astype(np.float32)
            hb.append({"head": cuda.to_device(h), "bias": cuda.to_device(bias), "head_b": cuda.to_device(h + bias),
                       "logp": cuda.device_array((rows, A, ATOMS), np.float32),
                       "q": cuda.device_array((rows, A), np.float32)})
        now_head = c51.head_kernel(ATOMS, BRANCHES)
        variants = [(f"head {n} {rows} rows", now_head if n == "now" else m[0].dueling_head_kernel,
                     m[0].head_launch(rows, ATOMS, nb)) for n, m in kmods.items()]
        for r in (32, 48, 64):  # occupancy against spills: other caps than the kernel's own
            variants.append((f"head now r{r} (variant) {rows} rows",
                             cuda.jit(now_head.signature, max_registers=r)(now_head.py_func),
                             c51.head_launch(rows, ATOMS, nb)))
        outputs = {}
        for label, kern, launch in variants:
            def make(buf, kern=kern, launch=launch):
                head = (buf["head"], buf["bias"]) if _reads_bias(kern) else (buf["head_b"],)
                logp = (buf["logp"], 1) if "write_logp" in _params(kern) else (buf["logp"],)  # written, as before
                if "atoms" not in _params(kern):  # built for its shape (head_kernel): no shape arguments
                    return lambda st: kern[launch + (st,)](*head, rows, consts[2], *logp, buf["q"])
                return lambda st: kern[launch + (st,)](*head, rows, nb, consts[0], consts[1], ATOMS,
                                                       max(BRANCHES), consts[2], *logp, buf["q"])
            outputs[label] = run(label, make, hb, kern, lambda buf: (buf["logp"].copy_to_host(), buf["q"].copy_to_host()))
        if "old" in kmods:
            diff = _maxdiff(outputs[f"head now {rows} rows"], outputs[f"head old {rows} rows"])
            res["max_abs_diff_vs_old"][f"head {rows} rows (logp, q)"] = diff
            print(f"head {rows} rows: max |now - old| {diff:.3g}")

    # ---- the heads and the C51 loss (inputs only read): now one launch, head_loss_kernel; a tree from
    # before it, three (its head kernel on the online rows of s and s' and on the target's, then its loss) ----
    lbs = []
    for _ in range(P):
        pair, ht = np.zeros((2 * B, cols), np.float32), np.zeros((B, cols), np.float32)
        pair[:, :W], ht[:, :W] = rng.normal(0, 0.7, (2 * B, W)), rng.normal(0, 0.7, (B, W))
        bias, bias_t = (rng.normal(0, 0.2, cols).astype(np.float32) for _ in range(2))
        lbs.append({"pair": cuda.to_device(pair), "ht": cuda.to_device(ht), "pair_b": cuda.to_device(pair + bias),
                    "ht_b": cuda.to_device(ht + bias_t), "bias": cuda.to_device(bias), "bias_t": cuda.to_device(bias_t),
                    "acts": cuda.to_device(rng.integers(0, 3, (B, nb)).astype(np.int32)),
                    "rew": cuda.to_device(rng.normal(0, 2, B).astype(np.float32)),
                    "done": cuda.to_device((rng.random(B) < 0.05).astype(np.float32)),
                    "w": cuda.to_device(rng.uniform(0.3, 1, B).astype(np.float32)),
                    "q": cuda.device_array((B, A), np.float32), "lp": cuda.device_array((2 * B, A, ATOMS), np.float32),
                    "qq": cuda.device_array((2 * B, A), np.float32), "lpt": cuda.device_array((B, A, ATOMS), np.float32),
                    "qt": cuda.device_array((B, A), np.float32),
                    "dhead": cuda.device_array((B, cols), np.float32), "loss": cuda.device_array(B, np.float32)})
    gamma_n = 0.99 ** 3

    def fused(lb, kern, launch=c51.loss_launch):
        heads = ((lb["pair"], lb["bias"], lb["ht"], lb["bias_t"]) if _reads_bias(kern) else (lb["pair_b"], lb["ht_b"]))
        if "atoms" not in _params(kern):  # built for its shape (head_loss_kernel): no shape arguments
            return lambda st: kern[launch(B, ATOMS, nb) + (st,)](
                *heads, lb["acts"], lb["rew"], lb["done"], gamma_n, -10.0, 10.0, lb["w"], consts[2], 1.0 / B, lb["q"],
                lb["dhead"], lb["loss"], B)
        return lambda st: kern[launch(B, ATOMS, nb) + (st,)](
            *heads, lb["acts"], lb["rew"], lb["done"], gamma_n, -10.0, 10.0,
            ATOMS, lb["w"], nb, consts[0], consts[1], max(BRANCHES), consts[2], 1.0 / B, lb["q"], lb["dhead"],
            lb["loss"], B)

    now_loss = c51.head_loss_kernel(ATOMS, BRANCHES)
    outputs = {"now": run(f"heads + loss now (one launch) {B} samples", lambda lb: fused(lb, now_loss), lbs, now_loss,
                          lambda lb: (lb["dhead"].copy_to_host(), lb["loss"].copy_to_host(), lb["q"].copy_to_host()))}
    for r in (40, 48, 64):  # occupancy against spills: register caps the kernel does not have
        kern = cuda.jit(now_loss.signature, max_registers=r)(now_loss.py_func)
        run(f"heads + loss now r{r} (variant)", lambda lb, kern=kern: fused(lb, kern), lbs, kern, lambda lb: None)
    if "old" in kmods and hasattr(kmods["old"][0], "c51_head_loss_kernel"):  # an older one-launch kernel
        m = kmods["old"][0]
        outputs["old"] = run(f"heads + loss old (one launch) {B} samples",
                             lambda lb: fused(lb, m.c51_head_loss_kernel, m.loss_launch), lbs, m.c51_head_loss_kernel,
                             lambda lb: (lb["dhead"].copy_to_host(), lb["loss"].copy_to_host(), lb["q"].copy_to_host()))
    elif "old" in kmods and hasattr(kmods["old"][0], "c51_loss_kernel"):
        m = kmods["old"][0]

        def three(lb):
            def launches(st):
                m.dueling_head_kernel[m.head_launch(2 * B, ATOMS, nb) + (st,)](
                    lb["pair"], lb["bias"], 2 * B, nb, consts[0], consts[1], ATOMS, max(BRANCHES), consts[2], lb["lp"],
                    lb["qq"])
                m.dueling_head_kernel[m.head_launch(B, ATOMS, nb) + (st,)](
                    lb["ht"], lb["bias_t"], B, nb, consts[0], consts[1], ATOMS, max(BRANCHES), consts[2], lb["lpt"],
                    lb["qt"])
                m.c51_loss_kernel[m.loss_launch(B, ATOMS, nb) + (st,)](
                    lb["lp"][:B], lb["qq"][B:], lb["lpt"], lb["acts"], lb["rew"], lb["done"], gamma_n, -10.0, 10.0,
                    ATOMS, lb["w"], nb, consts[0], consts[1], 1.0 / B, lb["dhead"], lb["loss"], B)
            return launches

        outputs["old"] = run(f"heads + loss old (three launches) {B} samples", three, lbs, m.c51_loss_kernel,
                             lambda lb: (lb["dhead"].copy_to_host(), lb["loss"].copy_to_host(),
                                         lb["qq"].copy_to_host()[:B]))
    if "old" in outputs:
        same = all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(outputs["now"], outputs["old"]))
        diff = _maxdiff(outputs["now"], outputs["old"])
        res["max_abs_diff_vs_old"]["heads + loss (dhead, loss, Q of s): now vs old"] = diff
        res["heads_loss_bit_for_bit_vs_old"] = same
        print(f"heads + loss: max |now - old| {diff:.3g}, bit for bit: {same}")

    # ---- the bias gradient: dY is changed in place (by the ReLU's mask: idempotent), so each output is
    # read after one launch from the same inputs ----
    for N, act, what in ((H, dense.ACT_RELU, "hidden, ReLU"), (W, dense.ACT_IDENTITY, "head")):
        ld = (N + 3) // 4 * 4
        dY0 = rng.normal(0, 1, (B, ld)).astype(np.float32)
        Y = cuda.to_device(np.maximum(rng.normal(0, 1, (B, ld)), 0).astype(np.float32))
        bb = [{"dY": cuda.to_device(dY0), "db": cuda.device_array(N, np.float32),
               "partial": cuda.device_array((64, N), np.float32), "arrivals": cuda.to_device(np.zeros(64, np.int32))}
              for _ in range(P)]
        variants = [(f"bias grad {n} {what} {B}x{N}", m[1], m[1].bias_backward_launch(N, False)) for n, m in kmods.items()]
        for blk, slices in (((32, 16), 4), ((32, 4), 16), ((16, 8), 8), ((32, 8), 16)):
            variants.append((f"bias grad now {blk}x{slices} slices (variant) {what}", dense,
                             (((N + blk[0] - 1) // blk[0], slices), blk)))
        outputs = {}
        for label, mod, launch in variants:
            kern = mod.bias_act_backward_kernel
            scratch = hasattr(mod, "BWD_SLICES")  # a tree from before the row slices takes no scratch

            def make(buf, kern=kern, launch=launch, scratch=scratch):
                extra = (buf["partial"], buf["arrivals"]) if scratch else ()
                return lambda st: kern[launch + (st,)](buf["dY"], Y, buf["db"], B, N, act, *extra)
            outputs[label] = run(label, make, bb, kern, lambda buf: (buf["dY"].copy_to_host(), buf["db"].copy_to_host()),
                                 reset=lambda buf: buf["dY"].copy_to_device(dY0, stream=d.stream))
        d_want, _ = dense.bias_act_backward_ref(dY0[:, :N], Y.copy_to_host()[:, :N], act)
        want = (d_want, d_want.astype(np.float64).sum(axis=0))
        for label, out in outputs.items():
            err = _maxdiff((out[0][:, :N], out[1]), want)
            res["kernels"][label]["max_abs_err_vs_float64"] = err
            print(f"{label}: max |out - float64 reference| {err:.3g}")
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
