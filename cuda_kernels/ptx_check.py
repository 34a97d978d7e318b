"""Compile every kernel to PTX for sm_90 with the signature it is launched with (no GPU needed).

``python -m cuda_kernels.ptx_check`` (run with ``NUMBA_ENABLE_CUDASIM=0``; needs NVVM, which
``numba-cuda[cu13]`` brings). The simulator does no type checking, so this is where dtype and layout
errors in kernels surface before a GPU sees them. Exit 1 and the kernel's name on the first failure.
"""
from __future__ import annotations

import sys
import time


def main() -> int:
    from cuda_kernels.nb import SIMULATOR, all_kernels

    if SIMULATOR:
        print("ptx_check: unset NUMBA_ENABLE_CUDASIM: the simulator cannot compile PTX", file=sys.stderr)
        return 2
    # Device functions compile for "the current device" (numba-cuda asks the driver for its compute
    # capability); with no GPU there is none, so tell the dispatcher it is an sm_90 part.
    import numba.cuda.dispatcher as dispatcher

    class _Sm90:
        compute_capability = (9, 0)

    dispatcher.get_current_device = lambda: _Sm90()
    from workbench.graph_edges import OUR_PREFIX

    failures = 0
    from cuda_kernels.c51 import head_kernel, head_loss_kernel

    for atoms, sizes in ((51, (3, 3, 3)), (11, (2, 4, 3)), (128, (4, 4, 4, 4))):  # built per shape: the
        head_kernel(atoms, sizes)  # reference shape, unequal branches, the most atoms and branches
        head_loss_kernel(atoms, sizes)
    kernels = all_kernels()
    for k in kernels:
        t0 = time.perf_counter()
        try:
            ptx = k.compile_ptx((9, 0))
            assert ".target sm_90" in ptx
            # graph edges into our kernels may be programmatic (workbench.device): each must wait first
            assert "griddepcontrol.wait" in ptx, "no grid_wait(): a programmatic edge would race it"
            assert f".entry {OUR_PREFIX}" in ptx, f"its name does not start with {OUR_PREFIX} (workbench.graph_edges)"
            print(f"ok   {k.py_func.__module__}.{k.__name__} ({len(ptx)} bytes, {time.perf_counter() - t0:.1f}s)")
        except Exception as exc:  # report every failing kernel, then fail
            failures += 1
            print(f"FAIL {k.py_func.__module__}.{k.__name__}: {type(exc).__name__}: {exc}")
    from cuda_kernels.graph_loop import LOOP_KERNEL, compile_loop_kernel

    try:  # the graph-loop condition kernel is CUDA C++ (NVRTC), not Numba
        ptx = compile_loop_kernel((9, 0), target="ptx").decode(errors="replace")
        assert ".target sm_90" in ptx and f".entry {LOOP_KERNEL}" in ptx and "griddepcontrol.wait" in ptx
        print(f"ok   cuda_kernels.graph_loop.{LOOP_KERNEL} (NVRTC, {len(ptx)} bytes)")
    except Exception as exc:
        failures += 1
        print(f"FAIL cuda_kernels.graph_loop.{LOOP_KERNEL}: {type(exc).__name__}: {exc}")
    print(f"{len(kernels) + 1 - failures} kernels compiled, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
