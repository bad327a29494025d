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

Arguments: tensors that require grad must be leaves passed again on every call (parameters):
the graph uses them in place. Other tensors and ``Ragged`` values/offsets are copied into static
buffers; a tensor of a new shape, a ``Ragged`` of a new batch size, or a T above every capacity
so far captures again. Non-tensor arguments must be hashable and are part of the capture key.
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

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from .ragged import Ragged
from .runtime import capture
from .runtime import stats as stats_module

MIN_CAPACITY = 65
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
    capacity = MIN_CAPACITY
    while capacity < total:
        capacity = 2 * capacity - 1
    return capacity


@dataclass
class _Capture:
    graph: torch.cuda.CUDAGraph
    statics: list[Any]           # per leaf: the static tensor / Ragged passed to the step
    outputs: Any
    capacities: dict[int, int]   # ragged leaf index -> rows its static values hold


class CudaGraphStep:
    """``fn`` captured per capacity and replayed (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], *, capacity: int | None = None, warmup: int = 2) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"cuda_graph: capacity must be a positive int or None, got {capacity!r}")
        if warmup < 1:
            raise ValueError(f"cuda_graph: warmup must be at least 1 (the check runs in it), got {warmup}")
        self.fn = fn
        self.capacity = capacity
        self.warmup = warmup
        self.captures: dict[Any, _Capture] = {}
        self.exact_reason: str | None = None   # why T is captured exactly, once the check said so
        self.replays = 0
        self._pool = None

    # ---- keys -----------------------------------------------------------------------------
    def _capacities(self, leaves: list[Any]) -> dict[int, int]:
        """Rows for each ragged leaf: a capacity (distinct per leaf, so that the check can tell
        them apart), or exactly T once the check found that capacities are not safe."""
        out: dict[int, int] = {}
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, Ragged):
                continue
            total = leaf.total_length
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
            while c in out.values():
                c = 2 * c - 1
            out[i] = c
        return out

    def _key(self, leaves: list[Any], spec: Any, capacities: dict[int, int]) -> Any:
        key: list[Any] = [spec if isinstance(spec, int) else str(spec)]  # a str hashes faster
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Ragged):
                if leaf.values.requires_grad:
                    raise ValueError("cuda_graph: ragged values that require grad are not supported (the "
                                     "graph reads a static copy of them)")
                # exact captures see the batch's max_length; capacity ones the capacity
                longest = leaf.max_length if self.exact_reason is not None else None
                key.append(("ragged", capacities[i], longest, leaf.batch_size, tuple(leaf.feature_shape),
                            leaf.dtype, leaf.offsets.dtype, leaf.device))
            elif isinstance(leaf, torch.Tensor):
                if leaf.requires_grad:
                    if not leaf.is_leaf:
                        raise ValueError("cuda_graph: a tensor argument requires grad but is not a leaf; "
                                         "the graph cannot reach what it was computed from")
                    key.append(("leaf", id(leaf)))
                else:
                    key.append(("tensor", tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device))
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
        if not kwargs and all(isinstance(a, (torch.Tensor, Ragged)) for a in args):
            leaves, spec = list(args), len(args)  # the common case, without pytree's cost
        else:
            leaves, spec = pytree.tree_flatten((args, kwargs), is_leaf=lambda x: isinstance(x, Ragged))
        capacities = self._capacities(leaves)
        key = self._key(leaves, spec, capacities)
        entry = self.captures.get(key)
        if entry is None:
            entry = self._capture(leaves, spec, capacities)
            if entry is None:  # the check turned capacities off: capture this T exactly
                capacities = self._capacities(leaves)
                key = self._key(leaves, spec, capacities)
                entry = self.captures.get(key) or self._capture(leaves, spec, capacities)
            self.captures[key] = entry
        _copy_in(entry, leaves)
        entry.graph.replay()
        self.replays += 1
        return entry.outputs

    def _capture(self, leaves: list[Any], spec: Any, capacities: dict[int, int]) -> _Capture | None:
        if not torch.cuda.is_available():
            raise RuntimeError("cuda_graph: CUDA graphs need a CUDA device")
        statics = [_static(leaf, capacities.get(i), self.exact_reason is not None) for i, leaf in enumerate(leaves)]
        entry = _Capture(torch.cuda.CUDAGraph(), statics, None, capacities)
        _copy_in(entry, leaves)
        call_args, call_kwargs = (tuple(statics), {}) if isinstance(spec, int) else pytree.tree_unflatten(statics, spec)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup - 1):
                self.fn(*call_args, **call_kwargs)
            reason = self._checked_run(call_args, call_kwargs, capacities)
        torch.cuda.current_stream().wait_stream(side)
        if reason is not None and self.exact_reason is None:
            self.exact_reason = reason
            warnings.warn(f"ember.cuda_graph: {reason}; the step is captured at each batch's exact "
                          "total length instead (one capture per length)", stacklevel=3)
            return None
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(entry.graph, pool=self._pool):
            entry.outputs = self.fn(*call_args, **call_kwargs)
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


def cuda_graph(fn: Callable[..., Any] | None = None, *, capacity: int | None = None, warmup: int = 2) -> Any:
    """``fn`` (typically a whole training step around ember-compiled code) captured in CUDA graphs
    and replayed; usable as a decorator. See the docstring of ``ember.cudagraphs``."""
    if fn is None:
        return lambda f: CudaGraphStep(f, capacity=capacity, warmup=warmup)
    return CudaGraphStep(fn, capacity=capacity, warmup=warmup)


def _divides(capacities: list[int], value: int) -> bool:
    return value > 0 and any(value % c == 0 for c in capacities)


def _inside_ember(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(capture.RANGE_PREFIX):
            return True
        parent = parent.cpu_parent
    return False


def _static(leaf: Any, rows: int | None, exact: bool) -> Any:
    """The static counterpart of one argument (parameters and constants are used as they are)."""
    if isinstance(leaf, Ragged):
        values = leaf.values.new_zeros((rows, *leaf.feature_shape))
        offsets = torch.empty_like(leaf.offsets)
        # capacity: the host sees ``rows`` rows (grids, buffers), the kernels the offsets' T
        return Ragged._make(values, offsets, leaf.max_length if exact else max(rows, leaf.max_length))
    if isinstance(leaf, torch.Tensor) and not leaf.requires_grad:
        return torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype, device=leaf.device)
    return leaf


def _copy_in(entry: _Capture, leaves: list[Any]) -> None:
    for static, leaf in zip(entry.statics, leaves):
        if isinstance(leaf, Ragged):
            static.values.narrow(0, 0, leaf.values.shape[0]).copy_(leaf.values, non_blocking=True)
            static.offsets.copy_(leaf.offsets, non_blocking=True)
        elif isinstance(leaf, torch.Tensor) and static is not leaf:
            static.copy_(leaf, non_blocking=True)
