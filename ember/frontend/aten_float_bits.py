"""Lowerings of ATen's sign and magnitude ops and integer gcd/lcm: hypot, copysign, signbit,
nextafter, fmax and fmin, gcd and lcm.

Each computes in the dtype eager computes in; a dtype eager's kernel has no implementation for
(hypot of integers, gcd of floats) stays an ATen call, which raises eager's own error.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import dtypes as dt
from ..ir.node import Node
from ..ir.ops import Op
from .context import Context, Unsupported, register

aten = torch.ops.aten


def _operands(ctx: Context, a: Any, b: Any, dtype: dt.DType) -> tuple[Node, Node]:
    shape = ctx.out_shape
    return ctx.operand(a, dtype, shape), ctx.operand(b, dtype, shape)


@register(aten.hypot.default)
def _hypot(ctx: Context, a: Any, b: Any) -> Node:
    dtype = ctx.out_dtype
    if not dtype.is_float:  # (eager's "hypot_cpu" not implemented for 'Long')
        raise Unsupported(f"hypot of {dtype} (ATen's NotImplementedError)")
    return ctx.make(Op.HYPOT, _operands(ctx, a, b, dtype))


@register(aten.copysign.Tensor, aten.copysign.Scalar)
def _copysign(ctx: Context, a: Any, b: Any) -> Node:
    # (integer and bool operands promote to the default float dtype: ctx.out_dtype is a float)
    return ctx.make(Op.COPYSIGN, _operands(ctx, a, b, ctx.out_dtype))


@register(aten.nextafter.default)
def _nextafter(ctx: Context, a: Any, b: Any) -> Node:
    dtype = ctx.out_dtype
    if dtype not in (dt.float32, dt.float64):
        # integers: eager's NotImplementedError; 16-bit floats step in their own 16 bits in
        # eager, which ember's float32 arithmetic on them would not
        raise Unsupported(f"nextafter of {dtype}")
    return ctx.make(Op.NEXTAFTER, _operands(ctx, a, b, dtype))


@register(aten.signbit.default)
def _signbit(ctx: Context, x: Node) -> Node:
    if x.dtype.is_float:
        return ctx.make(Op.SIGNBIT, (x,))
    if x.dtype.is_bool or x.dtype == dt.uint8:
        return ctx.operand(False, dt.bool_, x.shape)
    return ctx.make(Op.LT, (x, ctx.operand(0, x.dtype, x.shape)))


@register(aten.fmax.default, aten.fmin.default)
def _fmax_fmin(ctx: Context, a: Any, b: Any) -> Node:
    dtype = ctx.out_dtype
    a, b = _operands(ctx, a, b, dtype)
    is_max = ctx.aten == "aten.fmax"
    if dtype.is_bool:
        return ctx.make(Op.OR if is_max else Op.AND, (a, b))
    if not dtype.is_float:
        return ctx.make(Op.MAX if is_max else Op.MIN, (a, b))
    # a NaN loses to a number (both NaN: NaN). Of -0.0 and 0.0 eager's CPU kernels keep the
    # first, bfloat16's the second (measured, vectorized or not): a comparison decides, where
    # maximum's tie would be the backend's
    keep_first = dtype != dt.bfloat16
    cmp = (Op.GE if keep_first else Op.GT) if is_max else (Op.LE if keep_first else Op.LT)
    take_a = ctx.make(Op.OR, (ctx.make(Op.ISNAN, (b,)), ctx.make(cmp, (a, b))))
    return ctx.make(Op.WHERE, (take_a, a, b))


@register(aten.gcd.default, aten.lcm.default)
def _gcd_lcm(ctx: Context, a: Any, b: Any) -> Node:
    dtype = ctx.out_dtype
    op = Op.GCD if ctx.aten == "aten.gcd" else Op.LCM
    if not dtype.is_int or dtype.is_bool:  # (eager's integer kernels exclude floats and bools)
        raise Unsupported(f"{op.value} of {dtype} (ATen's NotImplementedError)")
    return ctx.make(op, _operands(ctx, a, b, dtype))
