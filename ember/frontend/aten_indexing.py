"""Lowerings of ATen's data-dependent indexing: gather, scatter (as selects), advanced indexing
``x[i, j]``, index_select, searchsorted/bucketize (how ragged row ids are found), and the writes
at indices: index_put (accumulating or not), index_add and scatter_add.

Indices become kernel values: the reading kernel loads an index, checks it against the size it
indexes (eager's error on the CPU; clamped on GPUs, as eager's device asserts cannot be caught)
and loads the element there, so a gather fuses into the kernel that consumes it. A write at
indices is a kernel over the written values that stores (or atomically adds) each one where its
indices point, so whatever computes the values fuses into it: the backward of a gather is one
kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node, fill_value, is_plus_zero, row_ids_offsets, view_base
from ..ir.ops import Op
from ..ragged import ops as _ragged_ops  # noqa: F401 -- registers torch.ops.ember.segment_reduce
from . import bag_decomps as _bag_decomps  # noqa: F401 -- registers torch.ops.ember.bag_bounds
from .aten_scalars import checked_scalar
from .context import Context, Unsupported, register, size_arg
from .lowering import storage_of

aten = torch.ops.aten

_INDEX_DTYPES = (dt.int32, dt.int64)


def _index_dtype(op: str, index: Any) -> None:
    """Eager indexes with int32 and int64 tensors only (int16 and float indices are its error):
    any other goes to ATen, which raises eager's error."""
    if isinstance(index, Node) and index.dtype not in _INDEX_DTYPES:
        raise Unsupported(f"{op} with a {index.dtype} index (eager's error)")


@register(aten.gather.default)
def _gather(ctx: Context, x: Node, dim: int, index: Node, sparse_grad: bool = False) -> Node:
    _index_dtype("gather", index)
    if x.rank == 0 or index.rank != x.rank:
        raise Unsupported("gather of a 0-d tensor")
    return ctx.make(Op.GATHER, (x, ctx.cast(index, dt.int64)), dim % x.rank)


@register(aten.scatter.value, aten.scatter.src)
def _scatter(ctx: Context, x: Node, dim: int, index: Node, src: Any) -> Node:
    """scatter with a few entries per row along ``dim`` (a one-hot, the backward of a gather)
    is a select per element: out[p] = src[q] where index[q] == p[dim], else x[p]."""
    _index_dtype("scatter", index)
    dim = dim % max(x.rank, 1)
    # (a 0-d self's and index's dim 0 is no dim of theirs: read, it failed the whole graph)
    m = sh.static(index.shape[dim]) if index.rank == x.rank and x.rank > 0 else None
    x_sizes, index_sizes = ctx.arg_metas[0].shape, ctx.arg_metas[2].shape
    if x.rank == 0 or m is None or m > 8 or not all(
            ctx.known(a == b) for d, (a, b) in enumerate(zip(index_sizes, x_sizes)) if d != dim):
        raise Unsupported("scatter of many entries per row (or into a larger tensor)")
    if sh.static(sh.numel(x.shape)) == 0:
        # the decomposition below checks an index only where the result has elements: ATen
        # raises eager's error for an index into an empty dim
        raise Unsupported("scatter into an empty tensor")
    source_dtype_matches("scatter", x, src)
    dtype, shape = ctx.out_dtype, ctx.out_shape
    positions = ctx.make(Op.IOTA, (), (shape[dim], 0, 1), dtype=dt.int64)
    positions = ctx.expand_to(ctx.reshape(positions, [s if d == dim else 1 for d, s in enumerate(shape)]), shape)
    out = ctx.operand(x, dtype, shape)
    index = ctx.cast(index, dt.int64)
    if isinstance(src, Node):
        if src.rank != x.rank:
            raise Unsupported("scatter with a source of another rank")
        src = _covered_part(ctx, "scatter", src, index, index_sizes, ctx.arg_metas[3].shape)
    for j in range(m):  # later entries win, as a sequential scatter writes them last
        one = sympy.Integer(1)
        idx_j = ctx.make(Op.SLICE, (index,), (dim, sympy.Integer(j), one, one))
        # the positions gathered at the index: the index itself, checked against the size as
        # eager checks it (an index matching no position would silently write nothing)
        idx_j = ctx.make(Op.GATHER, (positions, idx_j), dim)
        hit = ctx.make(Op.EQ, (positions, ctx.expand_to(idx_j, shape)))
        if isinstance(src, Node):
            val = ctx.expand_to(ctx.cast(ctx.make(Op.SLICE, (src,), (dim, sympy.Integer(j), one, one)), dtype), shape)
        else:
            val = ctx.operand(checked_scalar(src, dtype), dtype, shape)
        out = ctx.make(Op.WHERE, (hit, val, out))
    return out


def _wrapped(ctx: Context, index: Node, size: sympy.Expr) -> Node:
    """Negative indices count from the end, as in eager: i < 0 -> i + size."""
    if index.op is Op.SEARCH:
        return ctx.cast(index, dt.int64)  # a count: never negative
    index = ctx.cast(index, dt.int64)
    shape = index.shape
    negative = ctx.make(Op.LT, (index, ctx.operand(0, dt.int64, shape)))
    shifted = ctx.make(Op.ADD, (index, ctx.operand(size, dt.int64, shape)))
    return ctx.make(Op.WHERE, (negative, shifted, index))


def _indexed_dims(x: Node, indices: Sequence[Any], op: str) -> list[int]:
    """The dims ``indices`` index (None skips a dim): integer index tensors on dims of a tensor
    of rank >= 1, else the op runs through ATen."""
    present = [d for d, i in enumerate(indices) if i is not None]
    if x.rank == 0 or not present:
        raise Unsupported(f"{op} of a 0-d tensor or with no index tensor")
    if any(not isinstance(indices[d], Node) or indices[d].dtype.is_bool or indices[d].dtype == dt.uint8
           for d in present):
        raise Unsupported(f"{op} with a boolean mask (its result's size depends on the data)")
    for d in present:
        _index_dtype(op, indices[d])
    return present


def _indexed_first(ctx: Context, x: Node, present: list[int]) -> tuple[Node, int]:
    """Index tensors on dims that are not adjacent (``x[i, :, j]``) put their broadcast dims
    first in eager's result, then the other dims in order: that is indexing at dim 0 of ``x``
    permuted to (indexed dims, other dims). Adjacent ones index in place, at the first of them.
    Returns the tensor to index and the dim its indexing starts at."""
    if present == list(range(present[0], present[0] + len(present))):
        return x, present[0]
    order = present + [d for d in range(x.rank) if d not in present]
    return ctx.make(Op.PERMUTE, (x,), tuple(order)), 0


@register(aten.index.Tensor)
def _index(ctx: Context, x: Node, indices: Sequence[Any]) -> Node:
    """``x[i0, i1, ...]`` with integer index tensors (None skips a dim)."""
    present = _indexed_dims(x, indices, "index")
    source, start = _indexed_first(ctx, x, present)
    k, out = len(present), ctx.out_shape
    shape = out[start:len(out) - (x.rank - start - k)]
    wrapped = [ctx.expand_to(_wrapped(ctx, indices[d], x.shape[d]), shape) for d in present]
    return ctx.make(Op.INDEX, (source, *wrapped), start)


@register(aten.as_strided.default)
def _as_strided(ctx: Context, x: Node, size: Sequence[Any], stride: Sequence[Any], storage_offset: Any = None) -> Node:
    """as_strided reads the memory under its argument. Of memory the program holds (an input, an
    ATen result) it is ATen's view of it; of a computed value, whose buffer ember lays out its
    own way, it is a gather from that value's elements in eager's memory order (which the traced
    value records): out[i] = flat[offset + sum(i_k * stride_k)]."""
    meta = ctx.arg_metas[0]
    if not isinstance(meta, torch.Tensor) or storage_of(meta) in ctx.input_storages:
        raise Unsupported("as_strided of an input: ATen's view of its memory")
    if view_base(x).op in (Op.EXTERN, Op.GETITEM, Op.TENSOR):
        raise Unsupported("as_strided of an ATen result: ATen's view of its memory")
    # the value whose memory it is: the argument itself where it fills its memory (a clone),
    # else the value its views start from (a slice of an exp: the exp), traced over the same memory
    base, base_meta = x, meta
    if not _fills_its_memory(ctx, meta):
        base = view_base(x)
        base_meta = ctx.metas.get(base)
    order = None if base_meta is None else _memory_order(ctx, base_meta)
    if (order is None or storage_of(base_meta) != storage_of(meta)
            or not sh.shapes_equal(base.shape, sh.shape(base_meta.shape)) or not _fills_its_memory(ctx, base_meta)):
        # (any failure here sends the whole graph through ATen, with one warning: the IR could
        # only read the buffer in ember's own order, which is not eager's)
        raise NotImplementedError("as_strided of a computed value whose memory order the trace does not fix")
    flat = ctx.reshape(ctx.make(Op.PERMUTE, (base,), tuple(order)) if order != list(range(base.rank)) else base,
                       [sh.numel(base.shape)])
    shape = ctx.out_shape  # (sizes as the trace has them: symbolic ones too, a GroupNorm's batch)
    offset = size_arg(storage_offset if storage_offset is not None else meta.storage_offset())
    position = ctx.operand(offset, dt.int64, shape)
    for d, (n, st) in enumerate(zip(shape, stride)):
        iota = ctx.make(Op.IOTA, (), (n, 0, size_arg(st)), dtype=dt.int64)
        along = ctx.expand_to(ctx.reshape(iota, [n if k == d else 1 for k in range(len(shape))]), shape)
        position = ctx.make(Op.ADD, (position, along))
    return ctx.make(Op.INDEX, (flat, position), 0)


def _fills_its_memory(ctx: Context, meta: torch.Tensor) -> bool:
    """A traced value that is all of its memory: from offset 0, dense, nothing else in it.
    (Equalities are proved from the shape environment: symbolic strides and storage sizes are
    spelled with ``Max(1, n)``, which is ``n`` for Dynamo's sizes of 2 or more.)"""
    numel = sh.numel(sh.shape(meta.shape))
    nbytes = sh.expr(meta.untyped_storage().nbytes())
    return (ctx.known_equal(nbytes, numel * meta.element_size()) and sh.equal(sh.expr(meta.storage_offset()), 0)
            and torch._prims_common.is_non_overlapping_and_dense_or_false(meta))


def _memory_order(ctx: Context, meta: torch.Tensor) -> list[int] | None:
    """A dense value's dims from the largest stride to the smallest: row-major where its strides
    are (symbolic ones too), else by static strides; None where they cannot be ordered."""
    shape, strides = sh.shape(meta.shape), sh.shape(meta.stride())
    if all(sh.is_one(n) or ctx.known_equal(st, sh.numel(shape[d + 1:]))
           for d, (n, st) in enumerate(zip(shape, strides))):
        return list(range(len(shape)))
    if any(sh.static(st) is None for st in strides):
        return None
    return sorted(range(len(shape)), key=lambda d: -int(strides[d]))


@register(aten.index_select.default)
def _index_select(ctx: Context, x: Node, dim: int, index: Node) -> Node:
    """x's slices along ``dim`` at ``index`` (1-d or 0-d): an INDEX at that dim. The kernel's
    check raises eager's error: an IndexError, but a RuntimeError along dim 1 of a tensor of rank
    > 1 (eager's fast path there; schedule/build.py picks the code)."""
    _index_dtype("index_select", index)
    if x.rank == 0 or index.rank > 1:
        raise Unsupported("index_select of a 0-d tensor, or with an index of rank > 1 (eager's error)")
    dim = dim % x.rank
    if not all(ctx.known_nonzero(n) for n in x.shape):
        # eager checks every index of an empty self (a RuntimeError, also where another dim is
        # empty, which leaves the kernel no element to check it at), and refuses an empty dim
        raise Unsupported("index_select of a tensor that may be empty")
    # no wrapping: index_select raises for negative indices, and so does the kernel
    index = ctx.reshape(ctx.cast(index, dt.int64), [index.shape[0] if index.rank else sympy.Integer(1)])
    return ctx.make(Op.INDEX, (x, index), dim)


@register(aten.embedding.default)
def _embedding(ctx: Context, weight: Node, indices: Node, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> Node:
    """weight's rows at ``indices`` (any shape): out[p, :] = weight[indices[p], :], a gather that
    fuses into what reads it. padding_idx and the rest concern the backward only."""
    _index_dtype("embedding", indices)
    if weight.rank != 2 or not (ctx.known_nonzero(weight.shape[0]) and ctx.known_nonzero(weight.shape[1])):
        # eager's errors: a weight that is not 2-D, or empty (its index_select checks every index
        # of an empty weight, a RuntimeError, where the kernel would have no element to check at)
        raise Unsupported("embedding of a weight that is not 2-D, or may be empty")
    # no wrapping: a negative index is eager's IndexError, as one past the rows is
    return ctx.make(Op.INDEX, (weight, ctx.cast(indices, dt.int64)), 0)


def _search(ctx: Context, seq: Node, values: Any, out_int32: bool, right: bool) -> Node:
    if not isinstance(values, Node):
        raise Unsupported("searchsorted of a Python scalar")
    if seq.rank == 0 or seq.dtype.is_low_precision or seq.dtype.is_bool or seq.dtype != values.dtype:
        raise Unsupported("searchsorted over a 0-d sequence, or one of another dtype")
    # a batched search (top-p sampling's per-row cumulative probabilities): eager wants the
    # leading dims of values equal to the sequence's; any other shape is ATen's (and its error)
    if seq.rank > 1 and (values.rank != seq.rank or not all(
            ctx.known_equal(a, b) for a, b in zip(seq.shape[:-1], values.shape[:-1]))):
        raise Unsupported("batched searchsorted whose values' leading dims are not the sequence's")
    dtype = dt.int32 if out_int32 else dt.int64
    return ctx.make(Op.SEARCH, (seq, values), (bool(right), False), dtype=dtype)


@register(torch.ops.ember.row_ids.default)
def _ragged_row_ids(ctx: Context, offsets: Node, total: Any) -> Node:
    """A Ragged's row ids: the search row_ids() runs, marked as the row ids of offsets that start
    at 0 and end at T (what segment kernels and the gathers of passes/ragged.py rely on)."""
    if offsets.rank != 1 or not offsets.dtype.is_int:
        raise Unsupported("row ids of offsets that are not a 1-d integer tensor")
    length = size_arg(total)
    batch = sympy.expand(offsets.shape[0] - 1)
    ends = ctx.make(Op.SLICE, (offsets,), (0, sympy.Integer(1), sympy.Integer(1), batch))
    iota = ctx.make(Op.IOTA, (), (length, 0, 1), dtype=offsets.dtype)
    return ctx.make(Op.SEARCH, (ends, iota), (True, True), dtype=dt.int64)


@register(aten.searchsorted.Tensor)
def _searchsorted(ctx: Context, seq: Node, values: Any, *, out_int32: bool = False, right: bool = False,
                  side: str | None = None, sorter: Any = None) -> Node:
    if sorter is not None:
        raise Unsupported("searchsorted with a sorter")
    if side not in (None, "left", "right"):  # (eager's RuntimeError, from ATen: its meta function lets it by)
        raise Unsupported(f"searchsorted with side={side!r}")
    return _search(ctx, seq, values, out_int32, right or side == "right")


@register(aten.bucketize.Tensor)
def _bucketize(ctx: Context, values: Node, boundaries: Node, *, out_int32: bool = False,
               right: bool = False) -> Node:
    if boundaries.rank != 1:  # (eager's RuntimeError, from ATen; searchsorted takes batches)
        raise Unsupported("bucketize with boundaries that are not 1-d")
    return _search(ctx, boundaries, values, out_int32, right)


# ---- writes at indices: index_put, index_add (decomposed to index_put), scatter_add -----------

# Dtypes every backend can add atomically; 16-bit floats accumulate in float32 (as eager's CUDA
# index_put does over duplicate indices), other types run through ATen.
_ATOMIC = frozenset({dt.float32, dt.float64, dt.int32, dt.int64})


def _put(ctx: Context, x: Node, start: int, indices: list[Node], src: Any, accumulate: bool | str,
         error: int) -> Node:
    """``x`` with ``src`` written (added, when accumulating; combined by "amax" or "amin" when
    ``accumulate`` names one) at ``x[a, i0, .., ik-1, b]``; indices already wrapped and int64,
    broadcast here. ``error``: the code a bad index flags on the CPU."""
    summed = _sum_by_row_ids(ctx, x, start, indices, src, accumulate) if accumulate is True else None
    if summed is not None:
        return summed
    if torch.are_deterministic_algorithms_enabled() and not isinstance(accumulate, str):
        # (a max or min is one value whatever order the writes come in: signed zeros ordered)
        raise Unsupported("writes at indices under torch.use_deterministic_algorithms (ATen's are)")
    dtype = x.dtype
    if isinstance(accumulate, str):
        if dtype.is_bool:
            raise Unsupported(f"scatter_reduce {accumulate!r} of bools")
        # max and min are exact in a wider type: 16-bit floats in float32, small ints in int32
        wide = dt.float32 if dtype.is_low_precision else dtype if dtype in _ATOMIC else dt.int32
        return ctx.cast(put_at(ctx, x, start, indices, src, accumulate, error, wide), dtype)
    if accumulate and dtype not in _ATOMIC and not dtype.is_low_precision:
        raise Unsupported(f"accumulating {dtype} at indices")
    wide = dt.float32 if accumulate and dtype.is_low_precision else dtype
    return ctx.cast(put_at(ctx, x, start, indices, src, accumulate, error, wide), dtype)


def put_at(ctx: Context, x: Node, start: int, indices: list[Node], src: Any, accumulate: bool | str,
            error: int, wide: dt.DType) -> Node:
    """The INDEX_PUT node, computed in ``wide``."""
    dtype = x.dtype
    shape_i = sh.broadcast(*(i.shape for i in indices))
    shape = x.shape[:start] + shape_i + x.shape[start + len(indices):]
    indices = [ctx.expand_to(i, shape_i) for i in indices]
    _broadcasts_to(ctx, src, shape)
    values = ctx.operand(src, dtype, shape)
    return ctx.make(Op.INDEX_PUT, (ctx.cast(x, wide), ctx.cast(values, wide), *indices), (start, accumulate, error))


def _broadcasts_to(ctx: Context, src: Any, shape: sh.Shape) -> None:
    """Values written at indices must broadcast to the indexed shape, which the trace does not
    check where sizes are symbolic (a value of 4 rows written at a ragged batch's T row ids):
    unless it provably does, the write goes to ATen, which raises eager's error when it does not
    (a kernel read past the values)."""
    if not isinstance(src, Node):
        return
    dims = list(src.shape)
    while len(dims) > len(shape) and sh.is_one(dims[0]):
        dims.pop(0)
    if len(dims) > len(shape) or not all(
            sh.is_one(a) or ctx.known_equal(a, b) for a, b in zip(dims, shape[len(shape) - len(dims):])):
        raise Unsupported(f"writing values of shape {sh.fmt(src.shape)} at indices of shape {sh.fmt(shape)}")


def source_dtype_matches(op: str, x: Node, src: Any) -> None:
    """Eager's writes at indices take a source of the destination's dtype only (a setitem casts
    before it writes); another goes to ATen, which raises eager's error."""
    if isinstance(src, Node) and src.dtype != x.dtype:
        raise Unsupported(f"{op} of a {src.dtype} source into {x.dtype} (eager's error)")


def _sum_by_row_ids(ctx: Context, x: Node, start: int, indices: list[Node], src: Any,
                    accumulate: bool) -> Node | None:
    """x + (src added up by ``ragged.row_ids()``) is x + a segment sum of src: each row reduced
    by one program, with no atomics (the backward of gathering a per-row value, ``s[row_ids]``)."""
    if not accumulate or start != 0 or len(indices) != 1 or not isinstance(src, Node):
        return None
    offsets = row_ids_offsets(indices[0])
    if offsets is None or not sh.equal(x.shape[0], offsets.shape[0] - 1) or sh.is_one(x.shape[0]):
        return None
    if x.dtype.is_bool or x.dtype == dt.uint8 or indices[0].rank != 1:
        return None
    fill = fill_value(x)
    if fill == 0 and not is_plus_zero(fill):
        # a row's sum starts from +0.0, so -0.0 + sum is +0.0 where eager's untouched (or
        # all -0.0) rows keep -0.0: the write at indices starts from the -0.0 fill instead
        return None
    wide = dt.float32 if x.dtype.is_low_precision else x.dtype
    _broadcasts_to(ctx, src, (indices[0].shape[0], *x.shape[1:]))
    values = ctx.cast(ctx.operand(src, x.dtype, (indices[0].shape[0], *x.shape[1:])), wide)
    total = ctx.make(Op.SEGMENT_REDUCE, (values, offsets), Op.SUM)
    if not is_plus_zero(fill):  # adding into zeros (a backward) adds nothing
        total = ctx.make(Op.ADD, (ctx.cast(x, wide), total))
    return ctx.cast(total, x.dtype)


@register(aten.index_put.default)
def _index_put(ctx: Context, x: Node, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Node:
    """``x[i0, i1, ...] = values`` (``+=`` when accumulating), integer index tensors
    (``x.index_put_``, and in-place ``x[i] += v`` after functionalization; the backward of
    ``x[i, :, j]``, whose values have the indexed dims first)."""
    source_dtype_matches("index_put", x, values)
    masked = _masked_write(ctx, x, indices, values, bool(accumulate))
    if masked is not None:
        return masked
    present = _indexed_dims(x, indices, "index_put")
    wrapped = [_wrapped(ctx, indices[d], x.shape[d]) for d in present]
    target, start = _indexed_first(ctx, x, present)
    out = _put(ctx, target, start, wrapped, values, bool(accumulate), 3)
    if target is x:
        return out
    order = target.arg  # back from (indexed dims, other dims) to x's order
    return ctx.make(Op.PERMUTE, (out,), tuple(order.index(d) for d in range(x.rank)))


def _masked_write(ctx: Context, x: Node, indices: Sequence[Any], values: Any, accumulate: bool) -> Node | None:
    """``x[mask] = v`` (``+=``) with one boolean mask and a ``v`` that broadcasts over the masked
    elements (a scalar, or a row per element: no size of the selected count) is ``where(mask, v,
    x)``, no data-dependent size in it; None for any other write (a mask whose shape is not
    x's there is eager's error, ATen's)."""
    present = [d for d, i in enumerate(indices) if i is not None]
    if len(present) != 1 or not isinstance(indices[present[0]], Node) or not indices[present[0]].dtype.is_bool:
        return None
    if len(indices) > x.rank:
        return None  # (more indices than dims, a 0-d mask into a 0-d x: eager's IndexError, ATen's)
    start, mask = present[0], indices[present[0]]
    rest = x.rank - start - mask.rank
    if rest < 0 or not all(ctx.known_equal(m, n) for m, n in zip(mask.shape, x.shape[start:])):
        return None
    if isinstance(values, Node) and values.rank > rest:
        count = values.rank - 1 - rest  # values' dim of the selected elements: it must broadcast
        if not sh.is_one(values.shape[count]) or values.rank - 1 + mask.rank > x.rank:
            return None
        values = ctx.reshape(values, [*values.shape[:count], *[sympy.Integer(1)] * mask.rank,
                                      *values.shape[count + 1:]])
    if isinstance(values, Node) and not all(sh.is_one(a) or ctx.known_equal(a, b)
                                            for a, b in zip(values.shape[::-1], x.shape[::-1])):
        return None  # (values that do not broadcast: eager's error)
    mask = ctx.expand_to(ctx.reshape(mask, [*[sympy.Integer(1)] * start, *mask.shape, *[sympy.Integer(1)] * rest]),
                         x.shape)
    if accumulate:
        values = ctx.make(Op.ADD, (x, ctx.operand(values, x.dtype, x.shape)))
    return ctx.make(Op.WHERE, (mask, ctx.operand(values, x.dtype, x.shape), x))


@register(aten.index_add.default)
def _index_add(ctx: Context, x: Node, dim: int, index: Node, source: Any, *, alpha: Any = 1) -> Node:
    """out[.., index[j], ..] += alpha * source[.., j, ..] along ``dim``; no negative indices, as
    in eager (a RuntimeError)."""
    if x.rank == 0 or index.rank != 1 or not isinstance(source, Node) or source.rank != x.rank:
        raise Unsupported("index_add into a 0-d tensor, or with a 0-d source")
    source_dtype_matches("index_add", x, source)
    _index_dtype("index_add", index)
    if alpha != 1:
        # eager converts alpha to self's dtype with its overflow check (1e5 into float16 raises);
        # one that does not fit goes to ATen, which raises that error (or returns early as eager)
        alpha = checked_scalar(alpha, x.dtype)
    dim = dim % x.rank
    if x.rank > 1 and sh.static(sh.numel(x.shape)) == 0:
        # eager's kernel returns an empty self of rank > 1 as it is, before it reads an index
        # (an index beyond the dim raised here where eager returns)
        return x
    if not all(ctx.known_equal(s, index.shape[0] if d == dim else n)
               for d, (s, n) in enumerate(zip(source.shape, x.shape))):
        # eager takes a source of exactly self's sizes but along dim (none broadcast): its error
        raise Unsupported("index_add with a source not shaped like self along the other dims")
    if alpha != 1:
        source = ctx.make(Op.MUL, (source, ctx.operand(alpha, source.dtype, source.shape)))
    # eager's CPU kernel scatter_adds (a RuntimeError for a bad index) only along the first or
    # the last dim of a self of rank > 1, with an int64 index and an alpha of 1; its other path
    # (a 1-d self, a middle dim, an int32 index, another alpha) raises an IndexError
    fast = x.rank > 1 and dim in (0, x.rank - 1) and index.dtype == dt.int64 and alpha == 1
    error = 4 if fast else 7
    return _put(ctx, x, dim, [ctx.cast(index, dt.int64)], source, True, error)


@register(aten.index_copy.default)
def _index_copy(ctx: Context, x: Node, dim: int, index: Node, source: Node) -> Node:
    """out[.., index[j], ..] = source[.., j, ..] along ``dim``: a write at indices, no negative
    ones (eager's IndexError, as the kernel's); index_fill decomposes to it."""
    if index.dtype != dt.int64 or index.rank > 1 or x.rank == 0 or source.rank != x.rank:
        # eager's errors (an int32 index: RuntimeError; ranks: IndexError), or a 0-d self
        raise Unsupported("index_copy with an index that is not 1-d int64, or of a 0-d tensor")
    if sh.static(sh.numel(x.shape)) == 0:
        raise Unsupported("index_copy into an empty tensor (ATen raises eager's error for any index)")
    source_dtype_matches("index_copy", x, source)
    dim = dim % x.rank
    count = index.shape[0] if index.rank else sympy.Integer(1)
    if not all(ctx.known_equal(s, count if d == dim else n) for d, (s, n) in enumerate(zip(source.shape, x.shape))):
        # eager takes a source of self's sizes but along dim (none broadcast): its IndexError
        raise Unsupported("index_copy with a source not shaped like self, but along dim")
    return _put(ctx, x, dim, [ctx.reshape(ctx.cast(index, dt.int64), [count])], source, False, 10)


@register(aten.put.default)
def _put_flat(ctx: Context, x: Node, index: Node, source: Node, accumulate: bool = False) -> Node:
    """x's elements in row-major order written (added, when accumulating) at ``index`` from
    ``source``'s (``take``'s backward): an index_put into x flattened, negative indices from the
    end. eager's errors (an index not int64, sizes that differ, an empty self) stay ATen's."""
    if index.dtype != dt.int64 or not isinstance(source, Node):
        raise Unsupported("put with an index that is not int64 (eager's error)")
    source_dtype_matches("put", x, source)
    numel, count = sh.numel(x.shape), sh.numel(index.shape)
    if not ctx.known_nonzero(numel) or not ctx.known_equal(count, sh.numel(source.shape)):
        raise Unsupported("put into a tensor that may be empty, or with a source of another size")
    flat = ctx.reshape(x, [numel])
    wrapped = _wrapped(ctx, ctx.reshape(index, [count]), numel)
    out = _put(ctx, flat, 0, [wrapped], ctx.reshape(source, [count]), bool(accumulate), 12)
    return ctx.reshape(out, x.shape)


@register(aten.scatter_add.default)
def _scatter_add(ctx: Context, x: Node, dim: int, index: Node, src: Node) -> Node:
    """out[.., index[p], ..] += src[p] over index's elements p: an index_put whose other indices
    are the positions themselves."""
    indices, src = _scatter_indices(ctx, "scatter_add", x, dim, index, src)
    return _put(ctx, x, 0, indices, src, True, 4)


def _scatter_indices(ctx: Context, op: str, x: Node, dim: int, index: Node, src: Node) -> tuple[list[Node], Node]:
    """A scatter's write as an index_put's: its index along ``dim``, the positions themselves
    along the other dims; and the part of ``src`` the index covers."""
    _index_dtype(op, index)
    if x.rank == 0 or index.rank != x.rank or src.rank != x.rank:
        raise Unsupported(f"{op} of a 0-d tensor or with an index of another rank")
    source_dtype_matches(op, x, src)
    dim = dim % x.rank
    x_sizes, index_sizes, src_sizes = (ctx.arg_metas[i].shape for i in (0, 2, 3))
    if not all(ctx.known(i <= s) for d, (i, s) in enumerate(zip(index_sizes, x_sizes)) if d != dim):
        raise Unsupported(f"{op} whose index is not provably within self")
    src = _covered_part(ctx, op, src, index, index_sizes, src_sizes)
    shape = index.shape
    indices = []
    for d in range(x.rank):
        if d == dim:
            indices.append(ctx.cast(index, dt.int64))
            continue
        positions = ctx.make(Op.IOTA, (), (shape[d], 0, 1), dtype=dt.int64)
        indices.append(ctx.reshape(positions, [s if e == d else 1 for e, s in enumerate(shape)]))
    return indices, src


def _covered_part(ctx: Context, op: str, src: Node, index: Node, index_sizes: Sequence[Any],
                  src_sizes: Sequence[Any]) -> Node:
    """The part of a scatter's ``src`` its index covers (src may be larger on any dim, and only
    that part is written); unless the index provably fits in src, the op goes to ATen."""
    if not all(ctx.known(i <= s) for i, s in zip(index_sizes, src_sizes)):
        raise Unsupported(f"{op} whose index is not provably within src")
    for d, (i, s) in enumerate(zip(index.shape, src.shape)):
        if not sh.equal(i, s):
            src = ctx.make(Op.SLICE, (src,), (d, sympy.Integer(0), sympy.Integer(1), i))
    return src


@register(aten.scatter_reduce.two)
def _scatter_reduce(ctx: Context, x: Node, dim: int, index: Node, src: Node, reduce: str,
                    *, include_self: bool = True) -> Node:
    """sum, mean, amax and amin (prod, a multiply no backend has atomically, stays ATen's). Where
    ``include_self`` is False, the elements written start from their first value and the others
    keep self's: a count of the writes at each element (an int32 scatter_add) tells them apart.
    amax/amin combine atomically into a buffer holding their identity, then with self, so a NaN
    of self's is taken as torch.maximum takes it; a NaN written wins, as in eager."""
    if reduce == "sum" and include_self:
        return _scatter_add(ctx, x, dim, index, src)
    if reduce not in ("sum", "mean", "amax", "amin"):
        raise Unsupported(f"scatter_reduce {reduce!r}")
    indices, src = _scatter_indices(ctx, "scatter_reduce", x, dim, index, src)
    if x.dtype.is_bool:
        raise Unsupported(f"scatter_reduce {reduce!r} of bools")
    count = None
    if reduce == "mean" or not include_self:
        zeros = ctx.operand(0, dt.int32, x.shape)
        count = _put(ctx, zeros, 0, indices, ctx.operand(1, dt.int32, src.shape), True, 4)
    if reduce in ("amax", "amin"):
        floats = x.dtype.is_float
        if reduce == "amax":
            identity = float("-inf") if floats else torch.iinfo(dt.to_torch(x.dtype)).min
        else:
            identity = float("inf") if floats else torch.iinfo(dt.to_torch(x.dtype)).max
        best = _put(ctx, ctx.operand(identity, x.dtype, x.shape), 0, indices, src, reduce, 4)
        if include_self:
            return ctx.make(Op.MAX if reduce == "amax" else Op.MIN, (x, best))
        return ctx.make(Op.WHERE, (ctx.make(Op.GT, (count, ctx.operand(0, dt.int32, x.shape))), best, x))
    base = x if include_self else ctx.operand(0, x.dtype, x.shape)
    total = _put(ctx, base, 0, indices, src, True, 4)
    if reduce == "sum":
        return ctx.make(Op.WHERE, (ctx.make(Op.GT, (count, ctx.operand(0, dt.int32, x.shape))), total, x))
    # mean: eager divides by the count of values (self's one among them), floored for integers,
    # and an element nothing was written to keeps self (divided by 1)
    ones = ctx.operand(1, dt.int32, x.shape)
    divisor = ctx.make(Op.ADD, (count, ones)) if include_self else ctx.make(Op.MAX, (count, ones))
    mean = ctx.make(Op.DIV if x.dtype.is_float else Op.FLOORDIV, (total, ctx.cast(divisor, x.dtype)))
    if include_self:
        return mean
    return ctx.make(Op.WHERE, (ctx.make(Op.GT, (count, ctx.operand(0, dt.int32, x.shape))), mean, x))


@register(torch.ops.ember.bag_bounds.default)
def _bag_bounds(ctx: Context, offsets: Node, total: Any, include_last_offset: bool) -> Node:
    """embedding_bag's bag bounds on a GPU: its offsets and, unless they include it, T after
    them (a cat the segment kernel reads through, no call of the op: its Python dispatch cost a
    training step 85 us of host time on an H200). Eager's GPU kernels do not check the offsets;
    on the CPU the op runs, and checks them as eager's CPU kernel does."""
    if ctx.device == "cpu" or offsets.rank != 1 or not offsets.dtype.is_int:
        raise Unsupported("embedding_bag's offsets on the CPU: the op checks them")
    if include_last_offset:
        return offsets
    last = ctx.reshape(ctx.const(total, offsets.dtype), [sympy.Integer(1)])
    return ctx.make(Op.CAT, (offsets, last), 0)


@register(torch.ops.ember.segment_reduce.default)
def _segment_reduce(ctx: Context, values: Node, offsets: Node, reduce: str) -> Node:
    """ember.ragged's per-row reductions: a kernel whose programs each read their row's offsets
    and reduce its values (no scatter, no row ids)."""
    op = {"sum": Op.SUM, "amax": Op.AMAX, "amin": Op.AMIN}.get(reduce)
    if op is None or values.rank < 1 or offsets.rank != 1 or not offsets.dtype.is_int:
        raise Unsupported("segment_reduce with arguments eager rejects")  # eager raises its error
    if values.dtype.is_bool or (op is Op.SUM and values.dtype.is_low_precision):
        raise Unsupported("segment_reduce of bools, or a 16-bit sum (ember.ragged sums in float32)")
    if sh.is_one(offsets.shape[0] - 1):
        # one row (a batch of one, a size Dynamo specializes): its offsets run from 0 to T, as a
        # Ragged validated, so the row is every packed row, a plain reduction over dim 0 (the
        # segment kernel's rows would be a dim of size 1, which the planner drops). An empty
        # row gives the reduction's identity there too
        return ctx.make(op, (values,), (0,))
    return ctx.make(Op.SEGMENT_REDUCE, (values, offsets), op)
