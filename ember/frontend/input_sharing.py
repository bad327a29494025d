"""Calls whose inputs share memory where the compiled graph's example inputs did not.

Dynamo guards on one tensor passed twice (``f(x, x)``), not on two distinct tensors that are
views of one memory. A graph compiled for ``x.copy_(y.flip(0))`` with ``x`` and ``y`` apart is
called again for ``b[:-1]`` and ``b[1:]``; its kernel, written for inputs apart, reads elements
of ``y`` it has already overwritten through ``x`` (Inductor's graphs too). Eager's ops give
eager's result there, or eager's overlap error.

``eager_where_inputs_newly_share_memory`` wraps a compiled graph that writes an input: each call
first reads its tensor inputs' storages (``torch._C._storage_address``, about 0.1 µs an input on
this project's CPU machine). Where they are all distinct, as the example inputs were, or shared
as the example inputs were at the same storage offsets (Dynamo guards the sizes and strides), the
compiled graph runs. Otherwise, where two tensors of one storage meet in memory, one of them
written, and the example inputs did not meet there, the call runs Dynamo's graph eagerly (eager's
ops: eager's result, or eager's overlap error) and ``ember.stats()["calls_on_shared_inputs"]``
counts it. Graphs compiled for inputs that met were checked when compiled
(``overlap.writes_overlapping_memory``). ``check_input_sharing=False`` (EMBER_CHECK_INPUT_SHARING=0)
drops the check, for graphs with many inputs whose callers never pass overlapping views. (A
``torch.optim`` step pays nothing: Dynamo holds its parameters and states as the graph's
attributes, and its inputs, the gradients, are only read.)

A graph compiled for inputs that already meet, one of them written and its memory returned, runs
eagerly from the start (``returns_a_written_input_that_overlaps_another``): AOTAutograd, which
merges such inputs into one base, rebuilds the returned views wrongly.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..runtime import stats
from .autograd_inputs import returns_a_view_of
from .overlap import _unwrapped, _value, _written, _written_values

_storage_address = torch._C._storage_address


def eager_where_inputs_newly_share_memory(compiled: Callable[..., Any], gm: torch.fx.GraphModule,
                                          example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """``compiled``, or a wrapper of it that runs ``gm`` eagerly on a call whose inputs newly share
    memory with one the graph writes (the module docstring)."""
    found = _tensor_inputs(gm, example_inputs)
    if found is None:
        return compiled
    values, tensors = found
    written_inputs = _written_inputs(gm, values, tensors)  # (once: it walks the whole graph)
    written = frozenset(n for n, i in enumerate(tensors) if i in written_inputs)
    if not written or len(tensors) < 2:
        return compiled
    examples = [values[i] for i in tensors]
    # each tensor input's label: the position (among the tensor inputs) of the first that shares its storage
    compiled_labels = _labels([StorageWeakRef(_unwrapped(v).untyped_storage()) for v in examples])
    holders = Counter(compiled_labels)
    shared = [n for n, label in enumerate(compiled_labels) if holders[label] > 1]
    compiled_offsets = [_static_int(examples[n].storage_offset()) for n in shared]
    met_when_compiled = _meeting_pairs(examples, compiled_labels, static=True)
    pick, count = operator.itemgetter(*tensors), len(tensors)

    def call(*args: Any) -> Any:
        ts = pick(args)
        try:
            apart = not shared and len(set(map(_storage_address, ts))) == count
            labels = None if apart else _labels(list(map(_storage_address, ts)))
        except Exception:  # noqa: BLE001 -- tensors without storage (functional, fake): nothing to compare
            return compiled(*args)
        if labels is None:
            return compiled(*args)
        if labels == compiled_labels and [ts[n].storage_offset() for n in shared] == compiled_offsets:
            return compiled(*args)  # (the sizes and strides Dynamo guarded: the same overlaps)
        for pair in _meeting_pairs(ts, labels):
            if pair not in met_when_compiled and (pair[0] in written or pair[1] in written):
                stats.bump("calls_on_shared_inputs")
                return gm.forward(*args)
        return compiled(*args)

    call.__wrapped__ = compiled  # type: ignore[attr-defined]
    return call


def returns_a_written_input_that_overlaps_another(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Does the graph write an input whose memory meets another input's, and return a view of that
    memory (the written input itself, or a view of it)? AOTAutograd merges such inputs into one
    synthetic base and rebuilds those outputs from it, wrongly: ``x0.mul_(2)[0]`` of ``x0 = b[1:]``
    comes back as ``b[0]`` (torch 2.11 and 2.13), and under torch 2.11 ``x0.fill_(2)`` itself
    comes back with the shape of the whole base. ``aot_eager`` and Inductor return the same. The
    inputs that meet are the example inputs' (Dynamo's values hold symbolic sizes)."""
    found = _tensor_inputs(gm, example_inputs)
    if found is None or len(found[1]) < 2:
        return False
    values, tensors = found
    examples = [example_inputs[i] for i in tensors]
    try:
        labels = _labels([_storage_address(t) for t in examples])
    except Exception:  # noqa: BLE001 -- tensors without storage (functional, fake): nothing to compare
        return False
    if len(set(labels)) == len(labels):
        return False
    written = _written_inputs(gm, values, tensors)
    merged = {tensors[n] for pair in _meeting_pairs(examples, labels, static=True) for n in pair
              if tensors[pair[0]] in written or tensors[pair[1]] in written}
    return bool(merged) and returns_a_view_of(gm, sorted(merged))


def _tensor_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[list[Any], list[int]] | None:
    """Dynamo's values of the graph's inputs, and the indices of its strided tensor inputs; None
    where the placeholders do not match the example inputs one to one."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return None
    values = [_value(n) for n in placeholders]
    return values, [i for i, (t, v) in enumerate(zip(example_inputs, values))
                    if isinstance(t, torch.Tensor) and t.layout == torch.strided and isinstance(v, torch.Tensor)]


def _labels(keys: list[Any]) -> list[int]:
    first: dict[Any, int] = {}
    return [first.setdefault(k, n) for n, k in enumerate(keys)]


def _static_int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _meeting_pairs(ts: Sequence[torch.Tensor], labels: list[int], static: bool = False) -> set[tuple[int, int]]:
    """The pairs (by position) of tensors of one storage whose byte spans meet. Each storage's
    tensors are swept in the order of their first byte, so a flat buffer's many disjoint views
    cost a sort, not every pair. ``static``: example values, whose sizes may be symbolic; those
    count as meeting nothing (a call then checks them)."""
    groups: dict[int, list[int]] = {}
    for n, label in enumerate(labels):
        groups.setdefault(label, []).append(n)
    pairs = set()
    for members in groups.values():
        if len(members) < 2:
            continue
        spans = sorted(span for n in members if (span := _span(ts[n], n, static)) is not None)
        open_: list[tuple[int, int]] = []  # (end, member) of the spans not yet ended
        for start, end, n in spans:
            open_ = [(e, m) for e, m in open_ if e > start]
            pairs.update((min(m, n), max(m, n)) for _, m in open_)
            open_.append((end, n))
    return pairs


def _span(t: torch.Tensor, n: int, static: bool) -> tuple[int, int, int] | None:
    """(first byte, one past the last byte, n) of ``t`` in its storage; None where it has no
    elements, or where ``static`` and its sizes are not ints. (Interleaved views whose elements
    do not meet count as meeting: such calls run eagerly, which is right, only slower.)"""
    shape, stride, offset = tuple(t.shape), t.stride(), t.storage_offset()
    if static and not all(isinstance(x, int) for x in (*shape, *stride, offset)):
        return None
    if 0 in shape:
        return None
    low = high = offset
    for size, step in zip(shape, stride):
        reach = (size - 1) * step
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    size = t.element_size()
    return low * size, (high + 1) * size, n


def _written_inputs(gm: torch.fx.GraphModule, values: list[Any], tensors: list[int]) -> frozenset[int]:
    """The indices of tensor inputs whose storage some node of ``gm`` writes."""
    storages = {StorageWeakRef(_unwrapped(v).untyped_storage())
                for node in gm.graph.nodes for v in _written_tensors(node) if isinstance(v, torch.Tensor)}
    return frozenset(i for i in tensors if StorageWeakRef(_unwrapped(values[i]).untyped_storage()) in storages)


def _written_tensors(node: torch.fx.Node) -> list[Any]:
    """What ``node`` writes, a foreach op's lists of tensors too."""
    lists = [a for a in _written(node) if isinstance(a, (list, tuple))]
    return [*_written_values(node), *(_value(x) for a in lists for x in a)]
