"""Graph invariants, checked after every pass when EMBER_DEBUG is set.

A failure here is a bug in the pass that ran last: the message names it and the node.
"""

from __future__ import annotations

from . import shapes as sh
from .node import Graph, IRError, infer
from .ops import EXTERN_OPS, Op
from .printer import format_node, node_names


class VerifyError(AssertionError):
    pass


def verify(graph: Graph, after: str = "") -> None:
    where = f" after pass '{after}'" if after else ""
    names = node_names(graph)
    placed: set = set()
    for node in graph.nodes:
        if node in placed:
            raise VerifyError(f"node listed twice{where}: {format_node(node, names)}")
        for i in node.inputs:
            if i not in placed:
                raise VerifyError(f"input used before it is defined{where}: {format_node(node, names)}")
        if node.op is Op.INPUT and node not in graph.inputs:
            raise VerifyError(f"INPUT node missing from graph.inputs{where}: {names[node]}")
        if node.op not in EXTERN_OPS and node.op not in (Op.INPUT, Op.TENSOR):
            try:
                dtype, shape = infer(node.op, node.inputs, node.arg, node.dtype)
            except IRError as e:
                raise VerifyError(f"{e}{where}: {format_node(node, names)}") from None
            if dtype != node.dtype or not sh.shapes_equal(shape, node.shape):
                raise VerifyError(
                    f"recorded type {node.dtype}{sh.fmt(node.shape)} but rule gives "
                    f"{dtype}{sh.fmt(shape)}{where}: {format_node(node, names)}")
        placed.add(node)
    for node in graph.inputs:
        if node not in placed:
            raise VerifyError(f"graph input {node!r} not in node list{where}")
    for out in graph.outputs:
        if out is not None and out not in placed:
            raise VerifyError(f"output {out!r} not in node list{where}")
