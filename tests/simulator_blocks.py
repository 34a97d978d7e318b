"""A block scheduler for Numba's CUDA simulator that waits instead of polling (tests only).

The simulator (numba-cuda 0.30) runs each thread of a block as a Python thread, and its ``BlockManager``
finds out that every live thread waits at a barrier, or has finished, by polling them in a loop: the
polling thread holds the GIL the threads it waits for need, and asks ``is_alive`` of each thread
millions of times (a third of a population test's time). Here the threads tell the manager instead: a
thread counts itself in when it reaches a barrier and out when it ends, under one condition variable, and
the manager sleeps on that condition until every live thread is at the barrier (it releases them), a
thread failed (it aborts the others and raises, as the simulator does) or none is left. The rule for
releasing a barrier is the simulator's (every thread still alive waits at it), so kernels compute the
same results; only the waiting changes. The threads are kept in a pool and run one block thread after
another (starting a Python thread costs ~0.1 ms, and a test's launches start tens of thousands); each is
set up as the simulator sets up a new thread (indices, flags, its own barrier event).
"""
from __future__ import annotations

import threading

import numpy as np
from numba.cuda.simulator import kernel as _sim


def _syncthreads(self) -> None:
    """``BlockThread.syncthreads``: as the simulator's, counted in with the manager."""
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads call")
    m = self._manager
    with m.cond:
        self.syncthreads_blocked = True
        m.blocked += 1
        if m.blocked == m.live:
            m.cond.notify()
    self.syncthreads_event.wait()
    self.syncthreads_event.clear()
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads clear")


_thread_run = _sim.BlockThread.run


def _run_thread(self) -> None:
    """``BlockThread.run`` (which keeps a kernel's exception on the thread), counted out at its end."""
    try:
        _thread_run(self)
    finally:
        m = self._manager
        with m.cond:
            m.live -= 1
            if self.exception and m.failed is None:
                m.failed = self
            if m.failed is not None or m.blocked == m.live:
                m.cond.notify()


class _Worker(_sim.BlockThread):
    """A pooled simulator thread: runs the block threads it is handed, one after another."""

    def __init__(self):
        threading.Thread.__init__(self, daemon=True)
        self.go = threading.Event()
        self.syncthreads_event = threading.Event()

    def assign(self, manager, target, grid_point, block_point) -> None:
        """Set up as ``BlockThread.__init__`` sets up a new thread, then run ``target``."""
        if manager._debug:
            def run_debug(f=target):
                np.seterr(divide="raise")
                f()

            target = run_debug
        self._target, self._args, self._kwargs = target, (), {}
        self._manager, self.debug = manager, manager._debug
        self.blockIdx, self.threadIdx = _sim.Dim3(*grid_point), _sim.Dim3(*block_point)
        dim = _sim.Dim3(*manager._block_dim)
        self.thread_id = self.threadIdx.x + dim.x * (self.threadIdx.y + dim.y * self.threadIdx.z)
        self.exception, self.abort, self.syncthreads_blocked = None, False, False
        self.syncthreads_event.clear()
        self.go.set()

    def run(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            _run_thread(self)
            with _POOL_LOCK:
                _POOL.append(self)


_POOL: list = []  # idle workers
_POOL_LOCK = threading.Lock()


def _workers(n: int) -> list:
    with _POOL_LOCK:
        got = [_POOL.pop() for _ in range(min(n, len(_POOL)))]
    for _ in range(n - len(got)):
        w = _Worker()
        w.start()
        got.append(w)
    return got


def _run_block(self, grid_point, *args) -> None:
    """``BlockManager.run``: run the block's threads, release each barrier once every live thread
    waits at it, raise the first thread's exception (the others aborted)."""
    def target():
        self._f(*args)

    points = list(np.ndindex(*self._block_dim))
    threads = _workers(len(points))
    self.cond, self.live, self.blocked, self.failed = threading.Condition(), len(threads), 0, None
    for t, block_point in zip(threads, points):
        t.assign(self, target, grid_point, block_point)
    with self.cond:
        while True:
            if self.failed is not None:
                for t in threads:
                    t.abort = True
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
                raise self.failed.exception[0].with_traceback(self.failed.exception[1])
            if self.live == 0:
                break
            if self.blocked == self.live:
                self.blocked = 0
                for t in threads:
                    if t.syncthreads_blocked:
                        t.syncthreads_blocked = False
                        t.syncthreads_event.set()
                continue
            self.cond.wait()


def _names(code) -> set:
    """The names a function's code uses, its comprehensions' included."""
    return set(code.co_names).union(*(_names(c) for c in code.co_consts if hasattr(c, "co_names")))


def install() -> bool:
    """Replace the simulator's polling with the waiting above, where the simulator is the one this was
    written against (its ``BlockManager.run`` polls ``is_alive``); False (nothing changed) otherwise."""
    if "is_alive" not in _names(_sim.BlockManager.run.__code__) or not hasattr(_sim.BlockThread, "syncthreads"):
        return False
    _sim.BlockThread.syncthreads = _syncthreads
    _sim.BlockThread.run = _run_thread
    _sim.BlockManager.run = _run_block
    return True
