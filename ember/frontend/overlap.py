"""In-place writes to a tensor whose elements share memory (``x.expand(3, 4).add_(1)``), or
that read another view of the memory they write (``x[1:].copy_(x[:-1])``, ``x.add_(x.t())``).

AOTAutograd functionalizes them: every alias is computed apart and copied back, so no error is
raised where eager's kernels raise "more than one element of the written-to tensor refers to a
single memory location" or "some elements of the input tensor and the written-to tensor refer to
a single memory location", and where eager's kernels do write (``fill_``, ``zero_``, an
overlapping ``as_strided``), the aliases are stored in another order than eager's. Only eager's
kernels give eager's behaviour there: ``writes_overlapping_memory`` finds such graphs in Dynamo's
FX graph (before functionalization), and the backend runs them eagerly.

Functionalization also drops eager's check that an in-place op's result type can be cast to the
tensor it writes: ``ints.mul_(floats)``, ``ints /= 2`` and ``torch._foreach_mul_(ints, floats)``
raise "result type Float can't be cast to the desired output type Long" in eager, and computed a
value when compiled (aot_eager too). ``refuses_inplace_cast`` finds them, and the graph runs
eagerly, which raises eager's error where eager does.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import guard_or_false, guard_or_true, statically_known_true
from torch.multiprocessing.reductions import StorageWeakRef

_INPLACE_OPERATORS = {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                      operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                      operator.ixor, operator.ilshift, operator.irshift}


def writes_overlapping_memory(gm: torch.fx.GraphModule) -> bool:
    """Does an in-place op of Dynamo's graph write to a tensor two of whose elements share memory,
    or read a tensor that overlaps the one it writes only in part?"""
    for node in gm.graph.nodes:
        if _foreach_list_shares_memory(node) or _foreach_reads_written_memory(node):
            return True
        for written in _written_values(node):
            if not isinstance(written, torch.Tensor):
                continue
            if may_overlap(written):
                return True
            # (the tensors written are not read: setitem's x is written as its view x[i])
            written_args = [_value(a) for a in _written(node)]
            read = [_value(a) for a in pytree.tree_leaves((node.args, node.kwargs))]
            if any(isinstance(r, torch.Tensor) and r is not written and not any(r is w for w in written_args)
                   and (_partly_overlap(written, r) or _overlap_unchecked_by_eager(written, r)) for r in read):
                return True
    return False


def _foreach_list_shares_memory(node: torch.fx.Node) -> bool:
    """Does an in-place foreach op (``torch._foreach_mul_(grads, c)``, clip_grad_norm_'s scaling)
    write a list two of whose tensors may share elements (views of one flat buffer)? Eager's
    kernel writes each in turn, so a shared element is scaled twice; functionalization computes
    each from the original and copies them back, scaled once (aot_eager too)."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op not in ("call_method", "call_function") or not isinstance(name, str) \
            or not name.startswith("_foreach_") or not name.endswith("_") or not node.args:
        return False
    listed = node.args[0] if isinstance(node.args[0], (list, tuple)) else []
    for tensors in _by_storage(v for v in (_value(a) for a in listed) if isinstance(v, torch.Tensor)).values():
        if any(_ranges_meet(a, b) for i, a in enumerate(tensors) for b in tensors[i + 1:]):
            return True
    return False


def _by_storage(tensors: Any) -> dict[Any, list[Any]]:
    """Tensors (or (tensor, ...) tuples) grouped by the memory they view: only a group's tensors
    can overlap. (A GPT's optimizer step lists each of its 148 parameters, each its own storage:
    compared pairwise, the check took 1.2 s of its compile, and 22 s at 600 parameters.)"""
    groups: dict[Any, list[Any]] = {}
    for item in tensors:
        groups.setdefault(_storage_key(item[0] if isinstance(item, tuple) else item), []).append(item)
    return groups


def _storage_key(t: torch.Tensor) -> tuple[Any, Any]:
    t = _unwrapped(t)
    return t.device, StorageWeakRef(t.untyped_storage())


def _foreach_reads_written_memory(node: torch.fx.Node) -> bool:
    """Does an in-place foreach op read memory that a tensor of its written list covers, other
    than that tensor at its own place (``torch._foreach_add_([x, y], [y, x])``,
    ``torch._foreach_add_([t[1:]], [t[:-1]])``)? Eager's CPU kernel updates one tensor at a time
    (``self[i].add_(other[i])``): it raises on other[i] overlapping self[i] in part, and reads
    self[i]'s new values where a later index reads it; functionalization reads all of them as they
    were before the op (aot_eager too). The list's tensors themselves are written, not checked here
    (``_foreach_list_shares_memory``), and ``_written_values`` sees no tensor in a list argument."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op not in ("call_method", "call_function") or not isinstance(name, str) \
            or not name.startswith("_foreach_") or not name.endswith("_") or not node.args \
            or not isinstance(node.args[0], (list, tuple)):
        return False
    reads = []  # (tensor, its index in a list argument, or None)
    for arg in (*node.args[1:], *node.kwargs.values()):
        listed = isinstance(arg, (list, tuple))
        reads += [(r, j if listed else None) for j, r in enumerate(map(_value, arg if listed else [arg]))
                  if isinstance(r, torch.Tensor)]
    reads_of = _by_storage(reads)
    for i, w in enumerate(map(_value, node.args[0])):
        if not isinstance(w, torch.Tensor):
            continue
        for r, j in reads_of.get(_storage_key(w), []):
            # (the i-th pair as eager's check compares it, x with x passing; any other read,
            # x again too, conservatively)
            if _partly_overlap(w, r) if j == i else _ranges_meet(w, r):
                return True
    return False


def _ranges_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do ``a`` and ``b`` (of one storage) span intersecting byte ranges? Conservative: strided
    views that interleave without sharing an element count too (they only run eagerly)."""
    if not _same_memory(a, b):
        return False
    a, b = _unwrapped(a), _unwrapped(b)
    if statically_known_true(a.numel() == 0) or statically_known_true(b.numel() == 0):
        return False

    def span(t: torch.Tensor) -> tuple[Any, Any]:
        begin = t.storage_offset() * t.element_size()
        last = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
        return begin, begin + (last + 1) * t.element_size()
    (a_begin, a_end), (b_begin, b_end) = span(a), span(b)
    return not guard_or_false(a_end <= b_begin) and not guard_or_false(b_end <= a_begin)


_UNFOLDS = {"unfold", torch.Tensor.unfold, torch.ops.aten.unfold.default}


def writes_through_a_gapped_unfold(gm: torch.fx.GraphModule) -> bool:
    """Does an in-place op of Dynamo's graph write through an ``unfold`` view whose windows leave
    elements of the unfolded dim uncovered (``x.unfold(0, 2, 3).mul_(3)``)? Functionalization
    writes such a view back into its base with ``unfold_backward``, the view's gradient, which
    sets every uncovered element to 0 (pytorch/pytorch#198102): eager leaves them as they were."""
    for node in gm.graph.nodes:
        for written in _written(node):
            seen = written
            while isinstance(seen, torch.fx.Node):
                if seen.op in ("call_method", "call_function") and seen.target in _UNFOLDS \
                        and not _windows_cover(seen):
                    return True
                base = seen.args[0] if seen.args else None
                # (up through views and in-place results: tensors over the written one's memory)
                if not (isinstance(base, torch.fx.Node) and _same_memory(_value(seen), _value(base))):
                    break
                seen = base
    return False


def _windows_cover(unfold: torch.fx.Node) -> bool:
    """Do the windows of ``unfold`` cover every element of its dim, each once, provably?"""
    args = [_value(a) if isinstance(a, torch.fx.Node) else a for a in unfold.args]
    kwargs = {k: _value(v) if isinstance(v, torch.fx.Node) else v for k, v in unfold.kwargs.items()}
    try:
        base, dim, size, step = (*args, *(kwargs[k] for k in ("dimension", "size", "step")[len(args) - 1:]))
    except (KeyError, ValueError):
        return False
    if not isinstance(base, torch.Tensor):
        return False
    if base.dim() == 0:
        return statically_known_true(size == 1)
    length = base.shape[dim]
    return (statically_known_true(size > 0) and statically_known_true(step == size)
            and statically_known_true(length % size == 0))


def _same_memory(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    return _storage_key(a) == _storage_key(b)


def _unwrapped(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s memory: under torch.func's transforms (grad, jvp, vmap: a
    jacrev's ``new_zeros(...).diagonal().fill_(1)``) Dynamo's values are wrappers, which have
    no storage of their own ("Cannot access storage of TensorWrapper")."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


# in-place operators and the out-of-place ops whose result type they write (a += b: a + b's)
_OUT_OF_PLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                 operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                 operator.imod: operator.mod, operator.ipow: operator.pow, operator.iand: operator.and_,
                 operator.ior: operator.or_, operator.ixor: operator.xor, operator.ilshift: operator.lshift,
                 operator.irshift: operator.rshift}


def refuses_inplace_cast(gm: torch.fx.GraphModule) -> str | None:
    """An in-place pointwise op of Dynamo's graph (a method ``mul_``, an operator ``*=``, a list
    op ``torch._foreach_mul_``) whose out-of-place result type cannot be cast to the dtype of the
    tensor it writes, which eager's kernels refuse; None where there is none."""
    for node in gm.graph.nodes:
        out_of_place = _out_of_place(node)
        if out_of_place is None:
            continue
        args, kwargs = pytree.tree_map(lambda a: _value(a) if isinstance(a, torch.fx.Node) else a,
                                       (tuple(node.args), dict(node.kwargs)))
        # (the example values' own mode: the tracing context's may be another one by now)
        fake_mode = next((v.fake_mode for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, FakeTensor)), None)
        if not args or fake_mode is None:
            continue
        try:
            with fake_mode:
                result = out_of_place(*args, **kwargs)
        except Exception:  # noqa: BLE001 -- an op the check cannot run: functionalization decides
            continue
        written = args[0]
        pairs = zip(written, result) if isinstance(written, (list, tuple)) and isinstance(result, (list, tuple)) \
            else [(written, result)]
        for w, r in pairs:
            if isinstance(w, torch.Tensor) and isinstance(r, torch.Tensor) and not torch.can_cast(r.dtype, w.dtype):
                return f"{_name(node)}: result type {r.dtype} can't be cast to the written tensor's {w.dtype}"
    return None


def _name(node: torch.fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))


def _out_of_place(node: torch.fx.Node) -> Any:
    """The out-of-place op of an in-place pointwise ``node`` (called as the node is), or None."""
    if node.op == "call_function" and node.target in _OUT_OF_PLACE:
        return _OUT_OF_PLACE[node.target]
    if node.op not in ("call_method", "call_function"):
        return None
    name = _name(node)
    if not isinstance(name, str) or not name.endswith("_") or name.startswith("__"):
        return None
    if name.startswith("_foreach_"):  # (torch._foreach_mul_ -> torch._foreach_mul)
        return getattr(torch, name[:-1], None)
    packet = getattr(torch.ops.aten, name, None)
    base = getattr(torch.Tensor, name[:-1], None)
    if packet is None or base is None or not any(torch.Tag.pointwise in getattr(packet, o).tags
                                                 for o in packet.overloads()):
        return None
    return base


def _value(arg: Any) -> Any:
    return arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None


def _written(node: torch.fx.Node) -> list[Any]:
    """The arguments ``node`` writes into (their data, not only their metadata)."""
    out = [node.kwargs["out"]] if "out" in node.kwargs else []
    if node.kwargs.get("inplace") is True or node.target in _INPLACE_OPERATORS:
        return [*out, node.args[0]] if node.args else out
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op in ("call_method", "call_function") and isinstance(name, str) and node.args and _writes_data(name):
        out.append(node.args[0])
    return out


def _written_values(node: torch.fx.Node) -> list[Any]:
    """The example values of what ``node`` writes: for ``x[i, 1:] = v`` with an index of ints,
    slices, None and Ellipsis, the view ``x[i, 1:]`` (eager's copy_ into it may read all of
    that view, as ``x[0, 1:] += 1`` does, but nothing else of ``x``); with tensors in the index,
    all of ``x`` (eager's index_put_ refuses values that overlap any of it)."""
    values = [_value(a) for a in _written(node)]
    if node.op != "call_function" or node.target is not operator.setitem or len(node.args) != 3:
        return values
    target, index = values[-1], node.args[1]
    index = [_index_value(i) for i in (index if isinstance(index, tuple) else (index,))]
    if not isinstance(target, FakeTensor) or not all(_basic_index(i) for i in index):
        return values
    try:
        with target.fake_mode:
            return [*values[:-1], _basic_view(target, index)]
    except Exception:  # noqa: BLE001 -- an index the check cannot apply: all of x, as before
        return values


def _basic_view(t: torch.Tensor, index: list[Any]) -> torch.Tensor:
    """``t[tuple(index)]`` for a basic index, through the ATen view ops: Tensor.__getitem__ reads
    a SymInt in the index as a Python int, a guard on its value (``x[i] = v`` with an index that
    changes recompiled for every one)."""
    at = next((k for k, i in enumerate(index) if i is Ellipsis), None)
    if at is not None:
        real = sum(1 for i in index if i is not None and i is not Ellipsis)
        index = [*index[:at], *[slice(None)] * (t.dim() - real), *index[at + 1:]]
    dim = 0
    for i in index:
        if i is None:
            t = t.unsqueeze(dim)
            dim += 1
        elif isinstance(i, slice):
            step = 1 if i.step is None else i.step
            t = torch.ops.aten.slice.Tensor(t, dim, i.start, i.stop, step)
            dim += 1
        else:
            t = torch.ops.aten.select.int(t, dim, i)
    return t


def _index_value(i: Any) -> Any:
    if isinstance(i, slice):
        return slice(*(_index_value(p) for p in (i.start, i.stop, i.step)))
    return _value(i) if isinstance(i, torch.fx.Node) else i


def _basic_index(i: Any) -> bool:
    """An index that selects a view (no tensor, list or bool: those make index_put_)."""
    if isinstance(i, slice):
        return all(_basic_index(p) for p in (i.start, i.stop, i.step))
    return i is None or i is Ellipsis or isinstance(i, torch.SymInt) or (isinstance(i, int) and not isinstance(i, bool))


def _writes_data(name: str) -> bool:
    """An ATen in-place op (``add_``), but not one that only changes a view's metadata
    (``unsqueeze_``, ``t_``: tagged inplace_view) nor a flag (``requires_grad_``: not ATen)."""
    if not name.endswith("_") or name.startswith("__"):
        return False
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    return not any(torch.Tag.inplace_view in getattr(packet, o).tags for o in packet.overloads())


def may_overlap(t: torch.Tensor) -> bool:
    """Eager's "Yes" of its overlap check (a dimension of stride 0 and more than one element),
    and any layout not provably one element per address. Symbolic sizes and strides (the graph
    Dynamo compiles again, dynamic, once a call brings other strides) are compared with guards:
    one compiled for a layout that is one element per address is not reused for a later call's
    layout that is not (``as_strided((4, 4), (2, 1))`` after a contiguous ``x``: ``x.add_(1)``
    was functionalized, adding 1 once where eager adds it once per element sharing the address).
    A size or stride without a hint (one the data decides) is not looked at."""
    dims = [(stride, size) for size, stride in zip(t.shape, t.stride())]
    if any(statically_known_true(size == 0) for _, size in dims):
        return False
    dims = [(stride, size) for stride, size in dims if statically_known_true(size > 1)]
    if any(statically_known_true(stride == 0) for stride, _ in dims):
        return True
    if any(_hint(v) is None for dim in dims for v in dim):
        return False
    reach = 0  # the farthest offset the dimensions of smaller strides reach
    # (in the order of this call's strides; the guards that each stride passes the reach of the
    # smaller ones keep that order for any later call the graph serves)
    for stride, size in sorted(dims, key=lambda d: _hint(d[0])):
        if guard_or_true(stride <= reach):
            return True
        reach += stride * (size - 1)
    return False


def _hint(v: Any) -> int | None:
    """A size's or stride's value in the call being compiled (None: the data decides it)."""
    return v if isinstance(v, int) else v.node.hint


def _partly_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Eager's PARTIAL overlap (``get_overlap_status``): two dense tensors of one storage whose
    byte ranges intersect, unless they are the same elements in the same order."""
    a, b = _unwrapped(a), _unwrapped(b)
    if a.device != b.device or StorageWeakRef(a.untyped_storage()) != StorageWeakRef(b.untyped_storage()):
        return False
    if not (is_non_overlapping_and_dense_or_false(a) and is_non_overlapping_and_dense_or_false(b)):
        return False  # (eager's "too hard": it does not check)
    a_begin, b_begin = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
    if statically_known_true(a.numel() == 0) or statically_known_true(b.numel() == 0):
        return False
    if statically_known_true(a_begin == b_begin) and statically_known_true(a_end == b_end):
        return not (a.dtype == b.dtype and _known_equal(a.shape, b.shape) and _known_equal(a.stride(), b.stride()))
    # symbolic ranges apart for these sizes (x[-1] and x[0]: n <= n * (n - 1)) are guarded apart,
    # so that sizes where they meet recompile and run eagerly; not only where provably apart
    # for every size, which sent every dynamic graph writing a row read from another eagerly
    return not guard_or_false(a_end <= b_begin) and not guard_or_false(b_end <= a_begin)


def _overlap_unchecked_by_eager(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do ``a`` and ``b`` of one storage share an element where eager's check cannot tell (either
    is not dense: "too hard")? Eager raises nothing there and its kernel writes in its own order:
    ``x[:, 1:] = x[:, :-1]`` copies each row's first element along the row. Functionalization
    reads every element as it was before the write (aot_eager too)."""
    a, b = _unwrapped(a), _unwrapped(b)
    if not _ranges_meet(a, b):
        return False
    if is_non_overlapping_and_dense_or_false(a) and is_non_overlapping_and_dense_or_false(b):
        return False  # (eager's check: _partly_overlap)
    if a.dtype == b.dtype and statically_known_true(a.storage_offset() == b.storage_offset()) \
            and _known_equal(a.shape, b.shape) and _known_equal(a.stride(), b.stride()):
        return False  # the same elements in the same order (x[:, ::2] += 1 writes its own view)
    return _share_an_element(a, b)


def _share_an_element(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact for views of one dtype with the same strides and static sizes, strides and offsets
    (``x[:, 0] = x[:, 1]`` shares none: it still compiles); True for any other pair, which only
    runs eagerly."""
    layouts = (*a.shape, *a.stride(), a.storage_offset(), *b.shape, *b.stride(), b.storage_offset())
    if a.dtype != b.dtype or not _known_equal(a.stride(), b.stride()):
        return True
    if not all(type(v) is int for v in layouts):
        return not _apart_within_smallest_stride(a, b)
    # element i of a is element j of b where (i - j) . strides = b's offset - a's offset, each
    # i_k - j_k in [-(b's size - 1), a's size - 1]
    dims = sorted(((stride, size_a - 1, size_b - 1) for stride, size_a, size_b in zip(a.stride(), a.shape, b.shape)
                   if stride > 0 and max(size_a, size_b) > 1), reverse=True)
    return _offset_reached(b.storage_offset() - a.storage_offset(), dims, budget=[4096])


def _apart_within_smallest_stride(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Symbolic layouts of equal strides: is every stride a multiple of the smallest, and the two
    offsets nearer than it (``x[:, 0]`` and ``x[:, 1]`` of an (s0, s1) tensor: 1 < s1)? Then every
    offset one view reaches from the other is a multiple of that stride, and none is the offsets'
    difference: no element is shared, for every size."""
    strides = [s for s in a.stride() if not statically_known_true(s == 0)]
    hints = [_hint(s) for s in strides]
    if not strides or any(h is None for h in hints):
        return False
    smallest = strides[hints.index(min(hints))]
    delta = b.storage_offset() - a.storage_offset()
    return (all(statically_known_true(s % smallest == 0) for s in strides)
            and statically_known_true(delta != 0)
            and statically_known_true(delta < smallest) and statically_known_true(-delta < smallest))


def _offset_reached(delta: int, dims: list[tuple[int, int, int]], budget: list[int]) -> bool:
    """Is ``delta`` a sum of ``d_k * stride_k`` with ``-low_k <= d_k <= high_k`` over ``dims``
    ((stride, high, low), largest stride first)? True once ``budget`` steps are spent."""
    if not dims:
        return delta == 0
    budget[0] -= 1
    if budget[0] < 0:
        return True
    (stride, high, low), rest = dims[0], dims[1:]
    above = sum(s * h for s, h, _ in rest)  # what the smaller strides can add, and take away
    below = sum(s * lo for s, _, lo in rest)
    first, last = max(-low, -((above - delta) // stride)), min(high, (delta + below) // stride)
    return any(_offset_reached(delta - d * stride, rest, budget) for d in range(first, last + 1))


def _known_equal(xs: tuple[Any, ...], ys: tuple[Any, ...]) -> bool:
    # (without a guard: sizes not known equal count as different, which only runs eagerly)
    return len(xs) == len(ys) and all(statically_known_true(x == y) for x, y in zip(xs, ys))
