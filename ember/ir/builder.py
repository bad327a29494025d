"""Build graphs by hand (pass tests, experiments) and compare graphs structurally.

    b = GraphBuilder()
    x = b.input((4, 8))
    y = b.add(b.relu(x), b.full(1.0, (4, 8)))
    graph = b.build(y)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from . import dtypes as dt
from . import shapes as sh
from .node import Graph, InputSpec, Node, make
from .ops import BINARY_OPS, REDUCE_OPS, UNARY_OPS, Op


class GraphBuilder:
    def __init__(self, name: str = "graph", device: str = "cpu"):
        self.name = name
        self.device = device
        self.inputs: list[Node] = []
        self.nodes: list[Node] = []

    def _add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def input(self, shape: Sequence[Any], dtype: dt.DType = dt.float32, strides: Sequence[Any] | None = None) -> Node:
        shape = sh.shape(shape)
        spec = InputSpec(len(self.inputs), f"arg{len(self.inputs)}", "tensor",
                         sh.shape(strides) if strides is not None else sh.contiguous_strides(shape))
        node = make(Op.INPUT, (), spec, dtype=dtype, shape=shape, device=self.device)
        self.inputs.append(node)
        return self._add(node)

    def op(self, op: Op, *inputs: Node, arg: Any = None, dtype: dt.DType | None = None) -> Node:
        return self._add(make(op, inputs, arg, dtype=dtype, device=self.device))

    def const(self, value: Any, dtype: dt.DType = dt.float32) -> Node:
        return self.op(Op.CONST, arg=value, dtype=dtype)

    def full(self, value: Any, shape: Sequence[Any], dtype: dt.DType = dt.float32) -> Node:
        return self.expand(self.const(value, dtype), shape)

    def expand(self, x: Node, shape: Sequence[Any]) -> Node:
        return self.op(Op.EXPAND, x, arg=sh.shape(shape))

    def reshape(self, x: Node, shape: Sequence[Any]) -> Node:
        return self.op(Op.RESHAPE, x, arg=sh.shape(shape))

    def permute(self, x: Node, dims: Sequence[int]) -> Node:
        return self.op(Op.PERMUTE, x, arg=tuple(dims))

    def slice(self, x: Node, dim: int, start: Any, step: Any, length: Any) -> Node:
        return self.op(Op.SLICE, x, arg=(dim, sh.expr(start), sh.expr(step), sh.expr(length)))

    def cast(self, x: Node, dtype: dt.DType) -> Node:
        return self.op(Op.CAST, x, dtype=dtype)

    def relu(self, x: Node) -> Node:
        return self.op(Op.MAX, x, self.full(0.0, x.shape, x.dtype))

    def reduce(self, op: Op, x: Node, dims: Sequence[int]) -> Node:
        return self.op(op, x, arg=tuple(sorted(dims)))

    def __getattr__(self, name: str) -> Any:
        # b.add(x, y), b.exp(x), b.sum(x, dims) ... for every op by its enum name
        try:
            op = Op[name.upper()]
        except KeyError:
            raise AttributeError(name) from None
        if op in UNARY_OPS or op in BINARY_OPS or op is Op.WHERE:
            return lambda *xs: self.op(op, *xs)
        if op in REDUCE_OPS:
            return lambda x, dims: self.reduce(op, x, dims)
        raise AttributeError(name)

    def build(self, *outputs: Node) -> Graph:
        return Graph(self.inputs, list(outputs), self.nodes, self.name)


def _arg_key(arg: Any) -> Any:
    if isinstance(arg, float):
        return repr(arg)
    if isinstance(arg, tuple):
        return tuple(_arg_key(a) for a in arg)
    if isinstance(arg, sympy.Basic):
        return sympy.expand(arg)
    if isinstance(arg, InputSpec):
        return (arg.index, arg.kind)
    return arg


def structurally_equal(a: Graph, b: Graph) -> bool:
    """Same computation: outputs built by the same ops with the same arguments from inputs in the
    same positions (node order, names and dead nodes do not matter)."""
    if len(a.inputs) != len(b.inputs) or len(a.outputs) != len(b.outputs):
        return False
    pairs: dict[Node, Node] = dict(zip(a.inputs, b.inputs))

    def same(x: Node | None, y: Node | None) -> bool:
        if x is None or y is None:
            return x is y
        if x in pairs:
            return pairs[x] is y
        ok = (x.op is y.op and x.dtype == y.dtype and _arg_key(x.arg) == _arg_key(y.arg)
              and (x.shape is None) == (y.shape is None)
              and (x.shape is None or sh.shapes_equal(x.shape, y.shape))
              and len(x.inputs) == len(y.inputs) and all(same(i, j) for i, j in zip(x.inputs, y.inputs)))
        if ok:
            pairs[x] = y
        return ok

    return all(same(x, y) for x, y in zip(a.outputs, b.outputs))
