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
