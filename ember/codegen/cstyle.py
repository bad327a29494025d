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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.ops import Op
from ..schedule.kernel_ir import Kernel, Value, index_error_message
from .c_accumulators import acc_init, acc_result, acc_type, acc_update, scan_acc_type, scan_combine, scan_init
from .cexpr import index_expr


@dataclass
class Language:
    name: str
    storage: dict[dt.DType, str]          # element type of buffers
    math_prefix: str                      # 'std::' on the CPU, '' in CUDA device code
    fast_f32: dict[Op, str] = field(default_factory=dict)  # float32 overrides, e.g. EXP
    fast_f64: dict[Op, str] = field(default_factory=dict)  # and float64's
    # a float64 pow whose users all round it to float32 or narrower (eager's float32 x ** scalar
    # computes in double): its spelling, where it may be less exact than a double (_narrowed_pow)
    narrowed_pow: str = ""
    sum_acc_f32: str = "double"           # accumulator of float32 sums
    restrict: str = "__restrict__"
    # out-of-range gather indices raise like eager (through the error flag); else they clamp
    checks_indices: bool = True
    # ... or stop the kernel with a device-side assert, as eager's CUDA kernels do
    asserts_indices: bool = False
    # integer division by zero raises like eager (through the error flag); else the division
    # helpers take no flag argument and return 0 (CUDA: eager does not raise on the GPU either)
    flags_int_division: bool = True
    # searchsorted starts from the answer of the thread's previous element (a ``<name>_hint``
    # variable the loop keeps): sorted queries, like ragged row ids, then cost O(1) each
    search_hints: bool = True
    # a helper template converting a float to an integer type (``name<int8_t>(x)``) with the
    # results eager gives for NaN and out-of-range values; empty: a plain C cast
    float_to_int: str = ""
    # bools loaded as bytes and stored as bytes through a select: GCC 12 left simd loops scalar
    # that mixed a bool buffer's elements with 16-bit floats ("no vectype": a BatchNorm's training
    # step in bfloat16, its relu mask loaded or stored beside them, took 10x its time). GCC 13
    # (-march=sapphirerapids) then left the float16 form of that loop scalar while the select's
    # type was bool (``x ? true : false``); a select of bytes stored as a byte it vectorizes
    bools_as_bytes: bool = False
    # unguarded bools written just before their first user (``_sunk_bools``: GCC 12 left simd
    # loops scalar where bools stayed live across float loads)
    sinks_bools: bool = False
    # guarded loads (schedule/guards.py) alone in their guard's run written as selects, ``v = g ?
    # load : 0``, not in an ``if (g) { ... }`` block: with jump threading and PRE off (config.py's
    # cxx_flags), GCC 12 left a column sum's simd loop scalar around a guarded load, a branch per
    # element (a relu's backward beside its bias gradient: 1.2 ms for 512 x 1024, 0.10 as a
    # select). Runs that compute keep their block, except in column tiles (cpp_columns.py; a
    # where(m, exp(x) * y, 0).sum(0) of 512 x 1024: 1.5 ms in blocks, 0.26 as selects): as one
    # select per value, row kernels ran up to 20% slower and the skip_masked GIoU loss's training
    # step took 10.0 ms against 1.4 (bench/cxx_flags_ab.py --train)
    guards_as_selects: bool = False

    def compute(self, dtype: dt.DType) -> str:
        return "float" if dtype.is_low_precision else self.storage[dtype]

    def load(self, dtype: dt.DType, ref: str) -> str:
        if dtype == dt.bfloat16:
            return f"ember_bf16_to_f32({ref})"
        if dtype == dt.float16:
            return f"ember_f16_to_f32({ref})"
        if dtype.is_bool and self.bools_as_bytes:
            return f"(*(const uint8_t*)&{ref} != 0)"
        return ref

    def store(self, dtype: dt.DType, value: str) -> str:
        if dtype == dt.bfloat16:
            return f"ember_f32_to_bf16({value})"
        if dtype == dt.float16:
            return f"ember_f32_to_f16({value})"
        if dtype.is_bool and self.bools_as_bytes:
            return f"({value} ? (uint8_t)1 : (uint8_t)0)"
        return value

    def store_target(self, dtype: dt.DType, ref: str) -> str:
        """The element ``ref`` as a store writes it (a bool as its byte, see bools_as_bytes)."""
        return f"*(uint8_t*)&{ref}" if dtype.is_bool and self.bools_as_bytes else ref


# ---- literals ------------------------------------------------------------------------------

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
         Op.POW: "pow", Op.HYPOT: "hypot", Op.COPYSIGN: "copysign", Op.NEXTAFTER: "nextafter"}
# Integer ops that can divide by zero: eager raises, so kernels report it through a flag.
INT_DIVISION_OPS = frozenset({Op.FLOORDIV, Op.TRUNCDIV, Op.MOD, Op.FMOD})


_WRAPPING = (Op.ADD, Op.SUB, Op.MUL)


def _wraps_in_unsigned(dtype: dt.DType) -> bool:
    """int32 and int64 arithmetic, which C does not promote (narrower ints compute in int,
    where their products and sums cannot overflow)."""
    return dtype.kind == "i" and dtype.itemsize >= 4


def _narrow(dtype: dt.DType, ctype: str, expr: str) -> str:
    """An int or int64 arithmetic result as the element type. int16 goes through
    ember_wrap_i16 (c_prelude.py): on the GPU, a plain cast let NVVM emit neg.s16, whose
    overflow ptxas ignores."""
    return f"ember_wrap_i16({expr})" if dtype == dt.int16 else f"(({ctype}){expr})"


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
    if op in _WRAPPING and _wraps_in_unsigned(dtype):
        # signed overflow is undefined in C: compilers (NVRTC, or g++ without -fwrapv) assumed it
        # away ((x + 1) > x was true at INT_MAX); unsigned arithmetic wraps as eager's does
        u = f"uint{8 * dtype.itemsize}_t"
        return f"(({ctype})(({u}){a} {_INFIX[op]} ({u}){args[1]}))"
    if op in _INFIX:
        expr = f"({a} {_INFIX[op]} {args[1]})"
        # C promotes narrow integers to int: bring results back to the element type
        if dtype.is_int and dtype.itemsize < 4 or dtype.is_bool and op in (Op.ADD, Op.MUL, Op.SUB):
            expr = _narrow(dtype, ctype, expr) if op in _WRAPPING else f"(({ctype}){expr})"
        return expr
    if op is Op.WHERE:
        return f"({a} ? {args[1]} : {args[2]})"
    if op is Op.NEG and _wraps_in_unsigned(dtype):
        return f"(({ctype})(0 - (uint{8 * dtype.itemsize}_t){a}))"
    if op is Op.NEG:
        return _narrow(dtype, ctype, f"(-{a})") if dtype.itemsize < 4 and not dtype.is_float else f"(-{a})"
    if op is Op.NOT or (op is Op.BITNOT and dtype.is_bool):
        return f"(!{a})"
    if op is Op.BITNOT:
        return f"(({ctype})~{a})"
    if op is Op.ISNAN:
        return f"({a} != {a})"
    if op in (Op.ISINF, Op.ABS, Op.SIGN, Op.MAX, Op.MIN, Op.SHL, Op.SHR, Op.SIGNBIT, Op.GCD, Op.LCM):
        return f"ember_{op.name.lower()}({', '.join(args)})"
    if op is Op.RECIPROCAL:
        return f"(({ctype})1 / {a})"
    if op is Op.ONE_PLUS_ERF:  # float32 only (passes/erf.py)
        return f"ember_one_plus_erf({a})"
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
        wide = "int64_t" if dtype.itemsize == 8 else "int32_t"  # (int32 holds int16's -32768 // -1)
        return _narrow(dtype, ctype, f"{fn}(({wide}){a}, ({wide}){args[1]}{err})")
    if op is Op.POW and not dtype.is_float:
        return _narrow(dtype, ctype, f"ember_ipow((int64_t){a}, (int64_t){args[1]})")
    if op in _MATH:
        if dtype.is_int and op in (Op.FLOOR, Op.CEIL, Op.TRUNC, Op.ROUND):
            return a
        if ctype == "float" and op in lang.fast_f32:
            return lang.fast_f32[op].format(*args)
        if ctype == "double" and op in lang.fast_f64:
            return lang.fast_f64[op].format(*args)
        return f"{lang.math_prefix}{_MATH[op]}({', '.join(args)})"
    raise NotImplementedError(f"no C spelling for {op.value}")


def _narrowed_pow(v: Value, users: list[Value]) -> bool:
    """A float64 pow that only casts to float32, bfloat16 or float16 read."""
    return (v.kind == "alu" and v.arg is Op.POW and v.dtype == dt.float64 and bool(users)
            and all(u.kind == "alu" and u.arg is Op.CAST and u.dtype in (dt.float32, dt.bfloat16, dt.float16)
                    for u in users))


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
    if dst == dt.int16 and src.is_int and src.itemsize > 2:  # (a narrowing NVVM could make neg.s16)
        return _narrow(dst, "int16_t", a)
    return f"(({lang.compute(dst)}){a})"


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
        # value id -> the float element a float16 load reads or store writes instead, of the row
        # its loop converts a strip at a time (the CPU backend's cpp_staging.py); or a bfloat16
        # load's float from its vector's 32-bit word (the CUDA backend's cuda_groups.py)
        self.staged: dict[int, str] = {}
        # value id -> a constant it is known to be in the loop being rendered (a guard of the
        # CPU backend's split loops, cpp_split.py)
        self.constants: dict[int, str] = {}
        # value id -> how the loop being rendered spells it instead (the CUDA backend's terms of a
        # softmax's sum, online_softmax.terms_lost_below_one)
        self.spelled: dict[int, str] = {}
        # float selects rendered as selects of bits (the CPU backend's, cpp_split.uniform_selects)
        self.bit_selects: set[int] = set()
        # a rewrite of every load's and store's index (cpp_split.Window.drop_clamps)
        self.index_rewrite: Callable[[sympy.Expr], sympy.Expr] | None = None
        # every guarded run written as selects where the language does so for lone loads
        # (``Language.guards_as_selects``; the CPU backend's column tiles, cpp_columns.py)
        self.every_guard_a_select = False
        # chunk store id -> the register that keeps the run's partial sum instead of the
        # partials buffer (the CUDA backend's row blocks, which store it at the run's end)
        self.kept_partials: dict[int, str] = {}
        # a scan's statement where the backend scans across threads (cuda_scan.py); else the
        # running value steps from element to element
        self.scan_line: Any = None
        # a check's flagged code: eager's exception (the low byte) above its place among the
        # kernel's checks, which are in the program's order (c_prelude.py keeps the smallest)
        checks = [v for v in kernel.values if v.kind == "checkindex"]
        # values computed from a bool converted to a number (a checked index's, cpp_prelude.py:
        # ember_opaque_index)
        self.from_bool_numbers: set[int] = set()
        for v in kernel.values:  # (in program order: a value's sources come before it)
            if (v.kind == "alu" and v.arg is Op.CAST and v.srcs[0].dtype.is_bool and not v.dtype.is_bool
                    or any(id(s) in self.from_bool_numbers for s in v.srcs)):
                self.from_bool_numbers.add(id(v))
        self.check_codes = {id(v): v.arg[2] + (rank << 8) for rank, v in enumerate(checks)}
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
        return f"{v.arg.buffer}[{index_expr(self.bound_index(v))}]"

    def bound_index(self, v: Value) -> sympy.Expr:
        """A load's or store's index, its indirect variables named by the values they hold."""
        index = v.arg.index
        if self.index_rewrite is not None:  # (clamps made idle by a split loop's bounds, cpp_split.Window)
            index = self.index_rewrite(index)
        if v.arg.bindings:
            srcs = v.srcs[1:] if v.kind == "store" else v.srcs
            index = index.xreplace({sym: sympy.Symbol(self.name(src), integer=True)
                                    for sym, src in zip(v.arg.bindings, srcs)})
        return index

    def statement(self, v: Value) -> str | None:
        lang = self.lang
        if v.kind == "store" and v.srcs[0].kind == "chunksum":  # add this row to the run's partial
            dtype = self.buffer_dtype[v.arg.buffer]
            ref, value = self.access(v), self.name(v.srcs[0].srcs[0])
            if id(v) in self.kept_partials:
                return f"{self.kept_partials[id(v)]} += {value};"
            return f"{ref} = {lang.store(dtype, f'{lang.load(dtype, ref)} + {value}')};"
        if v.kind == "store" and id(v) in self.staged:  # (rounded with its row after the loop)
            return f"{self.staged[id(v)]} = {self.name(_unrounded(v, self.buffer_dtype[v.arg.buffer]))};"
        if v.kind == "store":
            dtype = self.buffer_dtype[v.arg.buffer]
            value = lang.store(dtype, self.name(_unrounded(v, dtype)))
            if v.arg.accumulate and id(v) not in self.vector_access:
                # threads may add to (or max, min with) one element: atomically (a vector's
                # elements go into its register, added by the group's vector atomic)
                combine = v.arg.accumulate if isinstance(v.arg.accumulate, str) else "add"
                return f"ember_atomic_{combine}(&{self.access(v)}, ({lang.storage[dtype]}){value});"
            return f"{lang.store_target(dtype, self.access(v))} = {value};"
        if v.kind in ("reduce", "chunksum", "rowreduce"):
            return None  # the backend places accumulators around its loops
        if self.users[id(v)] and all(u.kind == "store" and u.srcs[0] is v and _unrounded(u, self.buffer_dtype[
                u.arg.buffer]) is not v for u in self.users[id(v)]):
            return None  # only stores read it, which convert its source (_unrounded)
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
        if id(v) in self.constants:
            return self.constants[id(v)]
        if id(v) in self.spelled:
            return self.spelled[id(v)]
        if v.kind == "load" and id(v) in self.staged:
            expr = self.staged[id(v)]
        elif v.kind == "load":
            dtype = self.buffer_dtype[v.arg.buffer]
            expr = lang.load(dtype, self.access(v))
        elif v.kind == "checkindex":
            bound = index_expr(sh.expr(v.arg[0]))
            index = self.name(v.srcs[0])
            code = self.check_codes[id(v)]
            length = self.kernel.segment_length
            # (an index only its row's elements read is checked once per row, before the row's
            # loop, where the row has elements: an empty row indexes nothing in eager)
            row_only = length is not None and not v.inner and v.arg[3]
            used, only_if = (f"{self.name(length)} > 0, ", "_if") if row_only else ("", "")
            if lang.checks_indices:
                expr = f"ember_check_index{only_if}({used}(int64_t){index}, {bound}, {code}, ember_err)"
                if id(v.srcs[0]) in self.from_bool_numbers:  # (a GCC 12 miscompile: cpp_prelude.py)
                    expr = f"ember_opaque_index({expr})"
            elif lang.asserts_indices:
                expr = f"ember_assert_index{only_if}({used}(int64_t){index}, {bound}, \"{index_error_message(v)}\")"
            else:
                expr = f"ember_clamp_index((int64_t){index}, {bound})"
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
        elif id(v) in self.bit_selects:
            expr = f"ember_pick_bits({', '.join(self.name(s) for s in v.srcs)})"
        elif lang.narrowed_pow and _narrowed_pow(v, self.users[id(v)]):
            expr = lang.narrowed_pow.format(*(self.name(s) for s in v.srcs))
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
        if self.lang.sinks_bools:
            order = _sunk_bools(order)
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
            if (self.lang.guards_as_selects and self.constants.get(id(head.guard)) != "true"
                    and (self.every_guard_a_select or all(v.kind == "load" for v in run))):
                for v in run:
                    ctype = self.lang.compute(v.dtype)
                    zero = "false" if ctype == "bool" else f"({ctype})0"
                    lines.append(f"const {ctype} {self.name(v)} = {self.name(head.guard)} ? "
                                 f"{self.expression(v)} : {zero};")
                continue
            inside = {id(v) for v in run}
            exported = {id(v) for v in run if any(id(u) not in inside for u in self.users[id(v)])}
            for v in run:
                if id(v) in exported:
                    ctype = self.lang.compute(v.dtype)
                    lines.append(f"{ctype} {self.name(v)} = {'false' if ctype == 'bool' else f'({ctype})0'};")
            if self.constants.get(id(head.guard)) == "true":  # (the CPU's split loops: a block, no branch)
                lines.append(f"{{  // {self.name(head.guard)} is true here")
            else:
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


def _sunk_bools(order: list[Value]) -> list[Value]:
    """``order`` with each unguarded bool that an unguarded value uses later moved down to just
    before that first user. GCC 12 gave up on a simd loop ("no vectype for stmt", at a float
    load) where bools (a max's NaN tests of a padded window's values, each written beside its
    value) stayed live across the loads after them; next to their use, the loop vectorizes."""
    position = {id(v): i for i, v in enumerate(order)}
    first_use: dict[int, Value] = {}
    for v in order:
        for s in (*v.srcs, *((v.guard,) if v.guard is not None else ())):
            first_use.setdefault(id(s), v)
    before: dict[int, list[Value]] = {}
    for v in order:
        user = first_use.get(id(v))
        if (v.kind == "alu" and v.dtype == dt.bool_ and v.guard is None and user is not None
                and (user.guard is None or user.kind in ("store", "reduce"))
                and position[id(user)] > position[id(v)] + 1):
            before.setdefault(id(user), []).append(v)
    if not before:
        return order
    moved = {id(v) for vs in before.values() for v in vs}
    out: list[Value] = []
    for v in order:
        out.extend(before.get(id(v), ()))
        if id(v) not in moved:
            out.append(v)
    return out


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


def _unrounded(store: Value, dtype: dt.DType) -> Value:
    """What ``store`` into a ``dtype`` buffer converts: a float32 value rounded to bfloat16 (or
    float16) just before it is stored is converted from its float32 source, which rounds the
    same once (round to nearest even leaves a rounded value as it is): the round trip would cost a
    CUDA store two conversions and a shift per element, a C++ store its software rounding twice.
    Only where the store sits beside the rounding: a row's value rounded before the loop that
    stores it along the row is carried into that loop, its source is not (a bf16 mean's
    backward, ``g / n`` stored across the rows beside its column sum, named an undeclared
    ``v3``: CPU fuzz seed 363425026600)."""
    v = store.srcs[0]
    beside = store.loop != 0 if v.inner else store.loop == 0 and store.stage == v.stage
    if (beside and dtype.is_low_precision and v.kind == "alu" and v.arg is Op.CAST and v.dtype == dtype
            and v.srcs[0].dtype == dt.float32):
        return v.srcs[0]
    return v
