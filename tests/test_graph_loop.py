"""Graph loops (Device.capture_loops): a phase's passes as one launch of a WHILE-node graph.

In CI these run the simulator's stand-in (EagerLoop, the same counting rule as the condition kernel's
CPU twin); on a GPU the real conditional nodes with the NVRTC condition kernel, cuBLAS inside the body
(``bench/gpu_check.sh``). The condition kernel itself is compiled to PTX for sm_90 without a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

from cuda_kernels import optim, rollout
from cuda_kernels.graph_loop import compile_loop_kernel, loop_next_ref
from cuda_kernels.nb import SIMULATOR, cuda
from workbench.device import Device, Loop


@pytest.fixture(scope="module")
def device():
    return Device()


def _counter(value: int = 0):
    return cuda.to_device(np.array([value], np.int64))


def _bump(c):
    return lambda st: optim.step_increment_kernel[1, 1, st](c)


def _warm(device) -> None:
    """Load the kernels the bodies launch before any capture (a first launch must not happen inside one)."""
    c = _counter()
    optim.step_increment_kernel[1, 1, device.stream](c)
    rollout.set_counter_kernel[1, 1, device.stream](c, 0)
    device.synchronize()


def test_loop_next_ref_counts_to_n_and_resets():
    count, more, passes = 0, True, 0
    while more:
        passes += 1
        count, more = loop_next_ref(count, 5, 0)
    assert passes == 5 and count == 0  # back to zero for the next launch
    assert loop_next_ref(0, 1, 0) == (0, False)  # one pass
    assert loop_next_ref(2, 10, 1) == (0, False)  # the guard ends the loop after the pass that tripped it


def test_condition_kernel_compiles_for_sm90():
    pytest.importorskip("cuda.bindings.nvrtc")
    ptx = compile_loop_kernel((9, 0), target="ptx").decode(errors="replace")
    assert ".entry loop_next" in ptx and "cudaGraphSetConditional" in ptx


def test_condition_kernel_cubin_is_cached_between_processes(tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    from cuda_kernels import graph_loop

    first = graph_loop.loop_cubin((9, 0), str(tmp_path))
    assert (tmp_path / "graph_loop_sm90.cubin").read_bytes() == first
    monkeypatch.setattr(graph_loop, "compile_loop_kernel", lambda *a: pytest.fail("compiled again"))
    assert graph_loop.loop_cubin((9, 0), str(tmp_path)) == first  # the next process reads it back
    assert list(tmp_path.iterdir()) == [tmp_path / "graph_loop_sm90.cubin"]  # no temporary file left


def test_each_loop_runs_its_own_count_with_head_and_tail(device):
    _warm(device)
    lanes = [device.lane(), device.lane()]
    body, head, tail = [_counter() for _ in lanes], [_counter() for _ in lanes], [_counter() for _ in lanes]
    g = device.capture_loops([Loop(lane, _bump(body[i]), n, head=_bump(head[i]), tail=_bump(tail[i]))
                              for i, (lane, n) in enumerate(zip(lanes, (7, 3)))])
    assert g.counts == [7, 3]
    for launches in (1, 2):  # a second launch starts its count afresh
        g.launch()
        device.synchronize()
        assert [int(c.copy_to_host()[0]) for c in body] == [7 * launches, 3 * launches]
        assert [int(c.copy_to_host()[0]) for c in head] == [launches] * 2
        assert [int(c.copy_to_host()[0]) for c in tail] == [launches] * 2


def _tripping_loop(device, lane, count, at):
    """A loop whose body counts its passes and trips its guard on pass ``at``."""
    passes, guard = _counter(), cuda.to_device(np.zeros(1, np.int32))

    def body(st):
        optim.step_increment_kernel[1, 1, st](passes)
        _trip_at_kernel[1, 1, st](passes, at, guard)

    return Loop(lane, body, count, guard=guard), passes, guard


def test_the_guard_ends_a_lone_loop_only(device):
    """A body that trips its guard on its 4th pass runs 4 passes of 10; the loop of another count runs all
    of its own."""
    _warm(device)
    _trip_at_kernel[1, 1, device.stream](_counter(), 99, cuda.to_device(np.zeros(1, np.int32)))
    device.synchronize()
    lone, passes, guard = _tripping_loop(device, device.lane(), 10, 4)
    other = _counter()
    g = device.capture_loops([lone, Loop(device.lane(), _bump(other), 9)])
    g.launch()
    device.synchronize()
    assert [int(passes.copy_to_host()[0]), int(other.copy_to_host()[0])] == [4, 9]
    assert int(guard.copy_to_host()[0]) == 1


def test_loops_of_one_count_share_a_loop_and_run_every_pass(device):
    """Loops of the same count are one WHILE node: each runs every pass even after its guard trips (a
    trainer's update changes nothing that lasts once its guard is set, so that equals stopping)."""
    _warm(device)
    _trip_at_kernel[1, 1, device.stream](_counter(), 99, cuda.to_device(np.zeros(1, np.int32)))
    device.synchronize()
    (a, pa, ga), (b, pb, _) = _tripping_loop(device, device.lane(), 6, 2), _tripping_loop(device, device.lane(), 6, 99)
    g = device.capture_loops([a, b])
    g.launch()
    device.synchronize()
    assert [int(pa.copy_to_host()[0]), int(pb.copy_to_host()[0])] == [6, 6] and int(ga.copy_to_host()[0]) == 1


def test_loop_groups_by_count_in_order():
    from workbench.device import loop_groups

    loops = [Loop(None, None, n) for n in (400, 200, 400, 100)]
    assert loop_groups(loops) == [(400, [0, 2]), (200, [1]), (100, [3])]


def test_a_loop_needs_a_pass(device):
    with pytest.raises(ValueError):
        device.capture_loops([Loop(device, lambda st: None, 0)])
    with pytest.raises(ValueError):
        device.capture_loops([])


@cuda.jit("void(int64[::1], int64, int32[::1])")
def _trip_at_kernel(count, at, guard):
    if cuda.grid(1) == 0 and count[0] == at:
        guard[0] = 1


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="cuBLAS inside a WHILE body needs a GPU")
def test_cublas_in_a_loop_body_matches_repeated_gemms(rng, device):
    """x <- x @ W, 5 passes in one launch, against 5 eager GEMMs: cuBLAS with its own workspace adds no
    allocation nodes, so the body instantiates."""
    from workbench.cublas import Cublas

    blas = Cublas(device)
    n = 64
    W = (rng.normal(size=(n, n)) / np.sqrt(n)).astype(np.float32)
    x0 = rng.normal(size=(8, n)).astype(np.float32)
    dW, x, y = cuda.to_device(W), cuda.to_device(x0), cuda.device_array((8, n), np.float32)

    def step(st):
        blas.gemm(x, dW, y)
        x.copy_to_device(y, stream=st)

    g = device.capture_loops([Loop(device, step, 5)])
    g.launch()
    device.synchronize()
    ref = cuda.to_device(x0)
    for _ in range(5):
        blas.gemm(ref, dW, y)
        ref.copy_to_device(y, stream=device.stream)
    device.synchronize()
    assert np.array_equal(x.copy_to_host(), ref.copy_to_host())


def test_lockstep_meets_every_loop_at_every_yield_in_order():
    """run_lockstep advances each generator to its next yield, then meets them, in loop order; a
    generator that stops early is an error, not a silent skip."""
    from workbench.device import run_lockstep

    log = []

    def steps(name, n):
        for k in range(n):
            log.append(f"{name}{k}")
            yield (name, k)
        log.append(f"{name}-end")

    run_lockstep([steps("a", 2), steps("b", 2)], lambda vals: log.append(tuple(vals)))
    assert log == ["a0", "b0", (("a", 0), ("b", 0)), "a1", "b1", (("a", 1), ("b", 1)), "a-end", "b-end"]
    with pytest.raises(ValueError, match="equally often"):
        run_lockstep([steps("a", 1), steps("b", 2)], lambda vals: None)


def test_a_group_written_as_steps_runs_in_lockstep_with_its_meeting(device):
    """Loops of one count, all written as steps, given a meet: each pass meets once per yield, the
    passes counted as usual; without a meet (or with one loop) the bodies run as they are."""
    _warm(device)
    met = []
    c = [_counter(), _counter()]

    def steps(i):
        def gen(st):
            optim.step_increment_kernel[1, 1, st](c[i])
            yield i
            optim.step_increment_kernel[1, 1, st](c[i])
        return gen

    class Meet(list):
        def __call__(self, vals):
            met.append(tuple(vals))

        def plan(self, vals):
            self.append(tuple(vals))

        def prepare(self):
            pass

    meet = Meet()
    loops = [Loop(device, lambda st: None, 3, steps=steps(i)) for i in range(2)]
    g = device.capture_loops(loops, meet=meet)
    g.launch()
    device.synchronize()
    assert [x.copy_to_host()[0] for x in c] == [6, 6]  # three passes of two increments each
    if SIMULATOR:
        assert met == [(0, 1)] * 3  # every pass meets, at launch
    else:
        assert met == [(0, 1)] and meet == [(0, 1)]  # captured once (planned once): the graph repeats it


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="cuBLAS batched GEMMs need a GPU")
def test_batched_gemm_meeting_matches_each_agents_gemm(rng, device):
    """Three lanes' x <- relu(x @ W) chains (their own W), 4 passes in one launch, meeting at each GEMM:
    one cublasSgemmBatched per meeting, against each lane's chain of single GEMMs (fp32: the same
    products; the batched kernels may add in another order, so within 1e-5)."""
    from cuda_kernels import dense
    from workbench.agent.gemm import GemmMeeting
    from workbench.agent.network import Gemm
    from workbench.cublas import Cublas

    n, rows, P = 64, 32, 3
    lanes = [device.lane() for _ in range(P)]
    blas = [Cublas(lane) for lane in lanes]
    W = [(rng.normal(size=(n, n)) / np.sqrt(n)).astype(np.float32) for _ in range(P)]
    x0 = [rng.normal(size=(rows, n)).astype(np.float32) for _ in range(P)]
    dW = [cuda.to_device(w) for w in W]
    x = [cuda.to_device(v) for v in x0]
    y = [cuda.device_array((rows, n), np.float32) for _ in range(P)]
    grid = dense.bias_act_launch(rows, n, False)
    zero_bias = cuda.to_device(np.zeros(n, np.float32))

    def steps(i):
        def gen(st):
            yield Gemm(x[i], dW[i], y[i], 0, 0, blas[i])
            dense.bias_act_kernel[grid[0], grid[1], st](y[i], zero_bias, rows, n, dense.ACT_RELU)
            x[i].copy_to_device(y[i], stream=st)
        return gen

    for lane in lanes:  # load the kernel before the capture
        dense.bias_act_kernel[grid[0], grid[1], lane.stream](y[0], zero_bias, rows, n, dense.ACT_RELU)
    device.synchronize()
    meet = GemmMeeting(device, Cublas(device), min_agents=2)  # a population batches from 8 agents; here 3
    g = device.capture_loops([Loop(lane, lambda st: None, 4, steps=steps(i)) for i, lane in enumerate(lanes)],
                             meet=meet)
    assert len(meet.arrays) == 1  # one meeting per pass, planned once
    g.launch()
    device.synchronize()
    for i in range(P):
        ref = x0[i].astype(np.float64)
        for _ in range(4):
            ref = np.maximum(ref @ W[i], 0)
        np.testing.assert_allclose(x[i].copy_to_host(), ref, rtol=1e-4, atol=1e-5)
