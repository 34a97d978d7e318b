"""Population throughput at the reference shape (issue #15): agent-updates per second with P agents
in one graph (``workbench.agent.population``: one branch per agent, one launch for all), fp32 and
TF32 cuBLAS, against PyTorch's CUDA-graph replay of one agent's update in the same run.

Shape as ``bench/train_step.py`` (batch 1024, hidden 512, 51 atoms, 3x3 actions, 16 features, replay
of 1M transitions per agent, filled by the agents' own envs: 4096 envs x 256 steps). Each agent has
its own seed (and its own copy of the window). Each figure: median over 5 timed blocks of ``--steps``
launches of the joint update graph, after one warm block, and the same ``--steps`` updates as one
launch of a loop graph (the agents' passes side by side in one WHILE node), each agent's GEMMs on its
own stream, (``sm share``, ``gpu.sm_share``) the same with each GEMM's algorithm chosen for the SMs
it fills beside the other agents, and (``batched``, ``gpu.batched_gemm``) the agents meeting at every GEMM for
one batched cuBLAS GEMM (``workbench.agent.gemm.GemmMeeting``), and (``beside``, what a population
of fewer than 8 agents runs by default) each agent's GEMMs on its own stream with its update's
independent work on a second stream of its own (``DeviceTrainer.update_beside``). Also: device memory
per agent, graph nodes, and the time to allocate, fill and capture. Usage (on the GPU machine):
    python bench/population_step.py [--sizes 1,4,16,32,64] [--steps 100] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import time

from train_step import B, ATOMS, CAP, H, _nvtx, _window, ms_per_step, torch_update


def population(P: int, steps: int, fused: bool = True, pdl_modes=(), maths=("fp32", "tf32"), quick: bool = False) -> dict:
    """One row of the table; ``quick``: the graph replay, the loop and ``sm_share`` only (no batched, beside or
    PDL variants, no breakdowns)."""
    from workbench.agent.gemm import GemmMeeting, make_gemm
    from workbench.agent.population import agent_bytes
    from workbench.agent.train_config import TrainConfig
    from workbench.agent.network import run_steps
    from workbench.agent.trainer import DeviceTrainer, Side
    from workbench.device import Device, Loop
    from workbench.gpu_profile import GpuProfile
    from workbench.markets import load_market

    if "bf16" in maths and len(maths) > 1:
        raise SystemExit("bf16 allocates bfloat16 networks: measure it in a run of its own (--maths bf16)")
    device = Device()
    prof = GpuProfile(name="bench", hidden=H, atoms=ATOMS, batch=B, n_envs=4096, replay_vram_fraction=0.5,
                      gemm="cublas", math="bf16" if "bf16" in maths else "fp32", fused_epilogues=fused)
    cfg = TrainConfig(replay_capacity=CAP, rollout_steps=256, learning_starts=0)
    w = _window()
    t0 = time.perf_counter()
    trainers = []
    for i in range(P):
        lane = device.lane()
        lane2 = device.lane()  # the agent's side stream (measured as "beside")
        side = Side(lane2, make_gemm(lane2, "cublas", "fp32"))
        t = DeviceTrainer(lane, make_gemm(lane, "cublas", "fp32"), prof, cfg, load_market("es"), 100_000.0, seed=1 + i,
                          side=lambda side=side: side)
        t.allocate(w)
        t.use_side()
        trainers.append(t)
    lanes = [t.device for t in trainers]
    device.wait_for(lanes)
    for t in trainers:
        t.state.envs.eps_slot.value[0] = 1.0
    device.capture_loops([t.experience_loop() for t in trainers]).launch()  # every ring filled by its own envs
    device.synchronize()
    setup_s = time.perf_counter() - t0
    for t in trainers:
        assert int(t.state.replay.size.copy_to_host()[0]) == CAP
    row = {"P": P, "bytes_per_agent": agent_bytes(trainers[0]), "setup_s": setup_s}
    for math in maths:
        for t in trainers:
            t.gemm.set_math(math)
            t.side.gemm.set_math(math)
        one_stream = [lambda st, t=t: run_steps(t.update_steps(st)) for t in trainers]
        t1 = time.perf_counter()
        upd = device.capture_lanes(lanes, one_stream)
        capture_s = time.perf_counter() - t1
        loops = [Loop(t.device, body, steps, guard=t.state.learner.guard, steps=t.update_steps)
                 for t, body in zip(trainers, one_stream)]
        loop = device.capture_loops(loops)
        ms = ms_per_step(device, lambda: upd.replay(steps), steps)
        loop_ms = ms_per_step(device, loop.launch, steps)
        row[math] = {"ms_per_launch": ms, "agent_updates_per_s": P * 1e3 / ms, "ms_per_agent_update": ms / P,
                     "graph_nodes": upd.n_nodes, "capture_s": capture_s,
                     "loop_ms_per_update": loop_ms, "loop_agent_updates_per_s": P * 1e3 / loop_ms}
        for name in ("batched",) if P > 1 and math != "bf16" and not quick else ():  # bf16: nothing batches
            # the agents meeting at every GEMM for one batched GEMM each (a population does from 8 agents)
            t2 = time.perf_counter()
            batched = device.capture_loops(loops, meet=GemmMeeting(device, make_gemm(device, "cublas", math), 2))
            row[math][f"{name}_capture_s"] = time.perf_counter() - t2
            b_ms = ms_per_step(device, batched.launch, steps)
            row[math].update({f"{name}_ms_per_update": b_ms, f"{name}_agent_updates_per_s": P * 1e3 / b_ms,
                              f"{name}_graph_nodes": batched.n_nodes})
            del batched
        if P > 1:  # each agent's GEMMs chosen for the SMs they fill beside the others (gpu.sm_share)
            for t in trainers:
                t.gemm.share_gpu(True)
            shared = device.capture_loops(loops)
            with _nvtx("population"):  # the range bench/ncu_bytes.py --population profiles
                sh_ms = ms_per_step(device, shared.launch, steps)
            row[math].update({"sm_share_ms_per_update": sh_ms, "sm_share_agent_updates_per_s": P * 1e3 / sh_ms})
            del shared
            if P >= 16 and not quick:
                row[math]["breakdown_sm_share_ms_per_agent"] = breakdown(device, lanes, trainers, steps)
            for t in trainers:
                t.gemm.share_gpu(False)
        if quick:
            continue
        beside = device.capture_loops([Loop(t.device, t.update_beside, steps, guard=t.state.learner.guard)
                                       for t in trainers])
        s_ms = ms_per_step(device, beside.launch, steps)
        row[math].update({"beside_ms_per_update": s_ms, "beside_agent_updates_per_s": P * 1e3 / s_ms,
                          "beside_graph_nodes": beside.n_nodes})
        del beside
        for mode in pdl_modes:  # the same loops (and, alone, beside) with programmatic edges
            for d in (device, *lanes):
                d.pdl = mode
            p_loop = device.capture_loops(loops)
            p_ms = ms_per_step(device, p_loop.launch, steps)
            row[math][f"pdl_{mode}_loop_agent_updates_per_s"] = P * 1e3 / p_ms
            del p_loop
            if P == 1:
                p_beside = device.capture_loops([Loop(t.device, t.update_beside, steps, guard=t.state.learner.guard)
                                                 for t in trainers])
                row[math][f"pdl_{mode}_beside_agent_updates_per_s"] = 1e3 / ms_per_step(device, p_beside.launch, steps)
                del p_beside
            for d in (device, *lanes):
                d.pdl = "off"
        assert all(t.state.learner.guard.copy_to_host()[0] == 0 for t in trainers)
        if P >= 16:
            row[math]["breakdown_ms_per_agent"] = breakdown(device, lanes, trainers, steps)
    return row


def _pieces(t) -> dict:
    """Pieces of one agent's update, each captured alone (for the saturated breakdown)."""
    S = t.state
    b, lr, nets = S.batch, S.learner, S.nets
    return {"sample (scan 1M, PER draw with the batch gathers)": t._sample,
            "forward s and s' (online, stacked; its head in the loss)": lambda _s: nets.online.forward(
                lr.params, b.obs_pair, head=False),
            "  its 3 GEMMs only": lambda _s: _gemms(t, lr.params, b.obs_pair),
            "forward s' (target)": lambda _s: nets.t2.forward(lr.target, b.obs_next, head=False),
            "heads + loss + backward + grad norm + guard": lambda s: (t._update_learn_tail(s)),
            "  heads + C51 loss": t._loss,
            "  backward (5 GEMMs, 3 bias gradients)": lambda _s: nets.s.backward(lr.params, lr.grads, b.obs, b.dhead),
            "  grad norm + guard": t._grad_norm_guard,
            "finish (Adam with EMA, priorities)": t._update_finish,
            "  priority update": t._priority_update,
            **_gemm_pieces(t)}


def _gemm_pieces(t) -> dict:
    """Each GEMM of the update alone, with its epilogue and SM target as the update runs it (fused into
    cuBLASLt's GEMM or our kernel after it): which of a pass's GEMMs its time goes to."""
    from workbench.agent.network import views

    S = t.state
    b, lr, nets, s = S.batch, S.learner, S.nets, S.nets.s
    passes = {"online forward": lambda: list(nets.online.forward_steps(lr.params, b.obs_pair, head=False)),
              "target forward": lambda: list(nets.t2.forward_steps(lr.target, b.obs_next, head=False)),
              "backward": lambda: list(s._backward_gemms(s._gemm_weights(lr.params), views(lr.grads, S.shape), b.obs,
                                                         b.dhead, s.gemm))}
    out = {}
    for name, steps in passes.items():
        for i, g in enumerate(steps()):  # the steps' GEMMs (a bf16 pass converts nothing here: its owners' copies)
            M, N = g.C.shape
            K = g.A.shape[0] if g.trans_a else g.A.shape[1]
            epi = f", {g.epi.kind}{' fused' if g.epi.fused else ''}" if g.epi is not None else ""
            out[f"    {name} GEMM {i + 1}: {M}x{N}x{K}{epi}"] = lambda _s, steps=steps, i=i: steps()[i].run()
    return out


def _gemms(t, params, x) -> None:
    from workbench.agent.network import views

    n = t.state.nets.online
    p, x = (views(n.p16, t.state.shape), n.x16) if n.bf16 else (views(params, t.state.shape), x)  # as its forward reads
    t.gemm.gemm(x, p["W1"], n.h1)
    t.gemm.gemm(n.h1, p["W2"], n.h2)
    t.gemm.gemm(n.h2, p["W3"], n.head)


def breakdown(device, lanes, trainers, steps) -> dict:
    """GPU time per agent of each piece of the update with every agent's piece in one graph (the
    population saturated): what the whole update's time is made of at this P."""
    out = {}
    names = list(_pieces(trainers[0]))
    for name in names:
        g = device.capture_lanes(lanes, [_pieces(t)[name] for t in trainers])
        g.replay(steps)
        a = device.event().record()
        g.replay(steps)
        b = device.event().record()
        out[name] = a.elapsed_ms(b) / steps / len(trainers)
    return out


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--sizes", default="1,4,16,32,64")
    a.add_argument("--steps", type=int, default=100)
    a.add_argument("--json")
    a.add_argument("--quick", action="store_true",
                   help="the graph replay, the loop and sm_share only (no batched, beside or PDL variants, no breakdowns)")
    a.add_argument("--maths", default="fp32,tf32", help="GEMM maths measured (comma list)")
    a.add_argument("--epilogues", choices=("fused", "kernels"), default="fused",
                   help="the trunk's bias + ReLU fused into cuBLASLt's GEMMs (where an agent's GEMMs run alone) "
                        "or our kernels after every GEMM")
    a.add_argument("--pdl", default="programmatic,order",
                   help="programmatic-edge modes (workbench.graph_edges) measured beside the plain loops")
    a.add_argument("--obs-align", type=int, metavar="N",
                   help="the observations' columns (so W1's rows) padded to a multiple of N floats "
                        "(an experiment: device_state.OBS_ALIGN, 1 by default)")
    a.add_argument("--fused-backward", metavar="MATHS",
                   help="the GEMM maths whose backward fuses the ReLU and bias gradients into cuBLASLt's GEMMs "
                        "(an experiment: network.FUSED_BACKWARD_MATH, fp32 alone by default)")
    a.add_argument("--no-torch", action="store_true",
                   help="skip PyTorch's CUDA-graph baseline (a sweep that measured it in its first run of the call)")
    a.add_argument("--pick", action="append", default=[], metavar="MATH:MxNxK=TARGET:INDEX",
                   help="an experiment (cublaslt.PICKS): that GEMM problem's SM count target ('-': the rule's) and the "
                        "heuristic's INDEX-th algorithm (0: its first), e.g. fp32:2048x512x512=-:1; repeatable")
    args = a.parse_args()
    for pick in args.pick:
        from workbench import cublaslt

        problem, choice = pick.split("=")
        math, dims = problem.split(":")
        target, index = choice.split(":")
        cublaslt.PICKS[(math, *map(int, dims.split("x")))] = (None if target == "-" else int(target), int(index))
    if args.fused_backward is not None:
        from workbench.agent import network

        network.FUSED_BACKWARD_MATH = tuple(m for m in args.fused_backward.split(",") if m)
    if args.obs_align is not None:
        from workbench.agent import device_state

        device_state.OBS_ALIGN = args.obs_align
    modes = [] if args.quick else [m for m in args.pdl.split(",") if m and m != "off"]
    rows = []
    for p in args.sizes.split(","):
        rows.append(population(int(p), args.steps, args.epilogues == "fused", modes, args.maths.split(","), args.quick))
        gc.collect()  # the previous population's buffers go before the next is allocated
        print(f"P={p}: {json.dumps(rows[-1])}", flush=True)
    torch_rows: list = []
    if args.no_torch:  # a sweep's later runs: the baseline measured once per call, by its first run
        torch_rows.append(("PyTorch not run (--no-torch)", float("nan")))
    else:
        torch_update(args.steps, torch_rows, graph=True)
    torch_ms = torch_rows[0][1]
    print(f"epilogues: {args.epilogues}; P agents in one graph, batch {B}, hidden {H}, {ATOMS} atoms, replay holding {CAP} each "
          f"(rings of {2 * CAP} slots); "
          f"{torch_rows[0][0]}: {torch_ms:.4f} ms/update = {1e3 / torch_ms:,.0f} updates/s")
    maths = args.maths.split(",")
    cols = ["ms/launch", "upd/s", "x torch", "loop upd/s", "batched", "sm share", "beside"]
    print(f"{'P':>3} {'MB/agent':>9} {'nodes':>6} {'setup s':>8} " + " ".join(f"{m + ' ' + c:>16}" for m in maths for c in cols))
    for r in rows:
        cells = []
        for m in maths:
            x = r[m]
            cells += [f"{x['ms_per_launch']:16.4f}", f"{x['agent_updates_per_s']:16,.0f}",
                      f"{x['agent_updates_per_s'] * torch_ms / 1e3:16.2f}", f"{x['loop_agent_updates_per_s']:16,.0f}",
                      f"{x.get('batched_agent_updates_per_s', 0):16,.0f}",
                      f"{x.get('sm_share_agent_updates_per_s', 0):16,.0f}", f"{x.get('beside_agent_updates_per_s', 0):16,.0f}"]
        print(f"{r['P']:3d} {r['bytes_per_agent'] / 2**20:9.0f} {r[maths[0]]['graph_nodes']:6d} {r['setup_s']:8.1f} "
              + " ".join(cells))
    for mode in modes:
        print(f"PDL {mode}, loop agent-updates/s: " + ", ".join(
            f"P={r['P']} " + " ".join(f"{m} {r[m][f'pdl_{mode}_loop_agent_updates_per_s']:,.0f}" for m in maths)
            + (" (beside: " + " ".join(f"{m} {r[m][f'pdl_{mode}_beside_agent_updates_per_s']:,.0f}" for m in maths)
               + ")" if r["P"] == 1 else "")
            for r in rows))
    if args.json:
        json.dump({"rows": rows, "torch_graph_ms": None if args.no_torch else torch_ms, "torch": torch_rows[0][0],
                   "picks": args.pick},
                  open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
