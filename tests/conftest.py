from __future__ import annotations

import os

# Kernels run in Numba's CUDA simulator unless a real GPU is there (this must precede any Numba import).
if "NUMBA_ENABLE_CUDASIM" not in os.environ and not os.path.exists("/dev/nvidia0"):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    # The simulator runs a block's threads as Python threads and polls them at every syncthreads; with
    # the default 5 ms GIL switch interval the polling thread starves them (a block with barriers costs
    # ~0.8 s). A 50 us interval hands the GIL over sooner: 4-6x faster barrier-heavy kernels, same results.
    # (Below, the blocks wait on their threads instead of polling them where the simulator is the one
    # that was written for; the interval then changes little, measured, and stays for any other.)
    import sys
    import threading
    import traceback

    sys.setswitchinterval(5e-5)

    # ... which widens a race in the simulator's cuda.shared.array (numba-cuda 0.30): a block's threads
    # look up the block's array by the calling line and create it when absent, unlocked, so two threads
    # can each create their own "shared" array and read the other's writes as uninitialised memory
    # (seen as 1e32 gradients). The same lookup under a lock:
    from numba.cuda.simulator import kernelapi as _sim

    _shared_lock = threading.Lock()
    _unlocked_array = _sim.FakeCUDAShared.array

    def _locked_shared_array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory, or the simulator's refusal
            return _unlocked_array(self, shape, dtype, alignment)
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[-1][0:2])  # the kernel's line
        with _shared_lock:
            arr = self._allocations.get(caller)
            if arr is None:
                import numpy

                arr = numpy.empty(shape, _sim.numpy_support.as_dtype(dtype) if isinstance(dtype, _sim.types.Type) else dtype)
                self._allocations[caller] = arr
        return arr

    _sim.FakeCUDAShared.array = _locked_shared_array

    # ... and its blocks wait on their threads instead of polling them (tests/simulator_blocks.py)
    import simulator_blocks

    simulator_blocks.install()
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "es_sample.parquet"


@pytest.fixture
def rng(request):
    """A generator seeded afresh for every test (fresh inputs each run); the seed is printed when the
    test fails, and ``WORKBENCH_TEST_SEED=<seed>`` replays it."""
    seed = int(os.environ.get("WORKBENCH_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)
    request.node.workbench_seed = seed
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seed = getattr(item, "workbench_seed", None)
    if seed is not None and report.failed:
        report.sections.append(("random inputs", f"seed {seed}: rerun with WORKBENCH_TEST_SEED={seed}"))


def pytest_collection_modifyitems(config, items):
    from cuda_kernels.nb import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none found, or running in the simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def synthetic_raw() -> pd.DataFrame:
    from workbench.synthetic import generate_bars

    return generate_bars(14_000, seed=3, start="2024-02-28 17:00")


@pytest.fixture(scope="session")
def bars(synthetic_raw):
    from workbench.data import load_bars

    return load_bars(synthetic_raw)


def simple_frame(n: int = 50, start: str = "2024-03-04 14:30", seed: int = 0) -> pd.DataFrame:
    """Plain, valid OHLCV bars with a DatetimeIndex (UTC), one per minute."""
    rng = np.random.default_rng(seed)
    close = 100 + np.cumsum(rng.normal(0, 0.1, n))
    open_ = np.concatenate([[100.0], close[:-1]])
    high = np.maximum(open_, close) + 0.05
    low = np.minimum(open_, close) - 0.05
    idx = pd.date_range(start, periods=n, freq="min", tz="UTC", name="ts").as_unit("ns")
    return pd.DataFrame({"open": open_, "high": high, "low": low, "close": close,
                         "volume": rng.integers(1, 100, n).astype(float)}, index=idx)


class HostGemm:
    """The GEMM contract computed by NumPy on the simulator's host-backed arrays, for whole-fold tests
    that check the trainer's wiring, not the GEMM (the Numba GEMM is pinned to NumPy in test_kernels
    and runs inside the network's forward and backward in test_network); the simulator's GEMM costs
    ~0.6 s a launch. bfloat16 operands (``uint16`` bits) are widened exactly, as the GEMM backends do."""

    name = "numpy"

    def gemm(self, A, B, C, trans_a=0, trans_b=0, alpha=1.0, beta=0.0):
        from cuda_kernels.bf16 import from_bf16_ref

        a, b = (from_bf16_ref(np.asarray(m)) if m.dtype == np.uint16 else np.asarray(m) for m in (A, B))
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        out = np.float32(alpha) * (a @ b)
        C[...] = out + np.float32(beta) * np.asarray(C) if beta else out


@pytest.fixture
def fold_gemm():
    """GEMM for whole-fold trainer tests: cuBLAS (or the Numba GEMM) on a GPU, NumPy in the simulator."""
    from workbench.agent.gemm import make_gemm

    return lambda device: HostGemm() if device.simulator else make_gemm(device)
