"""Kernels launched from their cubins with the driver's ``cuLaunchKernel``, without Numba's dispatcher.

Why: the first Numba dispatcher a process makes initialises Numba's CUDA typing, 0.66 s of every GPU
process on the H200 with the kernel cache warm (``bench/startup_probe.py``), although every kernel here
has a declared signature and a cached cubin. So on a GPU each :class:`cuda_kernels.nb.Kernel` keeps
its cubin and entry name in the kernel cache (one file per kernel and compute capability, beside
Numba's entries and keyed on the same sources), loads it with ``cuModuleLoadData`` and launches it with
the arguments laid out as Numba's kernels take them: per array its meminfo and parent (null), item
count, item size, data pointer, shape and strides in bytes; scalars as their C types. On a cache miss
the kernel is compiled (or read from Numba's cache) once through the dispatcher and the file written.

An argument that is not a device array (a host array, which Numba's dispatcher would copy over) sends
that launch through the dispatcher as before; a device array of the wrong dtype, rank or layout is
refused with the argument named, as the dispatcher refuses it. The simulator never comes here.
"""
from __future__ import annotations

import ctypes
import math
import os
import struct
import weakref
from pathlib import Path

import numpy as np

from . import nb

# a scalar parameter's 8-byte slot of the parameter block (``Layout``): its C type's struct code, padded
_SCALAR_SLOTS = {"int8": "b7x", "int16": "h6x", "int32": "i4x", "int64": "q", "uint8": "B7x", "uint16": "H6x",
                 "uint32": "I4x", "uint64": "Q", "float32": "f4x", "float64": "d", "bool": "?7x"}


class ArraySpec:
    """What an array parameter must be: its dtype, rank and whether it must be C-contiguous."""

    __slots__ = ("dtype", "ndim", "c_only")

    def __init__(self, dtype: np.dtype, ndim: int, c_only: bool):
        self.dtype, self.ndim, self.c_only = dtype, ndim, c_only


def arg_specs(signature) -> list:
    """Per parameter of a Numba kernel signature: an :class:`ArraySpec`, or a scalar's slot (its struct code).
    Raises NotImplementedError for a parameter type the raw launch does not lay out (records, tuples, ...)."""
    out = []
    for ty in signature.args:
        layout = getattr(ty, "layout", None)
        if layout is not None and hasattr(ty, "ndim"):
            if layout not in ("C", "A"):
                raise NotImplementedError(f"array layout {layout!r}")
            out.append(ArraySpec(np.dtype(str(ty.dtype)), int(ty.ndim), layout == "C"))
        elif str(ty) in _SCALAR_SLOTS:
            out.append(_SCALAR_SLOTS[str(ty)])
        else:
            raise NotImplementedError(f"parameter type {ty}")
    return out


def c_strides(shape, itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


_NUMBA_ARRAYS: tuple = ()  # Numba's device array class, once imported (its arrays never change shape or address)
_FIELDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # such an array -> its parameter fields


class Layout:
    """A kernel's parameter block: every parameter (a scalar, or one of an array's fields) in its own 8-byte
    slot (each is at most 8 bytes; the driver reads a parameter's own size from its slot's start), packed
    by one ``struct`` call; ``kernelParams`` is an array of pointers to the slots."""

    __slots__ = ("struct", "n")

    def __init__(self, specs: list):
        fmt = "".join("QQqqQ" + "q" * (2 * s.ndim) if isinstance(s, ArraySpec) else s for s in specs)
        self.struct = struct.Struct("=" + fmt)
        self.n = self.struct.size // 8

    def params(self, values):
        """(slots, pointers): keep both alive until the launch has returned (the driver copies them then)."""
        slots = ctypes.create_string_buffer(self.struct.size)
        self.struct.pack_into(slots, 0, *values)
        base = ctypes.addressof(slots)
        return slots, (ctypes.c_void_p * self.n)(*range(base, base + 8 * self.n, 8))


def _array_fields(name: str, i: int, spec: ArraySpec, a):
    """An array argument's fields as the kernel takes them (meminfo, parent, item count, item size, data,
    shape, strides in bytes), or None when it is not on the device. Kept per Numba device array (its
    shape and address are fixed for its life); read from ``__cuda_array_interface__`` for any other."""
    global _NUMBA_ARRAYS
    if not _NUMBA_ARRAYS:
        try:
            from numba.cuda.cudadrv.devicearray import DeviceNDArray
        except ImportError:  # the simulator's module (whose arrays never come here) has another name for it
            DeviceNDArray = type("NoDeviceArray", (), {})
        _NUMBA_ARRAYS = (DeviceNDArray,)
    numba_array = isinstance(a, _NUMBA_ARRAYS)
    if numba_array:
        found = _FIELDS.get(a)
        if found is not None:
            dtype, ndim, dense, fields = found
            if dtype != spec.dtype or ndim != spec.ndim or (spec.c_only and not dense):
                _refuse(name, i, spec, dtype, ndim, fields)
            return fields
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        return None
    shape = tuple(int(n) for n in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    dense_strides = c_strides(shape, dtype.itemsize)
    strides = tuple(int(s) for s in cai["strides"]) if cai.get("strides") else dense_strides
    dense = 0 in shape or all(n <= 1 or s == d for n, s, d in zip(shape, strides, dense_strides))
    fields = (0, 0, math.prod(shape), dtype.itemsize, int(cai["data"][0] or 0), *shape, *strides)
    if numba_array:
        _FIELDS[a] = (dtype, len(shape), dense, fields)
    if dtype != spec.dtype or len(shape) != spec.ndim or (spec.c_only and not dense):
        _refuse(name, i, spec, dtype, len(shape), fields)
    return fields


def _refuse(name: str, i: int, spec: ArraySpec, dtype, ndim: int, fields: tuple):
    if dtype != spec.dtype or ndim != spec.ndim:
        raise TypeError(f"{name}: argument {i} is a {dtype} array of rank {ndim}; the kernel takes "
                        f"{spec.dtype} of rank {spec.ndim}")
    raise TypeError(f"{name}: argument {i} is not C-contiguous (strides {fields[5 + ndim:]}); the kernel takes a "
                    f"C-contiguous array")


def pack(name: str, specs: list, args: tuple):
    """The launch's parameter values in the kernel's order (an array's as its fields), or None when an
    array argument is not on the device (the caller then launches through Numba's dispatcher). Raises
    TypeError, naming the argument, for a wrong count, dtype, rank or layout."""
    if len(args) != len(specs):
        raise TypeError(f"{name} takes {len(specs)} arguments, {len(args)} given")
    values = []
    for i, (spec, a) in enumerate(zip(specs, args)):
        if not isinstance(spec, ArraySpec):
            values.append(a)
            continue
        fields = _array_fields(name, i, spec, a)
        if fields is None:
            return None
        values += fields
    return values


def _dims(d) -> tuple[int, int, int]:
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    if not 1 <= len(d) <= 3:
        raise ValueError(f"a launch dimension has 1 to 3 entries, not {d}")
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def _stream_handle(stream) -> int:
    if stream is None or (isinstance(stream, int) and stream == 0):
        return 0
    return int(stream)  # a Numba stream (its handle) or a raw handle


# ---- the cubin, from the kernel cache or from Numba once ----

def cache_path(kernel, cc: tuple[int, int], cache_dir: str | None) -> Path | None:
    if not cache_dir:
        return None
    return Path(cache_dir) / "cubin" / f"{kernel.py_func.__module__}.{kernel.__name__}_sm{cc[0]}{cc[1]}.bin"


def read_entry(path: Path | None) -> tuple[str, bytes] | None:
    """(entry name, cubin) from a cache file: the entry's name, a newline, then the cubin's bytes."""
    if path is None or not path.is_file():
        return None
    entry, sep, cubin = path.read_bytes().partition(b"\n")
    return (entry.decode(), cubin) if sep and entry and cubin else None


def write_entry(path: Path | None, entry: str, cubin: bytes) -> None:
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(entry.encode() + b"\n" + cubin)
        os.replace(tmp, path)  # atomic: concurrent workers never read half a file
    except OSError:  # the cache is a convenience: the cubin in hand is used all the same
        tmp.unlink(missing_ok=True)


def numba_entry(kernel, cc: tuple[int, int]) -> tuple[str, bytes] | None:
    """(entry name, cubin) of the kernel's one overload through Numba's dispatcher (compiled, or read from
    Numba's cache); None when its module needs Numba's own set-up at load or a cooperative launch, which
    the raw launch does not do (the kernel then always goes through the dispatcher)."""
    overloads = list(kernel.dispatcher.overloads.values())
    if len(overloads) != 1:
        return None
    ov = overloads[0]
    lib = ov._codelibrary
    if getattr(lib, "_setup_functions", None) or getattr(ov, "cooperative", False) or getattr(ov, "debug", False):
        return None
    cubin = lib.get_cubin(cc=cc)
    cubin = getattr(cubin, "code", cubin)  # numba-cuda 0.30 hands a cuda.core ObjectCode, older ones bytes
    if not isinstance(cubin, (bytes, bytearray)):
        return None  # a path, not an image in memory: leave it to the dispatcher
    return lib._entry_name, bytes(cubin)


def check(result, call: str, error: type[Exception] = RuntimeError):
    """The value(s) after a cuda-bindings driver call's result code (None when there are none); raises
    ``error`` naming ``call`` and the driver's error name unless the code is success. ``workbench.device``
    calls it with its own error class."""
    from cuda.bindings import driver as drv

    err = result[0] if isinstance(result, tuple) else result
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        raise error(f"{call} failed: {name.decode() if isinstance(name, bytes) else name}")
    if isinstance(result, tuple):
        rest = result[1:]
        return rest[0] if len(rest) == 1 else (rest or None)
    return None


def current_context() -> int:
    """The current CUDA context's handle, Numba's primary context made current first if none is."""
    from cuda.bindings import driver as drv

    ctx = int(check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    if ctx == 0:
        nb.cuda.current_context()
        ctx = int(check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    return ctx


def compute_capability() -> tuple[int, int]:
    from cuda.bindings import driver as drv

    dev = check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
    A = drv.CUdevice_attribute
    return tuple(int(check(drv.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute"))
                 for a in (A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                           A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))


def load_function(kernel, cache_dir: str | None):
    """The kernel's CUfunction in the current context (loaded once per context), or None when it must go
    through Numba's dispatcher (see :func:`numba_entry`)."""
    from cuda.bindings import driver as drv

    ctx = current_context()
    if ctx in kernel.functions:
        return kernel.functions[ctx][1]
    cc = compute_capability()
    path = cache_path(kernel, cc, cache_dir)
    found = read_entry(path)
    if found is None:
        found = numba_entry(kernel, cc)
        if found is None:
            kernel.functions[ctx] = (None, None)
            return None
        write_entry(path, *found)
    entry, cubin = found
    module = check(drv.cuModuleLoadData(cubin), f"cuModuleLoadData ({kernel.__name__})")
    fn = check(drv.cuModuleGetFunction(module, entry.encode()), f"cuModuleGetFunction ({kernel.__name__})")
    kernel.functions[ctx] = (module, fn)
    return fn


class RawLaunch:
    """``kernel[grid, block(, stream(, shared bytes))]`` on a GPU: calling it launches the kernel."""

    __slots__ = ("kernel", "config", "grid", "block", "stream", "shared")

    def __init__(self, kernel, config):
        cfg = tuple(config) if isinstance(config, tuple) else (config,)
        if not 2 <= len(cfg) <= 4:
            raise ValueError(f"{kernel.__name__}: a launch takes [grid, block(, stream(, shared bytes))], got {cfg}")
        self.kernel, self.config = kernel, config
        self.grid, self.block = _dims(cfg[0]), _dims(cfg[1])
        self.stream = _stream_handle(cfg[2] if len(cfg) > 2 else 0)
        self.shared = int(cfg[3]) if len(cfg) > 3 else 0

    def __call__(self, *args):
        from cuda.bindings import driver as drv

        k = self.kernel
        values = pack(k.__name__, k.specs, args)
        fn = load_function(k, nb.CACHE_DIR) if values is not None else None
        if fn is None:
            return k.dispatcher[self.config](*args)
        slots, pointers = k.layout.params(values)  # both held until the driver has copied them
        check(drv.cuLaunchKernel(fn, *self.grid, *self.block, self.shared, drv.CUstream(self.stream),
                                  ctypes.addressof(pointers), 0), f"cuLaunchKernel ({k.__name__})")
