"""``ember.cuda_graph``: a whole step captured in a CUDA graph once, replayed for every batch,
ragged batches of any total length included.

A compiled training step still costs the host hundreds of microseconds a call (Dynamo's frame,
AOTAutograd's wrappers, the autograd engine, the launches) where its kernels take tens. A CUDA
graph replays the step's kernels with one launch and none of that host work, but only with the
shapes and arguments it was captured with, and a ragged batch's total length T changes every
batch. ember's kernels read T from the offsets on the device (schedule/device_sizes.py), so a
step captured with buffers of C rows computes every batch of at most C rows exactly: the graph
is captured once per *capacity* C (by default the next 2^k + 1 at or above T) and replayed
after copying the batch into its static inputs.

    step = ember.cuda_graph(train_step)    # train_step(pred, targets: Ragged) -> loss
    for pred, targets in batches:
        loss = step(pred, targets)         # one graph launch; loss is overwritten by the next call

Arguments: tensors that require grad must be leaves passed again on every call (parameters): the
graph uses them in place. Their gradients follow eager's rules across captures and calls: after
a call, every parameter the step's backward reached (an argument, or a closure's, such as a
model's) has as ``.grad`` the buffer of the capture that ran, and a gradient set to None between
calls (an optimizer's ``zero_grad()``) starts from zero where the step adds to it. Other tensors
and ``Ragged`` values/offsets are copied into static buffers on the GPU; a tensor of a new
shape, a ``Ragged`` of a new batch size, or a T above every capacity so far captures again. A
``Ragged`` whose values require grad (a leaf) is copied in like any other; after each call its
``values.grad`` is the first T rows of the graph's gradient buffer (assigned, not accumulated;
overwritten by the next call). Tensors of T rows beside a ``Ragged`` (per-row targets, an
upstream gradient) must be passed as ``Ragged`` sharing its offsets tensor: such leaves get
buffers of one capacity. Arguments still on the CPU (a DataLoader's pinned batch,
``ragged.collate``'s packed buffer) are copied straight into those buffers, asynchronously from
pinned memory: no ``to_device`` first, and no second copy on the GPU. A ``Ragged`` whose offsets
precede its values in one host buffer (``collate`` of one ragged field) is one copy: its static
buffers keep that layout, so the batch's bytes up to its values' end land in place at once.
Arguments named in ``static_args`` (positions) are not copied: the graph reads them where they
are, as a hand-written capture reads its static inputs, so a call must pass the same tensors
(other ones capture again) and their contents are the step's inputs; a ``Ragged`` among them is
captured at its exact T. Non-tensor arguments must be hashable and are part of the capture key.
Outputs are the graph's static tensors, overwritten by the next call (clone what you keep).

Before each capture the step runs ``warmup`` times on the batch (side effects included, as in
any CUDA-graph warm-up), the last time under a check: a capacity replay is only right if nothing
takes T from the host. The check records the sizes each ember program takes from the host
(runtime/capture.py) and profiles the ATen calls outside ember programs; if any of them depends
on the ragged rows (or an output has a dimension of them), the step is captured at exactly this
batch's T instead, once per T, with one warning saying why. That checked run itself used the
capacity's rows: in a step with side effects beyond its outputs and gradients (an optimizer step
inside it), the warning also means that one run's update was computed over them. Graphs need a
CUDA device.
"""

from __future__ import annotations

import gc
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from .ragged import Ragged
from .runtime import capture
from .runtime import stats as stats_module
from .runtime.backend import BuildError
from .runtime.driver_copies import Copy, DriverCopies, tensor_copy

MIN_CAPACITY = 65
# arguments that are leaves of themselves: a call of only these skips pytree's flattening
_LEAF_TYPES = (torch.Tensor, Ragged, type(None), bool, int, float, str)
# ATen calls outside ember that may touch the ragged rows: views, allocations and copies keep
# every row where it was, so the rows past T stay apart from the batch's
_HARMLESS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::alias", "aten::detach",
    "aten::detach_", "aten::as_strided", "aten::slice", "aten::select", "aten::t", "aten::transpose",
    "aten::permute", "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::lift_fresh",
    "aten::resolve_conj", "aten::resolve_neg", "aten::copy_", "aten::clone", "aten::contiguous", "aten::to",
    "aten::_to_copy", "aten::unbind", "aten::split", "aten::narrow",
})


def capacity_for(total: int) -> int:
    """The smallest 2^k + 1 (at least ``MIN_CAPACITY``) holding ``total`` rows. Odd on purpose:
    the check finds tensors of the ragged rows by a dimension the capacity divides, and an odd
    capacity is rarely a model's own dimension."""
    # 2^k + 1 >= total: k is the bit length of total - 2 (MIN_CAPACITY is 2^6 + 1)
    return MIN_CAPACITY if total <= MIN_CAPACITY else (1 << (total - 2).bit_length()) + 1


@dataclass
class _Capture:
    graph: torch.cuda.CUDAGraph
    statics: list[Any]           # per leaf: the static tensor / Ragged passed to the step
    outputs: Any
    capacities: dict[int, int]   # ragged leaf index -> rows its static values hold
    # ragged leaf index -> (the GPU bytes its static offsets and values are views of, their host
    # layout, ``_packed_layout``): a batch laid out alike is copied in one piece
    packed: dict[int, tuple[torch.Tensor, tuple[int, int]]] = field(default_factory=dict)
    graded: list[int] = field(default_factory=list)  # ragged leaves whose values require grad
    # leaves copied into static buffers on each call (the others are read where they are)
    copied: list[int] = field(default_factory=list)
    # (parameter, the gradient buffer the graph writes): buffers the capture allocated (its
    # backward started from .grad = None; the graph overwrites them), and gradients that existed
    # before it and that it added to in place (``_grad_buffers``)
    assigned: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    accumulated: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class CudaGraphStep:
    """``fn`` captured per capacity and replayed (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], *, capacity: int | None = None, warmup: int = 2,
                 static_args: Sequence[int] = ()) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)):
            # (a TypeError, as warmup's: capacity="64" was a ValueError)
            raise TypeError(f"cuda_graph: capacity must be a positive int or None, got {capacity!r}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"cuda_graph: capacity must be a positive int or None, got {capacity!r}")
        if not callable(fn):
            raise TypeError(f"cuda_graph takes a function (a training step), got {type(fn).__name__} {fn!r:.80}")
        if isinstance(warmup, bool) or not isinstance(warmup, int):
            raise TypeError(f"cuda_graph: warmup must be an int, got {warmup!r}")
        if warmup < 1:
            raise ValueError(f"cuda_graph: warmup must be at least 1 (the check runs in it), got {warmup}")
        if isinstance(static_args, (str, bytes)) or not isinstance(static_args, (list, tuple, set, frozenset, range)):
            raise TypeError(f"cuda_graph: static_args must be a sequence of argument positions, got {static_args!r}")
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in static_args):
            raise ValueError(f"cuda_graph: static_args must be positions of arguments, got {static_args!r}")
        self.fn = fn
        self.capacity = capacity
        self.warmup = warmup
        self.static_args = frozenset(static_args)
        self._last_static = max(self.static_args, default=-1)
        self.captures: dict[Any, _Capture] = {}
        self.exact_reason: str | None = None   # why T is captured exactly, once the check said so
        self.replays = 0
        self._pool = None
        # warm-ups and captures share one stream: what a program allocates for a stream on its
        # first launch (Triton's reduction counters) then exists before the capture, instead of
        # being captured as a fill that every replay runs again
        self._stream: torch.cuda.Stream | None = None
        self._copier: DriverCopies | None = None  # copies into the static buffers (the driver)
        self._repeat: _Repeat | None = None

    # ---- keys -----------------------------------------------------------------------------
    def _in_place(self, args: tuple[Any, ...], fast: bool) -> frozenset[int]:
        """Leaf positions of the arguments named in ``static_args``."""
        if not self.static_args:
            return frozenset()
        if self._last_static >= len(args):
            raise ValueError(f"cuda_graph: static_args names argument {self._last_static}, but the step "
                             f"got {len(args)} positional argument(s)")
        if fast:  # one leaf per argument
            return self.static_args
        out, start = set(), 0
        for i, arg in enumerate(args):
            n = len(pytree.tree_leaves(arg, is_leaf=lambda x: isinstance(x, Ragged)))
            if i in self.static_args:
                out.update(range(start, start + n))
            start += n
        return frozenset(out)

    def _capacities(self, leaves: list[Any], in_place: frozenset[int] = frozenset()) -> dict[int, int]:
        """Rows for each ragged leaf: a capacity (distinct per leaf, so that the check can tell
        them apart; one for leaves sharing one offsets tensor, whose rows go together), or
        exactly T once the check found that capacities are not safe."""
        out: dict[int, int] = {}
        by_offsets: dict[int, int] = {}
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, Ragged) or i in in_place:
                continue
            offsets = id(leaf.offsets)
            shared = by_offsets.get(offsets)
            if shared is not None:
                out[i] = out[shared]
                continue
            by_offsets[offsets] = i
            total = leaf.values.shape[0]
            if self.exact_reason is not None:
                out[i] = total
                continue
            if self.capacity is not None:
                if total > self.capacity:
                    raise ValueError(f"cuda_graph: a ragged argument has {total} rows, more than the "
                                     f"capacity {self.capacity}")
                c = self.capacity
            else:
                c = capacity_for(total)
            while out and c in out.values():
                c = 2 * c - 1
            out[i] = c
        return out

    def _key(self, leaves: list[Any], spec: Any, capacities: dict[int, int],
             in_place: frozenset[int] = frozenset()) -> Any:
        key: list[Any] = [spec if isinstance(spec, int) else str(spec)]  # a str hashes faster
        for i, leaf in enumerate(leaves):
            if i in in_place and isinstance(leaf, (Ragged, torch.Tensor)):  # read where it is
                # flat tuples, no generator: every call of a graphed step builds this key
                if isinstance(leaf, Ragged):
                    v, o = leaf.values, leaf.offsets
                    key.append(("in place", id(v), v.data_ptr(), v.shape, v.stride(), v.dtype,
                                id(o), o.data_ptr(), o.shape, o.stride(), o.dtype))
                else:
                    key.append(("in place", id(leaf), leaf.data_ptr(), leaf.shape, leaf.stride(), leaf.dtype))
            elif isinstance(leaf, Ragged):
                values, offsets = leaf.values, leaf.offsets
                grad = values.requires_grad
                if grad and not values.is_leaf:
                    raise ValueError("cuda_graph: ragged values require grad but are not a leaf; the "
                                     "graph cannot reach what they were computed from")
                # exact captures see the batch's max_length; capacity ones the capacity
                longest = leaf.max_length if self.exact_reason is not None else None
                shape = values.shape  # T varies; the rest, a torch.Size (a tuple), is part of the key
                # the device as its index: ``.device`` builds a torch.device object every call
                key.append(("ragged", capacities[i], longest, offsets.shape[0], shape[1:],
                            values.dtype, offsets.dtype, values.get_device(), grad))
            elif isinstance(leaf, torch.Tensor):
                if leaf.requires_grad:
                    if not leaf.is_leaf:
                        raise ValueError("cuda_graph: a tensor argument requires grad but is not a leaf; "
                                         "the graph cannot reach what it was computed from")
                    key.append(("leaf", id(leaf)))
                else:
                    key.append(("tensor", leaf.shape, leaf.stride(), leaf.dtype, leaf.get_device()))
            else:
                try:
                    hash(leaf)
                except TypeError:
                    raise TypeError(f"cuda_graph: argument of type {type(leaf).__name__} is not a tensor, "
                                    "a Ragged or hashable") from None
                key.append(("const", leaf))
        return tuple(key)

    # ---- calls ----------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        repeat = self._repeat
        if repeat is not None and not kwargs and repeat.matches(args):  # the last call's arguments again
            return self._run(repeat.entry, list(args))
        fast = not kwargs
        for a in args:  # a loop, not all() of a generator: host time of every call
            if not isinstance(a, _LEAF_TYPES):
                fast = False
                break
        if fast:  # the common case, without pytree's cost (10-20 µs of a call's host time)
            leaves, spec = list(args), len(args)
        else:
            leaves, spec = pytree.tree_flatten((args, kwargs), is_leaf=lambda x: isinstance(x, Ragged))
        in_place = self._in_place(args, fast)
        capacities = self._capacities(leaves, in_place)
        key = self._key(leaves, spec, capacities, in_place)
        entry = self.captures.get(key)
        if entry is None:
            # the parameters, and which had no gradient before the warm-ups (runs of the step) gave them one
            params = _grad_leaves()
            unset = {id(t) for t in params if t.grad is None}
            entry = self._capture(leaves, spec, capacities, in_place, params, unset)
            if entry is None:  # the check turned capacities off: capture this T exactly
                capacities = self._capacities(leaves, in_place)
                key = self._key(leaves, spec, capacities, in_place)
                entry = self.captures.get(key) or self._capture(leaves, spec, capacities, in_place, params, unset)
            self.captures[key] = entry
        # nothing to copy in and one leaf per argument: the next call with these same arguments
        # needs no key (a loop over fixed buffers, static_args)
        self._repeat = _Repeat(args, entry) if fast and not entry.copied and not entry.graded else None
        return self._run(entry, leaves)

    def _run(self, entry: _Capture, leaves: list[Any]) -> Any:
        """Copy the call's arguments in, replay ``entry``, hand on the gradients."""
        if entry.copied:
            _copy_in(entry, leaves, self._copier)
        for param, buffer in entry.accumulated:  # the graph adds to ``buffer``: make it .grad
            grad = param.grad
            if grad is not buffer:  # set to None (or replaced) since the last call
                with torch.no_grad():
                    if grad is None:
                        buffer.zero_()
                    else:
                        buffer.copy_(grad)
                param.grad = buffer
        entry.graph.replay()
        self.replays += 1
        for param, buffer in entry.assigned:  # another capture's call, or zero_grad(), left another
            if param.grad is not buffer:
                param.grad = buffer
        for i in entry.graded:  # the gradient of ragged values: the first T rows of the graph's
            leaf, static = leaves[i], entry.statics[i].values
            if static.grad is not None:
                leaf.values.grad = static.grad[:leaf.total_length]
        return entry.outputs

    def _capture(self, leaves: list[Any], spec: Any, capacities: dict[int, int],
                 in_place: frozenset[int] = frozenset(), params: Sequence[torch.Tensor] = (),
                 unset: frozenset[int] | set[int] = frozenset()) -> _Capture | None:
        if not torch.cuda.is_available():
            raise RuntimeError("cuda_graph: CUDA graphs need a CUDA device")
        device = _device_of(leaves)
        entry = _Capture(torch.cuda.CUDAGraph(), [], None, capacities)
        for i, leaf in enumerate(leaves):
            if i in in_place:
                if isinstance(leaf, (torch.Tensor, Ragged)) and not (leaf.values if isinstance(leaf, Ragged)
                                                                     else leaf).is_cuda:
                    raise ValueError("cuda_graph: an argument in static_args must be on the GPU already")
                entry.statics.append(leaf)  # the graph reads it where it is
                continue
            static, packed = _static(leaf, capacities.get(i), self.exact_reason is not None, device)
            entry.statics.append(static)
            if static is not leaf:
                entry.copied.append(i)
            if packed is not None:
                entry.packed[i] = packed
            if isinstance(leaf, Ragged) and leaf.values.requires_grad:
                static.values.requires_grad_()  # a leaf of the graph, whose gradient the call hands on
                entry.graded.append(i)
        statics = entry.statics
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
            try:
                self._copier = DriverCopies(device)
            except BuildError:  # no driver library to load: PyTorch's copy_ it is
                self._copier = None
        _copy_in(entry, leaves, self._copier)
        call_args, call_kwargs = (tuple(statics), {}) if isinstance(spec, int) else pytree.tree_unflatten(statics, spec)
        side = self._stream
        side.wait_stream(torch.cuda.current_stream())
        graded = [statics[i].values for i in entry.graded]

        def fresh() -> None:  # a call's ragged values are new leaves: no gradient to add to
            for values in graded:
                values.grad = None

        with torch.cuda.stream(side), capture.totals_on_device():
            for _ in range(self.warmup - 1):
                fresh()
                self.fn(*call_args, **call_kwargs)
            fresh()
            reason = self._checked_run(call_args, call_kwargs, capacities)
        torch.cuda.current_stream().wait_stream(side)
        if reason is not None and self.exact_reason is None:
            self.exact_reason = reason
            warnings.warn(f"ember.cuda_graph: {reason}; the step is captured at each batch's exact "
                          "total length instead (one capture per length)", stacklevel=3)
            return None
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        before = [(t, t.grad, None if t.grad is None else t.grad._version) for t in params]
        fresh()  # the capture's backward allocates the gradient buffer each replay overwrites
        with torch.cuda.graph(entry.graph, pool=self._pool, stream=side), capture.totals_on_device():
            entry.outputs = self.fn(*call_args, **call_kwargs)
        entry.assigned, entry.accumulated = _grad_buffers(before)
        with torch.no_grad():
            for param, buffer in entry.accumulated:
                if id(param) in unset:  # this call's backward starts from None, as in eager: the
                    buffer.zero_()      # warm-ups' gradients are not part of it
        return entry

    def _checked_run(self, args: tuple[Any, ...], kwargs: dict[str, Any], capacities: dict[int, int]) -> str | None:
        """Run the step once under the check; why a capacity replay would be wrong, or None."""
        if not capacities or self.exact_reason is not None:
            self.fn(*args, **kwargs)
            return None
        before = stats_module.snapshot()
        with capture.check_programs() as check, torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            outputs = self.fn(*args, **kwargs)
        after = stats_module.snapshot()
        caps = sorted(set(capacities.values()))
        if any(after[k] > before[k] for k in ("build_failures", "graph_fallbacks")):
            return "a kernel or graph ran through ATen while the step was checked"
        for run in check.runs:
            if run.opaque:
                return f"{run.program} takes a size from the host that the check cannot read"
            for symbol, value in run.host_sizes.items():
                if _divides(caps, value):
                    return f"{run.program} takes the ragged total length ({symbol} = {value}) from the host"
        for event in prof.events():
            if event.name in _HARMLESS or not event.name.startswith("aten::") or _inside_ember(event):
                continue
            if any(isinstance(s, (list, tuple)) and any(_divides(caps, d) for d in s if isinstance(d, int))
                   for s in event.input_shapes or ()):
                return f"{event.name} runs outside ember over the ragged rows"
        for out in pytree.tree_leaves(outputs):
            if isinstance(out, torch.Tensor) and any(_divides(caps, d) for d in out.shape):
                return f"an output of shape {tuple(out.shape)} has a dimension of the ragged rows"
        return None


def cuda_graph(fn: Callable[..., Any] | None = None, *, capacity: int | None = None, warmup: int = 2,
               static_args: Sequence[int] = ()) -> Any:
    """``fn`` (typically a whole training step around ember-compiled code) captured in CUDA graphs
    and replayed; usable as a decorator. See the docstring of ``ember.cudagraphs``."""
    if fn is None:
        return lambda f: CudaGraphStep(f, capacity=capacity, warmup=warmup, static_args=static_args)
    return CudaGraphStep(fn, capacity=capacity, warmup=warmup, static_args=static_args)


class _Repeat:
    """A call's arguments, when none is copied into the capture (in-place arguments, parameters,
    constants): a later call of the very same objects, whose tensors keep their storage and
    layout, has the same key. Checking that costs a fraction of building the key."""

    def __init__(self, args: tuple[Any, ...], entry: _Capture):
        self.args = args
        self.entry = entry
        # the tensors the key reads (a Ragged's parts as they are now), with their layout
        self.tensors = [(t, _layout(t)) for a in args if isinstance(a, (torch.Tensor, Ragged))
                        for t in ((a,) if isinstance(a, torch.Tensor) else (a.values, a.offsets))]
        self.ragged = [(a, a.values, a.offsets) for a in args if isinstance(a, Ragged)]

    def matches(self, args: tuple[Any, ...]) -> bool:
        mine = self.args
        if len(args) != len(mine):
            return False
        for a, b in zip(args, mine):
            if a is not b:
                return False
        for r, values, offsets in self.ragged:
            if r.values is not values or r.offsets is not offsets:
                return False
        for t, layout in self.tensors:
            if _layout(t) != layout:
                return False
        return True


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return t.data_ptr(), t.shape, t.stride()


def _grad_leaves() -> list[torch.Tensor]:
    """Every leaf tensor of the process that requires grad: the step's parameters among them,
    passed as arguments or read from a closure (a model's). A scan of the garbage collector's
    objects, once per capture (tens of ms)."""
    return [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.requires_grad and o.is_leaf]


def _grad_buffers(before: list[tuple[torch.Tensor, torch.Tensor | None, int | None]]
                  ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """From (parameter, its .grad, that gradient's version) before a capture: (parameters whose
    gradient the capture allocated, with it; parameters whose existing gradient it changed in
    place, with it). Parameters the step did not touch are in neither."""
    assigned, accumulated = [], []
    for param, grad, version in before:
        now = param.grad
        if now is not None and now is not grad:
            assigned.append((param, now))
        elif now is not None and now._version != version:
            accumulated.append((param, now))
    return assigned, accumulated


def _divides(capacities: list[int], value: int) -> bool:
    return value > 0 and any(value % c == 0 for c in capacities)


def _inside_ember(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(capture.RANGE_PREFIX):
            return True
        parent = parent.cpu_parent
    return False


def _device_of(leaves: list[Any]) -> torch.device:
    """The GPU the step runs on: that of its first GPU argument, else the current one."""
    for leaf in leaves:
        t = leaf.values if isinstance(leaf, Ragged) else leaf
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return t.device
    return torch.device("cuda", torch.cuda.current_device())


def _packed_layout(leaf: Ragged) -> tuple[int, int] | None:
    """(byte offset of the offsets, of the values) in the one host buffer both are views of, when
    the offsets come first (``collate``'s layout): the bytes up to the values' end then hold
    the whole batch, and grow only at their end with T (with one ragged field: the place of
    another field's values moves with that field's T, and such a batch takes two copies). None
    for any other layout."""
    values, offsets = leaf.values, leaf.offsets
    # every call copies through here: cheap tensor attributes only (``device.type`` builds a
    # device object, several times the cost of ``is_cpu``)
    if not (values.is_cpu and offsets.is_cpu and values.is_contiguous() and offsets.is_contiguous()):
        return None
    base = values.untyped_storage().data_ptr()
    if offsets.untyped_storage().data_ptr() != base:
        return None
    start = offsets.data_ptr() - base
    values_start = values.data_ptr() - base
    if start + offsets.nbytes > values_start:
        return None
    return start, values_start


def _static(leaf: Any, rows: int | None, exact: bool,
            device: torch.device) -> tuple[Any, tuple[torch.Tensor, tuple[int, int]] | None]:
    """The static counterpart of one argument, on the GPU (parameters and constants are used as
    they are), and for a packed ``Ragged`` the GPU bytes its static offsets and values view."""
    if isinstance(leaf, Ragged):
        # capacity: the host sees ``rows`` rows (grids, buffers), the kernels the offsets' T
        longest = leaf.max_length if exact else max(rows, leaf.max_length)
        shape = (rows, *leaf.feature_shape)
        layout = _packed_layout(leaf)
        if layout is None:
            values = leaf.values.new_zeros(shape, device=device)
            offsets = torch.empty_like(leaf.offsets, device=device)
            return Ragged._make(values, offsets, longest), None
        start, values_start = layout
        packed = torch.zeros(values_start + math.prod(shape) * leaf.values.element_size(), dtype=torch.uint8,
                             device=device)
        offsets = packed[start:start + leaf.offsets.numel() * leaf.offsets.element_size()].view(leaf.offsets.dtype)
        values = packed[values_start:].view(leaf.dtype).view(shape)
        return Ragged._make(values, offsets, longest), (packed, layout)
    if isinstance(leaf, torch.Tensor) and not leaf.requires_grad:
        return torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype,
                                   device=device if leaf.device.type == "cpu" else leaf.device), None
    return leaf, None


def _copy_in(entry: _Capture, leaves: list[Any], copier: DriverCopies | None = None) -> None:
    """Copy the call's arguments into the capture's static buffers: through the driver when
    there is a ``copier`` and the bytes are dense alike (one copy of a packed batch), else with
    ``copy_`` (under no_grad: static ragged values may be leaves that require grad; a decorator
    would cost every call the grad-mode switch)."""
    copies: list[Copy] = []
    host: list[torch.Tensor] = []
    for i in entry.copied:
        static, leaf = entry.statics[i], leaves[i]
        packed, layout = entry.packed.get(i, (None, None))
        if packed is not None and _packed_layout(leaf) == layout:  # offsets and values at once
            start, values_start = layout
            end = values_start + leaf.values.nbytes
            if copier is not None:
                copies.append((packed.data_ptr() + start, leaf.offsets.data_ptr(), end - start, True))
                host.append(leaf.offsets)  # a view of the whole buffer: it keeps the values alive too
            else:
                source = leaf.offsets.view(torch.uint8).as_strided((end - start,), (1,), start)
                with torch.no_grad():
                    packed[start:end].copy_(source, non_blocking=True)
            continue
        if isinstance(leaf, Ragged):  # the values fill the static's first T rows
            pairs = [(static.values, leaf.values), (static.offsets, leaf.offsets)]
        elif isinstance(leaf, torch.Tensor):
            pairs = [(static, leaf)]
        else:
            continue
        for dst, src in pairs:
            raw = tensor_copy(dst, src) if copier is not None else None
            if raw is None:
                with torch.no_grad():
                    (dst.narrow(0, 0, src.shape[0]) if dst.shape != src.shape else dst).copy_(src, non_blocking=True)
                continue
            copies.append(raw)
            if src.device.type == "cpu":
                host.append(src)
    if copier is not None and copies:
        copier.copy(copies, host)
