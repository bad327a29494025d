"""Lowerings of cumulative scans: cumsum, cumprod, logcumsumexp, cummax and cummin, each an Op.SCAN
along a dim (cummax and cummin two: their values, then their indices).

A scan is a kernel of its own kind (schedule/domains.py): each row along the dim is walked in
order, its producers fused into its loads and its pointwise consumers into its stores. Before
these, each ran as an ATen call that split the fused kernels around it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node, ScanArg
from ..ir.ops import Op
from .context import Context, Unsupported, register

aten = torch.ops.aten

_COMBINE = {"aten.cumsum": "sum", "aten.cumprod": "prod", "aten.logcumsumexp": "logsumexp"}


@register(aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default)
def _scan(ctx: Context, x: Node, dim: int, *, dtype: Any = None) -> Node:
    """The input converted to the result's dtype first (eager's ``dtype=`` and its promotion of
    integers and bools to int64), then scanned in it: integers in int64 arithmetic, whose low
    bits are the narrower type's; 16-bit floats accumulate in float32 and round each result,
    as eager's kernels do (its CPU kernel sums float32 in double: so does ember's)."""
    combine = _COMBINE[ctx.aten]
    out = ctx.out_dtype
    if combine == "logsumexp" and not out.is_float:
        raise Unsupported("logcumsumexp of integers (ATen raises eager's error)")
    if out.is_bool:
        raise Unsupported(f"a {ctx.aten} into bool")
    x = ctx.cast(x, out)
    if x.rank == 0:
        return x  # (one element: the scan is the element, -0.0 too, as eager's copy of it)
    d = dim % x.rank
    if any(sh.equal(s, 0) for s in x.shape):
        return x  # no elements at all
    if sh.is_one(x.shape[d]):
        # one element along the dim: its own scan, but a cumsum or logcumsumexp of -0.0 is
        # 0.0 in eager (its sums start from 0.0, its logaddexp from -inf: -0.0 + log1p(0)).
        # eager's CUDA scans copy a tensor of one element, keeping -0.0
        alone = ctx.device != "cpu" and all(sh.is_one(s) for s in x.shape)
        return x if combine == "prod" or alone else ctx.sum_of_one(x)
    return ctx.make(Op.SCAN, (x,), ScanArg(combine, d))


_EXTREMUM = {"aten.cummax": "max", "aten.cummin": "min"}


@register(aten.cummax.default, aten.cummin.default)
def _cummax_cummin(ctx: Context, x: Node, dim: int) -> tuple[Node, Node]:
    """Values and indices as eager's rule (ATen's cummax_cummin_helper): an element replaces the
    best so far where it is NaN, or where the best is not NaN and it is >= it (<= for cummin): ties
    take the later index, a NaN sticks (the latest NaN's index), -0.0 replaces 0.0. The values are
    a scan of that combine; the indices need no pair of carries: element j replaced the best
    exactly where the values' scan at j is x[j] itself (equal, or both NaN: where it did not, the
    best stayed strictly beyond x[j], or NaN against a number), so the index at i is the last such
    j <= i, a running max of ``j where replaced else 0`` (element 0 always replaces)."""
    combine = _EXTREMUM[ctx.aten]
    values_dtype = x.dtype
    if x.dtype.is_bool:  # (bools scanned as 0 and 1: the same order)
        x = ctx.cast(x, dt.uint8)
    if x.rank == 0 and dim not in (-1, 0):  # (the trace lets it by: ATen raises eager's IndexError)
        raise Unsupported(f"{ctx.aten} of a 0-d tensor along dim {dim}")
    shape = x.shape
    d = dim % x.rank if x.rank else 0
    if x.rank == 0 or sh.is_one(shape[d]) or any(sh.equal(s, 0) for s in shape):
        # one element along the dim (its own best, index 0), or none at all
        return ctx.cast(x, values_dtype), ctx.expand_to(ctx.const(0, dt.int64), shape)
    values = ctx.make(Op.SCAN, (x,), ScanArg(combine, d))
    replaced = ctx.make(Op.EQ, (values, x))
    if x.dtype.is_float:
        both_nan = ctx.make(Op.AND, (ctx.make(Op.ISNAN, (values,)), ctx.make(Op.ISNAN, (x,))))
        replaced = ctx.make(Op.OR, (replaced, both_nan))
    positions = ctx.make(Op.IOTA, (), (shape[d], 0, 1), dtype=dt.int64)
    positions = ctx.expand_to(ctx.reshape(positions, [s if i == d else 1 for i, s in enumerate(shape)]), shape)
    taken = ctx.make(Op.WHERE, (replaced, positions, ctx.expand_to(ctx.const(0, dt.int64), shape)))
    indices = ctx.make(Op.SCAN, (taken,), ScanArg("max", d))
    return ctx.cast(values, values_dtype), indices
