"""Masked multiplies as selects: the seed article's conditional execution, done by the compiler.

Padded code masks away what it should not count: ``loss * mask`` with ``mask =
(targets[..., 3] > 0).to(dtype)``. Eager computes the loss of every padded box and multiplies
most of them by zero. This pass (on with the ``skip_masked`` option) rewrites such products as
``where(cond, loss, 0)`` and moves the select outward through what keeps a zero a zero (products,
quotients, negation, casts, views, concatenation, padding, sums of two values masked alike).
Kernel generation then computes the masked value only where the mask is 1
(schedule/guards.py): padded boxes are neither loaded nor computed, forward and backward.

It is an option, not a default, because it is not exact: where the mask is 0, everything this
pass moves the select through is 0 in ember, while eager's value is NaN when an inf or NaN met
the zero (or a quotient became 0/0), and -0 where a negation or a negative factor flipped it.
"""

from __future__ import annotations

from typing import Any

from ..ir import dtypes as dt
from ..ir.node import Graph, Node, fill_value, is_plus_zero, make, rewrite
from ..ir.ops import VIEW_OPS, Op


def mask_multiplies(graph: Graph) -> Graph:
    made: dict[Any, Node] = {}

    def build(op: Op, inputs: tuple[Node, ...], arg: Any = None, *, dtype: dt.DType | None = None,
              origin: str | None = None, device: str | None = None) -> Node:
        """One node per (op, inputs, arg): conditions derived alike are the same node, so sums of
        values masked alike can be recognized."""
        key = (op, tuple(id(i) for i in inputs), repr(arg), dtype, device)
        if key not in made:
            made[key] = make(op, inputs, arg, dtype=dtype, device=inputs[0].device if inputs else device,
                             origin=origin)
        return made[key]

    def zeros(like: Node) -> Node:
        c = build(Op.CONST, (), 0.0, dtype=like.dtype, device=like.device)
        return build(Op.EXPAND, (c,), like.shape) if like.shape else c

    def select(cond: Node, x: Node, like: Node) -> Node:
        if x.dtype != like.dtype:
            x = build(Op.CAST, (x,), dtype=like.dtype, origin=like.origin)
        return build(Op.WHERE, (cond, x, zeros(like)), origin=like.origin)

    def condition(m: Node) -> Node | None:
        """The bool a 0/1 mask was made from: cast(bool), through views."""
        if m.op is Op.CAST and m.inputs[0].dtype.is_bool and not m.dtype.is_bool:
            return m.inputs[0]
        if m.op in VIEW_OPS and m.inputs[0].dtype == m.dtype:
            inner = condition(m.inputs[0])
            return None if inner is None else build(m.op, (inner,), m.arg)
        return None

    def masked(n: Node) -> tuple[Node, Node] | None:
        """(cond, x) of ``where(cond, x, 0)``; a 0/1 mask itself is ``where(cond, 1, 0)``."""
        c = condition(n)
        if c is not None:
            one = build(Op.CONST, (), 1.0, dtype=n.dtype, device=n.device)
            return c, build(Op.EXPAND, (one,), n.shape) if n.shape else one
        if n.op is Op.WHERE and _plus_zero(n.inputs[2]) and n.inputs[1].dtype == n.dtype:
            return n.inputs[0], n.inputs[1]
        return None

    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        op = node.op
        if node.dtype is None or not node.dtype.is_float or node.shape is None:
            return None
        parts = [masked(i) for i in inputs]
        if op is Op.MUL:
            for x, m in (inputs, inputs[::-1]):
                c = condition(m)
                if c is not None:
                    return select(c, x, node)
            for other, part in ((inputs[1], parts[0]), (inputs[0], parts[1])):
                if part is not None:
                    return select(part[0], build(Op.MUL, (part[1], other), origin=node.origin), node)
        if op is Op.DIV and parts[0] is not None:
            return select(parts[0][0], build(Op.DIV, (parts[0][1], inputs[1]), origin=node.origin), node)
        if op in (Op.NEG, Op.CAST) and parts[0] is not None and inputs[0].dtype.is_float:
            return select(parts[0][0], build(op, (parts[0][1],), node.arg, dtype=node.dtype,
                                             origin=node.origin), node)
        if op in VIEW_OPS and parts[0] is not None:
            c, x = parts[0]
            return select(build(op, (c,), node.arg), build(op, (x,), node.arg, origin=node.origin), node)
        if op in (Op.ADD, Op.SUB) and parts[0] and parts[1] and parts[0][0] is parts[1][0]:
            return select(parts[0][0], build(op, (parts[0][1], parts[1][1]), origin=node.origin), node)
        if op is Op.CAT and all(parts):
            conds = tuple(p[0] for p in parts)
            xs = tuple(p[1] for p in parts)
            return select(build(Op.CAT, conds, node.arg), build(Op.CAT, xs, node.arg, origin=node.origin), node)
        if op is Op.PAD and parts[0] is not None and _plus_zero(inputs[1]):
            c, x = parts[0]
            false = build(Op.CONST, (), False, dtype=dt.bool_, device=node.device)
            return select(build(Op.PAD, (c, false), node.arg),
                          build(Op.PAD, (x, inputs[1]), node.arg, origin=node.origin), node)
        if op is Op.WHERE and (parts[1] or parts[2]):
            # where(p, a, b) with each branch masked by one cond c, or zero: where(c, where(p, ...), 0)
            c = (parts[1] or parts[2])[0]
            branches = []
            for x, part in zip(inputs[1:], parts[1:]):
                if part is not None and part[0] is c:
                    branches.append(part[1])
                elif part is None and _plus_zero(x):
                    branches.append(x)
                else:
                    return None
            return select(c, build(Op.WHERE, (inputs[0], *branches), origin=node.origin), node)
        return None

    return rewrite(graph, rule)


def _plus_zero(node: Node) -> bool:
    """Is ``node`` filled with +0? The selects this pass builds fill with +0, so an explicit -0.0
    fill (``torch.where(m, x, -0.0)``), equal to 0, must keep its sign: it is no zero here."""
    return is_plus_zero(fill_value(node))
