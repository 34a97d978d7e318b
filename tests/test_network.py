"""The device network (Numba GEMM in the simulator, cuBLAS on a GPU) against the NumPy reference."""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from workbench.agent.gemm import make_gemm
from workbench.agent.network import DeviceNetwork, NetShape, backward_ref, forward_ref, init_params, relayout, views
from workbench.device import Device


@pytest.mark.parametrize("head_align", [1, 4])
def test_forward_backward_match_reference(rng, head_align):
    """The device network in the device layout (W3's rows padded to head_align columns: 50 -> 52 here)
    against the NumPy reference in the host layout; the padding columns' gradients are exactly zero."""
    shape = NetShape(obs_dim=10, hidden=16, atoms=5, head_align=head_align)
    host = shape.host
    rows = 6
    params = init_params(host, seed=int(rng.integers(0, 1000)))
    params += rng.normal(0, 0.05, params.size).astype(np.float32)  # non-zero biases too
    x = rng.normal(size=(rows, shape.obs_dim)).astype(np.float32)
    support = np.linspace(-1, 1, shape.atoms).astype(np.float32)
    device = Device()
    net = DeviceNetwork(device, make_gemm(device), shape, rows, cuda.to_device(support),
                        cuda.to_device(np.array(shape.branch_sizes, np.int32)),
                        cuda.to_device(np.array(shape.branch_offsets, np.int32)))
    p_dev, x_dev = cuda.to_device(relayout(params, host, shape)), cuda.to_device(x)
    net.forward(p_dev, x_dev)
    ref = forward_ref(params, x.astype(np.float64), host, support)
    np.testing.assert_allclose(net.q.copy_to_host(), ref["q"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(net.logp.copy_to_host(), ref["logp"], rtol=1e-4, atol=1e-5)
    dhead = rng.normal(size=(rows, shape.head_width)).astype(np.float32)
    dhead_dev = np.zeros((rows, shape.head_cols), np.float32)  # the loss leaves the padding columns zero
    dhead_dev[:, :shape.head_width] = dhead
    grads = cuda.to_device(np.full(shape.n_params, np.nan, np.float32))
    net.backward(p_dev, grads, x_dev, cuda.to_device(dhead_dev))
    want = backward_ref(params, x.astype(np.float64), ref, dhead.astype(np.float64), host)
    got = grads.copy_to_host()
    np.testing.assert_allclose(relayout(got, shape, host), want, rtol=1e-3, atol=1e-5)
    assert (views(got, shape)["W3"][:, shape.head_width:] == 0).all()


def test_relayout_round_trip_and_init_in_every_layout():
    host = NetShape(obs_dim=7, hidden=8, atoms=3)  # head width 30 -> 32 columns at head_align 4
    pad = NetShape(obs_dim=7, hidden=8, atoms=3, head_align=4)
    assert pad.head_cols == 32 and pad.n_params == host.n_params + 8 * 2
    p = init_params(host, seed=3)
    q = init_params(pad, seed=3)
    assert np.array_equal(relayout(q, pad, host), p)  # the same weights in either layout
    assert (views(q, pad)["W3"][:, 30:] == 0).all()
    assert np.array_equal(relayout(relayout(p, host, pad), pad, host), p)


def test_a_stacked_forward_equals_its_halves_alone(rng):
    """The update's online forward runs s over s' as one stack of 2B rows (row_range views give each half):
    each half equals a forward of those rows alone (bit for bit with the Numba GEMM, which computes every
    output from its own row; within rounding with cuBLAS, whose kernels depend on the row count)."""
    shape = NetShape(obs_dim=10, hidden=16, atoms=5, head_align=4)
    rows = 6
    params = cuda.to_device(init_params(shape, seed=int(rng.integers(0, 1000))))
    x = rng.normal(size=(2 * rows, shape.obs_dim)).astype(np.float32)
    support = np.linspace(-1, 1, shape.atoms).astype(np.float32)
    device = Device()
    gemm = make_gemm(device)
    mk = lambda n: DeviceNetwork(device, gemm, shape, n, cuda.to_device(support),  # noqa: E731
                                 cuda.to_device(np.array(shape.branch_sizes, np.int32)),
                                 cuda.to_device(np.array(shape.branch_offsets, np.int32)))
    both, alone = mk(2 * rows), mk(rows)
    both.forward(params, cuda.to_device(x))
    exact = gemm.name == "numba"
    for half, (a, b) in enumerate(((0, rows), (rows, 2 * rows))):
        alone.forward(params, cuda.to_device(x[a:b]))
        view = both.row_range(a, b)
        assert view.rows == rows and view.nbytes == 0 and view.q.shape == (rows, shape.n_actions)
        for got, want in ((view.q, alone.q), (view.logp, alone.logp), (view.h2, alone.h2)):
            if exact:
                assert np.array_equal(got.copy_to_host(), want.copy_to_host()), f"half {half}"
            else:
                np.testing.assert_allclose(got.copy_to_host(), want.copy_to_host(), rtol=1e-4, atol=1e-5)
