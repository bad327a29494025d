"""C spellings of size and index expressions (sympy), shared by the C-style renderers.

Indices are int64 arithmetic; C's / and % truncate, so a quotient or remainder of a size that may
be negative goes through the prelude's flooring helpers, as Python floors.
"""

from __future__ import annotations

import functools

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

from ..ir import shapes as sh
from ..schedule.device_sizes import DEVICE_TOTALS
from ..schedule.kernel_ir import Kernel


@functools.lru_cache(maxsize=1 << 14, typed=True)  # (typed: 2.0 is not 2)
def index_expr(e: sympy.Expr) -> str:
    """A non-negative integer index expression as C (int64 arithmetic). Memoized: a kernel's
    accesses share their terms, and sympy's printing and sign queries cost milliseconds."""
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
        ints = all(_integer_valued(a) for a in e.args)
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


def _integer_valued(e: sympy.Expr) -> bool:
    """Whether a size expression is an integer. sympy's ``is_integer`` is None for a remainder
    whose divisor it cannot prove nonzero (roll's shift % a symbolic size), and a min of those
    spelled in double fed C's integer %, which does not compile."""
    if e.is_integer:
        return True
    if e.is_integer is False or e.is_Float:
        return False
    if isinstance(e, (sympy.Mod, Mod, PythonMod, sympy.Add, sympy.Mul, *sh.MAXES, *sh.MINS)):
        return all(_integer_valued(a) for a in e.args)
    return False


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
