"""Kernels launched from their cubins without Numba's dispatcher (cuda_kernels.launch): the parameter
layout and checks on any machine; on a GPU the raw launch against the dispatcher's, bit for bit, and a
process with a warm cache that never builds a dispatcher."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuda_kernels import launch

ROOT = Path(__file__).resolve().parents[1]


def _kernels():
    from cuda_kernels.nb import all_kernels

    return all_kernels()


class FakeDeviceArray:
    """Just what the raw launch reads of a device array: its CUDA array interface."""

    def __init__(self, shape, dtype, ptr=0xDEAD0000, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": np.dtype(dtype).str, "data": (ptr, False),
                                         "strides": strides, "version": 3}


def test_every_kernel_has_a_raw_parameter_layout():
    """Every declared kernel's parameters are types the raw launch lays out, so none falls back to the
    dispatcher (and its 0.7 s start) on a GPU."""
    kernels = _kernels()
    assert len(kernels) > 20
    for k in kernels:
        assert k.specs is not None, f"{k.__name__}: a parameter type the raw launch does not lay out"
        assert len(k.specs) == len(k.signature.args)


def test_pack_lays_arrays_out_as_numba_kernels_take_them():
    from cuda_kernels.nb import float32, int64, uint32, void

    specs = launch.arg_specs(void(float32[:, ::1], int64, float32, uint32))
    vals = launch.pack("k", specs, (FakeDeviceArray((3, 5), np.float32, ptr=4096), 7, 0.5, 9))
    # meminfo, parent, item count, item size, data, shape (2), strides in bytes (2); then the scalars
    assert list(vals) == [0, 0, 15, 4, 4096, 3, 5, 20, 4, 7, 0.5, 9]
    # the parameter block: one 8-byte slot each, a scalar's bytes at its slot's start; a pointer per slot
    slots, pointers = launch.Layout(specs).params(vals)
    assert len(pointers) == 12 and len(slots.raw) == 96
    assert [p - pointers[0] for p in pointers] == list(range(0, 96, 8))
    raw = slots.raw
    assert np.frombuffer(raw[:72], np.int64).tolist() == [0, 0, 15, 4, 4096, 3, 5, 20, 4]
    assert np.frombuffer(raw[72:80], np.int64)[0] == 7
    assert np.frombuffer(raw[80:84], np.float32)[0] == 0.5 and np.frombuffer(raw[88:92], np.uint32)[0] == 9
    assert ctypes.c_float.from_address(pointers[10]).value == 0.5  # what the driver reads for parameter 10


def test_pack_refuses_what_the_dispatcher_refuses_and_hands_host_arrays_back():
    from cuda_kernels.nb import float32, void

    specs = launch.arg_specs(void(float32[:, ::1], float32[::1]))
    good = FakeDeviceArray((4,), np.float32)
    with pytest.raises(TypeError, match="argument 0 is a float64 array"):
        launch.pack("k", specs, (FakeDeviceArray((2, 2), np.float64), good))
    with pytest.raises(TypeError, match="argument 1 is a float32 array of rank 2"):
        launch.pack("k", specs, (FakeDeviceArray((2, 2), np.float32), FakeDeviceArray((2, 2), np.float32)))
    with pytest.raises(TypeError, match="argument 0 is not C-contiguous"):
        launch.pack("k", specs, (FakeDeviceArray((2, 3), np.float32, strides=(4, 8)), good))
    with pytest.raises(TypeError, match="takes 2 arguments, 1 given"):
        launch.pack("k", specs, (good,))
    # a size-1 dimension's stride does not matter (a row slice of a wider array is still C-contiguous)
    vals = launch.pack("k", specs, (FakeDeviceArray((1, 3), np.float32, strides=(400, 4)), good))
    assert list(vals[5:9]) == [1, 3, 400, 4]
    # a host array: None, and the caller launches through Numba's dispatcher (which copies it over)
    assert launch.pack("k", specs, (np.zeros((2, 2), np.float32), good)) is None


def test_cache_file_round_trip_and_partial_files(tmp_path):
    k = _kernels()[0]
    path = launch.cache_path(k, (9, 0), str(tmp_path))
    assert path.name.endswith("_sm90.bin") and k.__name__ in path.name
    assert launch.read_entry(path) is None
    launch.write_entry(path, "_Z3fooPf", b"\x7fELF\x00\nbinary\n")
    assert launch.read_entry(path) == ("_Z3fooPf", b"\x7fELF\x00\nbinary\n")
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary left behind
    path.write_bytes(b"_Z3fooPf")  # cut short: no cubin after the name
    assert launch.read_entry(path) is None
    assert launch.cache_path(k, (9, 0), None) is None


def test_launch_config_forms():
    k = _kernels()[0]
    if k.specs is None:
        pytest.skip("no raw layout")
    r = launch.RawLaunch(k, (4, 128))
    assert (r.grid, r.block, r.stream, r.shared) == ((4, 1, 1), (128, 1, 1), 0, 0)
    r = launch.RawLaunch(k, ((2, 3), (32, 4), 0, 256))
    assert (r.grid, r.block, r.shared) == ((2, 3, 1), (32, 4, 1), 256)
    with pytest.raises(ValueError, match="a launch takes"):
        launch.RawLaunch(k, (1,))


@pytest.mark.gpu
def test_raw_launch_matches_the_dispatcher_bit_for_bit(rng):
    """Adam (arrays, int64, float32 scalars) and the gradient norm with the guard (a 2-D array, float
    partials, an arrivals counter) launched raw and through Numba's dispatcher on the same inputs."""
    from numba import cuda

    from cuda_kernels import optim
    from workbench.device import Device

    d = Device()
    n = 100_003
    host = {k: rng.normal(0, 1e-2, n).astype(np.float32) for k in ("p", "g", "m", "t")}
    host["v"] = rng.random(n).astype(np.float32) * 1e-4
    loss_h, q_h = rng.random(64).astype(np.float32), rng.normal(size=(64, 9)).astype(np.float32)
    outs = []
    for raw in (True, False):
        b = {k: cuda.to_device(v) for k, v in host.items()}
        lr, step = cuda.to_device(np.array([1e-3], np.float32)), cuda.to_device(np.array([3], np.int64))
        clip, guard = cuda.device_array(2, np.float32), cuda.to_device(np.zeros(1, np.int32))
        part, arr = cuda.device_array(64, np.float64), cuda.to_device(np.zeros(1, np.int32))
        loss, w = cuda.to_device(loss_h), cuda.to_device(np.ones(64, np.float32))
        q = cuda.to_device(q_h)  # the same inputs for both launches
        stats = cuda.to_device(np.zeros(4, np.float32))  # accumulated into: must start at zero
        norm = optim.grad_norm_guard_kernel if raw else optim.grad_norm_guard_kernel.dispatcher
        adam = optim.adam_kernel if raw else optim.adam_kernel.dispatcher
        norm[64, 256, d.stream](b["g"], n, part, arr, 1e-3, clip, loss, w, 64, q, 64, 1e6, guard, stats)
        adam[132, 256, d.stream](b["p"], b["g"], b["m"], b["v"], n, lr, 0.9, 0.999, 1e-8, 0.0, step, clip, guard,
                                 b["t"], 0.005)
        d.synchronize()
        outs.append([x.copy_to_host() for x in (clip, stats, b["p"], b["m"], b["v"], b["t"])])
    assert outs[0][0][1] < 1.0  # the clip engaged: the scale is used
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
def test_a_process_with_a_warm_cache_builds_no_dispatcher(tmp_path):
    """The point of the raw launch: the second process loads every kernel and launches one without
    Numba's dispatcher (whose first use costs ~0.7 s)."""
    script = (
        "import json, numpy as np\n"
        "from numba import cuda\n"
        "from cuda_kernels import nb, optim\n"
        "from workbench.device import Device\n"
        "nb.all_kernels(); d = Device(); n = nb.load_kernels()\n"
        "a = cuda.device_array(1000, np.float32)\n"
        "optim.fill_kernel[4, 256, d.stream](a, 2.5); d.synchronize()\n"
        "ok = bool((a.copy_to_host() == 2.5).all())\n"
        "print(json.dumps({'kernels': n, 'ok': ok, 'dispatchers': [k.__name__ for k in nb.KERNELS "
        "if k._dispatcher is not None]}))\n")
    env = {**os.environ, "WORKBENCH_KERNEL_CACHE": str(tmp_path / "kernels"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["ok"] and warm["ok"] and cold["kernels"] == warm["kernels"] > 20
    assert len(cold["dispatchers"]) == cold["kernels"]  # the first process compiled through Numba
    assert warm["dispatchers"] == []
