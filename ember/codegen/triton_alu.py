"""Triton spellings of the kernel IR's scalar pieces: types, literals, the elementwise ops
(``alu``) and the reductions' neutral elements and combine functions. The kernel bodies that use
them are codegen/triton.py (values, index setup) and codegen/triton_loops.py (reduction loops)."""

from __future__ import annotations

import math
from typing import Any

import sympy

from ..ir import dtypes as dt
from ..ir.ops import Op
from ..schedule.kernel_ir import Value
from .wrapper import pexpr as host_pexpr


def pexpr(e: Any, minmax: tuple[str, str] = ("max", "min")) -> str:
    """A size expression as it is spelled inside a Triton kernel."""
    return host_pexpr(e, minmax, in_triton=True)


class RenderError(ValueError):
    """The kernel uses something this backend cannot express; its group runs through ATen."""


TL_TYPES = {
    dt.float16: "tl.float16", dt.bfloat16: "tl.bfloat16", dt.float32: "tl.float32",
    dt.float64: "tl.float64", dt.int8: "tl.int8", dt.int16: "tl.int16", dt.int32: "tl.int32",
    dt.int64: "tl.int64", dt.uint8: "tl.uint8", dt.bool_: "tl.int1",
}


def compute_type(dtype: dt.DType) -> str:
    return TL_TYPES[dt.compute_dtype(dtype)]


_FLOAT32_MAX = 3.4028234663852886e38


def literal(value: Any, dtype: dt.DType) -> str:
    if isinstance(value, sympy.Basic):
        if value.is_Number and not value.is_Integer:
            value = float(value)
        else:
            return f"tl.full([1], {pexpr(value)}, {compute_type(dtype)})"
    if dtype.is_bool:
        text = "1" if value else "0"
    elif dtype.is_int:
        text = str(int(value))
    else:
        v = float(value)
        if dt.compute_dtype(dtype) != dt.float64 and math.isfinite(v) and abs(v) > _FLOAT32_MAX:
            v = math.copysign(math.inf, v)  # (1e40 in float32, as eager makes it)
        if math.isnan(v):
            text = "float('nan')"
        elif math.isinf(v):
            text = "float('inf')" if v > 0 else "float('-inf')"
        elif v == 0 and math.copysign(1.0, v) < 0:
            # tl.full makes any value == 0 a null constant, +0.0: -0.0 is its bits, reinterpreted
            bits = 64 if dt.compute_dtype(dtype) == dt.float64 else 32
            return f"tl.full([1], {-2 ** (bits - 1)}, tl.int{bits}).to({compute_type(dtype)}, bitcast=True)"
        else:
            text = repr(v)
    return f"tl.full([1], {text}, {compute_type(dtype)})"


# reductions: neutral element, elementwise combine (looped mode), block reduction
def neutral(op: Op, dtype: dt.DType) -> str:
    if op is Op.SUM or op is Op.ANY:
        return "0"
    if op is Op.PROD or op is Op.ALL:
        return "1"
    lowest = op in (Op.AMAX, Op.ARGMAX)
    if dtype.is_float:
        return "float('-inf')" if lowest else "float('inf')"
    if dtype.is_bool:
        return "0" if lowest else "1"
    bits = dtype.itemsize * 8
    lo, hi = (0, 2**bits - 1) if dtype.kind == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return str(lo if lowest else hi)


def typed_neutral(op: Op, dtype: dt.DType) -> str:
    """The neutral element as a tensor of the accumulator's type (a bare 0 would promote a bool
    or int8 accumulator to int32 and break the loop-carried type)."""
    if dtype.is_float:
        return neutral(op, dtype)
    return f"tl.full([1], {neutral(op, dtype)}, {compute_type(dtype)})"


_COMBINE = {Op.SUM: "eh.add", Op.PROD: "eh.mul", Op.ANY: "eh.logical_or", Op.ALL: "eh.logical_and"}


def combine_fn(op: Op, dtype: dt.DType) -> str:
    if op in _COMBINE:
        return _COMBINE[op]
    if op in (Op.AMAX, Op.AMIN):
        return ("eh.maximum" if op is Op.AMAX else "eh.minimum") if dtype.is_float else (
            "eh.imaximum" if op is Op.AMAX else "eh.iminimum")
    return "eh.argmax_combine" if op is Op.ARGMAX else "eh.argmin_combine"


_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.DIV: "/", Op.EQ: "==", Op.NE: "!=", Op.LT: "<",
          Op.LE: "<=", Op.GT: ">", Op.GE: ">=", Op.AND: "&", Op.OR: "|", Op.XOR: "^",
          Op.BITAND: "&", Op.BITOR: "|", Op.BITXOR: "^"}
_TL = {Op.EXP: "tl.exp", Op.EXP2: "tl.exp2", Op.LOG: "tl.log", Op.LOG2: "tl.log2",
       Op.SQRT: "tl.sqrt_rn", Op.RSQRT: "tl.rsqrt", Op.SIGMOID: "tl.sigmoid", Op.ERF: "tl.erf",
       Op.FLOOR: "tl.floor", Op.CEIL: "tl.ceil", Op.ABS: "tl.abs"}
_HELPER = {Op.EXPM1: "expm1", Op.LOG1P: "log1p", Op.LOG10: "log10", Op.SIN: "sin", Op.COS: "cos",
           Op.TAN: "tan", Op.ASIN: "asin", Op.ACOS: "acos", Op.ATAN: "atan", Op.SINH: "sinh",
           Op.COSH: "cosh", Op.TANH: "tanh", Op.ASINH: "asinh", Op.ACOSH: "acosh",
           Op.ATANH: "atanh", Op.ERFC: "erfc", Op.ONE_PLUS_ERF: "one_plus_erf", Op.ROUND: "rint", Op.TRUNC: "trunc",
           Op.SIGN: "sign", Op.ISINF: "isinf", Op.ATAN2: "atan2", Op.SHL: "shl", Op.SHR: "shr",
           Op.HYPOT: "hypot", Op.COPYSIGN: "copysign", Op.NEXTAFTER: "nextafter", Op.SIGNBIT: "signbit",
           Op.GCD: "gcd", Op.LCM: "lcm"}


_LOGIC = (Op.AND, Op.OR, Op.XOR, Op.BITAND, Op.BITOR, Op.BITXOR, Op.WHERE)


# int16 ops computed in int32 and cut back through eh.wrap_i16 (runtime/triton_bits.py): in int16,
# LLVM made neg.s16 of negations (and of 0 - x, x * -1, x // -1), whose overflow ptxas ignores
_INT16_IN_INT32 = (Op.NEG, Op.ADD, Op.SUB, Op.MUL, Op.FLOORDIV, Op.TRUNCDIV, Op.MOD, Op.FMOD, Op.POW)


def alu(v: Value, args: list[str], scalars: bool = False) -> str:
    """``v``'s spelling; ``scalars``: its operands are all 0-d."""
    if v.dtype == dt.int16 and all(s.dtype == dt.int16 for s in v.srcs):
        if v.arg in _INT16_IN_INT32:
            return f"eh.wrap_i16({_alu(v, [f'{a}.to(tl.int32)' for a in args])})"
    elif v.dtype == dt.int16 and v.arg is Op.CAST and v.srcs[0].dtype in (dt.int32, dt.int64):
        return f"eh.wrap_i16({args[0]}.to(tl.int32))"
    text = _alu(v, args)
    if scalars and v.dtype.is_bool and v.arg not in _LOGIC:  # (comparisons, casts to bool, not)
        # (Triton 3.6's interpreter tags a comparison of two 0-d values with its operands' float
        # type, and broadcasting it makes floats, which & and | refuse; through an int32 it is
        # a bool again. Compiled, the != 0 of an int1 folds away)
        return f"({text} != 0)"
    if text.startswith("eh.") and not (v.dtype.is_float or v.dtype.is_bool) and v.dtype.itemsize < 4:
        # (a helper's bare literals are int32: shr's tl.where(a < 0, -1, 0) made an int8 or uint8
        # result int32, and the next product or shift did not wrap at 8 bits as eager's does;
        # int32 and int64 results keep their type)
        return f"{text}.to({TL_TYPES[v.dtype]})"
    return text


def _alu(v: Value, args: list[str]) -> str:
    op, dtype = v.arg, v.dtype
    src = v.srcs[0].dtype if v.srcs else dtype
    a = args[0] if args else ""
    if op is Op.CAST:
        if dtype.is_bool:
            return f"({a} != 0)"
        if dtype.is_low_precision:  # through float32, as c10's conversions go
            return f"{a}.to(tl.float32).to({TL_TYPES[dtype]}).to(tl.float32)"
        if dt.compute_dtype(src) == dt.compute_dtype(dtype):
            return a
        if src.is_float and dtype.is_int and dtype.itemsize < 4:
            # as eager converts: uint8 through int64 (c10: -1.7 -> -1 -> 255), int8 and int16
            # through int32 (a truncation); Triton's own conversion saturates at 16 bits
            # (cvt.rzi.u16.f32: -1.7 -> 0 as uint8, 40000.0 -> 32767 as int16)
            wide = "tl.int64" if dtype == dt.uint8 else "tl.int32"
            return f"{a}.to({wide}).to({TL_TYPES[dtype]})"
        return f"{a}.to({TL_TYPES[dtype]})"
    if op is Op.DIV and dtype.is_low_precision:
        # IEEE float32 division is a long instruction sequence; the approximate one (2 ulp of
        # float32) cannot show once the result is rounded to 16 bits
        return f"tl.math.fdiv({a}, {args[1]}, ieee_rounding=False)"
    if op in (Op.DIV, Op.RECIPROCAL) and dtype == dt.float32:
        # Triton's float32 / is div.full.f32 (2 ulp): 4.6875 / 0.9375 gave 5.0000005, and a
        # floor or a comparison of the quotient then differed from eager's IEEE division
        num, den = (a, args[1]) if op is Op.DIV else ("1.0", a)
        return f"tl.math.div_rn({num}, {den})"
    if dtype.is_bool and op in (Op.ADD, Op.MUL):  # int1 arithmetic would wrap: True + True = True
        return f"({a} {'|' if op is Op.ADD else '&'} {args[1]})"
    if op in _INFIX:
        return f"({a} {_INFIX[op]} {args[1]})"
    if op is Op.WHERE:
        return f"tl.where({a}, {args[1]}, {args[2]})"
    if op is Op.NEG:
        # Triton's unary minus is 0 - x, which makes -(+0.0) +0.0; a product by -1 is exact
        return f"({a} * -1.0)" if dtype.is_float else f"(-{a})"
    if op is Op.NOT or (op is Op.BITNOT and dtype.is_bool):
        return f"({a} == 0)"
    if op is Op.BITNOT:  # (unsigned: an xor with all ones; ~ made the interpreter's -1 overflow uint8)
        return f"({a} ^ 0xFF)" if dtype == dt.uint8 else f"(~{a})"
    if op is Op.ISNAN:
        return f"({a} != {a})"
    if op is Op.RECIPROCAL:
        return f"(1.0 / {a})"
    if op in (Op.MAX, Op.MIN):
        fn = "maximum" if op is Op.MAX else "minimum"
        return f"eh.{fn}({a}, {args[1]})" if dtype.is_float else f"tl.{fn}({a}, {args[1]})"
    if op in (Op.FLOOR, Op.CEIL, Op.TRUNC, Op.ROUND) and not dtype.is_float:
        return a
    if op is Op.ABS and dtype.is_bool:
        return a
    if op is Op.ABS and dtype.kind == "i":
        return f"eh.iabs({a})"
    if op in (Op.FLOORDIV, Op.TRUNCDIV, Op.MOD, Op.FMOD):
        kind = "float" if dtype.is_float else "int"
        if dtype.is_low_precision and op is not Op.FMOD:
            kind = "bf16" if dtype == dt.bfloat16 else "f16"
        return f"eh.{op.name.lower()}_{kind}({a}, {args[1]})"
    if op is Op.POW:
        return f"eh.pow({a}, {args[1]})" if dtype.is_float else f"eh.ipow({a}, {args[1]})"
    if op is Op.ERF and dtype.is_low_precision:
        return f"eh.erf_lowp({a})"  # 1.5e-7 absolute error: exact once rounded to 16 bits
    if op is Op.SQRT and dtype == dt.float64:
        return f"tl.sqrt({a})"  # sqrt_rn is float32 only; float64 sqrt is IEEE already
    if op in _TL:
        return f"{_TL[op]}({a})"
    if op in _HELPER:
        return f"eh.{_HELPER[op]}({', '.join(args)})"
    raise RenderError(f"no Triton spelling for {op.value}")


def atomic_combine(combine: str, dtype: dt.DType, pointer: str, value: str, mask: str, name: str,
                   indent: str) -> str:
    """scatter_reduce's atomic amax/amin of ``value`` into a buffer that holds the identity
    (-inf, +inf) or values written here. Triton's float atomic_max loses NaNs and orders -0.0
    below negative numbers, so floats go as their bits: a float's bits order as a signed integer
    where its sign is 0 and as an unsigned one, reversed, where it is 1, so a max is an integer
    max of the first or an unsigned min of the second (+0.0 above -0.0, in any order). A NaN
    becomes the greatest bits (the least, for amin), so it wins, as in eager."""
    big, small = ("max", "min") if combine == "amax" else ("min", "max")
    if not dtype.is_float:
        return f"tl.atomic_{big}({pointer}, {value}{', ' + mask if mask else ''}, sem='relaxed')"
    bits = 64 if dtype == dt.float64 else 32
    nan = 2 ** (bits - 1) - 1 if combine == "amax" else -1
    both = f"{mask} & " if mask else ""
    lines = [f"{name}_v = {value}",
             f"{name}_b = tl.where({name}_v != {name}_v, {nan}, {name}_v.to(tl.int{bits}, bitcast=True))",
             f"tl.atomic_{big}(({pointer}).to(tl.pointer_type(tl.int{bits}), bitcast=True), {name}_b, "
             f"{both}({name}_b >= 0), sem='relaxed')",
             f"tl.atomic_{small}(({pointer}).to(tl.pointer_type(tl.uint{bits}), bitcast=True), "
             f"{name}_b.to(tl.uint{bits}, bitcast=True), {both}({name}_b < 0), sem='relaxed')"]
    return ("\n" + indent).join(lines)
