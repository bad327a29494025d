"""Size expressions (sympy, with torch's integer functions) spelled as Python: for the host
program (``wrapper.py``) and, with ``in_triton``, for scalars inside Triton kernels; and chains
of views taken in the host program."""

from __future__ import annotations

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

from ..ir import shapes as sh
from ..ir.node import ViewChain
from ..ir.ops import Op


class WrapperError(ValueError):
    """The graph needs something the wrapper cannot express (e.g. a size it cannot bind)."""


def pexpr(e: Any, minmax: tuple[str, str] = ("max", "min"), in_triton: bool = False) -> str:
    """A size expression as Python (``minmax``: how to spell max/min, e.g. for Triton tensors;
    ``in_triton``: float powers and conversions of sizes spelled for a Triton kernel)."""
    e = sympy.sympify(e)

    def p(x: Any) -> str:
        return pexpr(x, minmax, in_triton)

    if isinstance(e, FloatPow):  # sizes in float math (an optimizer's 1 - 0.9 ** step)
        return f"eh.pow({p(e.args[0])}, {p(e.args[1])})" if in_triton else f"({p(e.args[0])} ** {p(e.args[1])})"
    if isinstance(e, ToFloat) and in_triton:
        return f"({p(e.args[0])}).to(tl.float64)"
    if isinstance(e, (FloorToInt, CeilToInt)) and sh.size_quotient(e.args[0]):  # a pad to a multiple of 32
        a, b = e.args[0].args
        if isinstance(e, FloorToInt):
            return p(FloorDiv(a, b))
        return f"(({p(a)} + {p(b)} - 1) // {p(b)})" if sh.nonnegative(a) else f"(-{p(FloorDiv(-a, b))})"
    if isinstance(e, (TruncToInt, FloorToInt, CeilToInt, RoundToInt)):  # (interpolate's 1.5 * h)
        x = p(e.args[0])
        if in_triton:
            fn = {TruncToInt: "", FloorToInt: "tl.floor", CeilToInt: "tl.ceil", RoundToInt: "eh.rint"}[type(e)]
            return f"{fn}({x}).to(tl.int64)"
        return {TruncToInt: f"int({x})", FloorToInt: f"int(({x}) // 1)", CeilToInt: f"(-int(-({x}) // 1))",
                RoundToInt: f"round({x})"}[type(e)]

    if isinstance(e, sympy.Abs):
        return p(sh.abs_as_max(e))
    if sh.bitwise_operator(e):
        return f"({p(e.args[0])} {sh.bitwise_operator(e)} {p(e.args[1])})"
    if isinstance(e, (*sh.MAXES, *sh.MINS)):
        fn = minmax[0] if isinstance(e, sh.MAXES) else minmax[1]
        out = p(e.args[0])
        for a in e.args[1:]:
            out = f"{fn}({out}, {p(a)})"
        return out
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(p(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(p(a) for a in e.args) + ")"
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        # (products: Triton's scalars take no **)
        return "(" + " * ".join([p(e.base)] * int(e.exp)) + ")" if int(e.exp) else "1"
    if isinstance(e, (FloorDiv, CleanDiv, ModularIndexing, Mod, PythonMod, sympy.Mod)):
        a, b = e.args[:2]
        if isinstance(e, ModularIndexing):
            a, b = FloorDiv(a, b) if b != 1 else a, e.args[2]
        floor = isinstance(e, (FloorDiv, CleanDiv))
        if in_triton and not (sh.nonnegative(a) and sh.nonnegative(b)):
            # Triton's // and % truncate as C's do: Python's, for a size expression that may be
            # negative (an int argument n % 3)
            return f"eh.{'floordiv_int' if floor else 'mod_int'}({p(a)}, {p(b)})"
        return f"({p(a)} {'//' if floor else '%'} {p(b)})"
    if isinstance(e, (IntTrueDiv, FloatTrueDiv)):
        return f"({p(e.args[0])} / {p(e.args[1])})"
    if isinstance(e, ToFloat):
        return f"float({p(e.args[0])})"
    if e in (sympy.true, sympy.false):
        return str(bool(e))
    if isinstance(e, sympy.core.relational.Relational) and e.rel_op in _COMPARISONS:
        # a graph returning a size test (``is_causal=q.shape[2] > 1`` split off by Dynamo)
        return f"({p(e.lhs)} {_COMPARISONS[e.rel_op]} {p(e.rhs)})"
    if isinstance(e, (sympy.And, sympy.Or)):
        return "(" + (" and " if isinstance(e, sympy.And) else " or ").join(p(a) for a in e.args) + ")"
    if isinstance(e, sympy.Not):
        return f"(not {p(e.args[0])})"
    if isinstance(e, sympy.Piecewise) and not in_triton and e.args[-1][1] is sympy.true:
        out = p(e.args[-1][0])  # (narrow's start normalized where it may be negative)
        for value, cond in reversed(e.args[:-1]):
            out = f"({p(value)} if {p(cond)} else {out})"
        return out
    fn = sh.unary_float_fn(e)
    if fn is not None:  # math.sqrt(h): an attention scale
        return f"tl.{fn}(({p(e.args[0])}).to(tl.float64))" if in_triton else f"math.{fn}({p(e.args[0])})"
    if e.is_Number:
        return repr(float(e))
    raise WrapperError(f"size expression {e} has no Python spelling here")


_COMPARISONS = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def shape_tuple(shape: tuple[sympy.Expr, ...]) -> str:
    items = [pexpr(s) for s in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def replayed_chain(expr: str, chain: ViewChain) -> str:
    """The views of ``chain`` taken of the tensor ``expr``, as Python."""
    for op, arg, shape in chain:
        if op is Op.RESHAPE:
            expr = f"{expr}.reshape({shape_tuple(shape)})"
        elif op is Op.PERMUTE:
            expr = f"{expr}.permute({tuple(arg)})"
        elif op is Op.EXPAND:
            expr = f"{expr}.expand({shape_tuple(shape)})"
        else:
            dim, start, step_, length = arg
            end = sympy.expand(start + (length - 1) * step_ + 1)
            expr = f"{expr}[{', '.join([':'] * dim + [f'{pexpr(start)}:{pexpr(end)}:{pexpr(step_)}'])}]"
    return expr
