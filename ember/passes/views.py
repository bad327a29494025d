"""View simplification: collapse chains of reshapes, permutes and expands, drop views that change
nothing, and turn any view of a broadcast constant into the constant broadcast to the new shape."""

from __future__ import annotations

from ..ir import shapes as sh
from ..ir.node import Graph, Node, make, rewrite, view_base
from ..ir.ops import VIEW_OPS, Op


def _root_const(node: Node) -> Node | None:
    base = view_base(node)
    return base if base.op is Op.CONST else None


def _view(node: Node, x: Node) -> Node | None:
    op = node.op
    if sh.shapes_equal(x.shape, node.shape) and op is not Op.PERMUTE and not (
            op is Op.SLICE and not _identity_slice(node)):
        return x
    const = _root_const(x)
    if const is not None:
        return make(Op.EXPAND, (const,), node.shape, device=node.device) if node.shape else const
    if op is Op.RESHAPE and x.op is Op.RESHAPE:
        inner = x.inputs[0]
        if sh.shapes_equal(inner.shape, node.shape):
            return inner
        return make(Op.RESHAPE, (inner,), node.arg, device=node.device, origin=node.origin)
    if op is Op.PERMUTE:
        if tuple(node.arg) == tuple(range(len(node.arg))):
            return x
        if x.op is Op.PERMUTE:
            dims = tuple(x.arg[d] for d in node.arg)
            inner = x.inputs[0]
            if dims == tuple(range(len(dims))):
                return inner
            return make(Op.PERMUTE, (inner,), dims, device=node.device, origin=node.origin)
    if op is Op.EXPAND and x.op is Op.EXPAND:
        return make(Op.EXPAND, (x.inputs[0],), node.arg, device=node.device, origin=node.origin)
    return None


def _identity_slice(node: Node) -> bool:
    dim, start, step, length = node.arg
    return sh.equal(start, 0) and sh.equal(step, 1) and sh.equal(length, node.inputs[0].shape[dim])


def simplify_views(graph: Graph) -> Graph:
    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        if node.op not in VIEW_OPS:
            return None
        return _view(node, inputs[0])

    return rewrite(graph, rule)
