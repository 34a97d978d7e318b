"""The condition kernel of a graph loop: the last node of a conditional WHILE node's body.

A phase of an epoch (the experience steps, the updates) runs as one ``cuGraphLaunch``: its body sits
inside a WHILE node whose condition this kernel sets on the device after each pass
(:meth:`workbench.device.Device.capture_loops`). Numba cannot call ``cudaGraphSetConditional``, so
this one kernel is CUDA C++ compiled at run time by NVRTC (cuda-bindings' ``nvrtc``); it runs on one
thread and costs one node per pass.

Each pass: ``count += 1``; the loop goes on while ``count < n`` and ``guard == 0`` (the training
guard of :func:`cuda_kernels.optim.grad_norm_guard_kernel`, or a buffer that stays zero); when it
stops, ``count`` is put back to 0 so the next launch starts afresh. The WHILE node enters its body once per launch
(``defaultLaunchValue`` 1), so a loop of ``n >= 1`` passes runs ``n`` passes, or fewer when the guard
trips (the pass that tripped it is the last, as on the CPU backend).
"""
from __future__ import annotations

import os
from pathlib import Path

LOOP_KERNEL = "loop_next"

LOOP_SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                     unsigned int value);

extern "C" __global__ void loop_next(cudaGraphConditionalHandle handle, int* count, int n, const int* guard)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");  // a programmatic edge may launch it early
#endif
    int done = count[0] + 1;
    bool more = done < n && guard[0] == 0;
    count[0] = more ? done : 0;
    cudaGraphSetConditional(handle, more ? 1u : 0u);
}
"""


def loop_next_ref(count: int, n: int, guard: int) -> tuple[int, bool]:
    """CPU twin of one pass's end: (the counter after it, whether the loop runs another pass)."""
    done = count + 1
    more = done < n and guard == 0
    return (done if more else 0), more


def compile_loop_kernel(cc: tuple[int, int], target: str = "cubin") -> bytes:
    """NVRTC-compile :data:`LOOP_SOURCE` for compute capability ``cc``: a cubin to load, or (``target``
    ``"ptx"``) PTX text, which CI compiles for sm_90 with no GPU. Raises RuntimeError with NVRTC's log."""
    from cuda.bindings import nvrtc

    def ok(result, call):
        err = result[0]
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"{call} failed: {err.name}")
        return result[1] if len(result) == 2 else result[1:]

    prog = ok(nvrtc.nvrtcCreateProgram(LOOP_SOURCE.encode(), b"graph_loop.cu", 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={'sm' if target == 'cubin' else 'compute'}_{cc[0]}{cc[1]}".encode()]
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = ok(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC could not compile the graph-loop kernel: {log.decode(errors='replace').strip()}")
        get_size, get = ((nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if target == "cubin"
                         else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX))
        out = b" " * ok(get_size(prog), get_size.__name__)
        ok((get(prog, out)[0], None), get.__name__)
        return out
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def loop_cubin(cc: tuple[int, int], cache_dir: str | None = None) -> bytes:
    """The condition kernel's cubin for compute capability ``cc``, from the kernel cache
    (:data:`cuda_kernels.nb.CACHE_DIR`, keyed on this package's sources; ``cache_dir`` overrides it)
    when there, else compiled (NVRTC, ~0.3 s with its library's loading) and written there for the
    next process. No cache (``WORKBENCH_KERNEL_CACHE=off``, a read-only home): compiled every time."""
    if cache_dir is None:
        from .nb import CACHE_DIR as cache_dir
    path = Path(cache_dir) / f"graph_loop_sm{cc[0]}{cc[1]}.cubin" if cache_dir else None
    if path is not None and path.is_file():
        return path.read_bytes()
    cubin = compile_loop_kernel(cc)
    if path is not None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(cubin)
            os.replace(tmp, path)  # atomic: concurrent workers never read half a file
        except OSError:  # the cache is a convenience: the compiled cubin is used all the same
            tmp.unlink(missing_ok=True)
    return cubin
