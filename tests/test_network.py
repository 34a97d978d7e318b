"""The device network (Numba GEMM in the simulator, cuBLAS on a GPU) against the NumPy reference."""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from workbench.agent.device_state import LAYOUT_ALIGN, OBS_ALIGN
from workbench.agent.gemm import make_gemm
from cuda_kernels import bf16
from workbench.agent.network import (DeviceNetwork, NetShape, backward_ref, device_obs, forward_ref, init_params, relayout,
                                    views)
from workbench.device import Device


@pytest.mark.parametrize("align", [1, 4])
def test_forward_backward_match_reference(rng, align):
    """The device network in the device layout (W3's rows padded to ``align`` columns: 50 -> 52 here, the
    observations' rows and so W1's rows 10 -> 12) against the NumPy reference in the host layout; the
    padding's gradients are exactly zero."""
    shape = NetShape(obs_dim=10, hidden=16, atoms=5, align=align, obs_align=align)
    host = shape.host
    rows = 6
    params = init_params(host, seed=int(rng.integers(0, 1000)))
    params += rng.normal(0, 0.05, params.size).astype(np.float32)  # non-zero biases too
    x = rng.normal(size=(rows, shape.obs_dim)).astype(np.float32)
    support = np.linspace(-1, 1, shape.atoms).astype(np.float32)
    device = Device()
    net = DeviceNetwork(device, make_gemm(device), shape, rows, cuda.to_device(support))
    p_dev, x_dev = cuda.to_device(relayout(params, host, shape)), cuda.to_device(device_obs(x, shape))
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
    assert (views(got, shape)["W1"][shape.obs_dim:] == 0).all()


def _consts(shape: NetShape) -> tuple:
    """A network's constant device inputs: the C51 support on [-1, 1]."""
    return (cuda.to_device(np.linspace(-1, 1, shape.atoms).astype(np.float32)),)


def test_the_padded_layout_changes_no_result(rng):
    """The same weights and observations in the host layout and in a padded layout (observations 23 -> 24
    columns, so W1's rows; the head 50 -> 52): Q, log-probabilities and every gradient equal bit for bit
    with the Numba GEMM, whose sums only gain exact zeros; within rounding with cuBLAS, which may run
    another kernel for another width."""
    pad = NetShape(obs_dim=23, hidden=16, atoms=5, align=4, obs_align=4)
    host = pad.host
    rows = 9
    params = init_params(host, seed=int(rng.integers(0, 1000)))
    params += rng.normal(0, 0.05, params.size).astype(np.float32)
    x = rng.normal(size=(rows, pad.obs_dim)).astype(np.float32)
    dhead = rng.normal(size=(rows, host.head_width)).astype(np.float32)
    device = Device()
    gemm = make_gemm(device)
    consts = _consts(pad)
    out = {}
    for shape in (host, pad):
        net = DeviceNetwork(device, gemm, shape, rows, *consts)
        p_dev, x_dev = cuda.to_device(relayout(params, host, shape)), cuda.to_device(device_obs(x, shape))
        d = np.zeros((rows, shape.head_cols), np.float32)
        d[:, :shape.head_width] = dhead
        grads = cuda.to_device(np.full(shape.n_params, np.nan, np.float32))
        net.forward(p_dev, x_dev)
        net.backward(p_dev, grads, x_dev, cuda.to_device(d))
        device.synchronize()
        out[shape.align] = (net.q.copy_to_host(), net.logp.copy_to_host(),
                            relayout(grads.copy_to_host(), shape, host))
    assert pad.obs_cols == 24 and pad.head_cols == 52
    for name, a, b in zip(("q", "logp", "gradients"), out[1], out[4]):
        if gemm.name == "numba":
            assert np.array_equal(a, b), name
        else:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)


def _one_bf16_step_apart(got16: np.ndarray, want: np.ndarray) -> bool:
    """bfloat16 bits ``got16`` against float64 values: the values rounded to bfloat16, but where a float32
    accumulation lands beside a rounding boundary (or, for a ReLU, beside zero: rare, ~1e-7 relative of a
    4e-3 step), a step (2^-8 relative) or float32's error from them, on at most 1 % of the entries."""
    got = bf16.from_bf16_ref(got16).astype(np.float64)
    exact = bf16.from_bf16_ref(bf16.to_bf16_ref(want.astype(np.float32))).astype(np.float64)
    off = got != exact
    near = np.abs(got - want) <= 2.0**-8 * np.abs(want) + 1e-5 * float(np.abs(want).max())
    return bool((near | ~off).all() and off.mean() <= 0.01)


def test_a_bf16_network_against_its_reference(rng):
    """A bf16 network (bfloat16 GEMM operands, float32 accumulation; the simulator's Numba GEMM and our
    epilogues, cuBLASLt's fused forward on a GPU), every stage against float64 from the network's own
    bfloat16 inputs to that stage, outputs poisoned first: the activations rounded once from their float32
    sums (at most a step apart beside a boundary), the head, d2, d1 (after the ReLU gradient) and every
    gradient to float32 accumulation's error, and the bfloat16 copies of d2 and d1 exactly d2 and d1
    rounded; a missing or extra rounding anywhere fails. And it differs from the float32 network."""
    shape = NetShape(obs_dim=23, hidden=32, atoms=5, align=LAYOUT_ALIGN, obs_align=OBS_ALIGN)  # the device's layout
    rows = 12
    params = init_params(shape, seed=int(rng.integers(0, 1000)))
    params += relayout(rng.normal(0, 0.05, shape.host.n_params).astype(np.float32), shape.host, shape)
    x = device_obs(rng.normal(size=(rows, shape.obs_dim)).astype(np.float32), shape)
    dhead = np.zeros((rows, shape.head_cols), np.float32)
    dhead[:, :shape.head_width] = rng.normal(size=(rows, shape.head_width))
    device = Device()
    gemm = make_gemm(device)
    consts = _consts(shape)
    grads = {}
    for is_bf16 in (True, False):
        net = DeviceNetwork(device, gemm, shape, rows, *consts, fused=True, bf16=is_bf16)
        for a in (net.h1, net.h2, net.head, net.d2, net.d1, net.d2_16, net.d1_16):
            if a is not None:
                a.copy_to_device(np.full(a.shape, 0x7FC0 if a.dtype == np.uint16 else np.nan, a.dtype))
        p_dev, x_dev = cuda.to_device(params), cuda.to_device(x)
        g_dev = cuda.to_device(np.full(shape.n_params, np.nan, np.float32))
        net.forward(p_dev, x_dev)
        device.synchronize()
        if is_bf16:
            fwd = {k: getattr(net, k).copy_to_host() for k in ("h1", "h2", "head")}
            bias16 = net.bias16
        net.backward(p_dev, g_dev, x_dev, cuda.to_device(dhead))
        device.synchronize()
        grads[is_bf16] = g_dev.copy_to_host()
        if is_bf16:
            bwd = {k: getattr(net, k).copy_to_host() for k in ("d2", "d1", "d2_16", "d1_16")}
    wide = lambda a16: bf16.from_bf16_ref(a16).astype(np.float64)  # noqa: E731
    r = lambda a: wide(bf16.to_bf16_ref(np.asarray(a, np.float32)))  # noqa: E731
    p = {k: v.astype(np.float64) for k, v in views(params, shape).items()}
    W = {k: r(p[k]) for k in ("W1", "W2", "W3")}
    xr, dr = r(x), r(dhead)
    h1, h2 = wide(fwd["h1"]), wide(fwd["h2"])
    b = {k: r(p[k]) if bias16 else p[k] for k in ("b1", "b2")}  # the trunk's biases as the network read them
    assert fwd["h1"].dtype == np.uint16 and _one_bf16_step_apart(fwd["h1"], np.maximum(xr @ W["W1"] + b["b1"], 0))
    assert _one_bf16_step_apart(fwd["h2"], np.maximum(h1 @ W["W2"] + b["b2"], 0))
    close = lambda got, want, what: np.testing.assert_allclose(got, want, rtol=1e-5,  # noqa: E731
                                                               atol=1e-5 * float(np.abs(want).max()), err_msg=what)
    close(fwd["head"], h2 @ W["W3"] + p["b3"], "head")
    d2 = (dr @ W["W3"].T) * (h2 > 0)
    close(bwd["d2"], d2, "d2")
    assert np.array_equal(bwd["d2_16"], bf16.to_bf16_ref(bwd["d2"]))
    d1 = (wide(bwd["d2_16"]) @ W["W2"].T) * (h1 > 0)
    close(bwd["d1"], d1, "d1")
    assert np.array_equal(bwd["d1_16"], bf16.to_bf16_ref(bwd["d1"]))
    g = views(grads[True], shape)
    close(g["W3"], h2.T @ dr, "W3")
    close(g["b3"], dhead.astype(np.float64).sum(axis=0), "b3")
    close(g["W2"], h1.T @ wide(bwd["d2_16"]), "W2")
    close(g["b2"], d2.sum(axis=0), "b2")
    close(g["W1"], xr.T @ wide(bwd["d1_16"]), "W1")
    close(g["b1"], d1.sum(axis=0), "b1")
    assert (g["W1"][shape.obs_dim:] == 0).all()  # any padding rows
    assert np.abs(grads[True] - grads[False]).max() > 1e-4 * np.abs(grads[False]).max()  # bf16 is not fp32


def test_relayout_round_trip_and_init_in_every_layout():
    host = NetShape(obs_dim=7, hidden=8, atoms=3)  # at align 4: head width 30 -> 32 columns, inputs 7 -> 8
    pad = NetShape(obs_dim=7, hidden=8, atoms=3, align=4, obs_align=4)
    assert pad.head_cols == 32 and pad.obs_cols == 8
    assert pad.n_params == host.n_params + 8 + 8 * 2 + 2  # a row of W1, two columns of W3 and of b3
    p = init_params(host, seed=3)
    q = init_params(pad, seed=3)
    assert np.array_equal(relayout(q, pad, host), p)  # the same weights in either layout
    assert (views(q, pad)["W3"][:, 30:] == 0).all() and (views(q, pad)["b3"][30:] == 0).all()
    assert (views(q, pad)["W1"][7:] == 0).all()
    q[-1] = 1.0  # b3's last padding entry: dropped in the host layout
    assert np.array_equal(relayout(q, pad, host), p)
    assert np.array_equal(relayout(relayout(p, host, pad), pad, host), p)


def test_an_acting_network_keeps_only_what_acting_reads(rng):
    """The envs' and the backtest's networks read Q alone and never backpropagate: no log-probabilities and no
    gradient workspaces (at the reference shape the backtest chunk's network then holds about half the
    memory); their Q is the Q of a network that keeps everything, bit for bit, and asking one for a
    backward is refused."""
    shape = NetShape(obs_dim=10, hidden=16, atoms=5, align=4)
    rows = 6
    params = cuda.to_device(init_params(shape, seed=int(rng.integers(0, 1000))))
    x = cuda.to_device(device_obs(rng.normal(size=(rows, shape.obs_dim)).astype(np.float32), shape))
    device = Device()
    consts = (cuda.to_device(np.linspace(-1, 1, shape.atoms).astype(np.float32)),)
    full = DeviceNetwork(device, make_gemm(device), shape, rows, *consts)
    acting = DeviceNetwork(device, make_gemm(device), shape, rows, *consts, logp=False, backward=False)
    assert acting.logp is None and acting.d1 is None and acting.d2 is None and not acting.bwd_scratch
    H, W, A = shape.hidden, shape.head_cols, shape.n_actions
    assert acting.nbytes == 4 * rows * (2 * H + W + A) + 4  # h1, h2, head, q and the head's one-float stand-in
    assert full.nbytes > acting.nbytes + 4 * rows * (2 * H + A * shape.atoms)
    full.forward(params, x)
    acting.forward(params, x)
    assert np.array_equal(acting.q.copy_to_host(), full.q.copy_to_host())
    with pytest.raises(ValueError, match="backward=False"):
        acting.backward(params, cuda.to_device(np.zeros(shape.n_params, np.float32)), x,
                        cuda.to_device(np.zeros((rows, W), np.float32)))


def test_a_stacked_forward_equals_its_halves_alone(rng):
    """The update's online forward runs s over s' as one stack of 2B rows (row_range views give each half):
    each half equals a forward of those rows alone (bit for bit with the Numba GEMM, which computes every
    output from its own row; within rounding with cuBLAS, whose kernels depend on the row count)."""
    shape = NetShape(obs_dim=10, hidden=16, atoms=5, align=4)
    rows = 6
    params = cuda.to_device(init_params(shape, seed=int(rng.integers(0, 1000))))
    x = device_obs(rng.normal(size=(2 * rows, shape.obs_dim)).astype(np.float32), shape)
    support = np.linspace(-1, 1, shape.atoms).astype(np.float32)
    device = Device()
    gemm = make_gemm(device)
    mk = lambda n: DeviceNetwork(device, gemm, shape, n, cuda.to_device(support))  # noqa: E731
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


def _reference_case(rng, obs_dim, hidden, atoms, rows):
    """A GPU test's network and inputs: (seed, shape, device, consts, params, x, dhead) with non-zero
    biases, a stacked batch of 2 x rows and the loss's gradient of the first rows (padding columns zero)."""
    seed = int(rng.integers(0, 2**31))
    shape = NetShape(obs_dim=obs_dim, hidden=hidden, atoms=atoms, align=4)
    device = Device()
    support = np.linspace(-1, 1, atoms).astype(np.float32)
    consts = (cuda.to_device(support),)
    params = init_params(shape, seed=seed)
    params += relayout(rng.normal(0, 0.05, shape.host.n_params).astype(np.float32), shape.host, shape)
    x = cuda.to_device(device_obs(rng.normal(size=(2 * rows, obs_dim)).astype(np.float32), shape))
    dhead = np.zeros((rows, shape.head_cols), np.float32)
    dhead[:, :shape.head_width] = rng.normal(size=(rows, shape.head_width))
    return seed, shape, device, consts, cuda.to_device(params), x, dhead


def _forward_backward(net, device, shape, rows, p_dev, x, dhead, activations_of=None) -> dict:
    """The stacked forward, then the backward through its first ``rows`` (what the update runs), outputs
    poisoned first: h1, h2, q (this forward's) and the gradients on the host. With ``activations_of`` (a
    network that ran the same forward) the backward reads that network's activations and ReLU masks
    instead of this forward's: where the two forwards differ by rounding, a ReLU gate near zero may be
    open in one and shut in the other, which changes a gradient by far more than rounding."""
    for a in (net.h1, net.h2, net.head, net.q):
        a.copy_to_device(np.full(a.shape, np.nan, np.float32))
    grads = cuda.to_device(np.full(shape.n_params, np.nan, np.float32))
    net.forward(p_dev, x)
    device.synchronize()
    out = {"h1": net.h1.copy_to_host(), "h2": net.h2.copy_to_host(), "q": net.q.copy_to_host()}
    if activations_of is not None:
        for name in ("h1", "h2", "mask1", "mask2"):
            if getattr(net, name) is not None:
                getattr(net, name).copy_to_device(getattr(activations_of, name))
    net.row_range(0, rows).backward(p_dev, grads, x[:rows], cuda.to_device(dhead))
    device.synchronize()
    return out | {"grads": grads.copy_to_host()}


@pytest.mark.gpu
@pytest.mark.parametrize("obs_dim,hidden,atoms,rows", [(23, 512, 51, 1024), (10, 96, 5, 37)])
@pytest.mark.parametrize("math", ["fp32", "tf32"])
def test_fused_epilogues_match_our_kernels(rng, obs_dim, hidden, atoms, rows, math):
    """cuBLASLt's fused bias + ReLU (forward; in fp32 the ReLU mask kept) and ReLU-gradient +
    bias-gradient (fp32's backward, reading that mask: FUSED_BACKWARD_MATH) against the same network with
    cuBLAS GEMMs and our bias kernels: a stacked forward of 2 x rows, the backward through its first rows
    (what the update runs). Outputs poisoned first; hidden 96 leaves mask bits past the row's last column
    unused (ld 128)."""
    pytest.importorskip("nvmath", reason="fused epilogues need nvmath-python")
    seed, shape, device, consts, p_dev, x, dhead = _reference_case(rng, obs_dim, hidden, atoms, rows)
    gemm = make_gemm(device, "cublas", math)
    assert gemm.fuses_epilogues, gemm.lt_error
    out = {}
    for fused in (False, True):
        net = DeviceNetwork(device, gemm, shape, 2 * rows, *consts, fused=fused, masks=True)
        assert net.fused == fused and (net.mask1 is not None) == fused
        assert net.fuses_backward == (fused and math == "fp32")
        out[fused] = _forward_backward(net, device, shape, rows, p_dev, x, dhead)
    for k in ("h1", "h2", "q"):  # the same GEMM then the same fp32 add and max: equal up to cuBLASLt's algorithm
        np.testing.assert_allclose(out[True][k], out[False][k], rtol=1e-5, atol=1e-6, err_msg=f"{k}, seed {seed}")
    g_t, g_f = views(out[True]["grads"], shape), views(out[False]["grads"], shape)
    for k in g_t:  # the bias gradients' sums run in another order
        scale = float(np.abs(g_f[k]).max()) or 1.0
        assert np.isfinite(g_t[k]).all(), f"{k} not written, seed {seed}"
        assert float(np.abs(g_t[k] - g_f[k]).max()) <= 1e-5 * scale * (10 if math == "tf32" else 1), (k, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("math", ["fp32", "tf32"])
def test_gemms_planned_for_shared_sms_match_the_whole_gpus_choice(rng, math):
    """``gpu.sm_share``: every GEMM of a forward (stacked, fused bias + ReLU) and backward at the reference
    shape through cuBLASLt with its SM count target (``Cublas.share_gpu``) against the same network with
    cuBLAS's own choice: other algorithms, so the same values up to the order of their float32 sums.
    Outputs poisoned first; the plans show the targets were used."""
    pytest.importorskip("nvmath", reason="SM count targets need cuBLASLt (nvmath-python)")
    rows = 1024
    seed, shape, device, consts, p_dev, x, dhead = _reference_case(rng, 23, 512, 51, rows)
    out, nets = {}, {}
    for shared in (False, True):
        gemm = make_gemm(device, "cublas", math)
        assert gemm.fuses_epilogues, gemm.lt_error
        gemm.share_gpu(shared)
        nets[shared] = net = DeviceNetwork(device, gemm, shape, 2 * rows, *consts, fused=True, masks=True)
        # the backwards from the same activations (TF32 forwards differ enough to flip ReLU gates near zero:
        # seen on the H100, W1's gradient 10.4 apart at a largest |dW1| of 142)
        out[shared] = _forward_backward(net, device, shape, rows, p_dev, x, dhead, nets.get(False) if shared else None)
        targets = {key[7] for key in gemm.lt.plans}  # (math, M, N, K, ta, tb, kind, SM target, types, pick, addresses)
        assert (max(targets) > 0) == shared, (targets, seed)
    # fp32: the same products summed in another order. TF32: also the operands' rounding to TF32 (10-bit
    # mantissa), which one algorithm may do where the other does not (for the first layer, K = 23, cuBLAS's
    # choice and the targeted kernel differ in kind; seen on the H100: h1 0.0025 apart at a largest |h1| ~3),
    # so each output is compared at the scale of its largest entry: 2^-8 of it, about four times the two
    # operands' rounding (2^-11 each) through the two or three TF32 GEMMs an output passes.
    for k in ("h1", "h2", "q"):
        if math == "fp32":
            np.testing.assert_allclose(out[True][k], out[False][k], rtol=1e-4, atol=1e-5, err_msg=f"{k}, seed {seed}")
        else:
            scale = float(np.abs(out[False][k]).max())
            assert float(np.abs(out[True][k] - out[False][k]).max()) <= 2.0 ** -8 * scale, (k, seed)
    g_t, g_f = views(out[True]["grads"], shape), views(out[False]["grads"], shape)
    for k in g_t:
        scale = float(np.abs(g_f[k]).max()) or 1.0
        assert np.isfinite(g_t[k]).all(), f"{k} not written, seed {seed}"
        assert float(np.abs(g_t[k] - g_f[k]).max()) <= (1e-4 if math == "fp32" else 2.0 ** -8) * scale, (k, seed)
