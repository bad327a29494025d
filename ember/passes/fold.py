"""Constant folding and exact algebraic identities.

* pointwise ops on constants are evaluated (with torch's own semantics, 16-bit floats in float32
  as kernels compute them, rounded once) and become constants; arithmetic on symbolic sizes stays
  symbolic;
* reductions over size-1 dims become casts (``unit_reduction``);
* identities that hold bit for bit, NaN and -0.0 included: x*1, x/1, x-0, x+(-0.0), integer x+0,
  -(-x), where(constant, a, b), and casts that round-trip through a wider type (bf16->f32->bf16).
  A constant ``where`` keeps a branch it drops that can raise (an index out of range, an integer
  division by zero): eager computes both branches and raises, so ember's kernels check them.
"""

from __future__ import annotations

from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv

from ..analysis.reference import eval_node
from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Graph, Node, make, rewrite
from ..ir.ops import POINTWISE_OPS, REDUCE_OPS, Op


def scalar_value(node: Node) -> Any:
    """The constant a node broadcasts everywhere (through views of a 0-d CONST), else None."""
    while node.op in (Op.EXPAND, Op.RESHAPE, Op.PERMUTE, Op.SLICE):
        node = node.inputs[0]
    if node.op is Op.CONST:
        return node.arg
    return None


def _is_literal(v: Any) -> bool:
    return v is not None and not isinstance(v, sympy.Basic)


def _exactly_holds(inner: dt.DType, wide: dt.DType) -> bool:
    """Every value of ``inner`` survives a round trip through ``wide``."""
    if inner == wide or inner.is_bool:
        return True
    if inner.is_float:
        return wide.is_float and wide.itemsize > inner.itemsize
    if wide.is_float:  # integers up to 16 bits fit float32's mantissa, 32 bits fit float64's
        mantissa = {2: 11, 4: 24, 8: 53}[wide.itemsize]
        return inner.itemsize * 8 <= mantissa
    return wide.is_int and wide.itemsize > inner.itemsize and (inner.kind == wide.kind or wide.kind == "i")


_EXACT_CASTS = (dt.int64, dt.float32, dt.float64)
_SYMBOLIC = {Op.ADD: lambda a, b: a + b, Op.SUB: lambda a, b: a - b, Op.MUL: lambda a, b: a * b,
             Op.FLOORDIV: FloorDiv, Op.MAX: sympy.Max, Op.MIN: sympy.Min}


def unit_reduction(node: Node, x: Node) -> Node | None:
    """A reduction over dims that all have size 1, as the pointwise op it is: its input cast to
    its dtype (any/all: tested against 0), plus 0.0 for a float sum (eager's sum starts from
    0.0, so a lone -0.0 sums to 0.0); argmax/argmin: zeros. None for any other reduction."""
    if node.op not in REDUCE_OPS or not all(sh.is_one(x.shape[d]) for d in node.arg):
        return None
    if node.op in (Op.ARGMAX, Op.ARGMIN):
        c = make(Op.CONST, (), 0, dtype=node.dtype, device=node.device, origin=node.origin)
        return make(Op.EXPAND, (c,), node.shape, device=node.device) if node.shape else c
    out = x if x.dtype == node.dtype else make(Op.CAST, (x,), dtype=node.dtype, device=node.device,
                                                origin=node.origin)
    if node.op is Op.SUM and node.dtype.is_float:
        zero = make(Op.CONST, (), 0.0, dtype=node.dtype, device=node.device, origin=node.origin)
        if node.shape:
            zero = make(Op.EXPAND, (zero,), node.shape, device=node.device)
        out = make(Op.ADD, (out, zero), None, dtype=node.dtype, device=node.device, origin=node.origin)
    return out


def unit_reductions(graph: Graph) -> Graph:
    """Every reduction over size-1 dims rewritten as a pointwise op (``unit_reduction``). Not an
    optional pass: the kernel planner needs it, as such a reduction has no loop to reduce in
    (the driver runs it after the pipeline, whichever passes were left out)."""
    return rewrite(graph, lambda node, inputs: unit_reduction(node, inputs[0]) if inputs else None)


def _fold(node: Node, inputs: tuple[Node, ...]) -> Node | None:
    op = node.op
    if op in REDUCE_OPS:
        return unit_reduction(node, inputs[0])
    if op not in POINTWISE_OPS:
        return None
    values = [scalar_value(i) for i in inputs]
    rebuilt_shape = node.shape

    def const(value: Any, dtype: dt.DType = node.dtype) -> Node:
        c = make(Op.CONST, (), value, dtype=dtype, device=node.device, origin=node.origin)
        return make(Op.EXPAND, (c,), rebuilt_shape, device=node.device) if rebuilt_shape else c

    if all(_is_literal(v) for v in values):
        # 16-bit constants are evaluated as kernels compute them, in float32 with the literals
        # as written (a mean's 1 / 65536 in float16 is 1.5e-5, not 1 / inf), then rounded to the
        # result's dtype, as eager rounds each op's result
        scalars = [make(Op.CONST, (), v, dtype=dt.compute_dtype(i.dtype), device=node.device)
                   for v, i in zip(values, inputs)]
        probe = make(op, scalars, node.arg, dtype=dt.compute_dtype(node.dtype), device="cpu")
        try:
            value = eval_node(probe, [eval_node(s, [], {}) for s in scalars], {})
        except (ZeroDivisionError, RuntimeError):
            # (an integer division by zero: left to its kernel, which raises eager's error when
            # it runs, where folding it failed the whole graph's compile)
            return None
        return const(value.to(dt.to_torch(node.dtype)).item())
    # sizes and other Python ints Dynamo made symbolic: arithmetic in int64 folds into one
    # expression (narrower ints wrap, as eager's int8 n * 200 does: kept as ops); a cast folds
    # where C's conversion of the expression is the cast (int64, float32, float64; a 16-bit
    # float rounds, a narrower int wraps, a bool tests: kept as casts)
    if all(v is not None for v in values) and node.dtype == dt.int64 and op in _SYMBOLIC and all(
            i.dtype == dt.int64 for i in inputs):
        return const(_SYMBOLIC[op](*(sh.expr(v) for v in values)))
    if op is Op.CAST and values[0] is not None and isinstance(values[0], sympy.Basic) and (
            node.dtype in _EXACT_CASTS and inputs[0].dtype in _EXACT_CASTS):
        return const(values[0])

    # identities
    if op is Op.CAST:
        (x,) = inputs
        if x.dtype == node.dtype:
            return x
        if x.op is Op.CAST and x.inputs[0].dtype == node.dtype and _exactly_holds(node.dtype, x.dtype):
            return x.inputs[0]
    if op is Op.NEG and inputs[0].op is Op.NEG:
        return inputs[0].inputs[0]
    if op is Op.WHERE and _is_literal(values[0]):
        kept, dropped = (inputs[1], inputs[2]) if values[0] else (inputs[2], inputs[1])
        if not _raising(dropped) - _raising(kept):
            return kept
    if op is Op.MUL:
        for x, v in ((inputs[0], values[1]), (inputs[1], values[0])):
            if _is_literal(v) and v == 1 and not isinstance(v, bool):
                return x
    if op is Op.DIV and _is_literal(values[1]) and values[1] == 1:
        return inputs[0]
    if op is Op.SUB and _is_literal(values[1]) and values[1] == 0 and not _negative_zero(values[1]):
        return inputs[0]
    if op is Op.ADD:
        for x, v in ((inputs[0], values[1]), (inputs[1], values[0])):
            if _is_literal(v) and v == 0 and (node.dtype.is_int or _negative_zero(v)):
                return x
    return None


_CHECKED_INDEXING = (Op.GATHER, Op.INDEX, Op.INDEX_PUT)
_INTEGER_DIVISIONS = (Op.FLOORDIV, Op.TRUNCDIV, Op.MOD, Op.FMOD)


def _raising(node: Node) -> set[Node]:
    """The nodes computing ``node`` runs that raise on bad data: gathers and indexing whose
    indices kernels bounds-check, integer divisions whose divisor may be 0."""
    seen, stack, found = set(), [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op in _CHECKED_INDEXING or (n.op in _INTEGER_DIVISIONS and not n.dtype.is_float):
            found.add(n)
        stack.extend(n.inputs)
    return found


def _negative_zero(v: Any) -> bool:
    return isinstance(v, float) and v == 0.0 and str(v).startswith("-")


def fold_constants(graph: Graph) -> Graph:
    return rewrite(graph, _fold)
