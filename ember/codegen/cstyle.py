"""The C-style renderer shared by the CPU C++ and CUDA C++ backends.

It turns kernel-IR values into typed C statements (``const float v3 = v1 + v2;``). What differs
between languages (type names, math spellings, how 16-bit floats load and store) is a
``Language`` table; the loop skeleton around the statements is the backend's (cpp.py, cuda.py).
Arithmetic on 16-bit floats happens in float32, as eager does per op; explicit casts round.
"""

from __future__ import annotations

import heapq
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import sympy
from torch.utils._sympy.functions import (
    CeilToInt,
    CleanDiv,
    FloatPow,
    FloatTrueDiv,
    FloorDiv,
    FloorToInt,
    IntTrueDiv,
    Mod,
    ModularIndexing,
    PythonMod,
    RoundToInt,
    ToFloat,
    TruncToInt,
)

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.ops import Op
from ..schedule.device_sizes import DEVICE_TOTALS
from ..schedule.kernel_ir import Kernel, Value


@dataclass
class Language:
    name: str
    storage: dict[dt.DType, str]          # element type of buffers
    math_prefix: str                      # 'std::' on the CPU, '' in CUDA device code
    fast_f32: dict[Op, str] = field(default_factory=dict)  # float32 overrides, e.g. EXP
    sum_acc_f32: str = "double"           # accumulator of float32 sums
    restrict: str = "__restrict__"
    # out-of-range gather indices raise like eager (through the error flag); else they clamp
    checks_indices: bool = True
    # integer division by zero raises like eager (through the error flag); else the division
    # helpers take no flag argument and return 0 (CUDA: eager does not raise on the GPU either)
    flags_int_division: bool = True
    # searchsorted starts from the answer of the thread's previous element (a ``<name>_hint``
    # variable the loop keeps): sorted queries, like ragged row ids, then cost O(1) each
    search_hints: bool = True
    # a helper template converting a float to an integer type (``name<int8_t>(x)``) with the
    # results eager gives for NaN and out-of-range values; empty: a plain C cast
    float_to_int: str = ""

    def compute(self, dtype: dt.DType) -> str:
        return "float" if dtype.is_low_precision else self.storage[dtype]

    def load(self, dtype: dt.DType, ref: str) -> str:
        if dtype == dt.bfloat16:
            return f"ember_bf16_to_f32({ref})"
        if dtype == dt.float16:
            return f"ember_f16_to_f32({ref})"
        return ref

    def store(self, dtype: dt.DType, value: str) -> str:
        if dtype == dt.bfloat16:
            return f"ember_f32_to_bf16({value})"
        if dtype == dt.float16:
            return f"ember_f32_to_f16({value})"
        return value


# ---- literals and index expressions ---------------------------------------------------------

def literal(value: Any, dtype: dt.DType, lang: Language) -> str:
    ctype = lang.compute(dtype)
    if isinstance(value, sympy.Basic):
        if value.is_Number and not value.is_Integer:
            value = float(value)
        else:
            return f"(({ctype})({index_expr(value)}))"
    if dtype.is_bool:
        return "true" if value else "false"
    if dtype.is_int:
        v = int(value)
        if dtype == dt.int64:
            return f"INT64_C({v})" if v >= 0 else f"(-INT64_C({-v}))" if v != -2**63 else "INT64_MIN"
        return f"(({ctype}){v})"
    v = float(value)
    if ctype == "float":
        # the float32 eager would use: a finite double beyond float32's range (1e40) is inf
        try:
            v = struct.unpack("f", struct.pack("f", v))[0]
        except OverflowError:
            v = math.copysign(math.inf, v)
    if math.isnan(v):
        return f"(({ctype})NAN)"
    if math.isinf(v):
        return f"(({ctype})INFINITY)" if v > 0 else f"(-({ctype})INFINITY)"
    return f"{v!r}f" if ctype == "float" else repr(v)


def index_expr(e: sympy.Expr) -> str:
    """A non-negative integer index expression as C (int64 arithmetic)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        v = int(e)
        return str(v) if abs(v) < 2**31 else f"INT64_C({v})"
    if e.is_Symbol:
        return e.name
    if e.is_Float:  # a float coefficient of sizes (label_smoothing / classes): a double
        return repr(float(e))
    if isinstance(e, sympy.Add):
        terms = sorted(e.args, key=lambda t: (t.is_Number, str(t)))
        out = index_expr(terms[0])
        for t in terms[1:]:
            if t.could_extract_minus_sign():
                out += f" - {index_expr(-t)}"
            else:
                out += f" + {index_expr(t)}"
        return out
    if isinstance(e, sympy.Mul):
        if e.could_extract_minus_sign():
            return f"-{_atom(-e)}"
        return "*".join(_atom(a) for a in sorted(e.args, key=lambda t: (not t.is_Number, str(t))))
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return "*".join([_atom(e.base)] * int(e.exp))
    # C's / and % truncate: right for indices (not negative), not for a size expression that may
    # be negative (an int argument n % 3, (rows - 8) // 3), which Python floors
    if isinstance(e, (FloorDiv, CleanDiv)):
        return _floordiv(*e.args)
    if isinstance(e, ModularIndexing):
        base, div, mod = e.args
        if _not_negative(base, div) and sh.nonnegative(mod):
            inner = _atom(base) if div == 1 else f"({_atom(base)} / {_atom(div)})"
            return f"{inner} % {_atom(mod)}"
        return _mod(FloorDiv(base, div), mod)
    if isinstance(e, (Mod, PythonMod, sympy.Mod)):
        return _mod(*e.args)
    if isinstance(e, (IntTrueDiv, FloatTrueDiv)):  # sizes divided as floats (x.shape[1] / 2)
        return f"((double){_atom(e.args[0])} / (double){_atom(e.args[1])})"
    if isinstance(e, ToFloat):
        return f"((double){_atom(e.args[0])})"
    if isinstance(e, FloatPow):  # sizes in float math (an optimizer's 1 - 0.9 ** step)
        return f"pow((double){_atom(e.args[0])}, (double){_atom(e.args[1])})"
    if sh.unary_float_fn(e):  # math.sqrt(h): an attention scale
        return f"{sh.unary_float_fn(e)}((double){_atom(e.args[0])})"
    if isinstance(e, (FloorToInt, CeilToInt)) and sh.size_quotient(e.args[0]):
        a, b = e.args[0].args  # a size over a positive integer (a pad to 32)
        if isinstance(e, FloorToInt):
            return _floordiv(a, b)
        if sh.nonnegative(a):
            return f"({_atom(a)} + {_atom(b)} - 1) / {_atom(b)}"
        return f"-({_floordiv(-a, b)})"
    if isinstance(e, tuple(_TO_INT)):  # sizes rounded back to ints (interpolate's 1.5 * h)
        return f"((int64_t){_TO_INT[type(e)]}((double){_atom(e.args[0])}))"
    if isinstance(e, sympy.Abs):
        return index_expr(sh.abs_as_max(e))
    if sh.bitwise_operator(e):
        return f"({_atom(e.args[0])} {sh.bitwise_operator(e)} {_atom(e.args[1])})"
    if isinstance(e, (*sh.MAXES, *sh.MINS)):
        # ints with the int64 helpers; floats among them (Python's min(1.0, step / 1000) of a
        # size) in double: the int64 ones truncated 0.002 to 0
        ints = all(a.is_integer for a in e.args)
        fn = ("ember_i" if ints else "ember_") + ("max" if isinstance(e, sh.MAXES) else "min")
        args = [index_expr(a) if ints else f"(double){_atom(a)}" for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = f"{fn}({out}, {a})"
        return out
    if isinstance(e, sympy.core.relational.Relational) and e.rel_op in ("==", "!=", "<", "<=", ">", ">="):
        return f"({index_expr(e.lhs)} {e.rel_op} {index_expr(e.rhs)})"  # (a bool read with .item(): Eq(u0, 1))
    if e in (sympy.true, sympy.false):
        return "1" if e is sympy.true else "0"
    if isinstance(e, (sympy.And, sympy.Or)):
        return "(" + (" && " if isinstance(e, sympy.And) else " || ").join(index_expr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Not):
        return f"(!{_atom(e.args[0])})"
    if isinstance(e, sympy.Piecewise):  # (narrow's start normalized where it may be negative)
        out = index_expr(e.args[-1][0]) if e.args[-1][1] is sympy.true else "0"
        for value, cond in reversed(e.args[:-1] if e.args[-1][1] is sympy.true else e.args):
            out = f"({index_expr(cond)} ? {index_expr(value)} : {out})"
        return out
    raise NotImplementedError(f"index expression {e!r} ({type(e).__name__}) has no C spelling")


# (nearbyint: halves to even, as Python's round)
_TO_INT = {TruncToInt: "trunc", FloorToInt: "floor", CeilToInt: "ceil", RoundToInt: "nearbyint"}


def device_size_lines(kernel: Kernel) -> list[str]:
    """C statements that load a kernel's ragged totals from their offsets in ember.cuda_graph
    steps (see schedule/device_sizes.py); they replace the host's values before anything uses
    them."""
    flag = DEVICE_TOTALS.name
    return [f"if ({flag}) {s.name} = ember_imin({s.name}, (int64_t){name}[{index_expr(index)}]);  // the ragged "
            "total, read on the device (never past the host's, which sized the buffers)"
            for s, (name, index) in kernel.device_sizes.items()]


def _atom(e: sympy.Expr) -> str:
    text = index_expr(e)
    return text if (sympy.sympify(e).is_Atom or text.isidentifier()) else f"({text})"


def _not_negative(a: sympy.Expr, b: sympy.Expr) -> bool:
    # (a divisor of 0 is an error either way: a size that may be 0 keeps C's spelling)
    return sh.nonnegative(a) and sh.nonnegative(b)


def _floordiv(a: sympy.Expr, b: sympy.Expr) -> str:
    if _not_negative(a, b):
        return f"{_atom(a)} / {_atom(b)}"
    return f"ember_ifloordiv({index_expr(a)}, {index_expr(b)})"


def _mod(a: sympy.Expr, b: sympy.Expr) -> str:
    if _not_negative(a, b):
        return f"{_atom(a)} % {_atom(b)}"
    return f"ember_imod({index_expr(a)}, {index_expr(b)})"


# ---- pointwise ops --------------------------------------------------------------------------

_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.DIV: "/", Op.EQ: "==", Op.NE: "!=",
          Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">=", Op.AND: "&&", Op.OR: "||",
          Op.XOR: "!=", Op.BITAND: "&", Op.BITOR: "|", Op.BITXOR: "^"}
_MATH = {Op.EXP: "exp", Op.EXP2: "exp2", Op.EXPM1: "expm1", Op.LOG: "log", Op.LOG2: "log2",
         Op.LOG10: "log10", Op.LOG1P: "log1p", Op.SQRT: "sqrt", Op.SIN: "sin", Op.COS: "cos",
         Op.TAN: "tan", Op.ASIN: "asin", Op.ACOS: "acos", Op.ATAN: "atan", Op.SINH: "sinh",
         Op.COSH: "cosh", Op.TANH: "tanh", Op.ASINH: "asinh", Op.ACOSH: "acosh",
         Op.ATANH: "atanh", Op.ERF: "erf", Op.ERFC: "erfc", Op.FLOOR: "floor", Op.CEIL: "ceil",
         Op.TRUNC: "trunc", Op.ROUND: "nearbyint", Op.ATAN2: "atan2", Op.FMOD: "fmod",
         Op.POW: "pow"}
# Integer ops that can divide by zero: eager raises, so kernels report it through a flag.
INT_DIVISION_OPS = frozenset({Op.FLOORDIV, Op.TRUNCDIV, Op.MOD, Op.FMOD})


def alu(lang: Language, v: Value, args: list[str]) -> str:
    """C expression for a pointwise value; ``args`` are the C spellings of its sources."""
    op, dtype = v.arg, v.dtype
    ctype = lang.compute(dtype)
    src = v.srcs[0].dtype if v.srcs else dtype
    a = args[0] if args else ""
    if op is Op.CAST:
        return cast(lang, src, dtype, a)
    if op is Op.DIV and ctype == "float" and op in lang.fast_f32:
        return lang.fast_f32[op].format(a, args[1])
    if op in _INFIX:
        expr = f"({a} {_INFIX[op]} {args[1]})"
        # C promotes narrow integers to int: bring results back to the element type
        if dtype.is_int and dtype.itemsize < 4 or dtype.is_bool and op in (Op.ADD, Op.MUL, Op.SUB):
            expr = f"(({ctype}){expr})"
        return expr
    if op is Op.WHERE:
        return f"({a} ? {args[1]} : {args[2]})"
    if op is Op.NEG:
        return f"(({ctype})(-{a}))" if dtype.itemsize < 4 and not dtype.is_float else f"(-{a})"
    if op is Op.NOT or (op is Op.BITNOT and dtype.is_bool):
        return f"(!{a})"
    if op is Op.BITNOT:
        return f"(({ctype})~{a})"
    if op is Op.ISNAN:
        return f"({a} != {a})"
    if op in (Op.ISINF, Op.ABS, Op.SIGN, Op.MAX, Op.MIN, Op.SHL, Op.SHR):
        return f"ember_{op.name.lower()}({', '.join(args)})"
    if op is Op.RECIPROCAL:
        return f"(({ctype})1 / {a})"
    if op is Op.SIGMOID:
        return f"ember_sigmoid({a})"
    if op is Op.RSQRT:
        return lang.fast_f32.get(op, "ember_rsqrt({})").format(a) if ctype == "float" else f"ember_rsqrt({a})"
    if dtype.is_low_precision and op in (Op.FLOORDIV, Op.TRUNCDIV, Op.MOD):
        # eager runs these algorithms on 16-bit values, rounding every step: so do we
        fn = {Op.FLOORDIV: "ember_floordiv", Op.TRUNCDIV: "ember_truncdiv", Op.MOD: "ember_mod"}[op]
        return f"{fn}_{'bf16' if dtype == dt.bfloat16 else 'f16'}({a}, {args[1]})"
    if op in (Op.FLOORDIV, Op.TRUNCDIV, Op.MOD) or (op is Op.FMOD and not dtype.is_float):
        fn = {Op.FLOORDIV: "ember_floordiv", Op.TRUNCDIV: "ember_truncdiv", Op.MOD: "ember_mod",
              Op.FMOD: "ember_fmod"}[op]
        if dtype.is_float:
            return f"{fn}({a}, {args[1]})"
        err = ", ember_err" if lang.flags_int_division else ""
        return f"(({ctype}){fn}((int64_t){a}, (int64_t){args[1]}{err}))"
    if op is Op.POW and not dtype.is_float:
        return f"(({ctype})ember_ipow((int64_t){a}, (int64_t){args[1]}))"
    if op in _MATH:
        if dtype.is_int and op in (Op.FLOOR, Op.CEIL, Op.TRUNC, Op.ROUND):
            return a
        if ctype == "float" and op in lang.fast_f32:
            return lang.fast_f32[op].format(*args)
        return f"{lang.math_prefix}{_MATH[op]}({', '.join(args)})"
    raise NotImplementedError(f"no C spelling for {op.value}")


def cast(lang: Language, src: dt.DType, dst: dt.DType, a: str) -> str:
    if dst.is_bool:
        return f"({a} != 0)"
    if src.is_bool:  # a select, not a conversion: GCC does not vectorize bool -> float converts
        ctype = lang.compute(dst)
        one, zero = ("1.0f", "0.0f") if ctype == "float" else (f"({ctype})1", f"({ctype})0")
        return f"({a} ? {one} : {zero})"
    if dst == dt.bfloat16:
        return f"ember_round_bf16((float){a})"
    if dst == dt.float16:
        return f"ember_round_f16((float){a})"
    if lang.compute(src) == lang.compute(dst):
        return a
    if src.is_float and dst == dt.uint8:
        # c10 converts a float to uint8 through int64 (-1.7 -> -1 -> 255, 300 -> 44), on every
        # device; a direct conversion saturates on the GPU (cvt.rzi.u32.f32: -1.7 -> 0)
        wide = f"{lang.float_to_int}<int64_t>({a})" if lang.float_to_int else f"(int64_t){a}"
        return f"((uint8_t){wide})"
    if lang.float_to_int and src.is_float and not dst.is_float:
        return f"{lang.float_to_int}<{lang.compute(dst)}>({a})"
    return f"(({lang.compute(dst)}){a})"


# ---- reductions -----------------------------------------------------------------------------

def acc_type(lang: Language, v: Value) -> str:
    op, src = v.arg.op, v.srcs[0].dtype
    ctype = lang.compute(src)
    if op in (Op.ANY, Op.ALL):
        return "bool"
    if op is Op.SUM and ctype == "float":
        return lang.sum_acc_f32
    if op in (Op.ARGMAX, Op.ARGMIN):
        return f"EmberArg<{ctype}>"
    return ctype


def acc_init(lang: Language, v: Value) -> str:
    op, src = v.arg.op, v.srcs[0].dtype
    ctype = lang.compute(src)
    if op is Op.SUM:
        return f"({acc_type(lang, v)})0"
    if op is Op.PROD:
        return f"({ctype})1"
    if op is Op.ANY:
        return "false"
    if op is Op.ALL:
        return "true"
    lowest = op in (Op.AMAX, Op.ARGMAX)
    if src.is_float:
        bound = f"-({ctype})INFINITY" if lowest else f"({ctype})INFINITY"
    elif src.is_bool:
        bound = "false" if lowest else "true"
    else:
        bound = f"ember_lowest(({ctype})0)" if lowest else f"ember_highest(({ctype})0)"
    if op in (Op.ARGMAX, Op.ARGMIN):
        return f"EmberArg<{ctype}>{{{bound}, INT64_MAX}}"
    return bound


def acc_update(v: Value, acc: str, x: str, position: str) -> str:
    """Statement folding value ``x`` (at flat reduce ``position``) into accumulator ``acc``."""
    op = v.arg.op
    if op is Op.SUM:
        return f"{acc} += {x};"
    if op is Op.PROD:
        return f"{acc} *= {x};"
    if op is Op.ANY:
        return f"{acc} = {acc} || {x};"
    if op is Op.ALL:
        return f"{acc} = {acc} && {x};"
    if op is Op.AMAX:
        return f"{acc} = ember_max({acc}, {x});"
    if op is Op.AMIN:
        return f"{acc} = ember_min({acc}, {x});"
    fn = "ember_argmax_step" if op is Op.ARGMAX else "ember_argmin_step"
    return f"{fn}({acc}, {x}, {position});"


def acc_result(lang: Language, v: Value, acc: str) -> str:
    if v.arg.op in (Op.ARGMAX, Op.ARGMIN):
        return f"{acc}.i"
    return f"(({lang.compute(v.dtype)}){acc})"


# ---- scans ----------------------------------------------------------------------------------

def scan_acc_type(lang: Language, v: Value) -> str:
    """A scan's accumulator: its compute type (float32 for 16-bit floats, as eager's kernels),
    float32 widened as sums are (double on the CPU, as eager's CPU kernel accumulates)."""
    ctype = lang.compute(v.dtype)
    return lang.sum_acc_f32 if ctype == "float" and not v.dtype.is_low_precision else ctype


def scan_init(lang: Language, v: Value) -> str:
    acc = scan_acc_type(lang, v)
    return {"sum": f"({acc})0", "prod": f"({acc})1", "logsumexp": f"-({acc})INFINITY"}[v.arg.combine]


def scan_combine(v: Value, acc: str, x: str) -> str:
    """``acc`` (the scan so far) combined with ``x`` (the next element, or the next run's scan)."""
    if v.arg.combine == "sum":
        return f"{acc} + {x}"
    if v.arg.combine == "prod":
        return f"{acc} * {x}"
    return f"ember_logaddexp({x}, {acc})"


# ---- statements -----------------------------------------------------------------------------

class BodyRenderer:
    """Names values and renders them as statements; loads and stores index the kernel's params."""

    def __init__(self, kernel: Kernel, lang: Language):
        self.kernel = kernel
        self.lang = lang
        self.names = {id(v): f"v{i}" for i, v in enumerate(kernel.values)}
        self.acc_names = {id(v): f"acc{i}" for i, v in enumerate(kernel.values)
                          if v.kind in ("reduce", "rowreduce", "scan")}
        self.buffer_dtype = {p.name: p.dtype for p in kernel.params}
        self.users: dict[int, list[Value]] = {id(v): [] for v in kernel.values}
        for v in kernel.values:
            for s in (*v.srcs, *((v.guard,) if v.guard is not None else ())):
                self.users[id(s)].append(v)
        # value id -> what a load reads or a store writes instead of ``buffer[index]`` (an element
        # of a vector the CUDA backend loads or stores for a group of elements)
        self.vector_access: dict[int, str] = {}
        # chunk store id -> the register that keeps the run's partial sum instead of the
        # partials buffer (the CUDA backend's row blocks, which store it at the run's end)
        self.kept_partials: dict[int, str] = {}
        # a scan's statement where the backend scans across threads (cuda_scan.py); else the
        # running value steps from element to element
        self.scan_line: Any = None
        self.uses_err = any(v.kind == "alu" and v.arg in INT_DIVISION_OPS and not v.dtype.is_float
                            and lang.flags_int_division
                            or v.kind == "checkindex" and lang.checks_indices for v in kernel.values)

    def name(self, v: Value) -> str:
        return self.names[id(v)]

    def access(self, v: Value) -> str:
        """``buffer[index]``, with a gather's (or a write at indices') indirect variables replaced
        by its index values."""
        if id(v) in self.vector_access:
            return self.vector_access[id(v)]
        index = v.arg.index
        if v.arg.bindings:
            srcs = v.srcs[1:] if v.kind == "store" else v.srcs
            index = index.xreplace({sym: sympy.Symbol(self.name(src), integer=True)
                                    for sym, src in zip(v.arg.bindings, srcs)})
        return f"{v.arg.buffer}[{index_expr(index)}]"

    def statement(self, v: Value) -> str | None:
        lang = self.lang
        if v.kind == "store" and v.srcs[0].kind == "chunksum":  # add this row to the run's partial
            dtype = self.buffer_dtype[v.arg.buffer]
            ref, value = self.access(v), self.name(v.srcs[0].srcs[0])
            if id(v) in self.kept_partials:
                return f"{self.kept_partials[id(v)]} += {value};"
            return f"{ref} = {lang.store(dtype, f'{lang.load(dtype, ref)} + {value}')};"
        if v.kind == "store":
            dtype = self.buffer_dtype[v.arg.buffer]
            value = lang.store(dtype, self.name(v.srcs[0]))
            if v.arg.accumulate:  # threads may add to one element: atomically
                return f"ember_atomic_add(&{self.access(v)}, ({lang.storage[dtype]}){value});"
            return f"{self.access(v)} = {value};"
        if v.kind in ("reduce", "chunksum", "rowreduce"):
            return None  # the backend places accumulators around its loops
        if v.kind == "scan" and self.scan_line is not None:
            return self.scan_line(v)
        if v.kind == "scan":  # the next element into the running value (its accumulator: scan_decl)
            acc = self.acc_names[id(v)]
            x = f"({scan_acc_type(lang, v)}){self.name(v.srcs[0])}"
            return (f"{acc} = {scan_combine(v, acc, x)}; "
                    f"const {lang.compute(v.dtype)} {self.name(v)} = ({lang.compute(v.dtype)}){acc};")
        return f"const {lang.compute(v.dtype)} {self.name(v)} = {self.expression(v)};"

    def expression(self, v: Value) -> str:
        """The C expression computing a value (not a store or a reduction)."""
        lang = self.lang
        ctype = lang.compute(v.dtype)
        if v.kind == "load":
            dtype = self.buffer_dtype[v.arg.buffer]
            expr = lang.load(dtype, self.access(v))
        elif v.kind == "checkindex":
            bound = index_expr(sh.expr(v.arg[0]))
            index = self.name(v.srcs[0])
            expr = (f"ember_check_index((int64_t){index}, {bound}, {v.arg[2]}, ember_err)" if lang.checks_indices
                    else f"ember_clamp_index((int64_t){index}, {bound})")
            length = self.kernel.segment_length
            if lang.checks_indices and length is not None and not v.inner and v.arg[3]:
                # checked once per row, before the row's loop: an empty row indexes nothing in eager
                expr = (f"ember_check_index_if({self.name(length)} > 0, (int64_t){index}, {bound}, {v.arg[2]}, "
                        "ember_err)")
        elif v.kind == "search":
            a = v.arg
            args = (f"{a.buffer} + ({index_expr(a.start)}), {index_expr(a.length)}, {index_expr(a.stride)}, "
                    f"{self.name(v.srcs[0])}, {'true' if a.right else 'false'}")
            expr = (f"ember_search_from({args}, &{self.name(v)}_hint)" if lang.search_hints
                    else f"ember_search({args})")
        elif v.kind == "const":
            expr = literal(v.arg, v.dtype, lang)
        elif v.kind == "index":
            expr = f"(({ctype})({index_expr(v.arg)}))"
        else:
            expr = alu(lang, v, [self.name(s) for s in v.srcs])
        return expr

    def statements(self, values: list[Value]) -> list[str]:
        """Statements for ``values``. Guarded values (schedule/guards.py) are computed in
        ``if (guard) { ... }`` blocks: the values are put in an order that keeps each guard's
        values together (a topological order that continues the current guard's block while it
        can, and writes unguarded values before starting another), and each run of one guard is a
        block. Values read outside their block are declared (zero) before it."""
        order = _grouped_order(values)
        lines: list[str] = []
        runs: list[list[Value]] = []
        for v in order:
            guarded = v.guard is not None and v.kind not in ("store", "reduce")
            if guarded and runs and runs[-1][0].guard is v.guard:
                runs[-1].append(v)
            else:
                runs.append([v])
        for run in runs:
            head = run[0]
            if head.guard is None or head.kind in ("store", "reduce"):
                text = self.statement(head)
                if text:
                    lines.append(text)
                continue
            inside = {id(v) for v in run}
            exported = {id(v) for v in run if any(id(u) not in inside for u in self.users[id(v)])}
            for v in run:
                if id(v) in exported:
                    ctype = self.lang.compute(v.dtype)
                    lines.append(f"{ctype} {self.name(v)} = {'false' if ctype == 'bool' else f'({ctype})0'};")
            lines.append(f"if ({self.name(head.guard)}) {{")
            for v in run:
                ctype = self.lang.compute(v.dtype)
                const = "" if id(v) in exported else f"const {ctype} "
                lines.append(f"  {const}{self.name(v)} = {self.expression(v)};")
            lines.append("}")
        return lines

    def reduce_update(self, v: Value) -> str:
        return acc_update(v, self.acc_names[id(v)], self.name(v.srcs[0]), index_expr(v.arg.position))

    def reduce_decl(self, v: Value) -> str:
        return f"{acc_type(self.lang, v)} {self.acc_names[id(v)]} = {acc_init(self.lang, v)};"

    def scan_decl(self, v: Value) -> str:
        return f"{scan_acc_type(self.lang, v)} {self.acc_names[id(v)]} = {scan_init(self.lang, v)};"

    def reduce_result(self, v: Value) -> str:
        return f"const {self.lang.compute(v.dtype)} {self.name(v)} = {acc_result(self.lang, v, self.acc_names[id(v)])};"


def _grouped_order(values: list[Value]) -> list[Value]:
    """``values`` in a dependency order (sources and guards first) that writes unguarded values
    as soon as they can be, and each guard's values one after another while they can be."""
    index = {id(v): i for i, v in enumerate(values)}
    deps = {id(v): [d for d in (*v.srcs, *((v.guard,) if v.guard is not None else ())) if id(d) in index]
            for v in values}
    missing = {id(v): len(deps[id(v)]) for v in values}
    users: dict[int, list[Value]] = {id(v): [] for v in values}
    for v in values:
        for d in deps[id(v)]:
            users[id(d)].append(v)
    ready_free: list[int] = []                 # unguarded, by position
    ready_guarded: dict[int, list[int]] = {}   # id(guard) -> positions

    def add(v: Value) -> None:
        if v.guard is None or v.kind in ("store", "reduce"):
            heapq.heappush(ready_free, index[id(v)])
        else:
            heapq.heappush(ready_guarded.setdefault(id(v.guard), []), index[id(v)])

    for v in values:
        if missing[id(v)] == 0:
            add(v)
    out: list[Value] = []
    current: int | None = None  # id of the guard whose block is open
    while len(out) < len(values):
        if current is not None and ready_guarded.get(current):
            i = heapq.heappop(ready_guarded[current])
        elif ready_free:
            i = heapq.heappop(ready_free)
        else:
            current = min((g for g, q in ready_guarded.items() if q), key=lambda g: ready_guarded[g][0])
            i = heapq.heappop(ready_guarded[current])
        v = values[i]
        out.append(v)
        for u in users[id(v)]:
            missing[id(u)] -= 1
            if missing[id(u)] == 0:
                add(u)
    return out


# Helpers every C-style backend includes. EMBER_FN is 'static inline' on the CPU and
# '__device__ __forceinline__' in CUDA.
COMMON_PRELUDE = r"""
template <typename T> struct EmberArg { T v; int64_t i; };
// Integer bounds, chosen by overload on a dummy argument (works in host and device code).
#define EMBER_LIMITS(T, LO, HI) \
  EMBER_FN T ember_lowest(T) { return LO; } \
  EMBER_FN T ember_highest(T) { return HI; }
EMBER_LIMITS(int8_t, INT8_MIN, INT8_MAX)
EMBER_LIMITS(int16_t, INT16_MIN, INT16_MAX)
EMBER_LIMITS(int32_t, INT32_MIN, INT32_MAX)
EMBER_LIMITS(int64_t, INT64_MIN, INT64_MAX)
EMBER_LIMITS(uint8_t, 0, UINT8_MAX)

// torch.maximum / torch.minimum: NaN wins.
// Bitwise | rather than ||: no branch, so loops using them still vectorize.
#if __CUDA_ARCH__ >= 800  // one instruction on the GPU (a NaN result is the canonical NaN)
EMBER_FN float ember_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
EMBER_FN float ember_min(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#elif defined(__CUDACC__)
EMBER_FN float ember_max(float a, float b) { return ((a > b) | (a != a)) ? a : b; }
EMBER_FN float ember_min(float a, float b) { return ((a < b) | (a != a)) ? a : b; }
#else  // eager's CPU kernels keep the first of equal values: relu(-0.0) and max([-0.0, 0.0]) are -0.0
EMBER_FN float ember_max(float a, float b) { return ((a >= b) | (a != a)) ? a : b; }
EMBER_FN float ember_min(float a, float b) { return ((a <= b) | (a != a)) ? a : b; }
#endif
#if defined(__CUDACC__)
EMBER_FN double ember_max(double a, double b) { return ((a > b) | (a != a)) ? a : b; }
EMBER_FN double ember_min(double a, double b) { return ((a < b) | (a != a)) ? a : b; }
#else
EMBER_FN double ember_max(double a, double b) { return ((a >= b) | (a != a)) ? a : b; }
EMBER_FN double ember_min(double a, double b) { return ((a <= b) | (a != a)) ? a : b; }
#endif
template <typename T> EMBER_FN T ember_max(T a, T b) { return a > b ? a : b; }
template <typename T> EMBER_FN T ember_min(T a, T b) { return a < b ? a : b; }
EMBER_FN int64_t ember_imax(int64_t a, int64_t b) { return a > b ? a : b; }
EMBER_FN int64_t ember_imin(int64_t a, int64_t b) { return a < b ? a : b; }
// Python's // and % of size expressions that may be negative (C's truncate)
EMBER_FN int64_t ember_ifloordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
EMBER_FN int64_t ember_imod(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t m = a % b;
  return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
}

// argmax/argmin: NaN counts as the largest (and smallest) value; ties keep the first index.
template <typename T> EMBER_FN void ember_argmax_step(EmberArg<T>& a, T v, int64_t i) {
  bool take = (v > a.v) || (v != v && a.v == a.v) || ((v == a.v || (v != v && a.v != a.v)) && i < a.i);
  if (take) { a.v = v; a.i = i; }
}
template <typename T> EMBER_FN void ember_argmin_step(EmberArg<T>& a, T v, int64_t i) {
  bool take = (v < a.v) || (v != v && a.v == a.v) || ((v == a.v || (v != v && a.v != a.v)) && i < a.i);
  if (take) { a.v = v; a.i = i; }
}

template <typename T> EMBER_FN T ember_abs(T a) { return a < 0 ? (T)(-a) : a; }
EMBER_FN uint8_t ember_abs(uint8_t a) { return a; }
EMBER_FN bool ember_abs(bool a) { return a; }
// (-0.0 and a NaN of either sign lose their sign bit, as fabs: eager's abs)
EMBER_FN float ember_abs(float a) { return a < 0.0f ? -a : (a == 0.0f ? 0.0f : (a == a ? a : (float)NAN)); }
EMBER_FN double ember_abs(double a) { return a < 0.0 ? -a : (a == 0.0 ? 0.0 : (a == a ? a : (double)NAN)); }
// (NaN -> 0, as eager's sign)
template <typename T> EMBER_FN T ember_sign(T a) { return (T)((T(0) < a) - (a < T(0))); }
EMBER_FN bool ember_isinf(float a) { return a == INFINITY || a == -INFINITY; }
EMBER_FN bool ember_isinf(double a) { return a == INFINITY || a == -INFINITY; }
EMBER_FN float ember_rsqrt(float a) { return 1.0f / sqrtf(a); }
EMBER_FN double ember_rsqrt(double a) { return 1.0 / sqrt(a); }

// Python-style rounding division and remainder, as torch.div(rounding_mode=...) and
// torch.remainder; integer division by zero sets *err (eager raises ZeroDivisionError).
template <typename F> EMBER_FN F ember_floordiv_f(F a, F b) {
  if (b == 0) return a / b;
  F mod = fmod(a, b);
  F div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  F fl;
  if (div != 0) { fl = floor(div); if (div - fl > (F)0.5) fl += 1; }
  else { fl = copysign((F)0, a / b); }
  return fl;
}
EMBER_FN float ember_floordiv(float a, float b) { return ember_floordiv_f<float>(a, b); }
EMBER_FN double ember_floordiv(double a, double b) { return ember_floordiv_f<double>(a, b); }
EMBER_FN float ember_truncdiv(float a, float b) { return truncf(a / b); }
EMBER_FN double ember_truncdiv(double a, double b) { return trunc(a / b); }
template <typename F> EMBER_FN F ember_mod_f(F a, F b) {
  F m = fmod(a, b);
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}
EMBER_FN float ember_mod(float a, float b) { return ember_mod_f<float>(a, b); }
EMBER_FN double ember_mod(double a, double b) { return ember_mod_f<double>(a, b); }
EMBER_FN int64_t ember_truncdiv(int64_t a, int64_t b, int32_t* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return (int64_t)(0 - (uint64_t)a);
  return a / b;
}
EMBER_FN int64_t ember_floordiv(int64_t a, int64_t b, int32_t* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return (int64_t)(0 - (uint64_t)a);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
EMBER_FN int64_t ember_fmod(int64_t a, int64_t b, int32_t* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return 0;
  return a % b;
}
EMBER_FN int64_t ember_mod(int64_t a, int64_t b, int32_t* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return 0;
  int64_t m = a % b;
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}
// A gather's or an indexing's index: eager raises for one out of range; kernels flag it (code 2
// or 3, which the host turns into eager's exception) and stay in bounds.
EMBER_FN int64_t ember_check_index(int64_t i, int64_t n, int32_t code, int32_t* err) {
  bool bad = (i < 0) | (i >= n);
  if (bad) *err = code;
  return bad ? 0 : i;
}
EMBER_FN int64_t ember_check_index_if(bool used, int64_t i, int64_t n, int32_t code, int32_t* err) {
  bool bad = (i < 0) | (i >= n);
  if (bad && used) *err = code;
  return bad ? 0 : i;
}
// searchsorted in a sorted sequence of n elements, stride apart: how many are < v (<= v when
// right), compared as eager compares (!(x >= v), !(x > v)): a NaN v sorts after every element.
// Eager's binary search, probe for probe: a NaN bound (torch.sort puts them last) passes that
// comparison too, so past the bounds below v the answer depends on which bounds are read.
// Each step halves a size every lane shares (it bounds every lane's range), so all lanes take
// the same number of steps.
template <typename T, typename V>
EMBER_FN int64_t ember_search(const T* seq, int64_t n, int64_t stride, V v, bool right) {
  int64_t lo = 0, hi = n;
  for (int64_t size = n; size > 0; size >>= 1) {
    if (lo < hi) {
      int64_t mid = lo + ((hi - lo) >> 1);
      T x = seq[mid * stride];
      if (right ? !(x > v) : !(x >= v)) lo = mid + 1; else hi = mid;
    }
  }
  return lo;
}
// The same answer, starting from a hint (the previous answer of this thread). Any hint is safe
// in a sequence whose answers are monotone: it is used only when every element before it is
// below v; a few linear steps find the answer for sorted queries, else a binary search of the
// rest does. A sequence ending in NaN (x != x) is not monotone: eager's full search answers.
template <typename T, typename V>
EMBER_FN int64_t ember_search_from(const T* seq, int64_t n, int64_t stride, V v, bool right, int64_t* hint) {
  if (n > 0 && !(seq[(n - 1) * stride] == seq[(n - 1) * stride])) return ember_search(seq, n, stride, v, right);
  int64_t lo = *hint;
  if (lo < 0 || lo > n) lo = 0;
  if (lo > 0) {
    T x = seq[(lo - 1) * stride];
    if (!(right ? !(x > v) : !(x >= v))) lo = 0;
  }
  for (int step = 0; lo < n; ++step, ++lo) {
    T x = seq[lo * stride];
    if (!(right ? !(x > v) : !(x >= v))) break;
    if (step == 8) { lo += ember_search(seq + lo * stride, n - lo, stride, v, right); break; }
  }
  *hint = lo;
  return lo;
}
EMBER_FN int64_t ember_clamp_index(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
EMBER_FN int64_t ember_ipow(int64_t base, int64_t exp) {
  if (exp < 0) return base == 1 ? 1 : (base == -1 ? ((exp & 1) ? -1 : 1) : 0);
  int64_t result = 1;
  while (exp) { if (exp & 1) result = (int64_t)((uint64_t)result * (uint64_t)base);
                base = (int64_t)((uint64_t)base * (uint64_t)base); exp >>= 1; }
  return result;
}
// The same algorithms with every intermediate rounded to a 16-bit float, as eager computes them
// on BFloat16/Half values. R is the backend's round-trip (ember_round_bf16 / ember_round_f16).
#define EMBER_ROUNDED_DIVISION(SUFFIX, R) \
  EMBER_FN float ember_floordiv_##SUFFIX(float a, float b) { \
    if (b == 0) return R(a / b); \
    float mod = R(fmodf(a, b)); \
    float div = R(R(a - mod) / b); \
    if (mod != 0 && ((b < 0) != (mod < 0))) div = R(div - 1); \
    float fl; \
    if (div != 0) { fl = floorf(div); if (R(div - fl) > 0.5f) fl = R(fl + 1); } \
    else { fl = copysignf(0.0f, R(a / b)); } \
    return fl; \
  } \
  EMBER_FN float ember_truncdiv_##SUFFIX(float a, float b) { return truncf(R(a / b)); } \
  EMBER_FN float ember_mod_##SUFFIX(float a, float b) { \
    float m = R(fmodf(a, b)); \
    if (m != 0 && ((b < 0) != (m < 0))) m = R(m + b); \
    return m; \
  }

template <typename T> EMBER_FN T ember_shl(T a, T b) {
  return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)0 : (T)((uint64_t)a << b);
}
template <typename T> EMBER_FN T ember_shr(T a, T b) {
  return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)(a < 0 ? -1 : 0) : (T)(a >> b);
}
"""
