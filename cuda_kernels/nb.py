"""The one module that imports Numba: a later move to another Numba CUDA backend changes only this file.

``SIMULATOR`` is true under ``NUMBA_ENABLE_CUDASIM=1``; graph capture and raw driver calls are not
available there and the runtime falls back to eager launches.

On-disk cache of compiled kernels (and of the njit CPU twins): ``CACHE_DIR`` is a per-user directory
(``$XDG_CACHE_HOME/workbench/kernels``, ``~/.cache`` by default; ``NUMBA_CACHE_DIR`` is used as the base
when set; ``WORKBENCH_KERNEL_CACHE=<dir>`` chooses another, ``=off`` disables it) with one subdirectory
per hash of every source file of this package and the Numba versions. Numba's own cache invalidates an
entry when its function's file or signature changes, but not when a device function it calls from
another file changes: keying the directory on the whole package closes that gap. Numba writes cache
files to a temporary name and renames them, so concurrent worker processes share one directory safely.
On a GPU, kernels launch from their cubins through the driver (``cuda_kernels.launch``, which reads the
cubin and entry name of Numba's compiled overload once and keeps them in ``CACHE_DIR/cubin``).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba import cuda, njit, prange  # noqa: F401  (re-exported)
from numba import float32, float64, int32, int64, uint16, uint32, uint64, int8, boolean, void  # noqa: F401

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
U = uint64  # cast an index known to be >= 0: Numba adds no wraparound select (three 64-bit operations) for it

# Small grids are deliberate here (the guard, the one-block norm tree, per-row heads at batch size):
# Numba's low-occupancy warning would fire on every first launch and bury a notebook's output.
# NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=1 in the environment brings it back.
if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:
    from numba import config as _numba_config

    _numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0


def _cache_dir() -> str | None:
    choice = os.environ.get("WORKBENCH_KERNEL_CACHE", "")
    if choice.lower() == "off":
        return None
    import numba
    import numba_cuda

    h = hashlib.sha256(f"{numba.__version__} {numba_cuda.__version__}".encode())
    for src in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(src.name.encode() + src.read_bytes())
    base = choice or os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "workbench", "kernels")
    path = Path(base) / h.hexdigest()[:16]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: compile every time, as without a cache
        return None
    from numba import config as _config

    _config.CACHE_DIR = str(path)  # where cache=True functions of this process look
    return str(path)


CACHE_DIR = _cache_dir()
CACHE = CACHE_DIR is not None


def cached_njit(fn=None, **kw):
    """``njit`` with the on-disk cache above (keyed on this package's sources, so a changed device
    function of another module invalidates its callers too)."""
    if fn is None:
        return lambda f: cached_njit(f, **kw)
    return njit(cache=CACHE, **kw)(fn)


def gpu_available() -> bool:
    """True when a real CUDA device can be used (never under the simulator)."""
    if SIMULATOR:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # driver missing or broken: treat as no GPU
        return False


class Kernel:
    """A ``@cuda.jit`` kernel compiled on first launch with exactly its declared signature.

    Compiling at import would need a driver (machines without a GPU could not even import the
    package); compiling lazily without a signature would let Python floats specialise kernels to
    float64. This wrapper does neither: ``kernel[grid, block, stream](...)`` compiles once with
    ``signature`` (argument values are cast to it), and ``compile_ptx()`` checks the same signature
    without a GPU. On a GPU the compiled cubin is then launched by the driver directly
    (:mod:`cuda_kernels.launch`, cached beside Numba's entries), so a process with a warm cache never
    builds a Numba dispatcher. Modules stay loaded per context; we never reset a context in-process.

    ``jit`` holds further ``cuda.jit`` options for the device build (``max_registers``: a cap that buys
    occupancy for a kernel bound by it, measured before it is set); the simulator ignores them.
    """

    def __init__(self, py_func, signature, **jit):
        self.py_func = py_func
        self.signature = signature
        self.jit = {} if SIMULATOR else jit
        self.__name__ = py_func.__name__
        self.__doc__ = py_func.__doc__
        self._dispatcher = None
        self._specs = None
        self._layout = None
        self.functions: dict = {}  # context handle -> (module, CUfunction) of the raw launch (cuda_kernels.launch)

    @property
    def dispatcher(self):
        if self._dispatcher is None:
            self._dispatcher = cuda.jit(self.signature, cache=CACHE and not SIMULATOR, **self.jit)(self.py_func)
        return self._dispatcher

    @property
    def specs(self):
        """Per parameter, what the raw launch packs (``cuda_kernels.launch.arg_specs``); None when a
        parameter type is one it does not lay out (the kernel then launches through the dispatcher)."""
        if self._specs is None:
            from .launch import arg_specs

            try:
                self._specs = arg_specs(self.signature)
            except NotImplementedError:
                self._specs = False
        return None if self._specs is False else self._specs  # [] (no parameters) is a layout too

    @property
    def layout(self):
        """The raw launch's parameter block (``cuda_kernels.launch.Layout``), built once from ``specs``."""
        if self._layout is None:
            from .launch import Layout

            self._layout = Layout(self.specs)
        return self._layout

    def __getitem__(self, launch_config):
        """``kernel[grid, block(, stream(, shared bytes))](*args)``. On a GPU: the cubin launched with
        ``cuLaunchKernel`` (:mod:`cuda_kernels.launch`; no Numba dispatcher, whose first use costs every
        process ~0.7 s); in the simulator, or for a parameter type the raw launch does not lay out,
        Numba's dispatcher."""
        if SIMULATOR or self.specs is None:
            return self.dispatcher[launch_config]
        from .launch import RawLaunch

        return RawLaunch(self, launch_config)

    def load(self) -> None:
        """Compile (or read from the on-disk cache) and load into the current context, without a launch:
        a graph captured afterwards holds the loaded function, and nothing ran that must be undone."""
        if SIMULATOR:
            return
        if self.specs is not None:
            from .launch import load_function

            if load_function(self, CACHE_DIR) is not None:
                return
        for overload in self.dispatcher.overloads.values():
            overload.bind()

    def compile_ptx(self, cc=(9, 0)) -> str:
        # a register cap is ptxas's (-maxrregcount at link), not the PTX's: the PTX is the same without it
        ptx, _ = cuda.compile_ptx(self.py_func, self.signature, cc=cc)
        return ptx


KERNELS: list[Kernel] = []


def kernel(signature, **jit):
    """Decorator: declare a kernel with the signature it is launched with (``jit``: see :class:`Kernel`)."""

    def wrap(fn):
        k = Kernel(fn, signature, **jit)
        KERNELS.append(k)
        return k

    return wrap


def all_kernels() -> list[Kernel]:
    """Every kernel the package declares, each module of ``cuda_kernels`` imported first."""
    import importlib
    import pkgutil

    package = __name__.rpartition(".")[0]
    for mod in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if mod.name not in ("nb", "ptx_check"):
            importlib.import_module(f"{package}.{mod.name}")
    return list(KERNELS)


def load_kernels() -> int:
    """Load every declared kernel into the current context (:meth:`Kernel.load`); returns how many."""
    for k in KERNELS:
        k.load()
    return len(KERNELS)


def device_function(fn):
    """A device function (inlined by NVVM into the kernels that call it)."""
    return cuda.jit(device=True)(fn)


# ---- warp reductions (the simulator has no warp shuffles) ----
WARP = 32
FULL_MASK = 0xFFFFFFFF
VOTE = 8 if SIMULATOR else WARP  # lanes of one vote (``first_lane``): a warp; fewer in the simulator (Python threads)

if SIMULATOR:
    @device_function
    def _row_tree(buf, v, op):
        """The simulator's stand-in for a shuffle tree: the values of a row of the block (``blockDim.x``
        lanes, a power of two <= 32, the "warp") through the shared ``buf``, reduced in the shuffle tree's
        order (lane i with lane i + width / 2, then + width / 4, ...), the total back to every lane. A
        narrower row than a real warp gives the same sums: on the GPU the missing lanes hold the neutral
        value, so the tree's upper levels add nothing. Every thread of the block must call it (it holds
        block barriers), as every lane of a warp calls a shuffle."""
        width = cuda.blockDim.x
        t = cuda.threadIdx.x + width * (cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
        buf[t] = v
        cuda.syncthreads()
        base = t - t % width
        vals = [buf[base + i] for i in range(width)]
        half = width // 2
        while half > 0:
            for i in range(half):
                vals[i] = vals[i] + vals[i + half] if op == 0 else max(vals[i], vals[i + half])
            half //= 2
        cuda.syncthreads()
        return vals[0]

    @device_function
    def _warp_tree(v, op):
        """``_row_tree`` of float32 values (a buffer of the values' type: its sums are theirs)."""
        return _row_tree(cuda.shared.array(1024, float32), v, op)

    @device_function
    def _warp_tree64(v, op):
        """``_row_tree`` of float64 values."""
        return _row_tree(cuda.shared.array(1024, float64), v, op)

    @device_function
    def first_lane(pred):
        """The simulator's stand-in for a ballot: the lowest lane of the caller's group of ``VOTE`` consecutive
        threads of the block whose ``pred`` is true, ``VOTE`` when none is. Every thread of the block calls
        it (it holds block barriers), as every lane of a warp votes."""
        buf = cuda.shared.array(1024, int32)
        width = VOTE
        t = cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
        buf[t] = 1 if pred else 0
        cuda.syncthreads()
        base = t - t % width
        first = width
        for i in range(width):
            if buf[base + i] != 0:
                first = i
                break
        cuda.syncthreads()
        return first

else:
    @device_function
    def _warp_step(v, op, delta):
        w = cuda.shfl_down_sync(FULL_MASK, v, delta)
        return v + w if op == 0 else max(v, w)

    @device_function
    def _warp_tree(v, op):
        """``v`` reduced over the warp's 32 lanes (op 0 sum, 1 max), the total back to every lane: a
        shuffle tree (lane i with lane i + 16, then i + 8, ... 1), the pairs of a shared-memory tree."""
        v = _warp_step(v, op, 16)
        v = _warp_step(v, op, 8)
        v = _warp_step(v, op, 4)
        v = _warp_step(v, op, 2)
        v = _warp_step(v, op, 1)
        return cuda.shfl_sync(FULL_MASK, v, 0)

    _warp_tree64 = _warp_tree  # a shuffle moves 32- and 64-bit values alike

    @device_function
    def first_lane(pred):
        """The lowest lane of the warp whose ``pred`` is true (a ballot), 32 when none is; every lane calls it."""
        m = cuda.ballot_sync(FULL_MASK, pred)
        return cuda.ffs(m) - 1 if m != 0 else WARP


# ---- programmatic dependent launch (Hopper's griddepcontrol) ----
# A graph edge between two kernel nodes may be made programmatic (workbench.device, ``pdl_edges``): the
# downstream kernel is then launched while the upstream one is still running, its blocks scheduled
# early, and it must not touch memory before ``grid_wait()`` returns. Every kernel of this package calls
# it first (ptx_check refuses one that does not), so every edge into one of them may be made so.
if SIMULATOR:
    @device_function
    def grid_wait():
        """The simulator runs launches one after another: nothing to wait for."""
        return

else:
    from llvmlite import ir as _ir
    from numba import types as _types
    from numba.cuda.core import targetconfig as _targetconfig
    from numba.cuda.extending import intrinsic as _intrinsic

    def _compute_capability() -> tuple[int, int]:
        try:
            return tuple(_targetconfig.ConfigStack().top().compute_capability)
        except Exception:  # no compile flags in force: assume a part without griddepcontrol
            return (0, 0)

    @_intrinsic
    def grid_wait(typingctx):
        """Wait until the grids this one depends on programmatically have finished and their writes are
        visible (PTX ``griddepcontrol.wait``; sm_90 and later, nothing on older parts and a no-op in a
        launch with no programmatic dependency). Every thread calls it before its first memory access."""

        def codegen(context, builder, sig, args):
            if _compute_capability() >= (9, 0):
                wait = _ir.InlineAsm(_ir.FunctionType(_ir.VoidType(), []), "griddepcontrol.wait;", "~{memory}",
                                     side_effect=True)
                builder.call(wait, [])
            return context.get_dummy_value()

        return _types.void(), codegen


@device_function
def warp_sum(v):
    """Sum of ``v`` over the warp's lanes, returned to every lane, in the tree order of ``_warp_tree``."""
    return _warp_tree(v, 0)


@device_function
def warp_sum64(v):
    """``warp_sum`` of float64 values."""
    return _warp_tree64(v, 0)


@device_function
def fold_to_warp(s, tid, nt, op, other):
    """The upper levels of a shared-memory tree over ``s[0:nt]`` (one value per thread of a block of ``nt``
    threads, a power of two, written before a block barrier), op 0 sum, 1 max: for half = nt / 2 down to
    the warp's width, s[i] = s[i] op s[i + half], a block barrier after each; returns the slot of each
    lane of the first warp, ``other`` to the rest. The caller finishes with the warp's shuffle levels
    (``warp_sum``, ``warp_sum64``, ``warp_max``), which every thread of the block calls: the tree's
    result in its order with half its barriers. Every thread of the block calls it; ``s`` is changed."""
    half = nt // 2
    while half >= WARP:
        if tid < half:
            s[tid] = s[tid] + s[tid + half] if op == 0 else max(s[tid], s[tid + half])
        cuda.syncthreads()
        half //= 2
    return s[tid] if tid < WARP else other


@device_function
def warp_max(v):
    """Maximum of ``v`` over the warp's lanes, returned to every lane (the same tree as warp_sum)."""
    return _warp_tree(v, 1)


@device_function
def last_to_arrive(arrivals, slot, count, flag):
    """True in every thread of the block that is the last of ``count`` blocks to call this with the same
    ``arrivals[slot]`` (int32, zero before): that block may then read what all of them wrote before the
    call (each block's writes are fenced before it is counted) and finish the launch's work in a fixed
    order, one launch where a second kernel would cost a graph node. It sets ``arrivals[slot]`` back
    to zero, so a replayed graph starts from zero again. ``flag``: a shared array (its first slot is
    used). Every thread of the block calls it (it holds block barriers)."""
    cuda.threadfence()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0 and cuda.threadIdx.z == 0:
        last = cuda.atomic.add(arrivals, slot, 1) == count - 1
        flag[0] = 1 if last else 0
        if last:
            arrivals[slot] = 0
    cuda.syncthreads()
    return flag[0] == 1
