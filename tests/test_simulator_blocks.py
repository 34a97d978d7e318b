"""The tests' block scheduler for Numba's CUDA simulator (tests/simulator_blocks.py): barriers hold until
every live thread of the block reaches them, a thread that has returned no longer counts, a failing
thread's exception reaches the launch, as with the simulator's own polling scheduler, and pooled threads
serve later launches afresh."""
from __future__ import annotations

import numpy as np
import pytest
import simulator_blocks
from cuda_kernels.nb import SIMULATOR, cuda

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the scheduler replaces the CUDA simulator's")


@cuda.jit
def _rotate_sum(x, out, rounds):
    """Each round every thread reads its right neighbour's value, then (after a barrier) writes the sum
    back: a barrier released early lets a thread read a value of the wrong round."""
    buf = cuda.shared.array(64, np.float64)
    t = cuda.threadIdx.x
    n = cuda.blockDim.x
    buf[t] = x[cuda.blockIdx.x * n + t]
    cuda.syncthreads()
    for _ in range(rounds):
        v = buf[t] + buf[(t + 1) % n]
        cuda.syncthreads()
        buf[t] = v
        cuda.syncthreads()
    out[cuda.blockIdx.x * n + t] = buf[t]


@cuda.jit
def _early_exit(out):
    """Threads of odd index return before the barrier; the even ones must still pass it."""
    t = cuda.threadIdx.x
    if t % 2 == 1:
        return
    cuda.syncthreads()
    out[t] = cuda.syncthreads_count(1)


@cuda.jit
def _fails_in_one_thread(out):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    if t == 3:
        raise ValueError("thread three")
    cuda.syncthreads()
    out[t] = 1


def _rotate_sum_ref(x: np.ndarray, n: int, rounds: int) -> np.ndarray:
    b = x.reshape(-1, n).copy()
    for _ in range(rounds):
        b = b + np.roll(b, -1, axis=1)
    return b.ravel()


def test_the_scheduler_is_installed():
    from numba.cuda.simulator import kernel as sim

    assert sim.BlockManager.run is simulator_blocks._run_block


def test_barriers_hold_until_every_thread_arrives(rng):
    n, blocks, rounds = 16, 3, 4
    x = rng.integers(-5, 5, n * blocks).astype(np.float64)
    out = np.full(n * blocks, np.nan)
    _rotate_sum[blocks, n](x, out, rounds)
    np.testing.assert_array_equal(out, _rotate_sum_ref(x, n, rounds))


def test_threads_that_returned_do_not_hold_a_barrier():
    out = np.full(8, -1, np.int64)
    _early_exit[1, 8](out)
    assert out[::2].tolist() == [4] * 4 and out[1::2].tolist() == [-1] * 4


def test_a_thread_s_exception_reaches_the_launch_and_later_launches_run(rng):
    out = np.zeros(8, np.int64)
    with pytest.raises(ValueError, match=r"tid=\[3, 0, 0\] ctaid=\[0, 0, 0\]: thread three"):
        _fails_in_one_thread[1, 8](out)
    # the aborted block's threads go back to the pool: the next launches get threads set up afresh
    x = rng.integers(-5, 5, 32).astype(np.float64)
    for _ in range(2):
        got = np.full(32, np.nan)
        _rotate_sum[2, 16](x, got, 3)
        np.testing.assert_array_equal(got, _rotate_sum_ref(x, 16, 3))
