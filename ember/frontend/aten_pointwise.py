"""Lowerings of ATen's pointwise ops: one input (neg, exp, the trigonometric functions, round,
isnan, relu, gelu, leaky_relu, elu, ...), two inputs (arithmetic, comparisons, bitwise, logical
and shift ops, add/sub with alpha, division with its rounding modes, pow), where and clamp
(hardtanh).

Each computes in the dtype eager computes in, with eager's treatment of 16-bit floats and of
scalar operands (rounded to 16 bits: aten_scalars.py; or read in float32, ``_read_in_float32``);
a call whose ATen kernel rejects the dtype stays an ATen call, which raises eager's error.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node
from ..ir.ops import Op
from .aten_scalars import _rounded_to, _symbolic, checked_scalar
from .context import Context, Unsupported, register

aten = torch.ops.aten


def _float_of(dtype: dt.DType) -> dt.DType:
    return dtype if dtype.is_float else dt.float32


# ---------------------------------------------------------------------------------------------
# pointwise: one input
# ---------------------------------------------------------------------------------------------

_UNARY = {
    aten.neg: Op.NEG, aten.abs: Op.ABS, aten.exp: Op.EXP, aten.exp2: Op.EXP2, aten.expm1: Op.EXPM1,
    aten.log: Op.LOG, aten.log2: Op.LOG2, aten.log10: Op.LOG10, aten.log1p: Op.LOG1P,
    aten.sqrt: Op.SQRT, aten.rsqrt: Op.RSQRT, aten.reciprocal: Op.RECIPROCAL, aten.sin: Op.SIN,
    aten.cos: Op.COS, aten.tan: Op.TAN, aten.asin: Op.ASIN, aten.acos: Op.ACOS, aten.atan: Op.ATAN,
    aten.sinh: Op.SINH, aten.cosh: Op.COSH, aten.tanh: Op.TANH, aten.asinh: Op.ASINH,
    aten.acosh: Op.ACOSH, aten.atanh: Op.ATANH, aten.sigmoid: Op.SIGMOID, aten.erf: Op.ERF,
    aten.erfc: Op.ERFC, aten.floor: Op.FLOOR, aten.ceil: Op.CEIL, aten.trunc: Op.TRUNC,
    aten.sign: Op.SIGN, aten.bitwise_not: Op.BITNOT,
}


def _unary(op: Op):
    def lower(ctx: Context, x: Node) -> Node:
        if op in (Op.FLOOR, Op.CEIL, Op.TRUNC) and x.dtype.is_int and not x.dtype.is_bool:
            return x  # identity on integers, as in ATen
        _check_dtype(op, ctx.out_dtype)
        return ctx.make(op, (ctx.cast(x, ctx.out_dtype),))
    return lower


for _target, _op in _UNARY.items():
    register(_target.default)(_unary(_op))
# x.conj().imag: a view whose negative bit ATen reads as -x; a kernel reading its memory would
# read x itself, so its value is computed
register(aten._neg_view.default)(_unary(Op.NEG))


@register(aten.round.default)
def _round(ctx: Context, x: Node) -> Node:
    _check_dtype(Op.ROUND, x.dtype)
    return x if x.dtype.is_int else ctx.make(Op.ROUND, (x,))


@register(aten.round.decimals)
def _round_decimals(ctx: Context, x: Node, decimals: int = 0) -> Node:
    if not x.dtype.is_float:  # (eager's round_cpu has no integer kernel: NotImplementedError)
        raise Unsupported(f"round(decimals=) of {x.dtype} (ATen's NotImplementedError)")
    # eager's kernel, in its op math type (float32 for 16-bit floats): 10**|decimals| as that
    # type, then nearbyint(x * p) / p, or nearbyint(x / p) * p for negative decimals
    compute = dt.compute_dtype(x.dtype)
    wide = ctx.cast(x, compute)
    power = ctx.operand(float(10 ** abs(decimals)), compute, x.shape)
    if decimals < 0:
        out = ctx.make(Op.MUL, (ctx.make(Op.ROUND, (ctx.make(Op.DIV, (wide, power)),)), power))
    else:
        out = ctx.make(Op.DIV, (ctx.make(Op.ROUND, (ctx.make(Op.MUL, (wide, power)),)), power))
    return ctx.cast(out, x.dtype)


@register(aten.logical_not.default)
def _logical_not(ctx: Context, x: Node) -> Node:
    return ctx.make(Op.NOT, (ctx.cast(x, dt.bool_),))


@register(aten.isnan.default, aten.isinf.default)
def _isnan_isinf(ctx: Context, x: Node) -> Node:
    op = Op.ISNAN if "isnan" in (ctx.aten or "") else Op.ISINF
    if x.dtype is None:
        raise Unsupported(f"{op.value} of a dtype ember does not generate (complex)")
    if not x.dtype.is_float:
        return ctx.operand(False, dt.bool_, x.shape)
    return ctx.make(op, (x,))


@register(aten.relu.default)
def _relu(ctx: Context, x: Node) -> Node:
    if x.dtype.is_bool:
        raise Unsupported("relu of bools (ATen's RuntimeError)")
    return ctx.make(Op.MAX, (x, ctx.operand(0, x.dtype, x.shape)))


@register(aten.gelu.default)
def _gelu(ctx: Context, x: Node, approximate: str = "none") -> Node:
    if not x.dtype.is_float:
        raise Unsupported("gelu of integers (ATen's NotImplementedError)")
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    c = lambda v: ctx.operand(v, x.dtype, x.shape)  # noqa: E731
    if approximate == "tanh":
        inner = ctx.make(Op.MUL, (c(math.sqrt(2 / math.pi)), ctx.make(Op.ADD, (x, ctx.make(
            Op.MUL, (c(0.044715), ctx.make(Op.MUL, (x, ctx.make(Op.MUL, (x, x))))))))))
        t = ctx.make(Op.ADD, (c(1.0), ctx.make(Op.TANH, (inner,))))
    else:
        t = ctx.make(Op.ADD, (c(1.0), ctx.make(Op.ERF, (ctx.make(Op.MUL, (x, c(math.sqrt(0.5)))),))))
    return ctx.make(Op.MUL, (ctx.make(Op.MUL, (x, c(0.5))), t))


@register(aten.hardtanh.default)
def _hardtanh(ctx: Context, x: Node, min_val: float = -1.0, max_val: float = 1.0) -> Node:
    return _clamp(ctx, x, min_val, max_val)


@register(aten.leaky_relu.default)
def _leaky_relu(ctx: Context, x: Node, slope: float = 0.01) -> Node:
    if not x.dtype.is_float:
        raise Unsupported("leaky_relu of integers (ATen's NotImplementedError)")
    slope = checked_scalar(slope, _op_math(x.dtype))  # (1e39 raises in eager, float16's too)
    zero = ctx.operand(0, x.dtype, x.shape)
    return ctx.make(Op.WHERE, (ctx.make(Op.GT, (x, zero)), x,
                               ctx.make(Op.MUL, (x, ctx.operand(slope, x.dtype, x.shape)))))


@register(aten.elu.default)
def _elu(ctx: Context, x: Node, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Node:
    if not x.dtype.is_float:
        raise Unsupported("elu of integers (ATen's NotImplementedError)")
    alpha, scale, input_scale = (checked_scalar(v, _op_math(x.dtype)) for v in (alpha, scale, input_scale))
    c = lambda v: ctx.operand(v, x.dtype, x.shape)  # noqa: E731
    neg = ctx.make(Op.MUL, (c(alpha), ctx.make(Op.EXPM1, (ctx.make(Op.MUL, (x, c(input_scale))),))))
    pos = ctx.make(Op.GT, (x, c(0)))
    return ctx.make(Op.MUL, (ctx.make(Op.WHERE, (pos, x, neg)), c(scale)))


def _op_math(dtype: dt.DType) -> dt.DType:
    """The type eager's float kernels compute in, and convert their Python numbers to."""
    return dt.float64 if dtype == dt.float64 else dt.float32


# ---------------------------------------------------------------------------------------------
# pointwise: two inputs
# ---------------------------------------------------------------------------------------------

# Ops whose ATen kernels reject some dtypes: such calls stay ATen calls, so the user gets eager's
# own error (a meta kernel does not check dtypes, so Dynamo traces them happily).
_INTEGER_ONLY = {Op.BITAND, Op.BITOR, Op.BITXOR, Op.SHL, Op.SHR, Op.BITNOT}
_NO_BOOL = {Op.SUB, Op.NEG, Op.ABS, Op.SHL, Op.SHR, Op.MOD, Op.FMOD, Op.ATAN2, Op.FLOOR, Op.CEIL, Op.TRUNC,
            Op.ROUND}


def _check_dtype(op: Op, dtype: dt.DType) -> None:
    if op in _INTEGER_ONLY and dtype.is_float or op in _NO_BOOL and dtype.is_bool:
        raise Unsupported(f"ATen's {op.value} rejects {dtype}")


def _binary(op: Op, *, compute: str = "result"):
    """compute='result': operate in the result dtype (arithmetic); 'promoted': in the promoted
    dtype of the operands (comparisons, whose result is bool)."""
    def lower(ctx: Context, a: Any, b: Any) -> Node:
        dtype = ctx.out_dtype if compute == "result" else ctx.promoted(0, 1)
        _check_dtype(op, dtype)
        shape = ctx.out_shape
        if dtype.is_low_precision and (compute == "promoted" or op in (Op.MOD, Op.FMOD)):
            # eager compares a 16-bit tensor with a Python float rounded to 16 bits (bf16 0.3 ==
            # 0.3 holds), and takes remainders by the rounded float too; products and quotients
            # take the float as it is
            a, b = (_rounded_to(x, dtype) for x in (a, b))
        if op is Op.MUL and _read_in_float32(b, dtype):
            return _in_float32(ctx, op, a, b, dtype, shape)
        return ctx.make(op, (ctx.operand(a, dtype, shape), ctx.operand(b, dtype, shape)))
    return lower


def _read_in_float32(b: Any, dtype: dt.DType) -> bool:
    """Whether eager reads the second operand ``b`` of a 16-bit product or quotient (on a GPU,
    either operand of a sum too) as a float32 scalar: a 0-d tensor of another dtype on the CPU
    (its CPU kernels' scalar path), or one a GPU kernel takes from the host (a CPU scalar).
    Rounded to 16 bits first, 1e5 would be inf."""
    if not (dtype.is_low_precision and isinstance(b, Node) and b.rank == 0 and b.dtype != dtype):
        return False
    return b.device == "cpu" or b.op is Op.INPUT and b.arg.to_device is not None


def _in_float32(ctx: Context, op: Op, a: Any, b: Node, dtype: dt.DType, shape: sh.Shape) -> Node:
    out = ctx.make(op, (ctx.operand(a, dt.float32, shape), ctx.operand(b, dt.float32, shape)))
    return ctx.cast(out, dtype)


for _packet, _op in {
    aten.mul: Op.MUL, aten.maximum: Op.MAX, aten.minimum: Op.MIN, aten.atan2: Op.ATAN2,
    aten.fmod: Op.FMOD, aten.remainder: Op.MOD, aten.bitwise_and: Op.BITAND,
    aten.bitwise_or: Op.BITOR, aten.bitwise_xor: Op.BITXOR, aten.bitwise_left_shift: Op.SHL,
    aten.bitwise_right_shift: Op.SHR,
    # (x << n and x >> n: the operators' own ATen ops, with the bitwise shifts' kernels)
    aten.__lshift__: Op.SHL, aten.__rshift__: Op.SHR,
}.items():
    for _name in ("Tensor", "Scalar", "Scalar_Tensor", "Tensor_Scalar", "default"):
        if hasattr(_packet, _name):
            register(getattr(_packet, _name))(_binary(_op))

for _packet, _op in {
    aten.eq: Op.EQ, aten.ne: Op.NE, aten.lt: Op.LT, aten.le: Op.LE, aten.gt: Op.GT, aten.ge: Op.GE,
}.items():
    register(_packet.Tensor, _packet.Scalar)(_binary(_op, compute="promoted"))


@register(aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default)
def _logical(ctx: Context, a: Node, b: Node) -> Node:
    op = {"aten.logical_and": Op.AND, "aten.logical_or": Op.OR, "aten.logical_xor": Op.XOR}[ctx.aten]
    shape = ctx.out_shape
    return ctx.make(op, (ctx.operand(a, dt.bool_, shape), ctx.operand(b, dt.bool_, shape)))


@register(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(ctx: Context, a: Any, b: Any, alpha: Any = 1) -> Node:
    dtype, shape = ctx.out_dtype, ctx.out_shape
    if ctx.aten == "aten.sub":
        _check_dtype(Op.SUB, dtype)
        if any(isinstance(x, bool) or isinstance(x, Node) and x.dtype.is_bool for x in (a, b)):
            raise Unsupported("subtraction with a bool (ATen's RuntimeError)")
    if dtype.is_low_precision and ctx.device == "cpu":
        # eager's CPU kernels add a 16-bit tensor and a Python float rounded to 16 bits (bf16
        # 1.703 + 1000.3 is 1000, not 1004); its GPU kernels, like its products, take it as is
        a, b = (_rounded_to(x, dtype) for x in (a, b))
    op = Op.ADD if ctx.aten == "aten.add" else Op.SUB
    if isinstance(alpha, bool) and not dtype.is_bool or isinstance(alpha, float) and not dtype.is_float:
        # ATen checks alpha against the result's dtype: a bool alpha only for bools, a float
        # one only for floats (its RuntimeError)
        raise Unsupported(f"alpha {alpha!r} for a {dtype} result (ATen's RuntimeError)")
    alpha = checked_scalar(alpha, dtype)
    if dtype.is_low_precision and ctx.device == "cpu" and alpha != 1:
        # (and alpha: its vectorized loop, the bulk of a tensor, multiplies by the rounded alpha)
        alpha = _rounded_to(alpha, dtype)
    # a GPU kernel reads a CPU scalar of another dtype (a float Dynamo passes as a 0-d tensor)
    # in float32, as it reads a Python float (eager's CPU kernels cast it, as above)
    wide = ctx.device != "cpu" and any(_read_in_float32(x, dtype) for x in (a, b))
    compute = dt.float32 if wide else dtype
    rhs = ctx.operand(b, compute, shape)
    if alpha != 1:
        rhs = ctx.make(Op.MUL, (rhs, ctx.operand(alpha, compute, shape)))
    if wide:
        return _in_float32(ctx, op, a, rhs, dtype, shape)
    return ctx.make(op, (ctx.operand(a, dtype, shape), rhs))


# (true_divide is div; torch's pass that turns float size arithmetic into 0-d tensors, a
# dynamic group norm's 1 / (H*W*C/G) in its backward, writes it after decomposition)
@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode,
          aten.true_divide.Tensor, aten.true_divide.Scalar)
def _div(ctx: Context, a: Any, b: Any, rounding_mode: str | None = None) -> Node:
    dtype, shape = ctx.out_dtype, ctx.out_shape
    if rounding_mode is None:
        dtype = _float_of(dtype)
        op = Op.DIV
    elif dtype.is_bool:
        raise Unsupported("rounding division of bools")
    else:
        op = Op.FLOORDIV if rounding_mode == "floor" else Op.TRUNCDIV
        on_cpu = ctx.device == "cpu"
        if dtype.is_low_precision:
            # a Python number dividend (70000.0 // x) is converted to the tensor's dtype (float16:
            # inf, and inf // x is NaN), on GPUs too (measured on an H100); only a scalar divisor
            # is read in float32
            a = _rounded_to(a, dtype)
        if dtype.is_low_precision and (not isinstance(b, Node) or (_one_element(b) if on_cpu else op is Op.FLOORDIV)):
            # eager divides a 16-bit tensor in float32 by a scalar (a Python number; on the CPU
            # any one element broadcast), the scalar unrounded, and floor-divides by any divisor
            # so on GPUs: x // 0.1 of 128.375 is 1283, where the CPU's 16-bit steps for a tensor
            # divisor give 1282 (its GPU trunc division of tensors takes the steps too; measured)
            return _in_float32(ctx, op, a, b, dtype, shape)
    if _read_in_float32(b, dtype):
        return _in_float32(ctx, op, a, b, dtype, shape)
    return ctx.make(op, (ctx.operand(a, dtype, shape), ctx.operand(b, dtype, shape)))


def _one_element(x: Node) -> bool:
    """Whether every element of ``x`` is one element in memory (0-d, size-1 dims, or broadcast
    with stride 0), which eager's CPU kernels read as a scalar."""
    if x.op is Op.EXPAND:
        x = x.inputs[0]
    if all(sh.is_one(d) for d in x.shape):
        return True
    strides = x.arg.strides if x.op is Op.INPUT and x.arg.kind == "tensor" else None
    return bool(strides) and all(sh.equal(st, 0) or sh.is_one(d) for st, d in zip(strides, x.shape))


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(ctx: Context, base: Any, exponent: Any) -> Node:
    dtype, shape = ctx.out_dtype, ctx.out_shape
    if dtype.is_bool or isinstance(base, bool) or isinstance(base, Node) and base.dtype.is_bool:
        # (bool ** True is a bool copy in eager, its other bool powers NotImplementedError)
        raise Unsupported("pow of bools (ATen's NotImplementedError)")
    if not dtype.is_float:  # (an exponent beyond the int type: ATen's overflow error)
        base, exponent = (checked_scalar(v, dtype) for v in (base, exponent))
        if _symbolic(exponent) is not None and not sh.nonnegative(_symbolic(exponent)):
            raise Unsupported("integer to a symbolic power that may be negative: ATen checks it")
    elif isinstance(base, Node) and not isinstance(exponent, Node):
        # eager converts a scalar exponent to the tensor's dtype (checked; 2.0001 is float16's 2)
        exponent = _rounded_to(checked_scalar(exponent, dtype), dtype) if dtype.is_low_precision else exponent
    elif isinstance(exponent, Node) and not isinstance(base, Node) and dtype.is_low_precision:
        # ... and a scalar base too (1.7 ** x in bfloat16 is 1.703125 ** x: 2% at x = 10)
        base = _rounded_to(checked_scalar(base, dtype), dtype)
    if isinstance(base, Node) and not isinstance(exponent, Node):
        x = ctx.operand(base, dtype, shape)
        # ATen's own fast paths, so results match eager bit for bit.
        if exponent == 1:
            return x
        if exponent == 2:
            return ctx.make(Op.MUL, (x, x))
        # eager's 16-bit x * x * x and 1 / (x * x) round the square first (bfloat16; float16 on
        # GPUs: the CPU's float16 kernel calls pow, one rounding)
        square_rounds = dtype == dt.bfloat16 or dtype == dt.float16 and ctx.device != "cpu"
        if exponent == 3:
            if square_rounds:
                square = ctx.cast(ctx.make(Op.MUL, (x, x)), dt.float32)
                return ctx.cast(ctx.make(Op.MUL, (square, ctx.cast(x, dt.float32))), dtype)
            return ctx.make(Op.MUL, (ctx.make(Op.MUL, (x, x)), x))
        # (eager's CPU kernel takes no root for float16: pow(-inf, 0.5) is inf, sqrt's nan)
        if dtype.is_float and not (dtype == dt.float16 and ctx.device == "cpu"):
            if exponent == 0.5:
                return ctx.make(Op.SQRT, (x,))
            if exponent == -0.5:
                return ctx.make(Op.RSQRT, (x,))
        if dtype.is_float:
            if exponent == -1:
                return ctx.make(Op.RECIPROCAL, (x,))
            if exponent == -2:
                if square_rounds:
                    square = ctx.cast(ctx.make(Op.MUL, (x, x)), dt.float32)
                    return ctx.cast(ctx.make(Op.RECIPROCAL, (square,)), dtype)
                return ctx.make(Op.RECIPROCAL, (ctx.make(Op.MUL, (x, x)),))
            if dtype == dt.float32 and ctx.device == "cpu" and isinstance(exponent, (int, float)):
                # eager's CPU kernel takes a Python exponent as a double and computes in double:
                # x ** (1/3) with the exponent rounded to float32 was 7-13 ulp off at 1e30
                wide = ctx.make(Op.POW, (ctx.cast(x, dt.float64), ctx.operand(exponent, dt.float64, shape)))
                return ctx.cast(wide, dtype)
        elif isinstance(exponent, (int, float)) and exponent < 0:
            raise Unsupported("integer to a negative power raises in ATen")
    return ctx.make(Op.POW, (ctx.operand(base, dtype, shape), ctx.operand(exponent, dtype, shape)))


@register(aten.where.self)
def _where(ctx: Context, cond: Any, a: Any, b: Any) -> Node:
    dtype, shape = ctx.out_dtype, ctx.out_shape
    return ctx.make(Op.WHERE, (ctx.operand(cond, dt.bool_, shape), ctx.operand(a, dtype, shape),
                               ctx.operand(b, dtype, shape)))


def _clamp(ctx: Context, x: Node, lo: Any = None, hi: Any = None) -> Node:
    dtype, shape = ctx.out_dtype, ctx.out_shape
    if dtype.is_bool:
        raise Unsupported("clamp of bools (ATen's NotImplementedError)")
    lo, hi = checked_scalar(lo, dtype), checked_scalar(hi, dtype)
    if dtype.is_low_precision:  # (eager's bounds are 16-bit values: float16 0.9999 is 1.0)
        lo, hi = _rounded_to(lo, dtype), _rounded_to(hi, dtype)
    out = ctx.operand(x, dtype, shape)
    if lo is not None:
        out = ctx.make(Op.MAX, (out, ctx.operand(lo, dtype, shape)))
    if hi is not None:
        out = ctx.make(Op.MIN, (out, ctx.operand(hi, dtype, shape)))
    return out


register(aten.clamp.default, aten.clamp.Tensor)(_clamp)
