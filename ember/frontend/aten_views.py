"""Lowerings of views and shape ops: view/reshape, permute, expand, squeeze/unsqueeze, slice,
select, split, and the ops that assemble along a dim: cat, roll and constant_pad_nd.

A slice or select starts where the traced op's storage offsets say (torch wraps and clamps a
negative start under its shape guards), so symbolic starts come out as eager's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node, SizeCheck
from ..ir.ops import Op
from .aten_scalars import checked_scalar, scalar_fits
from .context import Context, Unsupported, register, size_arg

aten = torch.ops.aten


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(ctx: Context, x: Node, size: Sequence[Any]) -> Node:
    return ctx.reshape(x, ctx.out_shape)  # the recorded shape has any -1 resolved


@register(aten.permute.default)
def _permute(ctx: Context, x: Node, dims: Sequence[int]) -> Node:
    dims = tuple(d % x.rank for d in dims) if x.rank else ()
    if dims == tuple(range(x.rank)):
        return x
    return ctx.make(Op.PERMUTE, (x,), dims)


@register(aten.expand.default)
def _expand(ctx: Context, x: Node, size: Sequence[Any], implicit: bool = False) -> Node:
    return ctx.expand_to(x, ctx.out_shape)


@register(aten.unsqueeze.default, aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze_unsqueeze(ctx: Context, x: Node, *_: Any) -> Node:
    return ctx.reshape(x, ctx.out_shape)


def _start_in_metas(ctx: Context, dim: int) -> sympy.Expr | None:
    """Where a slice or select starts along ``dim``, as the traced op computed it: the distance
    between the output's and the input's storage offsets, in strides. Torch wraps a negative start
    and clamps it to the size under its shape guards (``x[-k:]`` with a symbolic ``k``, ``x[-5:]``
    recompiled for a size under 5), which the op's arguments alone do not say. None where the
    stride cannot tell (a broadcast dim)."""
    x, out = ctx.arg_metas[0] if ctx.arg_metas else None, ctx.out
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    stride = sh.expr(x.stride()[dim])
    if (int(stride) <= 0) if stride.is_Integer else not ctx.known(x.stride()[dim] > 0):
        return None
    start = sympy.cancel((sh.expr(out.storage_offset()) - sh.expr(x.storage_offset())) / stride)
    return start if sympy.fraction(start)[1] == 1 else None


def _slice_start(ctx: Context, dim: int, start: Any, size: sympy.Expr) -> sympy.Expr:
    traced = _start_in_metas(ctx, dim)
    if traced is not None:
        return traced
    if start is None:
        return sympy.Integer(0)
    start = size_arg(start)
    if not start.is_Integer:
        raise Unsupported("slice with a symbolic start whose sign and range the traced op does not record")
    if int(start) < 0:  # from the end, and from 0 where the size is shorter
        start = sympy.Max(0, size + start)
    return sympy.Min(start, size)


@register(aten.slice.Tensor)
def _slice(ctx: Context, x: Node, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Node:
    dim = dim % x.rank
    length = ctx.out_shape[dim]
    first = _slice_start(ctx, dim, start, x.shape[dim])
    step = size_arg(step)  # (a SymInt step, x[::k], arrives as its scalar node)
    if sh.equal(first, 0) and sh.equal(step, 1) and sh.equal(length, x.shape[dim]):
        return x
    return ctx.make(Op.SLICE, (x,), (dim, first, step, length))


@register(aten.select.int)
def _select(ctx: Context, x: Node, dim: int, index: Any) -> Node:
    dim = dim % x.rank
    index = size_arg(index)
    size = sh.static(x.shape[dim])
    if index.is_Integer and size is not None and not -size <= int(index) < size:
        # (torch before 2.13 traces it without eager's check): ATen raises eager's IndexError
        raise Unsupported("select index out of range")
    traced = _start_in_metas(ctx, dim)
    if traced is not None:
        index = traced
    elif not index.is_Integer:
        raise Unsupported("select at a symbolic index whose sign the traced op does not record")
    elif int(index) < 0:
        index = x.shape[dim] + index
    one = ctx.make(Op.SLICE, (x,), (dim, index, sympy.Integer(1), sympy.Integer(1)))
    return ctx.reshape(one, ctx.out_shape)


@register(aten.split_with_sizes.default, aten.split.Tensor)
def _split(ctx: Context, x: Node, sizes: Any, dim: int = 0) -> tuple[Node, ...]:
    dim = dim % x.rank
    outs, start = [], sympy.Integer(0)
    for meta in ctx.out:
        length = sh.expr(meta.shape[dim])
        outs.append(ctx.make(Op.SLICE, (x,), (dim, start, sympy.Integer(1), length)))
        start = start + length
    return tuple(outs)


@register(aten.cat.default)
def _cat(ctx: Context, tensors: Sequence[Any], dim: int = 0) -> Node:
    shape = ctx.out_shape
    dim = dim % len(shape)
    parts = [ctx.cast(t, ctx.out_dtype) for t in tensors
             if not (t.rank == 1 and sh.equal(t.shape[0], 0) and len(shape) > 1)]  # legacy empty inputs
    if any(t.rank != len(shape) for t in parts):
        raise Unsupported("cat of tensors of different ranks")
    parts = [t for t in parts if not sh.equal(t.shape[dim], 0)] or parts[:1]
    return parts[0] if len(parts) == 1 else ctx.make(Op.CAT, parts, dim)


@register(aten.roll.default)
def _roll(ctx: Context, x: Node, shifts: Any, dims: Any = ()) -> Node:
    """roll along a dim: the rows past the shift, then the rest (a cat of two slices, which
    fuses with what reads it; the decomposition's index_select along another dim than the first
    ran through ATen). Sizes and shifts may be symbolic (the shift taken modulo the size, in
    Python's sign convention as eager's): a size that may be 0 goes to ATen."""
    shifts = list(shifts) if isinstance(shifts, (list, tuple)) else [shifts]
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if not dims or len(shifts) != len(dims) or x.rank == 0:
        raise Unsupported("roll of the flattened tensor (or shifts and dims of other lengths)")
    out = x
    one = sympy.Integer(1)
    for shift, dim in zip(shifts, dims):
        dim, shift = dim % x.rank, size_arg(shift)
        size = sh.expr(x.shape[dim])
        if size.is_Integer and (size == 0 or shift.is_Integer and int(shift) % int(size) == 0):
            continue
        if not ctx.known_nonzero(size):
            raise Unsupported("roll along a size that may be 0")
        # (a whole turn leaves the tail empty: the cat is then the input, as eager's roll)
        keep = sympy.expand(size - sympy.Mod(shift, size))
        tail = ctx.make(Op.SLICE, (out,), (dim, keep, one, sympy.expand(size - keep)))
        head = ctx.make(Op.SLICE, (out,), (dim, sympy.Integer(0), one, keep))
        out = ctx.make(Op.CAT, (tail, head), dim)
    return out


def _narrowed_size_check(ctx: Context, size: Any, left: sympy.Expr) -> None:
    """eager narrows the input by each negative amount of padding first, and raises where one
    takes more than the dim holds (``F.pad(x, (-3, 5))`` of 2 elements), whatever the output's
    size: ATen's call raises it for a static size, the host program for a symbolic one.
    ``size``: the dim's traced size plus the amount (a SymInt or an int), ``left`` the same as
    a size expression."""
    if ctx.known(size >= 0):
        return
    if isinstance(size, int):
        raise Unsupported("negative padding beyond the input's size: ATen raises")
    check = SizeCheck(sympy.expand(left), 0, 2**63 - 1, "RuntimeError", "narrow(): length must be non-negative.")
    if check not in ctx.size_checks:
        ctx.size_checks.append(check)


@register(aten.constant_pad_nd.default)
def _constant_pad(ctx: Context, x: Node, pad: Sequence[Any], value: Any = 0) -> Node:
    pairs = [(sympy.Integer(0), sympy.Integer(0))] * x.rank
    for i in range(len(pad) // 2):  # pad lists the last dim first, (lo, hi) each
        pairs[x.rank - 1 - i] = (size_arg(pad[2 * i]), size_arg(pad[2 * i + 1]))
        for amount in pad[2 * i:2 * i + 2]:
            if isinstance(amount, int) and amount < 0:
                dim = x.rank - 1 - i
                _narrowed_size_check(ctx, ctx.arg_metas[0].shape[dim] + amount, sh.expr(x.shape[dim]) + amount)
    if isinstance(value, (int, float)) and not scalar_fits(value, dt.to_torch(x.dtype), wraps=False):
        raise Unsupported(f"pad value {value} does not fit {x.dtype}: ATen raises")
    return ctx.make(Op.PAD, (x, ctx.const(checked_scalar(value, x.dtype), x.dtype)), tuple(pairs))
