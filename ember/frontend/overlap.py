"""In-place writes to a tensor whose elements share memory (``x.expand(3, 4).add_(1)``), or
that read another view of the memory they write (``x[1:].copy_(x[:-1])``, ``x.add_(x.t())``).

AOTAutograd functionalizes them: every alias is computed apart and copied back, so no error is
raised where eager's kernels raise "more than one element of the written-to tensor refers to a
single memory location" or "some elements of the input tensor and the written-to tensor refer to
a single memory location", and where eager's kernels do write (``fill_``, ``zero_``, an
overlapping ``as_strided``), the aliases are stored in another order than eager's. Only eager's
kernels give eager's behaviour there: ``writes_overlapping_memory`` finds such graphs in Dynamo's
FX graph (before functionalization), and the backend runs them eagerly.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.multiprocessing.reductions import StorageWeakRef

_INPLACE_OPERATORS = {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                      operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                      operator.ixor, operator.ilshift, operator.irshift}


def writes_overlapping_memory(gm: torch.fx.GraphModule) -> bool:
    """Does an in-place op of Dynamo's graph write to a tensor two of whose elements share memory,
    or read a tensor that overlaps the one it writes only in part?"""
    for node in gm.graph.nodes:
        for written in map(_value, _written(node)):
            if not isinstance(written, torch.Tensor):
                continue
            if _may_overlap(written):
                return True
            read = [_value(a) for a in pytree.tree_leaves((node.args, node.kwargs))]
            if any(isinstance(r, torch.Tensor) and r is not written and _partly_overlap(written, r) for r in read):
                return True
    return False


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


def _writes_data(name: str) -> bool:
    """An ATen in-place op (``add_``), but not one that only changes a view's metadata
    (``unsqueeze_``, ``t_``: tagged inplace_view) nor a flag (``requires_grad_``: not ATen)."""
    if not name.endswith("_") or name.startswith("__"):
        return False
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    return not any(torch.Tag.inplace_view in getattr(packet, o).tags for o in packet.overloads())


def _may_overlap(t: torch.Tensor) -> bool:
    """Eager's "Yes" of its overlap check (a dimension of stride 0 and more than one element),
    and, for concrete sizes, any layout not provably one element per address. Symbolic sizes are
    never guarded on: they are read only where their value is known."""
    dims = [(stride, size) for size, stride in zip(t.shape, t.stride())]
    if any(statically_known_true(size == 0) for _, size in dims):
        return False
    dims = [(stride, size) for stride, size in dims if statically_known_true(size > 1)]
    if any(statically_known_true(stride == 0) for stride, _ in dims):
        return True
    if not all(isinstance(v, int) for dim in dims for v in dim):
        return False
    reach = 0  # the farthest offset the dimensions of smaller strides reach
    for stride, size in sorted(dims):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _partly_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Eager's PARTIAL overlap (``get_overlap_status``): two dense tensors of one storage whose
    byte ranges intersect, unless they are the same elements in the same order."""
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
    # (symbolic ranges that may intersect count as intersecting: eager's kernels then decide)
    return not statically_known_true(a_end <= b_begin) and not statically_known_true(b_end <= a_begin)


def _known_equal(xs: tuple[Any, ...], ys: tuple[Any, ...]) -> bool:
    # (without a guard: sizes not known equal count as different, which only runs eagerly)
    return len(xs) == len(ys) and all(statically_known_true(x == y) for x, y in zip(xs, ys))
