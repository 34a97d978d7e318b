"""Programmatic edges (``gpu.pdl``, workbench.graph_edges): which edges of a captured graph may be made
programmatic, that every kernel of the package waits first (what makes that safe), and on a GPU that a
graph so made runs its chain in order."""
from __future__ import annotations

import ast
import inspect
import textwrap

import numpy as np
import pytest

from workbench.graph_edges import OUR_PREFIX, programmatic_edges, waits_first


def _kernels():
    from cuda_kernels.c51 import head_kernel, head_loss_kernel
    from cuda_kernels.nb import all_kernels

    head_kernel(51, (3, 3, 3))  # kernels built per shape are declared when first asked for
    head_loss_kernel(51, (3, 3, 3))
    return all_kernels()


def test_every_kernel_waits_for_its_prerequisites_first():
    """A programmatic edge launches a kernel before the one it depends on has finished: each kernel's
    first statement (after its docstring) must be ``grid_wait()`` (ptx_check also finds the instruction)."""
    kernels = _kernels()
    assert len(kernels) > 20
    for k in kernels:
        fn = ast.parse(textwrap.dedent(inspect.getsource(k.py_func))).body[0]
        body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
            else fn.body
        first = body[0]
        assert (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
                and getattr(first.value.func, "id", None) == "grid_wait" and not first.value.args), \
            f"{k.py_func.__module__}.{k.__name__} does not call grid_wait() first"


def test_only_plain_edges_from_a_kernel_into_one_of_ours_become_programmatic():
    ours, loop, cublas = f"{OUR_PREFIX}3c5124c51_head_loss_a51_b3x3x3B3v20", "loop_next", "sm90_xmma_gemm_f32f32_tf32f32"
    names = {1: ours, 2: ours, 3: cublas, 4: loop}  # 5: a memset node, 6: a child graph (no kernel name)
    edges = [(1, 2, True),    # ours -> ours
             (3, 2, True),    # cuBLAS -> ours: ours waits, so yes
             (2, 3, True),    # ours -> cuBLAS: cuBLAS's kernels do not wait: no
             (2, 4, True),    # ours -> the loop's condition kernel (it waits too)
             (5, 1, True),    # memset -> ours: not a kernel upstream
             (1, 6, True),    # ours -> a child graph
             (1, 2, False)]   # already annotated: left alone
    assert programmatic_edges(edges, names) == [0, 1, 3]
    assert waits_first(ours) and waits_first(loop) and not waits_first(cublas)


def test_gpu_pdl_setting_is_checked():
    from workbench.agent.backend import Backend
    from workbench.config import GpuOverrides
    from workbench.errors import ConfigError

    b = Backend("cpu")
    assert b.sized(GpuOverrides(pdl="order")).pdl == "order"
    with pytest.raises(ConfigError, match="gpu.pdl must be one of off, programmatic, order"):
        b.sized(GpuOverrides(pdl="yes"))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["programmatic", "order"])
def test_a_chain_with_programmatic_edges_runs_in_order(mode):
    """A chain of dependent launches (each reads what the one before wrote) captured with programmatic
    edges: the edges are made so, and replays give the chain's result every time."""
    from cuda_kernels import optim
    from cuda_kernels.nb import cuda
    from workbench.device import Device, _drv, check

    device = Device(pdl=mode)
    if device.info.compute_capability < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    x = cuda.to_device(np.zeros(1 << 20, np.float32))
    step = cuda.to_device(np.zeros(1, np.int64))
    optim.fill_kernel[64, 256, device.stream](x, 0.0)
    optim.step_increment_kernel[1, 1, device.stream](step)
    device.synchronize()

    def chain(st):  # fills of rising values: one overtaking the fill before it would leave a smaller value behind
        for v in range(1, 9):
            optim.fill_kernel[512, 256, st](x, float(v))
            optim.step_increment_kernel[1, 1, st](step)

    g = device.capture(chain)
    drv = _drv()
    froms, tos, data, n = check(drv.cuGraphGetEdges(g._graph, 64), "cuGraphGetEdges")
    kinds = [int(d.type) for d in data[:n]]
    assert n == 15 and kinds.count(1) == 15, kinds  # every link of the chain is programmatic
    for r in range(1, 4):
        g.replay(1)
        device.synchronize()
        assert np.all(x.copy_to_host() == 8.0)
        assert int(step.copy_to_host()[0]) == 1 + 8 * r
