"""The device network (Numba GEMM in the simulator, cuBLAS on a GPU) against the NumPy reference."""
from __future__ import annotations

import numpy as np
from numba import cuda

from workbench.agent.gemm import make_gemm
from workbench.agent.network import DeviceNetwork, NetShape, backward_ref, forward_ref, init_params
from workbench.device import Device


def test_forward_backward_match_reference(rng):
    shape = NetShape(obs_dim=10, hidden=16, atoms=5)
    rows = 6
    params = init_params(shape, seed=int(rng.integers(0, 1000)))
    params += rng.normal(0, 0.05, params.size).astype(np.float32)  # non-zero biases too
    x = rng.normal(size=(rows, shape.obs_dim)).astype(np.float32)
    support = np.linspace(-1, 1, shape.atoms).astype(np.float32)
    device = Device()
    net = DeviceNetwork(device, make_gemm(device), shape, rows, cuda.to_device(support),
                        cuda.to_device(np.array(shape.branch_sizes, np.int32)),
                        cuda.to_device(np.array(shape.branch_offsets, np.int32)))
    p_dev, x_dev = cuda.to_device(params), cuda.to_device(x)
    net.forward(p_dev, x_dev)
    ref = forward_ref(params, x.astype(np.float64), shape, support)
    np.testing.assert_allclose(net.q.copy_to_host(), ref["q"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(net.logp.copy_to_host(), ref["logp"], rtol=1e-4, atol=1e-5)
    dhead = rng.normal(size=(rows, shape.head_width)).astype(np.float32)
    grads = cuda.to_device(np.full(shape.n_params, np.nan, np.float32))
    net.backward(p_dev, grads, x_dev, cuda.to_device(dhead))
    want = backward_ref(params, x.astype(np.float64), ref, dhead.astype(np.float64), shape)
    np.testing.assert_allclose(grads.copy_to_host(), want, rtol=1e-3, atol=1e-5)
