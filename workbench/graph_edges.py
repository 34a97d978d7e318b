"""Programmatic edges in a captured graph (Hopper's programmatic dependent launch, sm_90 and later).

A plain edge between two kernel nodes starts the downstream kernel only once the upstream one has
finished and its writes are flushed: the downstream kernel's launch (its blocks scheduled, their
prologue) waits behind that, a ramp of a few microseconds at every link of an update's chain of small
kernels. A programmatic edge lets the downstream kernel launch earlier, when every block of the
upstream one has exited or triggered (``from_port`` programmatic) or has merely started (``order``);
the downstream kernel then waits inside, in ``griddepcontrol.wait``, for the upstream grid to finish
with its writes visible. Every kernel of :mod:`cuda_kernels` does that first (``nb.grid_wait``;
``ptx_check`` refuses one that does not), and so does the graph-loop condition kernel: an edge *into*
one of them may be made programmatic without a race. Edges into anything else (cuBLAS's kernels, copies,
memsets, child graphs, conditional nodes) stay as captured.

``gpu.pdl`` chooses: ``off`` (the graph as captured), ``programmatic``, ``order``. The same kernels on
the same buffers in the same order of writes: the results are the same bit for bit.
"""
from __future__ import annotations

PORTS = ("off", "programmatic", "order")
OUR_PREFIX = "_ZN12cuda_kernels"  # Numba's mangled names of this package's kernels


def waits_first(name: str) -> bool:
    """Whether the kernel named ``name`` waits for its programmatic prerequisites before touching memory."""
    from cuda_kernels.graph_loop import LOOP_KERNEL

    return name.startswith(OUR_PREFIX) or name == LOOP_KERNEL


def programmatic_edges(edges, names) -> list[int]:
    """The indices of ``edges`` ((upstream, downstream, plain) triples; ``plain``: the edge carries no data
    yet) that may become programmatic: plain edges from a kernel node into a kernel node that waits first.
    ``names`` maps each kernel node to its kernel's name (other nodes are absent)."""
    return [i for i, (a, b, plain) in enumerate(edges)
            if plain and a in names and b in names and waits_first(names[b])]


def make_programmatic(graph, port: str) -> int:
    """Turn the edges :func:`programmatic_edges` picks in ``graph`` (a captured, not yet instantiated
    graph; its child graphs are made so when they are captured) into programmatic ones through ``port``
    ('programmatic' or 'order'); returns how many."""
    from .device import _drv, check

    if port == "off":
        return 0
    if port not in PORTS:
        raise ValueError(f"gpu.pdl must be one of {', '.join(PORTS)}, got {port!r}")
    drv = _drv()
    n = int(check(drv.cuGraphGetEdges(graph, 0), "cuGraphGetEdges")[-1])
    if n == 0:
        return 0
    froms, tos, data, _ = check(drv.cuGraphGetEdges(graph, n), "cuGraphGetEdges")
    names: dict[int, str] = {}
    for node in {int(x): x for x in (*froms, *tos)}.values():
        name = _kernel_name(drv, node)
        if name is not None:
            names[int(node)] = name
    edges = [(int(a), int(b), _plain(d)) for a, b, d in zip(froms, tos, data)]
    pick = programmatic_edges(edges, names)
    if not pick:
        return 0
    src, dst = [froms[i] for i in pick], [tos[i] for i in pick]
    check(drv.cuGraphRemoveDependencies(graph, src, dst, None, len(pick)), "cuGraphRemoveDependencies")
    annotated = []
    for _ in pick:
        e = drv.CUgraphEdgeData()
        e.from_port = (drv.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC if port == "programmatic"
                       else drv.CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER)
        e.to_port = 0
        e.type = drv.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        annotated.append(e)
    try:
        check(drv.cuGraphAddDependencies(graph, src, dst, annotated, len(pick)), "cuGraphAddDependencies (programmatic)")
    except BaseException:  # put the plain edges back: the graph stays what was captured
        check(drv.cuGraphAddDependencies(graph, src, dst, None, len(pick)), "cuGraphAddDependencies")
        raise
    return len(pick)


def _plain(data) -> bool:
    return data is None or (int(data.from_port) == 0 and int(data.to_port) == 0 and int(data.type) == 0)


_NAMES: dict[int, str] = {}  # a loaded function's handle -> its name


def _kernel_name(drv, node) -> str | None:
    """The name of a kernel node's function, None for a node of another type."""
    from .device import check

    if check(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType") != drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
        return None
    p = check(drv.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
    func = int(p.func) if p.func is not None else 0
    key = func or int(p.kern)
    if key not in _NAMES:
        raw = (check(drv.cuFuncGetName(p.func), "cuFuncGetName") if func
               else check(drv.cuKernelGetName(p.kern), "cuKernelGetName"))
        _NAMES[key] = raw.decode() if isinstance(raw, bytes) else str(raw)
    return _NAMES[key]
