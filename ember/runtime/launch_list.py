"""A captured CUDA graph of ember's own kernels, replayed as plain launches.

``ember.cuda_graph`` captures a step so that a call skips Dynamo, AOTAutograd and the autograd
engine. Replaying the graph itself (``cudaGraphLaunch``) is not free, though: on the device
machines a one-kernel graph took 8.6-17.5 µs from event to event where its kernel took 2.4
(bench/RESULTS.md, "a graphed call's host path"), more than launching that kernel. When every
node of a captured graph is a kernel that ember launched itself through ``cuLaunchKernel``
(Triton's and the CUDA C++ backend's launchers note their launches here while a capture
records), the step can instead launch those kernels again, in capture order, on the current
stream: the same functions, grids and argument values (copied when they were launched), into
the same memory the graph's pool keeps alive. The replay is what the graph would run, with a
cheaper start.

A graph with anything else in it (an ATen kernel, a copy or fill node, a launch on another
stream, a kernel Triton's own launcher started) is replayed as a graph: the recorded launches
must match the graph's nodes one for one (``matches``).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import cuda_backend  # (imports this module: its names are read at call time)

_SUCCESS, _INVALID_CONTEXT = 0, 201  # CUresult values
_KERNEL_NODE = 0                     # CU_GRAPH_NODE_TYPE_KERNEL


@dataclass(frozen=True)
class Launch:
    name: str
    function: int                  # the CUfunction's handle
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    stream: int                    # the cudaStream_t it was launched on
    argv: Any                      # the void*[] of the argument copies below
    arguments: tuple[Any, ...]     # ctypes copies of the argument values at the launch

    def signature(self) -> tuple[int, ...]:
        """What a graph's kernel node of this launch reports."""
        return (self.function, *self.grid, *self.block, self.shared)


class LaunchList:
    """The launches noted while a capture records, and their replay."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self._calls: list[tuple[Any, ...]] = []
        self._device = 0

    def note(self, name: str, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
             shared: int, stream: int, slots: list[Any]) -> None:
        # copies: the launcher's slots are refilled by its next launch
        arguments = tuple(type(s)(s.value) for s in slots)
        argv = (ctypes.c_void_p * max(1, len(arguments)))(*[ctypes.addressof(a) for a in arguments])
        self.launches.append(Launch(name, int(function), grid, block, shared, stream, argv, arguments))

    def matches(self, nodes: list[tuple[int, ...]] | None, stream: int) -> bool:
        """Whether the graph's nodes (``graph_kernel_nodes``) are exactly these launches, all made
        on the capture's ``stream`` (one stream: the graph is a chain in launch order)."""
        if nodes is None or len(nodes) != len(self.launches):
            return False
        if any(launch.stream != stream for launch in self.launches):
            return False
        return sorted(nodes) == sorted(launch.signature() for launch in self.launches)

    def prepare(self, device: int) -> None:
        """Bind the launches to ``device`` for ``replay`` (after ``matches`` said yes)."""
        self._device = device
        self._calls = [(launch.function, *launch.grid, *launch.block, launch.shared, ctypes.addressof(launch.argv),
                        launch.name) for launch in self.launches]

    def replay(self) -> None:
        """Launch the kernels again on the current stream, in capture order."""
        lib = _libcuda()
        stream = cuda_backend._current_stream(self._device)
        for fn, gx, gy, gz, bx, by, bz, shared, argv, name in self._calls:
            err = lib.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shared, stream, argv, None)
            if err == _INVALID_CONTEXT:  # a thread without a current context
                cuda_backend.make_context_current(self._device)
                err = lib.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shared, stream, argv, None)
            if err != _SUCCESS:
                raise RuntimeError(f"cuda_graph: launching {name} (grid {gx}x{gy}x{gz}) failed: CUresult {err}")

    def __len__(self) -> int:
        return len(self.launches)


_recording: list[LaunchList] = []


def recording_active() -> bool:
    """Whether a launcher should ``note`` its launches (one list test per launch otherwise)."""
    return bool(_recording)


def note(name: str, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int,
         stream: int, slots: list[Any]) -> None:
    """A launcher's launch, noted in every list that records (call only after it succeeded)."""
    for launches in _recording:
        launches.note(name, function, grid, block, shared, stream, slots)


@contextlib.contextmanager
def record() -> Iterator[LaunchList]:
    """Note every launch ember's launchers make inside (on any thread and stream)."""
    launches = LaunchList()
    _recording.append(launches)
    try:
        yield launches
    finally:
        _recording.remove(launches)


class _KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p),
                ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


def graph_kernel_nodes(raw_graph: int) -> list[tuple[int, ...]] | None:
    """(function, grid, block, shared memory) of each node of a CUDA graph (a ``cudaGraph_t``),
    or None if some node is not a kernel with a CUfunction, or the driver cannot say."""
    try:
        lib = _libcuda()
        count = ctypes.c_size_t(0)
        if lib.cuGraphGetNodes(raw_graph, None, ctypes.byref(count)) != _SUCCESS:
            return None
        nodes = (ctypes.c_void_p * max(1, count.value))()
        if lib.cuGraphGetNodes(raw_graph, nodes, ctypes.byref(count)) != _SUCCESS:
            return None
        out = []
        for node in nodes[:count.value]:
            kind = ctypes.c_int(-1)
            if lib.cuGraphNodeGetType(node, ctypes.byref(kind)) != _SUCCESS or kind.value != _KERNEL_NODE:
                return None
            p = _KernelNodeParams()
            if lib.cuGraphKernelNodeGetParams_v2(node, ctypes.byref(p)) != _SUCCESS or not p.func:
                return None
            out.append((p.func, p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY, p.blockDimZ,
                        p.sharedMemBytes))
        return out
    except (OSError, AttributeError):  # no driver library, or one without these calls
        return None


_lib: list[Any] = []


def _libcuda() -> Any:
    """The driver library, with the argument types of the calls made here."""
    if not _lib:
        lib = ctypes.CDLL("libcuda.so.1")
        ptr, uint = ctypes.c_void_p, ctypes.c_uint
        for name, args in (("cuLaunchKernel", [ptr, uint, uint, uint, uint, uint, uint, uint, ptr, ptr, ptr]),
                           ("cuGraphGetNodes", [ptr, ptr, ctypes.POINTER(ctypes.c_size_t)]),
                           ("cuGraphNodeGetType", [ptr, ctypes.POINTER(ctypes.c_int)]),
                           ("cuGraphKernelNodeGetParams_v2", [ptr, ctypes.POINTER(_KernelNodeParams)])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        _lib.append(lib)
    return _lib[0]
