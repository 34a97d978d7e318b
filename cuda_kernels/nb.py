"""The one module that imports Numba: a later move to another Numba CUDA backend changes only this file.

``SIMULATOR`` is true under ``NUMBA_ENABLE_CUDASIM=1``; graph capture and raw driver calls are not
available there and the runtime falls back to eager launches.
"""
from __future__ import annotations

import os

from numba import cuda, njit, prange  # noqa: F401  (re-exported)
from numba import float32, float64, int32, int64, uint32, uint64, int8, boolean, void  # noqa: F401

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def gpu_available() -> bool:
    """True when a real CUDA device can be used (never under the simulator)."""
    if SIMULATOR:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # driver missing or broken: treat as no GPU
        return False
