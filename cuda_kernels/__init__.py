"""Numba kernels and device functions, and only those.

This package sees NumPy arrays, device arrays and Numba types; it imports no pandas, rich or TOML and
holds no policy. Every Numba import goes through :mod:`cuda_kernels.nb`.
"""
