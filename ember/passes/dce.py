"""Dead-code elimination: keep only what the outputs need (and every input, to keep positions)."""

from __future__ import annotations

from ..ir.node import Graph


def dce(graph: Graph) -> Graph:
    return Graph.from_outputs(graph.inputs, graph.outputs, graph.name, graph.scalar_outputs, graph.output_strides,
                             graph.totals, graph.fresh_outputs, graph.effects)
