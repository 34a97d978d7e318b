"""Training-step benchmark at the reference shape (issue #4): ours vs PyTorch on the same GPU, same run.

Shape: batch 1024, hidden 512, 51 atoms, 3 branches of 3 actions, observation = 16 features + 7
position one-hot, replay of 1M transitions. One update = PER sample from 1M (prefix sum + stratified
search + weights), gathers, online forward on s and s', target forward on s', dueling C51 double-DQN
n-step loss, backward, global-norm clip, Adam, priority update, Polyak target update.

- ours: one update captured as a graph and replayed ``--steps`` times (``graph replay``), ``--steps``
  updates as one launch of a graph loop (``graph loop``, what the trainer runs), and the same kernels
  launched eagerly from Python (``eager``); cuBLAS fp32, and cuBLAS TF32, each with our bias / ReLU
  kernels after the GEMMs and with them fused into cuBLASLt's GEMMs (``workbench/cublaslt.py``);
- PyTorch: the same network and update written with torch ops, eager and captured as a torch CUDA
  graph (Adam capturable=True), fp32 with TF32 disabled.

Each figure: median ms per update over 5 timed blocks of ``--steps`` updates, after warm-up.
"""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

B, H, ATOMS, F, CAP = 1024, 512, 51, 16, 1 << 20
BRANCHES = (3, 3, 3)
N_POS = 7


def _window(T=40_000, seed=0):
    from workbench.agent.window import Window
    import pandas as pd

    rng = np.random.default_rng(seed)
    close = np.round((5000 + np.cumsum(rng.normal(0, 0.5, T))) / 0.25) * 0.25
    open_ = np.concatenate([[close[0]], close[:-1]])
    idx = pd.date_range("2024-01-01", periods=T, freq="min", tz="UTC")
    return Window(0, rng.normal(size=(T, F)).astype(np.float32), open_, np.maximum(open_, close) + 0.25,
                  np.minimum(open_, close) - 0.25, close, np.zeros(T, np.int8), (np.arange(T) // 1380).astype(np.int32),
                  (0, 30_000), (30_100, 35_000), (35_100, 40_000), idx)


class _nvtx:
    """An NVTX range around a block (PyTorch's binding; nothing where PyTorch is absent)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        try:
            import torch

            torch.cuda.nvtx.range_push(self.name)
            self.pop = torch.cuda.nvtx.range_pop
        except Exception:  # no PyTorch: no range
            self.pop = None
        return self

    def __exit__(self, *exc):
        if self.pop is not None:
            self.pop()


def ms_per_step(device, fn, steps: int) -> float:
    """GPU ms per step of ``fn`` (which enqueues ``steps`` steps): median of 5 event-timed calls after one
    warm call."""
    fn()
    device.synchronize()
    out = []
    for _ in range(5):
        a = device.event().record()
        fn()
        b = device.event().record()
        out.append(a.elapsed_ms(b) / steps)
    return statistics.median(out)


def us_per_launch(device, lanes, fns, inner: int) -> float:
    """GPU us per launch (per agent) of ``fns``: one alone on the device's stream, or one per lane of
    ``lanes`` side by side in one graph, each launched ``inner`` times in a row, the graph replayed."""
    if len(fns) == 1:
        g = device.capture(lambda st: [fns[0](st) for _ in range(inner)])
    else:
        g = device.capture_lanes(lanes, [lambda st, f=f: [f(st) for _ in range(inner)] for f in fns])
    return 1e3 * ms_per_step(device, lambda: g.replay(4), 4 * inner * len(fns))


def ours(math: str, steps: int, rows: list, fused: bool = True, beside: bool = False, pdl: str = "off",
         share: bool = False):
    """Our update at the reference shape (``beside``: its independent work on a side stream,
    ``DeviceTrainer.update_beside``; ``pdl``: programmatic edges between the graphs' kernels,
    ``workbench.graph_edges``; ``share``: the GEMMs planned for the SMs they fill, ``gpu.sm_share``, what
    an agent alone runs where its profile shares the GPU with a population; the per-launch breakdown is
    measured on one stream without them only)."""
    from workbench.agent.gemm import make_gemm
    from workbench.agent.train_config import TrainConfig
    from workbench.agent.trainer import DeviceTrainer, Side
    from workbench.device import Device, Loop
    from workbench.gpu_profile import GpuProfile
    from workbench.markets import load_market

    device = Device(pdl)
    prof = GpuProfile(name="bench", hidden=H, atoms=ATOMS, batch=B, n_envs=4096, replay_vram_fraction=0.5,
                      gemm="cublas", math=math, fused_epilogues=fused)
    cfg = TrainConfig(replay_capacity=CAP, rollout_steps=256, learning_starts=0)
    lane = device.lane()
    main_gemm, side_gemm = make_gemm(device, "cublas", math), make_gemm(lane, "cublas", math)
    for g in (main_gemm, side_gemm):
        g.share_gpu(share)
    side = (lambda: Side(lane, side_gemm)) if beside else None
    tr = DeviceTrainer(device, main_gemm, prof, cfg, load_market("es"), 100_000.0, seed=1, side=side)
    w = _window()
    g = tr.prepare(w)
    if fused and not tr.state.nets.online.fused:
        raise SystemExit(f"fused epilogues asked for but unavailable: {tr.gemm.lt_error}")
    back = "and backward" if tr.state.nets.online.fuses_backward else "only"
    math = (f"{math}, {f'fused epilogues: forward {back}' if fused else 'bias kernels'}"
            + (", side stream" if beside else "") + (f", PDL {pdl}" if pdl != "off" else "")
            + (", sm_share" if share else ""))
    tr.state.envs.eps_slot.value[0] = 1.0
    g.experience.launch()  # 4096 envs x 256 steps = 1M transitions: a full ring
    device.synchronize()

    one = device.capture(tr.enqueue_update)
    loop = device.capture_loops([Loop(device, tr.enqueue_update, steps, guard=tr.state.learner.guard)])
    with _nvtx("update"):  # the range bench/ncu_bytes.py profiles
        graph_ms = ms_per_step(device, lambda: one.replay(steps), steps)
    loop_ms = ms_per_step(device, loop.launch, steps)
    eager_ms = ms_per_step(device, lambda: [tr.enqueue_update(device.stream) for _ in range(steps)], steps)
    assert tr.state.learner.guard.copy_to_host()[0] == 0  # every loop ran all its passes
    if not beside and pdl == "off" and not share:
        breakdown(tr, device, rows, math)
    rows.append((f"ours, graph replay, cuBLAS {math}", graph_ms, one.n_nodes))
    rows.append((f"ours, graph loop ({steps} updates in one launch), cuBLAS {math}", loop_ms, one.n_nodes))
    rows.append((f"ours, eager Numba launches, cuBLAS {math}", eager_ms, one.n_nodes))
    rb = tr.state.replay.size.copy_to_host()[0]
    assert rb == CAP, rb
    return tr


def breakdown(tr, device, rows, math: str, inner: int = 50):
    """GPU time of every launch of one update, each timed alone: the launch recorded from an eager update,
    captured ``inner`` times back to back in a graph of its own and replayed (so host launch gaps, which
    dominate eager timing, are not counted). Names: the kernel, or the GEMM's shape; the sum of the parts
    beside the whole graph says how much the graph's dependencies and node gaps add."""
    from collections import defaultdict

    from cuda_kernels import nb

    launches = []
    cls = type(tr.gemm)
    orig_getitem, orig_gemm, orig_epi = nb.Kernel.__getitem__, cls.gemm, getattr(cls, "gemm_epilogue", None)

    def getitem(self, cfg):
        launch = orig_getitem(self, cfg)
        grid = cfg[0] if isinstance(cfg, tuple) else cfg
        block = cfg[1] if isinstance(cfg, tuple) and len(cfg) > 1 else 1
        return lambda *args: launches.append((f"{self.__name__} <<<{grid}, {block}>>>", lambda: launch(*args)))

    def gemm(self, A, B, C, trans_a=0, trans_b=0, alpha=1.0, beta=0.0):
        launches.append((f"gemm {C.shape[0]}x{C.shape[1]} (k={A.shape[0] if trans_a else A.shape[1]}) "
                         f"ta={trans_a} tb={trans_b}", lambda: orig_gemm(self, A, B, C, trans_a, trans_b, alpha, beta)))

    def gemm_epilogue(self, A, B, C, trans_a, trans_b, kind, bias, mask=None):
        launches.append((f"gemm+{kind} {C.shape[0]}x{C.shape[1]} (k={A.shape[0] if trans_a else A.shape[1]}) "
                         f"ta={trans_a} tb={trans_b}",
                         lambda: orig_epi(self, A, B, C, trans_a, trans_b, kind, bias, mask)))

    nb.Kernel.__getitem__, cls.gemm = getitem, gemm
    if orig_epi is not None:
        cls.gemm_epilogue = gemm_epilogue
    try:
        tr.enqueue_update(device.stream)  # recorded, not launched
    finally:
        nb.Kernel.__getitem__, cls.gemm = orig_getitem, orig_gemm
        if orig_epi is not None:
            cls.gemm_epilogue = orig_epi
    spent, count = defaultdict(float), defaultdict(int)
    for name, launch in launches:
        g = device.capture(lambda _st, launch=launch: [launch() for _ in range(inner)])
        g.replay(2)
        device.synchronize()
        times = []
        for _ in range(3):
            a = device.event().record()
            g.replay(4)
            b = device.event().record()
            times.append(a.elapsed_ms(b) / (4 * inner))
        spent[name] += statistics.median(times)
        count[name] += 1
    rows.append((f"  {math} breakdown, launches timed alone: sum of {len(launches)}", sum(spent.values()), None))
    for name in sorted(spent, key=spent.get, reverse=True):
        rows.append((f"  {math} breakdown: {name} (x{count[name]})", spent[name], None))


def torch_update(steps: int, rows: list, graph: bool):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    D, A = F + N_POS, sum(BRANCHES)
    W = ATOMS * (1 + A)
    net = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.ReLU(), torch.nn.Linear(H, H), torch.nn.ReLU(),
                              torch.nn.Linear(H, W)).to(dev)
    tgt = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.ReLU(), torch.nn.Linear(H, H), torch.nn.ReLU(),
                              torch.nn.Linear(H, W)).to(dev)
    tgt.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, eps=1.5e-4, capturable=True)
    support = torch.linspace(-10, 10, ATOMS, device=dev)
    feats = torch.randn(40_000, F, device=dev, generator=g)
    prio = torch.rand(CAP, device=dev, generator=g) + 0.1
    ints = torch.randint(0, 30_000, (CAP, 7), device=dev, generator=g)
    ints[:, [1, 6]] = torch.randint(0, N_POS, (CAP, 2), device=dev, generator=g)
    ints[:, 2:5] = torch.randint(0, 3, (CAP, 3), device=dev, generator=g)
    rew = torch.randn(CAP, device=dev, generator=g) * 0.1
    done = (torch.rand(CAP, device=dev, generator=g) < 0.01).float()
    eye = torch.eye(N_POS, device=dev)
    ar = torch.arange(B, device=dev)
    gamma_n, vmin, vmax, dz = 0.99 ** 3, -10.0, 10.0, 20.0 / (ATOMS - 1)
    params, tparams = list(net.parameters()), list(tgt.parameters())

    def heads(x, model):
        out = model(x).view(B, 1 + A, ATOMS)
        V, adv = out[:, :1], out[:, 1:]
        logps = []
        for i, n in enumerate(BRANCHES):
            a = adv[:, sum(BRANCHES[:i]):sum(BRANCHES[:i]) + n]
            logps.append(torch.log_softmax(V + a - a.mean(1, keepdim=True), dim=-1))
        return logps

    def step():
        cums = torch.cumsum(prio.double(), 0)
        total = cums[-1]
        u = (torch.arange(B, device=dev, dtype=torch.float64) + torch.rand(B, device=dev, dtype=torch.float64)) * total / B
        idx = torch.searchsorted(cums, u, right=True).clamp_(max=CAP - 1)
        w = (CAP * prio[idx] / total.float()) ** -0.4
        w = w / w.max()
        r = ints[idx]
        s = torch.cat([feats[r[:, 0]], eye[r[:, 1]]], 1)
        s2 = torch.cat([feats[r[:, 5]], eye[r[:, 6]]], 1)
        logp = heads(s, net)
        with torch.no_grad():
            on2, tg2 = heads(s2, net), heads(s2, tgt)
            tz = (rew[idx, None] + (1 - done[idx, None]) * gamma_n * support[None]).clamp(vmin, vmax)
            bj = (tz - vmin) / dz
            lo, hi = bj.floor().long(), bj.ceil().long()
        loss_b = 0
        for i in range(len(BRANCHES)):
            with torch.no_grad():
                best = (on2[i].exp() * support).sum(-1).argmax(1)
                pn = tg2[i][ar, best].exp()
                m = torch.zeros(B, ATOMS, device=dev)
                m.scatter_add_(1, lo, pn * (hi.float() - bj + (lo == hi).float()))
                m.scatter_add_(1, hi, pn * (bj - lo.float()))
            loss_b = loss_b - (m * logp[i][ar, r[:, 2 + i]]).sum(-1)
        loss_b = loss_b / len(BRANCHES)
        loss = (w * loss_b).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0, foreach=True)
        opt.step()
        prio[idx] = (loss_b.detach() + 1e-3) ** 0.6
        with torch.no_grad():
            torch._foreach_lerp_(tparams, params, 0.005)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if graph:
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            step()
        run = lambda: [cg.replay() for _ in range(steps)]  # noqa: E731
    else:
        run = lambda: [step() for _ in range(steps)]  # noqa: E731
    run()
    torch.cuda.synchronize()
    out = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / steps)
    rows.append((f"PyTorch {torch.__version__}, {'CUDA graph' if graph else 'eager'}, fp32 (no TF32)",
                 statistics.median(out), None))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--json")
    p.add_argument("--pdl", default="programmatic,order",
                   help="programmatic-edge modes measured beside the plain graphs (comma-separated; '' for none)")
    p.add_argument("--maths", default="fp32,tf32", help="GEMM maths measured (comma list)")
    p.add_argument("--sm-share", action="store_true",
                   help="also the side-stream update with gpu.sm_share's GEMMs (what an agent alone runs then)")
    p.add_argument("--only-sm-share", action="store_true",
                   help="only the side-stream update with gpu.sm_share's GEMMs, no PyTorch (bench/ncu_bytes.py "
                        "profiles it)")
    args = p.parse_args()
    rows: list = []
    modes = [m for m in args.pdl.split(",") if m and m != "off"]
    if args.only_sm_share:
        for math in args.maths.split(","):
            ours(math, args.steps, rows, True, beside=True, share=True)
        for name, ms, nodes in rows:
            print(f"{name:70s} {ms:8.4f} ms/update" + (f"  ({nodes} graph nodes)" if nodes else ""))
        return 0
    for math in args.maths.split(","):
        for fused in (False, True):
            ours(math, args.steps, rows, fused)
        if args.sm_share:
            ours(math, args.steps, rows, True, beside=True, share=True)
        for pdl in ("off", *modes):
            ours(math, args.steps, rows, True, beside=True, pdl=pdl)
            if math == "tf32" and pdl != "off":
                ours(math, args.steps, rows, True, pdl=pdl)
    for graph in (False, True):
        torch_update(max(20, args.steps // 4) if not graph else args.steps, rows, graph)
    D, W = F + N_POS, ATOMS * 10
    fwd = 2 * B * (D * H + H * H + H * W)
    print(f"update at batch {B}, hidden {H}, {ATOMS} atoms, 3x3 actions, replay holding {CAP} transitions "
          f"(a ring of {2 * CAP} slots: at least two rollouts of 4096 envs x 256 steps; PyTorch's holds {CAP}): "
          f"{(3 * fwd + 2 * fwd) / 1e9:.2f} GFLOP of GEMMs per update")
    for name, ms, nodes in rows:
        print(f"{name:70s} {ms:8.4f} ms/update" + (f"  ({nodes} graph nodes)" if nodes else ""))
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
