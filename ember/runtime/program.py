"""A compiled graph at run time: the generated wrapper, bound to built kernels.

Kernels are ctypes functions over raw pointers. A kernel group whose build failed runs through
ATen instead (``group_fallback``), so a compiler problem never breaks the user's program.
"""

from __future__ import annotations

import ctypes
import linecache
import math
import struct
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..analysis.reference import eval_node, evaluate
from ..codegen.cpp import MAX_CTYPES_ARGUMENTS
from ..config import Config, log
from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Graph, Node
from ..ir.ops import Op
from ..schedule.steps import KernelStep, Schedule
from . import capture

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_HUGEPAGE = 14
_HUGE = 2 << 20


def _fast_allocators() -> dict[str, Callable[..., torch.Tensor]]:
    """(shape, strides, dtype) -> tensor, through Dynamo's C helpers where this torch has them
    (they skip the argument parsing of torch.empty_strided, a few microseconds per buffer)."""
    try:
        from torch._C._dynamo.guards import _empty_strided_cpu, _empty_strided_cuda
        return {"empty_cpu": _empty_strided_cpu, "empty_cuda": _empty_strided_cuda}
    except ImportError:
        return {"empty_cpu": lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype),
                "empty_cuda": lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype,
                                                                               device="cuda")}


def make_advise_huge(cfg: Config) -> Callable[[torch.Tensor], torch.Tensor]:
    """Fresh large CPU buffers fault in page by page; ask for 2 MB pages before the kernel
    writes them (a fresh 64 MB output costs ~16k page faults otherwise)."""
    threshold = cfg.huge_page_bytes

    def advise(t: torch.Tensor) -> torch.Tensor:
        nbytes = t.numel() * t.element_size()
        if threshold and nbytes >= threshold and sys.platform == "linux":
            start = (t.data_ptr() + _HUGE - 1) & ~(_HUGE - 1)
            end = (t.data_ptr() + nbytes) & ~(_HUGE - 1)
            if end > start:
                _libc.madvise(start, end - start, _MADV_HUGEPAGE)
        return t

    return advise


def bind_kernel(lib: ctypes.CDLL, name: str, n_pointers: int, float_sizes: list[bool],
                error_flag: bool) -> Callable[..., None]:
    """A kernel of the CPU library: pointers, then its sizes (int64, or double for the floats a
    program reads from the data), then the error flag if it raises. Past ctypes' 1024 arguments,
    its entry taking them in one array of 64-bit words (codegen/cpp.py: packed_entry)."""
    if n_pointers + len(float_sizes) + error_flag > MAX_CTYPES_ARGUMENTS:
        return _packed_call(lib[f"{name}_packed"], n_pointers, float_sizes)
    fn = lib[name]
    fn.argtypes = [ctypes.c_void_p] * n_pointers + [ctypes.c_double if f else ctypes.c_int64 for f in float_sizes] + (
        [ctypes.c_void_p] if error_flag else [])
    fn.restype = None
    return fn


def _packed_call(fn: Any, n_pointers: int, float_sizes: list[bool]) -> Callable[..., None]:
    fn.argtypes, fn.restype = [ctypes.c_void_p], None
    floats = [n_pointers + i for i, f in enumerate(float_sizes) if f]

    def call(*args: Any) -> None:
        words = [a or 0 for a in args]  # (an address of None: a tensor with no elements)
        for i in floats:
            words[i] = struct.unpack("<q", struct.pack("<d", args[i]))[0]
        fn((ctypes.c_int64 * len(words))(*words))

    return call


def group_fallback(step: KernelStep, schedule: Schedule) -> Callable[..., None]:
    """Run a kernel group's IR nodes through ATen, with the kernel's own arguments (its parameter
    tensors in order, then its size symbols), writing its outputs in place."""
    by_name = {info.name: node for node, info in schedule.buffers.items()}
    kernel = step.kernel
    n_params = len(kernel.params)

    def run(*args: Any) -> None:
        tensors, sizes = args[:n_params], args[n_params:n_params + len(kernel.sizes)]
        bound = dict(zip(kernel.sizes, sizes))
        env: dict[Node, Any] = {by_name[p.name]: t for p, t in zip(kernel.params, tensors) if not p.is_output}
        for p, out in zip(kernel.params, tensors):
            node = by_name[p.name]
            if p.is_output and node.op is Op.INDEX_PUT:
                env[node.inputs[0]] = out.clone()  # the wrapper filled it with the tensor written into

        def value(node: Node) -> Any:
            if node not in env and node.shape and sh.numel(node.shape) == 0:
                # nothing to compute in a value of no elements; and the kernel loads no buffer or
                # input of none (schedule/build.py), so they are no parameters of it
                env[node] = torch.empty([evaluate(d, bound) for d in node.shape], dtype=dt.to_torch(node.dtype),
                                        device=node.device)
            if node not in env:
                env[node] = eval_node(node, [value(i) for i in node.inputs], bound)
            return env[node]

        # every output is computed before any is written: an output may be written over an input
        # (codegen/wrapper.py), and its values may be views of that input
        results = [(out, value(by_name[p.name])) for p, out in zip(kernel.params, tensors) if p.is_output]
        inputs = {t.untyped_storage().data_ptr() for p, t in zip(kernel.params, tensors)
                  if not p.is_output and isinstance(t, torch.Tensor)}
        if any(out.untyped_storage().data_ptr() in inputs for out, _ in results):
            results = [(out, r.clone() if isinstance(r, torch.Tensor) else r) for out, r in results]
        for out, result in results:
            out.copy_(result)

    return run


def relayout(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``t``'s values in a tensor of the given strides (a backward's input laid out otherwise
    than the graph was traced with, codegen/wrapper.py)."""
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def as_traced(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``t``, an ATen result the program returns, or its values laid out with the strides the
    graph was traced with where ATen laid it out otherwise: a clone or ``.contiguous()`` of it is
    no op in ember's IR (``conv2d(x).contiguous()`` of a channels_last ``x`` came back
    channels_last, and the user's ``.view(n, -1)`` raised where eager's did not). Dims of size 1
    may have any stride; nothing is stored in an empty tensor."""
    if t.layout != torch.strided or t.stride() == strides:  # (the common case, checked first: a
        return t                                             # training step makes 80 such calls)
    if t.numel() == 0 or all(a == b or n == 1 for a, b, n in zip(t.stride(), strides, t.shape)):
        return t
    return relayout(t, strides)


def as_own(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``as_traced(t, strides)``, and a copy too where ``t`` views only part of its memory: an
    output eager returns in memory of its own that ember's program returns as a view of an ATen
    result or a kernel's buffer (``(x @ w)[:1].clone()``, ``x.cumsum(0)[-1].clone()``: the clone
    is no op in ember's IR) kept that whole buffer alive as long as the user held the result (a
    row of a 512 x 512 product kept 1 MB), and began at another storage offset than eager's."""
    out = as_traced(t, strides)
    if out is t and t.layout == torch.strided and (t.storage_offset() != 0
                                                   or t.untyped_storage().nbytes() > _extent(t)):
        return relayout(t, strides)
    return out


def view_in(own: torch.Tensor, whole: torch.Tensor, view: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``view``, a view of the memory ``whole`` views all of, as the same elements of ``own``
    (``whole``'s values in memory of their own, laid out as eager returns it), with eager's
    ``strides``: outputs that eager returns as views of one fresh result share its copy, at
    eager's strides and offsets (codegen/outputs.py). Where ``view``'s first element is not one
    of ``whole``'s, it comes back as a copy of its own: its values, not the shared memory."""
    if view.numel() == 0:
        return own.as_strided(view.shape, strides, own.storage_offset())
    left, index = view.storage_offset() - whole.storage_offset(), [0] * whole.dim()
    # (whole is a chain of views of dense memory: each dim's stride exceeds all that the dims of
    # smaller strides span, so the greedy quotients are the element's index)
    for d in sorted((d for d in range(whole.dim()) if whole.shape[d] > 1), key=lambda d: -whole.stride(d)):
        if whole.stride(d) > 0:
            index[d] = min(max(left // whole.stride(d), 0), whole.shape[d] - 1)
            left -= index[d] * whole.stride(d)
    if left != 0:
        return relayout(view, strides)
    offset = sum(i * st for i, st in zip(index, own.stride()))
    return own.as_strided(view.shape, strides, own.storage_offset() + offset)


def _extent(t: torch.Tensor) -> int:
    """The bytes from ``t``'s first element to its last, inclusive (0 when empty)."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))) * t.element_size()


def boxed(fn: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """``fn(*args)`` in AOTAutograd's boxed convention (for graphs that run through ATen)."""

    def call(args: list[Any]) -> Any:
        return fn(*args)

    call._boxed_call = True
    return call


_functorch = torch._C._functorch


def tangent_positions(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Where a backward graph takes its incoming gradients (AOTAutograd's ``tangents_*``, after
    the saved values); every position where it names none."""
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    return tuple(i for i, name in enumerate(names) if name.startswith("tangents")) or tuple(range(len(names)))


def eager_for_batched_calls(program: Any, load_eager: Callable[[], Callable[[list[Any]], Any]],
                            tangents: tuple[int, ...]) -> None:
    """Make ``program`` (a backward's CompiledProgram or TimedChoice) run its ATen graph (in the
    boxed convention, from ``load_eager()`` at the first such call) when an incoming gradient
    (at ``tangents``) is a batched tensor of torch's own vmap. Autograd calls a backward so under
    ``autograd.grad(..., is_grads_batched=True)`` and ``autograd.functional.jacobian(...,
    vectorize=True)``: the gradients have no memory a kernel could read ("Cannot access data
    pointer of Tensor that doesn't have storage"), where ATen's ops batch them as in eager (and
    as ``aot_eager``). (``torch.func.vmap`` over a compiled backward is refused by AOTAutograd
    before it gets here.) Only the gradients are looked at, in backward calls only: a step's
    host time pays a check or two, not one per saved value."""
    inner = program.run
    eager: list[Callable[[list[Any]], Any]] = []

    def run(args: list[Any]) -> Any:
        for i in tangents:
            a = args[i]
            if isinstance(a, torch.Tensor) and _functorch.is_legacy_batchedtensor(a):
                if not eager:
                    eager.append(load_eager())
                return eager[0](args)
        return inner(args)

    program.run = run


_THREAD = threading.local()


def thread_error_flag() -> int:
    """The address of this thread's error flag, which CPU kernels set on a bad index or an
    integer division by zero. One per thread: kernels release the GIL, so calls of one program
    from two threads run at once, and one shared flag gave one thread's error to the other."""
    address = getattr(_THREAD, "address", None)
    if address is None:
        _THREAD.flag = ctypes.c_int32(0)
        address = _THREAD.address = ctypes.addressof(_THREAD.flag)
    return address


def _raise_error_code(code: int) -> None:
    """Raise the error a kernel flagged (0: none), as eager raises it."""
    if code == 1:
        raise RuntimeError("ZeroDivisionError")
    code &= 0xFF  # (an index check's place in the kernel sits above its code: c_prelude.py)
    if code in _INDEX_ERRORS:
        kind, message = _INDEX_ERRORS[code]
        raise kind(message)


# codes kernels flag for a bad index (schedule/build.py: ``indirect``), with eager's exception type
_INDEX_ERRORS = {
    2: (RuntimeError, "gather: index out of bounds (an index is negative or not smaller than the size of the "
                      "dimension it indexes)"),
    3: (IndexError, "index: index out of bounds (an index is below minus the size of the dimension it indexes, "
                    "or not smaller than that size)"),
    4: (RuntimeError, "index_add/scatter_add: index out of bounds (an index is negative or not smaller than the "
                      "size of the dimension it indexes)"),
    5: (IndexError, "nll_loss / cross_entropy: a target is out of bounds (negative and not ignore_index, or not "
                    "smaller than the number of classes)"),
    6: (RuntimeError, "scatter: index out of bounds (an index is negative or not smaller than the size of the "
                      "dimension it indexes)"),
    7: (IndexError, "index_add: index out of range in self (an index is negative or not smaller than the size of "
                    "the dimension it indexes)"),
    8: (IndexError, "embedding: index out of range in self (an index is negative or not smaller than the number "
                    "of rows of the weight)"),
    9: (IndexError, "index_select: index out of range in self (an index is negative or not smaller than the size "
                    "of the dimension it indexes)"),
    10: (IndexError, "index_copy: index out of bounds (an index is negative or not smaller than the size of the "
                     "dimension it indexes)"),
    11: (RuntimeError, "index_select: INDICES element is out of DATA bounds (an index along dim 1 is negative "
                       "or not smaller than its size)"),
    12: (IndexError, "put: index out of range (an index is below minus the number of elements of self, or not "
                     "smaller than it)"),
}


class CompiledProgram:
    """Callable with AOTAutograd's boxed convention (takes the argument list, may clear it)."""

    def __init__(self, name: str, source: str, namespace: dict[str, Any], cfg: Config,
                 cuda_device: int | None = None, host_sizes: dict[int, str] | None = None,
                 opaque_sizes: bool = False):
        # An instance attribute, not a class one: Dynamo wraps backward programs with
        # functools.wraps, which copies only the instance __dict__.
        self._boxed_call = True
        self.name = name
        self.source = source
        self.timings: dict[str, list[float]] = {}
        # (IR graph, schedule) this program was built from, set by the driver where the plan may
        # be cached (torch's AOTAutograd cache stores it, frontend/aot_cache.py)
        self.plan: tuple[Graph, Schedule] | None = None
        # size inputs (index -> symbol) whose host value a result depends on (runtime/capture.py)
        self.host_sizes = host_sizes or {}
        self.opaque_sizes = opaque_sizes

        def check_error_flag(address: int) -> None:
            flag = ctypes.c_int32.from_address(address)
            code, flag.value = flag.value, 0
            _raise_error_code(code)

        def timed(kernel: str, fn: Callable[[], None]) -> None:
            start = time.perf_counter()
            fn()
            ms = (time.perf_counter() - start) * 1e3
            self.timings.setdefault(kernel, []).append(ms)
            log(4, f"{name}: {kernel} {ms:.3f} ms", cfg)

        ns = {"torch": torch, "math": math, "warnings": warnings, **_fast_allocators(),
              "advise_huge": make_advise_huge(cfg), "relayout": relayout, "as_traced": as_traced,
              "as_own": as_own, "view_in": view_in,
              "in_graphed_step": capture.in_graphed_step, "thread_error_flag": thread_error_flag,
              "check_error_flag": check_error_flag, "timed": timed, **namespace}
        filename = f"<ember wrapper {name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), ns)
        self._call = ns["call"]
        # (the source, for tracebacks, only while the program lives: each compile's name is
        # new, and every recompile or torch._dynamo.reset() left another copy in linecache)
        weakref.finalize(self._call, linecache.cache.pop, filename, None)
        # The program allocates and launches on the current device, as Inductor's does: a graph
        # on another GPU than the current one runs with that GPU made current.
        self.cuda_device = cuda_device
        self.run: Callable[[list[Any]], tuple[Any, ...]] = self._call if cuda_device is None else self._on_device

    def _on_device(self, args: list[Any]) -> tuple[Any, ...]:
        if _current_cuda_device() != self.cuda_device:
            with torch.cuda.device(self.cuda_device):
                return self._call(args)
        return self._call(args)

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        # AOTAutograd calls boxed (one list it lets us clear) or, on some paths, with the
        # arguments spread out; graph inputs are never lists, so the two cannot be confused.
        args_list = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
        if capture.active:  # ember.cuda_graph's check: which sizes come from the host
            capture.record(self.name, args_list, self.host_sizes, self.opaque_sizes)
            with torch.profiler.record_function(f"{capture.RANGE_PREFIX}{self.name}"):
                return self.run(args_list)
        return self.run(args_list)


# the current CUDA device without building a torch.device (what Inductor's generated code reads)
_current_cuda_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
