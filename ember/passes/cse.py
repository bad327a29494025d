"""Common-subexpression elimination: nodes with the same op, inputs and argument become one.

Random ops (impure EXTERN calls) are never merged: two dropout masks must stay two.
"""

from __future__ import annotations

from typing import Any

from ..ir.node import ExternCall, Graph, Node, TensorConst, rewrite
from ..ir.ops import COMMUTATIVE_OPS, Op


def _arg_key(node: Node) -> Any:
    arg = node.arg
    if node.op is Op.CONST:
        return (type(arg).__name__, repr(arg))  # 0.0 and -0.0 differ; NaN matches NaN
    if isinstance(arg, ExternCall):
        return (arg.target, repr(arg.args), repr(sorted(arg.kwargs.items())))
    if isinstance(arg, TensorConst):
        return id(arg)
    return arg


def cse(graph: Graph) -> Graph:
    seen: dict[Any, Node] = {}

    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        if node.op is Op.INPUT:
            return None
        if node.op is Op.EXTERN and node.arg.impure:
            return None
        ids = tuple(id(i) for i in inputs)
        if node.op in COMMUTATIVE_OPS:
            ids = tuple(sorted(ids))
        key = (node.op, ids, _arg_key(node), node.dtype, node.shape, node.device)
        found = seen.get(key)
        if found is not None:
            return found
        fresh = node if inputs == node.inputs else Node(
            node.op, inputs, node.arg, node.dtype, node.shape, node.device, node.origin)
        seen[key] = fresh
        return fresh

    return rewrite(graph, rule)
