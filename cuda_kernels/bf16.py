"""bfloat16 storage for GEMM operands (issue #16's bf16 setting): float32 <-> bfloat16 bit patterns.

A bfloat16 is the upper half of a float32 (sign, 8 exponent bits, 7 stored mantissa bits). Device
buffers hold them as ``uint16`` (Numba has no bfloat16 array type; cuBLASLt reads the same bytes as
``CUDA_R_16BF``). :func:`to_bf16` rounds to nearest, ties to even, as cuBLAS and PyTorch round: finite
values beyond bfloat16's largest round to infinity, infinities and signed zeros are kept, subnormals
round like any other value (bfloat16 has float32's exponent range), and a NaN stays a NaN (quiet,
its sign kept). :func:`from_bf16` is exact. Both are device functions for kernels that write or read
bfloat16 operands; :func:`to_bf16_ref` and :func:`from_bf16_ref` are their NumPy references.

They are the first pieces of bf16 GEMM operands in memory, which cuBLAS needs before it runs bf16 tensor
cores (``workbench/cublas.py`` says why); :mod:`cuda_kernels.dense` has the simulator's GEMM on bf16
operands and a bf16 layer's unfused epilogues, and ``DeviceNetwork(bf16=True)``
(:mod:`workbench.agent.network`) runs a network on them, and :func:`cuda_kernels.optim.adam_bf16_kernel`
writes the weights' copies (``gpu.math = "bf16"``).
"""
from __future__ import annotations

import numpy as np

from .nb import SIMULATOR, U, cuda, device_function, float32, grid_wait, int64, kernel, uint16, uint32, void

if SIMULATOR:  # the simulator has no libdevice bit casts: NumPy's views are the same reinterpretation
    @device_function
    def _bits(x):
        return np.float32(x).view(np.uint32)

    @device_function
    def _float(u):
        return np.uint32(u).view(np.float32)
else:
    from numba.cuda import libdevice

    @device_function
    def _bits(x):
        return uint32(libdevice.float_as_int(x))

    @device_function
    def _float(u):
        return libdevice.int_as_float(u)


@device_function
def to_bf16(x):
    """float32 -> the bfloat16 nearest it (ties to even), as its 16 bits."""
    u = _bits(float32(x))
    if (u & uint32(0x7FFFFFFF)) > uint32(0x7F800000):  # NaN: keep sign and payload's top, set the quiet bit
        return uint16((u >> uint32(16)) | uint32(0x0040))
    return uint16((u + uint32(0x7FFF) + ((u >> uint32(16)) & uint32(1))) >> uint32(16))


@device_function
def from_bf16(h):
    """bfloat16 bits -> float32 (exact)."""
    return _float(uint32(h) << uint32(16))


@kernel(void(float32[::1], uint16[::1], int64))
def to_bf16_kernel(src, dst, n):
    """dst[i] = to_bf16(src[i]) for i < n (a grid-stride loop)."""
    grid_wait()
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[U(i)] = to_bf16(src[U(i)])


@kernel(void(uint16[::1], float32[::1], int64))
def from_bf16_kernel(src, dst, n):
    """dst[i] = from_bf16(src[i]) for i < n: a bfloat16 buffer read back as float32."""
    grid_wait()
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[U(i)] = from_bf16(src[U(i)])


# ---- NumPy references ----

def to_bf16_ref(x: np.ndarray) -> np.ndarray:
    """float32 array -> uint16 bfloat16 bits, rounded to nearest, ties to even (NaN quiet, sign kept)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x0040).astype(np.uint16), rounded)


def from_bf16_ref(h: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits -> float32 (exact)."""
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)
