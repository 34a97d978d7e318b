"""The condition kernel of a graph loop: the last node of a conditional WHILE node's body.

A phase of an epoch (the experience steps, the updates) runs as one ``cuGraphLaunch``: its body sits
inside a WHILE node whose condition this kernel sets on the device after each pass
(:meth:`workbench.device.Device.capture_loops`). Numba cannot call ``cudaGraphSetConditional``, so
this one kernel is CUDA C++ compiled at run time by NVRTC (cuda-bindings' ``nvrtc``); it runs on one
thread and costs one node per pass.

Each pass: ``count += 1``; the loop goes on while ``count < n`` and ``guard == 0`` (the training guard
of :func:`cuda_kernels.optim.guard_kernel`, or a buffer that stays zero); when it stops, ``count`` is
put back to 0 so the next launch starts afresh. The WHILE node enters its body once per launch
(``defaultLaunchValue`` 1), so a loop of ``n >= 1`` passes runs ``n`` passes, or fewer when the guard
trips (the pass that tripped it is the last, as on the CPU backend).
"""
from __future__ import annotations

LOOP_KERNEL = "loop_next"

LOOP_SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                     unsigned int value);

extern "C" __global__ void loop_next(cudaGraphConditionalHandle handle, int* count, int n, const int* guard)
{
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
