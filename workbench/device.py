"""Device runtime on the CUDA driver API (``cuda.bindings.driver``): a non-blocking stream (and more
lanes, one per agent of a population, joined in one graph by :meth:`Device.capture_lanes`), graph
capture and replay, graph loops (:meth:`Device.capture_loops`: a phase's passes as conditional WHILE
nodes, one launch per phase), raw scalar readbacks into pinned memory, pinned host-to-device slots,
events.

Capture rules (GPU_NOTES.md; each one was seen to break a capture):

- everything is allocated before capture (no ``cuda.device_array`` / ``to_device`` / host arrays as
  kernel arguments inside ``fn``), every kernel has been loaded into the context first
  (``cuda_kernels.nb.load_kernels``);
- ``fn`` enqueues on ``device.stream`` only; nothing synchronises inside it;
- capture runs inside ``cuda.defer_cleanup()`` so Numba's deferred frees cannot fire mid-capture;
- Python scalars passed to kernels are frozen into the graph: values that change between replays
  live in device arrays, fed from the host through :class:`HostSlot` copies captured in the graph;
- a WHILE node's body holds no allocation: cuBLAS runs on its own workspace (set after its stream:
  ``cublasSetStream`` resets the workspace and cuBLAS would then add allocation nodes);
- whatever a graph's nodes read by address lives as long as the graph: loop counters, guards, a
  batched GEMM's address arrays and its cuBLAS workspace (the :class:`LoopGraph` keeps them; a GEMM
  meeting freed after its capture gave ``CUDA_ERROR_ILLEGAL_ADDRESS`` on the H200).

In Numba's simulator there is no driver: :meth:`Device.capture` returns a graph that runs ``fn``
eagerly on every replay, :meth:`Device.capture_loops` Python loops with the condition kernel's rule,
and readbacks use ``copy_to_host``, so the same code path runs in CI.
Every driver call's result is checked; a failure names the call.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from cuda_kernels.launch import check as launch_check
from cuda_kernels.nb import SIMULATOR, cuda

from .errors import WorkbenchError


class DeviceError(WorkbenchError):
    """A CUDA driver call failed."""


def _drv():
    from cuda.bindings import driver

    return driver


def check(result, call: str):
    """Raise :class:`DeviceError` unless ``result`` (a cuda-bindings tuple) reports success; else its
    value(s) (``cuda_kernels.launch.check``, which the raw kernel launches use too)."""
    return launch_check(result, call, DeviceError)


def device_count() -> int:
    """CUDA devices the driver sees (after ``CUDA_VISIBLE_DEVICES``); 0 under the simulator."""
    if SIMULATOR:
        return 0
    drv = _drv()
    check(drv.cuInit(0), "cuInit")
    return int(check(drv.cuDeviceGetCount(), "cuDeviceGetCount"))


def device_pointer(arr) -> int:
    """The array's start address (in the simulator, where arrays are host memory, the host address)."""
    if SIMULATOR:
        return int(arr.__array_interface__["data"][0])
    return int(arr.__cuda_array_interface__["data"][0])


class Graph:
    """An instantiated CUDA graph; ``replay(n)`` launches it ``n`` times on the device's stream."""

    def __init__(self, device: "Device", graph, exec_graph, n_nodes: int):
        self.device, self._graph, self._exec, self.n_nodes = device, graph, exec_graph, n_nodes

    def replay(self, n: int = 1) -> None:
        drv = _drv()
        for _ in range(n):
            check(drv.cuGraphLaunch(self._exec, self.device.raw_stream), "cuGraphLaunch")

    def __del__(self):
        try:
            drv = _drv()
            drv.cuGraphExecDestroy(self._exec)
            drv.cuGraphDestroy(self._graph)
        except Exception:  # interpreter shutdown or a dead context: nothing left to free
            pass


class LoopGraph(Graph):
    """A graph of WHILE loops (:meth:`Device.capture_loops`): one ``launch()`` runs every loop's head,
    its body its own number of passes (a loop alone in its group fewer when its guard trips), its tail."""

    def __init__(self, device: "Device", graph, exec_graph, n_nodes: int, counts: list[int], keep: list):
        super().__init__(device, graph, exec_graph, n_nodes)
        self.counts, self._keep = counts, keep  # what the graph's nodes point at: loop counters, guards, meetings

    def launch(self) -> None:
        self.replay(1)


class EagerGraph:
    """Simulator stand-in: replaying runs the captured function again."""

    n_nodes = 0

    def __init__(self, device: "Device", fn):
        self.device, self.fn = device, fn

    def replay(self, n: int = 1) -> None:
        for _ in range(n):
            self.fn(self.device.stream)


class Loop(NamedTuple):
    """One branch of a loop graph (:meth:`Device.capture_loops`): on ``lane``, ``head(stream)`` once,
    ``body(stream)`` ``count`` times (or until ``guard[0]`` is non-zero after a pass), ``tail(stream)`` once.
    ``steps``, where given, is the body written as steps: a generator ``steps(stream)`` that enqueues
    the same pass and yields a value wherever it needs something done for it (a GEMM); a group of
    loops given a ``meet`` runs their steps in lockstep (:func:`run_lockstep`)."""

    lane: "Device"
    body: Callable
    count: int
    guard: object = None
    head: Callable | None = None
    tail: Callable | None = None
    steps: Callable | None = None


_DONE = object()


def run_lockstep(gens, meet, between=None) -> None:
    """Advance the generators ``gens`` together: each up to its next yield (enqueuing its own work), then
    ``meet(the values they yielded)``, until all are exhausted; ``between(before_meet)`` is called just
    before (True) and after (False) each meeting that ``meet.joins(values)`` says needs the loops joined
    (the joins and forks of a capture; every meeting where ``meet`` has no ``joins``), and then
    ``meet.after(values)`` where ``meet`` has it: work each loop does on its own again, once forked.
    Every generator must yield equally often."""
    joins = getattr(meet, "joins", lambda vals: True)
    after = getattr(meet, "after", None)
    while True:
        vals = [next(g, _DONE) for g in gens]
        done = [v is _DONE for v in vals]
        if all(done):
            return
        if any(done):
            raise ValueError("the loops of a lockstep group must meet equally often")
        join = between is not None and joins(vals)
        if join:
            between(True)
        meet(vals)
        if join:
            between(False)
        if after is not None:
            after(vals)


def loop_groups(loops) -> list[tuple[int, list[int]]]:
    """The loops of a loop graph grouped by count, ``[(count, [loop indices])]`` in order of first
    appearance: a group shares one WHILE node. Only a loop alone in its group ends early on its guard;
    a group runs every pass, which for a trainer whose guard tripped changes nothing that lasts (its
    update kernels skip every lasting write once the guard is set), the same as stopping it."""
    groups: dict[int, list[int]] = {}
    for i, lp in enumerate(loops):
        groups.setdefault(lp.count, []).append(i)
    return list(groups.items())


class EagerLoop:
    """Simulator stand-in of :class:`LoopGraph`, the same rules: per group (:func:`loop_groups`) the
    heads, then ``count`` passes of every member's body (a lone loop stops once its guard reads non-zero
    after a pass: the condition kernel's rule), then the tails."""

    n_nodes = 0

    def __init__(self, loops, meet=None):
        self.loops, self.counts, self.meet = list(loops), [lp.count for lp in loops], meet

    def launch(self) -> None:
        from cuda_kernels.graph_loop import loop_next_ref

        for count, members in loop_groups(self.loops):
            group = [self.loops[i] for i in members]
            for lp in group:
                if lp.head is not None:
                    lp.head(lp.lane.stream)
            guard = group[0].guard if len(group) == 1 else None
            done, more = 0, True
            while more:
                if _lockstep(group, self.meet):
                    run_lockstep([lp.steps(lp.lane.stream) for lp in group], self.meet)
                else:
                    for lp in group:
                        lp.body(lp.lane.stream)
                done, more = loop_next_ref(done, count, 0 if guard is None else int(guard.copy_to_host()[0]))
            for lp in group:
                if lp.tail is not None:
                    lp.tail(lp.lane.stream)


def _lockstep(group, meet) -> bool:
    """Whether a group's passes run in lockstep: several loops, all written as steps, and a meeting."""
    return meet is not None and len(group) > 1 and all(lp.steps is not None for lp in group)


_LOOP_FUNCTIONS: dict = {}


def _loop_function(device: "Device"):
    """The graph-loop condition kernel (:mod:`cuda_kernels.graph_loop`) for this GPU (NVRTC-compiled, or
    read from the kernel cache) loaded into the current context once per process."""
    drv = _drv()
    ctx = int(check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    if ctx not in _LOOP_FUNCTIONS:
        from cuda_kernels.graph_loop import LOOP_KERNEL, loop_cubin

        try:
            cubin = loop_cubin(device.info.compute_capability)
        except Exception as exc:
            raise DeviceError(f"cannot build the graph-loop kernel: {exc}",
                              "install the 'gpu' extra (numba-cuda[cu13] brings NVRTC)") from exc
        module = check(drv.cuModuleLoadData(cubin), "cuModuleLoadData (graph-loop kernel)")
        _LOOP_FUNCTIONS[ctx] = (module, check(drv.cuModuleGetFunction(module, LOOP_KERNEL.encode()),
                                              "cuModuleGetFunction (graph-loop kernel)"))
    return _LOOP_FUNCTIONS[ctx][1]


@dataclass
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    multiprocessors: int
    max_threads_per_block: int
    shared_memory_per_block_optin: int
    total_memory: int


class Device:
    """The GPU (or the simulator) with one non-blocking stream."""

    def __init__(self, pdl: str = "off"):
        self.simulator = SIMULATOR
        self.pdl = pdl  # programmatic edges in what this stream captures (workbench.graph_edges; gpu.pdl)
        if self.simulator:
            self.stream = cuda.stream()
            self.raw_stream = None
            self.info = DeviceInfo("simulator", (0, 0), 1, 1024, 48 * 1024, 0)
            return
        drv = _drv()
        cuda.current_context()  # Numba's primary context becomes current for the driver calls below
        self.raw_stream = check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self.stream = cuda.external_stream(int(self.raw_stream))
        dev = cuda.get_current_device()
        handle = check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
        A = drv.CUdevice_attribute

        def attr(a):
            return int(check(drv.cuDeviceGetAttribute(a, handle), f"cuDeviceGetAttribute({a.name})"))

        self.info = DeviceInfo(
            name=dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
            compute_capability=tuple(dev.compute_capability),
            multiprocessors=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            max_threads_per_block=attr(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            shared_memory_per_block_optin=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            total_memory=int(check(drv.cuDeviceTotalMem(handle), "cuDeviceTotalMem")),
        )

    def lane(self) -> "Device":
        """Another non-blocking stream on the same device and context: one agent of a population
        enqueues on its own lane, so its work can run beside the others' (:meth:`capture_lanes`)."""
        other = object.__new__(Device)
        other.simulator, other.info, other.pdl = self.simulator, self.info, self.pdl
        if self.simulator:
            other.stream, other.raw_stream = cuda.stream(), None
            return other
        drv = _drv()
        other.raw_stream = check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        other.stream = cuda.external_stream(int(other.raw_stream))
        return other

    def wait_for(self, others) -> None:
        """Work enqueued on this stream from now on starts after what is enqueued on ``others`` now
        (an event on each, waited on here; no host sync)."""
        if self.simulator:
            return
        drv = _drv()
        for o in others:
            if o.raw_stream is self.raw_stream:
                continue
            ev = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
            check(drv.cuEventRecord(ev, o.raw_stream), "cuEventRecord")
            check(drv.cuStreamWaitEvent(self.raw_stream, ev, 0), "cuStreamWaitEvent")
            check(drv.cuEventDestroy(ev), "cuEventDestroy")  # released once the wait is satisfied

    # ---- graphs ----
    def capture_lanes(self, lanes, fns) -> Graph | EagerGraph:
        """One graph of independent branches: ``fns[i](lanes[i].stream)`` enqueues branch i on lane i,
        forked from and joined back into this device's stream (the graph replays on it), so the GPU
        runs the branches side by side. In the simulator the branches run one after another."""
        if self.simulator:
            return EagerGraph(self, lambda _st: [fn(lane.stream) for lane, fn in zip(lanes, fns)])
        with self._fork_join(lanes, fns) as branches:
            return self._captured(branches)

    @contextmanager
    def _fork_join(self, lanes, fns):
        """``enqueue()``, for use inside a capture of this stream: ``fns[i](lanes[i].stream)`` on each lane,
        forked from and joined back into this stream by events (freed on leaving the block)."""
        drv = _drv()
        flag = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        fork = check(drv.cuEventCreate(flag), "cuEventCreate")
        joins = [check(drv.cuEventCreate(flag), "cuEventCreate") for _ in lanes]

        def branches() -> None:
            check(drv.cuEventRecord(fork, self.raw_stream), "cuEventRecord (fork)")
            for lane, fn, join in zip(lanes, fns, joins):
                check(drv.cuStreamWaitEvent(lane.raw_stream, fork, 0), "cuStreamWaitEvent (fork)")
                fn(lane.stream)
                check(drv.cuEventRecord(join, lane.raw_stream), "cuEventRecord (join)")
                check(drv.cuStreamWaitEvent(self.raw_stream, join, 0), "cuStreamWaitEvent (join)")

        try:
            yield branches
        finally:
            for ev in (fork, *joins):
                check(drv.cuEventDestroy(ev), "cuEventDestroy")

    @contextmanager
    def _events(self):
        """A maker of events for a capture's joins and forks, every event freed on leaving the block."""
        drv = _drv()
        made = []

        def new_event():
            made.append(check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate"))
            return made[-1]

        try:
            yield new_event
        finally:
            for ev in made:
                check(drv.cuEventDestroy(ev), "cuEventDestroy")

    def _lockstep_pass(self, group, meet, new_event) -> None:
        """For use inside a capture of this stream: one pass of every loop of ``group`` in lockstep, each on
        its lane, forked from this stream; at each meeting the lanes join this stream, ``meet`` enqueues
        on it, and the lanes fork again; joined back at the end."""
        drv = _drv()
        lanes = [lp.lane for lp in group]

        def link(src, dsts) -> None:
            ev = new_event()
            check(drv.cuEventRecord(ev, src.raw_stream), "cuEventRecord")
            for d in dsts:
                check(drv.cuStreamWaitEvent(d.raw_stream, ev, 0), "cuStreamWaitEvent")

        def between(before_meet: bool) -> None:
            if before_meet:
                for lane in lanes:
                    link(lane, [self])
            else:
                link(self, lanes)

        link(self, lanes)
        run_lockstep([lp.steps(lp.lane.stream) for lp in group], meet, between)
        for lane in lanes:
            link(lane, [self])

    def capture_loops(self, loops: "list[Loop]", meet=None) -> LoopGraph | EagerLoop:
        """One graph that runs every :class:`Loop` on its lane: its ``head`` once, its ``body`` ``count``
        times, then its ``tail`` once. Loops of one count share a conditional WHILE node whose body
        forks every loop's pass onto its lane and joins them (:func:`loop_groups`), so the GPU runs the
        agents side by side and the loop costs one condition per pass for all of them; a loop alone
        in its group also ends early when its ``guard`` (an int32 device array) is non-zero after a
        pass. One :meth:`LoopGraph.launch` runs a phase: no host loop of launches. Each loop's body
        is captured on its own lane (the stream its cuBLAS handle is bound to); the WHILE body ends
        with the condition kernel (:mod:`cuda_kernels.graph_loop`).

        With ``meet``, a group of several loops that are all written as steps (:attr:`Loop.steps`) runs its
        passes in lockstep: wherever the loops yield, their lanes join this stream, ``meet(values)``
        enqueues on it (a population's batched GEMM over its agents' same GEMM), and the lanes fork
        again. ``meet.plan(values)`` is shown every meeting first, in a capture that is thrown away, and
        ``meet.prepare()`` then allocates what the meetings need, before the real capture."""
        loops = list(loops)
        if not loops or min(lp.count for lp in loops) < 1:
            raise ValueError("capture_loops needs at least one loop, each of count >= 1")
        if self.simulator:
            return EagerLoop(loops, meet)
        import ctypes

        drv = _drv()
        fn_next = _loop_function(self)
        groups = loop_groups(loops)
        counters = cuda.to_device(np.zeros(len(groups), np.int32))
        never = cuda.to_device(np.zeros(1, np.int32))  # the guard of a group of several loops
        ctx = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        graph = check(drv.cuGraphCreate(0), "cuGraphCreate")

        def child(lane, fn, deps):
            sub = lane._captured(lambda: fn(lane.stream), instantiate=False)
            node = check(drv.cuGraphAddChildGraphNode(graph, deps, len(deps), sub), "cuGraphAddChildGraphNode")
            check(drv.cuGraphDestroy(sub), "cuGraphDestroy")  # the child node holds its own copy
            return node

        lockstep = {g for g, (_count, members) in enumerate(groups) if _lockstep([loops[i] for i in members], meet)}
        for g in sorted(lockstep):  # the planning capture: the meetings' arguments, nothing kept
            with self._events() as new_event:
                sub = self._captured(lambda m=groups[g][1], e=new_event: self._lockstep_pass([loops[i] for i in m],
                                                                                             meet.plan, e),
                                     instantiate=False)
            check(drv.cuGraphDestroy(sub), "cuGraphDestroy")
        if lockstep:
            meet.prepare()
        try:
            for g, (count, members) in enumerate(groups):
                group = [loops[i] for i in members]
                heads = [child(lp.lane, lp.head, []) for lp in group if lp.head is not None]
                handle = check(drv.cuGraphConditionalHandleCreate(graph, ctx, 1, drv.CU_GRAPH_COND_ASSIGN_DEFAULT),
                               "cuGraphConditionalHandleCreate")
                params = drv.CUgraphNodeParams()
                params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
                params.conditional.handle = handle
                params.conditional.type = drv.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
                params.conditional.size = 1
                params.conditional.ctx = ctx
                node = check(drv.cuGraphAddNode(graph, heads, None, len(heads), params), "cuGraphAddNode (WHILE)")
                guard = group[0].guard if len(group) == 1 and group[0].guard is not None else never
                owner = group[0].lane if len(group) == 1 else self  # the stream the pass is captured on
                args = ((int(handle), device_pointer(counters) + 4 * g, int(count), device_pointer(guard)),
                        (ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p))

                def condition(owner=owner, args=args):
                    check(drv.cuLaunchKernel(fn_next, 1, 1, 1, 1, 1, 1, 0, owner.raw_stream, args, 0),
                          "cuLaunchKernel (loop condition)")

                body_graph = params.conditional.phGraph_out[0]
                if len(group) == 1:
                    owner._captured(lambda lp=group[0], c=condition: (lp.body(lp.lane.stream), c()), into=body_graph)
                elif g in lockstep:
                    with self._events() as new_event:
                        owner._captured(lambda grp=group, c=condition, e=new_event: (self._lockstep_pass(grp, meet, e),
                                                                                     c()), into=body_graph)
                else:  # the events live until the capture has ended
                    with self._fork_join([lp.lane for lp in group], [lp.body for lp in group]) as branches:
                        owner._captured(lambda b=branches, c=condition: (b(), c()), into=body_graph)
                for lp in group:
                    if lp.tail is not None:
                        child(lp.lane, lp.tail, [node])
            exec_graph = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate (loops)")
        except BaseException:
            drv.cuGraphDestroy(graph)
            raise
        _, n_nodes = check(drv.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
        return LoopGraph(self, graph, exec_graph, int(n_nodes), [lp.count for lp in loops],
                         [counters, never, [lp.guard for lp in loops], meet])  # meet: its address arrays

    def capture(self, fn) -> Graph | EagerGraph:
        """Capture what ``fn(stream)`` enqueues into an instantiated graph."""
        if self.simulator:
            return EagerGraph(self, fn)
        return self._captured(lambda: fn(self.stream))

    def _captured(self, enqueue, into=None, instantiate: bool = True):
        """Capture what ``enqueue()`` puts on this device's stream (and the streams it forks and joins back)
        into an instantiated graph (``instantiate=False``: the bare graph; ``into``: into that existing
        graph, a WHILE node's body, returning nothing); on an error in ``enqueue`` the capture is ended
        and the stream usable."""
        drv = _drv()
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        if into is None:
            check(drv.cuStreamBeginCapture(self.raw_stream, mode), "cuStreamBeginCapture")
        else:
            check(drv.cuStreamBeginCaptureToGraph(self.raw_stream, into, None, None, 0, mode),
                  "cuStreamBeginCaptureToGraph")
        try:
            with cuda.defer_cleanup():
                enqueue()
        except BaseException:
            drv.cuStreamEndCapture(self.raw_stream)  # leave the stream usable; the error is enqueue's
            raise
        graph = check(drv.cuStreamEndCapture(self.raw_stream), "cuStreamEndCapture (was something "
                      "allocated, synchronised, launched on another stream or a lane not joined back inside "
                      "the capture?)")
        if self.pdl != "off" and self.info.compute_capability >= (9, 0):  # griddepcontrol: sm_90 and later
            from .graph_edges import make_programmatic

            try:
                make_programmatic(into if into is not None else graph, self.pdl)
            except BaseException:
                if into is None:
                    drv.cuGraphDestroy(graph)
                raise
        if into is not None or not instantiate:
            return None if into is not None else graph
        exec_graph = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        _, n = check(drv.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
        return Graph(self, graph, exec_graph, int(n))

    def free_memory(self) -> int:
        """Free device memory in bytes now (0 in the simulator: no limit is known)."""
        if self.simulator:
            return 0
        free, _total = check(_drv().cuMemGetInfo(), "cuMemGetInfo")
        return int(free)

    def fill(self, arr, value=0) -> None:
        """Every element of the device array ``arr`` set to ``value``, enqueued on this device's stream:
        a driver memset where the array is contiguous and its elements are 4 bytes wide or the value is
        all zero bits, so nothing crosses the bus (measured on the H100: the sample's init phase 453 ->
        340 ms for 5 agents, against uploading zeros from pageable host memory); otherwise, and in the
        simulator, a copy from the host."""
        n = int(arr.size) * arr.dtype.itemsize
        if not n:
            return
        word = np.array(value, arr.dtype)
        if not self.simulator and arr.is_c_contiguous():
            if arr.dtype.itemsize == 4:
                check(_drv().cuMemsetD32Async(device_pointer(arr), int(word.view(np.uint32)), n // 4,
                                              self.raw_stream), "cuMemsetD32Async")
                return
            if not any(word.tobytes()):
                check(_drv().cuMemsetD8Async(device_pointer(arr), 0, n, self.raw_stream), "cuMemsetD8Async")
                return
        arr.copy_to_device(np.full(arr.shape, value, arr.dtype), stream=self.stream)

    # ---- synchronisation and timing ----
    def synchronize(self) -> None:
        """Host sync point: waits for all work on the stream."""
        if self.simulator:
            return
        check(_drv().cuStreamSynchronize(self.raw_stream), "cuStreamSynchronize")

    def event(self) -> "Event":
        return Event(self)


class Event:
    """A CUDA event on the device's stream (host clock in the simulator)."""

    def __init__(self, device: Device):
        self.device = device
        self._t = None
        if not device.simulator:
            drv = _drv()
            self._ev = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

    def __del__(self):
        try:
            if not self.device.simulator:
                _drv().cuEventDestroy(self._ev)
        except Exception:  # interpreter shutdown
            pass

    def record(self) -> "Event":
        if self.device.simulator:
            self._t = time.perf_counter()
        else:
            check(_drv().cuEventRecord(self._ev, self.device.raw_stream), "cuEventRecord")
        return self

    def elapsed_ms(self, later: "Event") -> float:
        """Milliseconds from this event to ``later`` (synchronises on ``later``)."""
        if self.device.simulator:
            return (later._t - self._t) * 1e3
        drv = _drv()
        check(drv.cuEventSynchronize(later._ev), "cuEventSynchronize")
        return float(check(drv.cuEventElapsedTime(self._ev, later._ev), "cuEventElapsedTime"))


class Handoff:
    """A dependency between two streams of one device, inside a capture or outside one: ``give(a)`` marks
    the work enqueued on ``a`` so far; ``take(b)``: work enqueued on ``b`` from then on runs after it
    (each ``take`` waits for the latest ``give``). One event, made once and reused. Inside a capture of
    ``a``, a stream that takes from it joins the capture (a fork), and every stream so joined must be
    given back to the capturing stream before the capture ends (a join). No-ops in the simulator, whose
    launches run in program order."""

    def __init__(self, device: Device):
        self.simulator = device.simulator
        if not self.simulator:
            drv = _drv()
            self._ev = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")

    def __del__(self):
        try:
            if not self.simulator:
                _drv().cuEventDestroy(self._ev)
        except Exception:  # interpreter shutdown
            pass

    def give(self, a: Device) -> "Handoff":
        if not self.simulator:
            check(_drv().cuEventRecord(self._ev, a.raw_stream), "cuEventRecord (handoff)")
        return self

    def take(self, b: Device) -> None:
        if not self.simulator:
            check(_drv().cuStreamWaitEvent(b.raw_stream, self._ev, 0), "cuStreamWaitEvent (handoff)")


class Readback:
    """Device scalars read back together: one ``cuMemcpyDtoHAsync`` each into one long-lived pinned
    buffer, then a single stream synchronisation (the only host sync of an epoch)."""

    def __init__(self, device: Device, sources: dict[str, object]):
        self.device = device
        self.sources = dict(sources)
        self.offsets, total = {}, 0
        for name, arr in self.sources.items():
            total = (total + 7) // 8 * 8
            self.offsets[name] = (total, arr.dtype, arr.size)
            total += arr.dtype.itemsize * arr.size
        self.host = cuda.pinned_array(max(total, 8), dtype=np.uint8)

    def read(self) -> dict[str, np.ndarray]:
        if self.device.simulator:
            return {k: np.array(v.copy_to_host()) for k, v in self.sources.items()}
        drv = _drv()
        base = self.host.ctypes.data
        for name, arr in self.sources.items():
            off, dtype, size = self.offsets[name]
            check(drv.cuMemcpyDtoHAsync(base + off, device_pointer(arr), dtype.itemsize * size, self.device.raw_stream),
                  f"cuMemcpyDtoHAsync({name})")
        self.device.synchronize()  # the sync point
        out = {}
        for name, (off, dtype, size) in self.offsets.items():
            out[name] = self.host[off:off + dtype.itemsize * size].view(dtype).copy()
        return out


class HostSlot:
    """A device array fed from pinned host memory by a copy that can sit inside a graph: write
    ``slot.value[...]`` on the host before a replay; the captured ``enqueue()`` copies it in."""

    def __init__(self, device: Device, dev_array):
        self.device, self.dev_array = device, dev_array
        self.value = cuda.pinned_array(dev_array.shape, dtype=dev_array.dtype)

    def enqueue(self, stream=None) -> None:
        if self.device.simulator:
            self.dev_array.copy_to_device(np.array(self.value))
            return
        check(_drv().cuMemcpyHtoDAsync(device_pointer(self.dev_array), self.value.ctypes.data, self.value.nbytes,
                                       self.device.raw_stream), "cuMemcpyHtoDAsync")
