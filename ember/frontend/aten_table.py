"""The ATen ops ember generates code for, each lowered to ember IR.

One block per family. A lowering gets the call's arguments with tensors replaced by IR nodes and
returns IR node(s); ``Context`` (lowering.py) casts and broadcasts operands, and the result is
cast to the dtype ATen would give. Raising ``Unsupported`` sends the call to ATen instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node
from ..ir.ops import Op
from .lowering import Context, Unsupported, register, size_arg

aten = torch.ops.aten
prims = torch.ops.prims


def _dims(dim: Any, rank: int) -> tuple[int, ...]:
    """Normalize a dim / dim list (None or [] meaning all) to sorted non-negative dims."""
    if dim is None:
        return tuple(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(rank))
    out = sorted({d % rank if rank else 0 for d in dim})
    return tuple(out) if rank else ()


def _keepdim_or_squeeze(ctx: Context, node: Node, dims: Sequence[int], keepdim: bool) -> Node:
    if keepdim:
        return node
    return ctx.reshape(node, [s for i, s in enumerate(node.shape) if i not in dims])


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


@register(aten.round.default)
def _round(ctx: Context, x: Node) -> Node:
    _check_dtype(Op.ROUND, x.dtype)
    return x if x.dtype.is_int else ctx.make(Op.ROUND, (x,))


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
    zero = ctx.operand(0, x.dtype, x.shape)
    return ctx.make(Op.WHERE, (ctx.make(Op.GT, (x, zero)), x,
                               ctx.make(Op.MUL, (x, ctx.operand(slope, x.dtype, x.shape)))))


@register(aten.elu.default)
def _elu(ctx: Context, x: Node, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Node:
    if not x.dtype.is_float:
        raise Unsupported("elu of integers (ATen's NotImplementedError)")
    c = lambda v: ctx.operand(v, x.dtype, x.shape)  # noqa: E731
    neg = ctx.make(Op.MUL, (c(alpha), ctx.make(Op.EXPM1, (ctx.make(Op.MUL, (x, c(input_scale))),))))
    pos = ctx.make(Op.GT, (x, c(0)))
    return ctx.make(Op.MUL, (ctx.make(Op.WHERE, (pos, x, neg)), c(scale)))


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


def _rounded_to(x: Any, dtype: dt.DType) -> Any:
    """A Python number as the nearest value of a 16-bit float ``dtype`` (ints too: float16
    2048 == 2049 holds in eager); anything else as it is."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(torch.tensor(float(x), dtype=dt.to_torch(dtype)))
    return x


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


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
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


def checked_scalar(value: Any, dtype: dt.DType) -> Any:
    """A Python scalar argument ATen converts with an overflow check (clamp's bounds, a fill
    value, add's alpha): out of ``dtype``'s range, the op runs through ATen, which raises
    "value cannot be converted to type ... without overflow" as in eager."""
    if isinstance(value, (int, float)) and not scalar_fits(value, dt.to_torch(dtype)):
        raise Unsupported(f"{value} does not fit {dtype}: ATen raises")
    if _symbolic(value) is not None and _narrower_than_a_size(dtype):
        # a Python int Dynamo made symbolic: eager checks each call's value; ATen does here
        raise Unsupported(f"symbolic scalar {_symbolic(value)} may not fit {dtype}: ATen checks it")
    return value


def _symbolic(value: Any) -> sympy.Expr | None:
    """The expression of a scalar argument Dynamo made symbolic (a constant of a size symbol)."""
    if isinstance(value, Node) and value.op is Op.CONST:
        value = value.arg
    if isinstance(value, sympy.Basic) and not value.is_number:
        return value
    return None


def _narrower_than_a_size(dtype: dt.DType) -> bool:
    """Can an int64 size or Python int overflow ``dtype``? (Not float32/64 or bfloat16, whose
    ranges hold every int64; float16 tops out at 65504.)"""
    if dtype.is_bool:
        return False
    if dtype.is_float:
        return dtype == dt.float16
    return dtype.itemsize < 8 or dtype.kind == "u"


def scalar_fits(value: int | float, dtype: torch.dtype, wraps: bool = True) -> bool:
    """Does ATen convert the Python scalar ``value`` to ``dtype`` without its overflow error?
    (c10's rule: floats take inf and nan; an unsigned type takes negative ints down to minus
    its maximum, wrapped, unless ``wraps`` is False (constant_pad_nd's value), and no negative
    float; bool and complex take anything.)"""
    if isinstance(value, bool) or dtype == torch.bool or dtype.is_complex:
        return True
    if dtype.is_floating_point:
        return not math.isfinite(value) or abs(value) <= torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    lowest = -info.max if info.min == 0 and wraps and isinstance(value, int) else info.min
    return math.isfinite(value) and lowest <= value <= info.max


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


# ---------------------------------------------------------------------------------------------
# casts, copies, constants
# ---------------------------------------------------------------------------------------------

@register(prims.convert_element_type.default)
def _convert(ctx: Context, x: Node, dtype: torch.dtype) -> Node:
    return ctx.cast(x, dt.from_torch(dtype) if dt.is_supported_torch(dtype) else _unsupported(dtype))


def _unsupported(what: Any) -> Any:
    raise Unsupported(str(what))


@register(aten._to_copy.default)
def _to_copy(ctx: Context, x: Node, *, dtype: Any = None, device: Any = None, layout: Any = None,
             pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> Node:
    if device is not None and torch.device(device) != ctx.out.device:
        raise Unsupported("device copy")
    if str(ctx.out.device) != x.device or layout not in (None, torch.strided) or pin_memory:
        raise Unsupported("layout or device change")
    return ctx.cast(x, ctx.out_dtype)


@register(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _identity(ctx: Context, x: Node, **_: Any) -> Node:
    return x


@register(aten.copy.default)
def _copy(ctx: Context, dst: Node, src: Node, non_blocking: bool = False) -> Node:
    return ctx.operand(src, ctx.out_dtype, ctx.out_shape)


def _filled_with(value: Any, dtype: dt.DType) -> Any:
    """The value a new tensor of ``dtype`` holds: checked, and a 16-bit float's rounded (kernels
    compute 16-bit values in float32, so a literal 0.1001 would compare above the tensor's)."""
    value = checked_scalar(value, dtype)
    if dtype.is_low_precision:
        if _symbolic(value) is not None:
            raise Unsupported(f"a 16-bit tensor filled with the symbolic {_symbolic(value)}: ATen rounds it")
        value = _rounded_to(value, dtype)
    return value


@register(aten.full.default)
def _full(ctx: Context, size: Sequence[Any], value: Any, **_: Any) -> Node:
    return ctx.operand(_filled_with(value, ctx.out_dtype), ctx.out_dtype, ctx.out_shape)


@register(aten.full_like.default)
def _full_like(ctx: Context, x: Node, value: Any, **_: Any) -> Node:
    return ctx.operand(_filled_with(value, ctx.out_dtype), ctx.out_dtype, ctx.out_shape)


@register(aten.scalar_tensor.default)
def _scalar_tensor(ctx: Context, value: Any, **kwargs: Any) -> Node:
    dtype = ctx.out_dtype
    device = torch.device(kwargs.get("device") or ctx.device)
    if (dtype.is_low_precision and device.type == "cpu" and isinstance(value, (int, float))
            and not isinstance(value, bool)):
        # ATen's CPU kernel rounds a number into a 16-bit float without full's overflow check
        # (float32 keeps it): where(mask, x, -1e9) of float16 scores fills -inf. Its CUDA kernel
        # checks, and eager's where raises there
        return ctx.const(_rounded_to(value, dtype), dtype)
    return ctx.const(_filled_with(value, dtype), dtype)


def _int_bound(value: Any) -> Any:
    """An arange bound that is an int: a Python int, or a SymInt's expression (arange(n - 1,
    -1, -1), a flip's positions); None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, Node) and value.op is Op.CONST and value.shape == () and value.dtype.is_int:
        return size_arg(value)
    return None


@register(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(ctx: Context, *args: Any, **_: Any) -> Node:
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    start, step = _int_bound(start), _int_bound(step)
    if start is None or step is None:
        raise Unsupported("non-integer arange bounds")  # float ranges round like ATen only there
    dtype = ctx.out_dtype
    if dtype.is_bool:
        raise Unsupported("arange of bools (ATen's NotImplementedError)")
    (length,) = ctx.out_shape
    return ctx.make(Op.IOTA, (), (length, start, step), dtype=dtype)


# ---------------------------------------------------------------------------------------------
# views
# ---------------------------------------------------------------------------------------------

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
    if sh.equal(first, 0) and step == 1 and sh.equal(length, x.shape[dim]):
        return x
    return ctx.make(Op.SLICE, (x,), (dim, first, sympy.Integer(step), length))


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
    """roll along a dim of static size: the rows past the shift, then the rest (a cat of two
    slices, which fuses with what reads it; the decomposition's index_select along another dim
    than the first ran through ATen)."""
    shifts = list(shifts) if isinstance(shifts, (list, tuple)) else [shifts]
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if not dims or len(shifts) != len(dims) or x.rank == 0:
        raise Unsupported("roll of the flattened tensor (or shifts and dims of other lengths)")
    out = x
    for shift, dim in zip(shifts, dims):
        dim, size, shift = dim % x.rank, sh.static(x.shape[dim % x.rank]), size_arg(shift)
        if size is None or not shift.is_Integer:
            raise Unsupported("roll along a symbolic size or by a symbolic shift")
        if size == 0 or int(shift) % size == 0:
            continue
        keep = size - int(shift) % size
        one = sympy.Integer(1)
        tail = ctx.make(Op.SLICE, (out,), (dim, sympy.Integer(keep), one, sympy.Integer(size - keep)))
        head = ctx.make(Op.SLICE, (out,), (dim, sympy.Integer(0), one, sympy.Integer(keep)))
        out = ctx.make(Op.CAT, (tail, head), dim)
    return out


@register(aten.constant_pad_nd.default)
def _constant_pad(ctx: Context, x: Node, pad: Sequence[Any], value: Any = 0) -> Node:
    pairs = [(sympy.Integer(0), sympy.Integer(0))] * x.rank
    for i in range(len(pad) // 2):  # pad lists the last dim first, (lo, hi) each
        pairs[x.rank - 1 - i] = (size_arg(pad[2 * i]), size_arg(pad[2 * i + 1]))
    if isinstance(value, (int, float)) and not scalar_fits(value, dt.to_torch(x.dtype), wraps=False):
        raise Unsupported(f"pad value {value} does not fit {x.dtype}: ATen raises")
    return ctx.make(Op.PAD, (x, ctx.const(checked_scalar(value, x.dtype), x.dtype)), tuple(pairs))


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------

def _reduce(ctx: Context, op: Op, x: Node, dims: tuple[int, ...], keepdim: bool) -> Node:
    if x.rank == 0:
        dims = ()
    if dims:
        node = ctx.make(op, (x,), dims)
    elif op in (Op.ARGMAX, Op.ARGMIN):
        node = ctx.operand(0, dt.int64, x.shape)  # the only position of a 0-d tensor
    else:
        node = x
    return _keepdim_or_squeeze(ctx, node, dims, keepdim)


def _count(x: Node, dims: Sequence[int]) -> sympy.Expr:
    return sh.numel([x.shape[d] for d in dims])


@register(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    x = ctx.cast(x, ctx.out_dtype)
    if x.dtype.is_low_precision:
        x = ctx.cast(x, dt.float32)  # accumulate wide; the result is cast back
    return _reduce(ctx, Op.SUM, x, _dims(dim, x.rank), keepdim)


@register(aten.prod.default, aten.prod.dim_int)
def _prod(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    if ctx.out_dtype.is_low_precision and ctx.device == "cpu":
        # eager's CPU kernel multiplies in the 16-bit type, rounding (and overflowing: float16
        # 300 * 300 is inf) at every step, where ember's would accumulate in float32
        raise Unsupported("a 16-bit product on the CPU (ATen rounds every step)")
    x = ctx.cast(x, dt.compute_dtype(ctx.out_dtype))
    return _reduce(ctx, Op.PROD, x, _dims(dim, x.rank), keepdim)


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    x = ctx.cast(x, dt.compute_dtype(ctx.out_dtype))
    dims = _dims(dim, x.rank)
    total = _reduce(ctx, Op.SUM, x, dims, keepdim)
    return ctx.make(Op.DIV, (total, ctx.operand(_count(x, dims), x.dtype, total.shape)))


@register(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def _amax_amin(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
    dims = _dims(dim, x.rank)
    if x.rank and not all(ctx.known_nonzero(x.shape[d]) for d in dims):
        # (only a reduced dim: eager's amax over the columns of a (0, 3) tensor is empty)
        raise Unsupported("max over an empty dim raises in ATen (its size may be 0)")
    op = Op.AMAX if ctx.aten in ("aten.amax", "aten.max") else Op.AMIN
    return _reduce(ctx, op, x, dims, keepdim)


@register(aten.max.dim, aten.min.dim)
def _max_dim(ctx: Context, x: Node, dim: int, keepdim: bool = False) -> tuple[Node, Node]:
    is_max = ctx.aten == "aten.max"
    dims = _dims(dim, x.rank)
    if x.rank and not ctx.known_nonzero(x.shape[dims[0]] if dims else 1):
        raise Unsupported("max over an empty dim raises in ATen (its size may be 0)")
    values = _reduce(ctx, Op.AMAX if is_max else Op.AMIN, x, dims, keepdim)
    indices = _reduce(ctx, Op.ARGMAX if is_max else Op.ARGMIN, x, dims, keepdim)
    return values, indices


@register(aten.argmax.default, aten.argmin.default)
def _argmax(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
    op = Op.ARGMAX if ctx.aten == "aten.argmax" else Op.ARGMIN
    if x.dtype.is_bool:
        raise Unsupported(f"ATen's {op.value} rejects bool")
    reduced = sh.numel(x.shape) if dim is None else x.shape[_dims(dim, x.rank)[0]] if x.rank else 1
    if not ctx.known_nonzero(reduced):
        raise Unsupported(f"{op.value} over no elements raises in ATen (the size may be 0)")
    if dim is None:
        flat = ctx.reshape(x, [sh.numel(x.shape)])
        out = _reduce(ctx, op, flat, (0,), True)
        return ctx.reshape(out, ctx.out_shape)
    return _reduce(ctx, op, x, _dims(dim, x.rank), keepdim)


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def _any_all(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
    op = Op.ANY if ctx.aten == "aten.any" else Op.ALL
    x = ctx.cast(x, dt.bool_)
    if isinstance(dim, (list, tuple)) and not dim:  # any(b, ()): over no dims, as in ATen
        return x
    return _reduce(ctx, op, x, _dims(dim, x.rank), keepdim)


def _var(ctx: Context, x: Node, dims: tuple[int, ...], correction: Any, keepdim: bool) -> tuple[Node, Node]:
    """Corrected two-pass variance (Chan, Golub and LeVeque): a first mean m, then over the
    deviations d = x - m both sum(d * d) and sum(d), which repair the rounding of m: the mean is
    m + sum(d) / n and the variance (sum(d * d) - sum(d)^2 / n) / (n - correction). Both passes
    fuse into one kernel (the second loop reads what the first computed). Without the repair, a
    large mean rounded to float32 (to 0.008 at 1e5; a float32 sum of 1e5 such values is off by
    more) was squared into the variance: relative errors of 1e-5 to 5 where eager's are 1e-8."""
    if not x.dtype.is_float:
        raise Unsupported("ATen's var and std reject integer and bool inputs")
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    n = _count(x, dims)
    total = ctx.make(Op.SUM, (x,), dims)
    count = ctx.operand(n, x.dtype, total.shape)
    first = ctx.make(Op.DIV, (total, count))
    dev = ctx.make(Op.SUB, (x, ctx.expand_to(first, x.shape)))
    sq = ctx.make(Op.SUM, (ctx.make(Op.MUL, (dev, dev)),), dims)
    drift = ctx.make(Op.SUM, (dev,), dims)
    mean = ctx.make(Op.ADD, (first, ctx.make(Op.DIV, (drift, count))))
    # (sum(d)^2 / n is at most sum(d * d): the difference, rounded, is kept at 0 or above)
    sq = ctx.make(Op.MAX, (ctx.make(Op.SUB, (sq, ctx.make(Op.DIV, (ctx.make(Op.MUL, (drift, drift)), count)))),
                           ctx.operand(0, x.dtype, sq.shape)))
    corr = 1 if correction is None else correction
    corr = sympy.Integer(int(corr)) if float(corr).is_integer() else sympy.Float(float(corr))
    denom = ctx.make(Op.MAX, (ctx.operand(n - corr, x.dtype, sq.shape), ctx.operand(0, x.dtype, sq.shape)))
    var = ctx.make(Op.DIV, (sq, denom))
    return _keepdim_or_squeeze(ctx, var, dims, keepdim), _keepdim_or_squeeze(ctx, mean, dims, keepdim)


@register(aten.var.correction)
def _var_correction(ctx: Context, x: Node, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Node:
    return _var(ctx, x, _dims(dim, x.rank), correction, keepdim)[0]


@register(aten.var_mean.correction)
def _var_mean(ctx: Context, x: Node, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple[Node, Node]:
    return _var(ctx, x, _dims(dim, x.rank), correction, keepdim)


@register(aten.linalg_vector_norm.default)
def _vector_norm(ctx: Context, x: Node, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: Any = None) -> Node:
    """The 2-norm (F.normalize, cosine similarity, clip_grad_norm_), the 1-norm, the inf and -inf
    norms (the largest and smallest magnitude) and the 0-"norm" (a count of nonzeros) as
    reductions over the reduced dims, so they fuse with what reads them; other orders run through
    ATen. A ``dtype`` casts the input first, as eager does."""
    if ord not in (0, 1, 2, math.inf, -math.inf) or x.dtype is None or not x.dtype.is_float:
        raise Unsupported(f"vector_norm of order {ord!r} (dtype={dtype})")
    if dtype is not None:
        if not ctx.out_dtype.is_float:
            raise Unsupported(f"vector_norm with dtype={dtype}")
        x = ctx.cast(x, ctx.out_dtype)
    dims = _dims(dim, x.rank)
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    if ord in (math.inf, -math.inf):
        if x.rank and not all(ctx.known_nonzero(x.shape[d]) for d in dims):
            raise Unsupported("the inf norm of no elements raises in ATen (the size may be 0)")
        op = Op.AMAX if ord > 0 else Op.AMIN
        return _reduce(ctx, op, ctx.make(Op.ABS, (x,)), dims, keepdim)
    if ord == 0:  # (a NaN counts, as in eager)
        nonzero = ctx.make(Op.NE, (x, ctx.operand(0, x.dtype, x.shape)))
        return _reduce(ctx, Op.SUM, ctx.cast(nonzero, x.dtype), dims, keepdim)
    if ord == 2 and sh.is_one(sh.numel([x.shape[d] for d in dims])):
        # the norm of one element is its size, as eager's is: its square overflows past 1.8e19
        # in float32 (and goes subnormal below 1e-19)
        ord = 1
    terms = ctx.make(Op.MUL, (x, x)) if ord == 2 else ctx.make(Op.ABS, (x,))
    total = _reduce(ctx, Op.SUM, terms, dims, keepdim)
    return ctx.make(Op.SQRT, (total,)) if ord == 2 else total


@register(aten.std.correction, aten.std_mean.correction)
def _std(ctx: Context, x: Node, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    """The root of a variance held in float64 until then, as eager's CPU kernel holds it: a
    float32 (or 16-bit) variance overflows for values past 1e19 and vanishes below 1e-23, where
    their standard deviation is finite."""
    if not x.dtype.is_float:
        raise Unsupported("ATen's var and std reject integer and bool inputs")
    wide = ctx.cast(x, dt.float64)
    var, mean = _var(ctx, wide, _dims(dim, x.rank), correction, keepdim)
    std = ctx.cast(ctx.make(Op.SQRT, (var,)), x.dtype)
    return (std, ctx.cast(mean, x.dtype)) if ctx.aten == "aten.std_mean" else std


# ---------------------------------------------------------------------------------------------
# normalizations
# ---------------------------------------------------------------------------------------------

@register(aten._softmax.default, aten._log_softmax.default)
def _softmax(ctx: Context, x: Node, dim: int, half_to_float: bool = False) -> Node:
    log = ctx.aten == "aten._log_softmax"
    if not x.dtype.is_float:
        raise Unsupported("ATen's softmax rejects integer and bool inputs")  # (eager's error)
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    if x.rank == 0:
        return ctx.operand(0.0 if log else 1.0, x.dtype, ())
    dims = (dim % x.rank,)
    m = ctx.expand_to(ctx.make(Op.AMAX, (x,), dims), x.shape)
    # A row of -inf has max -inf; ATen then gives NaN, and x - m does too.
    shifted = ctx.make(Op.SUB, (x, m))
    e = ctx.make(Op.EXP, (shifted,))
    s = ctx.expand_to(ctx.make(Op.SUM, (e,), dims), x.shape)
    if log:
        return ctx.make(Op.SUB, (shifted, ctx.make(Op.LOG, (s,))))
    return ctx.make(Op.DIV, (e, s))


@register(aten.native_layer_norm.default)
def _layer_norm(ctx: Context, x: Node, normalized_shape: Sequence[Any], weight: Node | None,
                bias: Node | None, eps: float) -> tuple[Node, Node, Node]:
    out_dtype = ctx.out[0].dtype
    params = [p.dtype for p in (weight, bias) if p is not None]
    if any(p != x.dtype for p in params) and not (x.dtype.is_low_precision and all(p == dt.float32 for p in params)):
        # eager takes parameters of the input's dtype, or float32 ones with a 16-bit input
        raise Unsupported("layer_norm with parameters of another dtype (ATen's RuntimeError)")
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    dims = tuple(range(x.rank - len(normalized_shape), x.rank))
    var, mean = _var(ctx, x, dims, 0, True)
    rstd = ctx.make(Op.RSQRT, (ctx.make(Op.ADD, (var, ctx.operand(eps, x.dtype, var.shape))),))
    out = ctx.make(Op.MUL, (ctx.make(Op.SUB, (x, ctx.expand_to(mean, x.shape))), ctx.expand_to(rstd, x.shape)))
    if weight is not None:
        out = ctx.make(Op.MUL, (out, ctx.operand(weight, x.dtype, x.shape)))
    if bias is not None:
        out = ctx.make(Op.ADD, (out, ctx.operand(bias, x.dtype, x.shape)))
    del out_dtype  # _finish casts each result to what ATen returns
    return out, mean, rstd
