"""Lowerings of cumulative scans: cumsum, cumprod and logcumsumexp, each an Op.SCAN along a dim.

A scan is a kernel of its own kind (schedule/domains.py): each row along the dim is walked in
order, its producers fused into its loads and its pointwise consumers into its stores. Before
these, each ran as an ATen call that split the fused kernels around it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import shapes as sh
from ..ir.node import Node, ScanArg
from ..ir.ops import Op
from .lowering import Context, Unsupported, register

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
        return x  # (one element: the scan is the element)
    d = dim % x.rank
    if sh.is_one(x.shape[d]) or any(sh.equal(s, 0) for s in x.shape):
        return x  # one element along the dim (its own scan), or none at all
    return ctx.make(Op.SCAN, (x,), ScanArg(combine, d))
