"""Dead-code elimination: keep only what the outputs need (and every input, to keep positions)."""

from __future__ import annotations

from ..ir.node import Graph, toposort


def dce(graph: Graph) -> Graph:
    """``graph`` without the nodes neither an output nor an effect needs, the rest in their order:
    random draws run in program order (fusion keeps impure calls in graph order), and a walk
    back from the outputs drew a second output's randn_like before the first's rand_like, so
    each got the other's numbers where eager's, under the same seed, are reproducible."""
    needed = set(toposort(list(graph.inputs) + [o for o in graph.outputs if o is not None] + list(graph.effects)))
    nodes = [n for n in graph.nodes if n in needed]
    saved = frozenset(n for n in graph.eager_saved if n in needed)
    if len(nodes) != len(needed):  # (a node the list lacks: place every needed one afresh)
        return Graph.from_outputs(graph.inputs, graph.outputs, graph.name, graph.scalar_outputs,
                                  graph.output_strides, graph.totals, graph.fresh_outputs, graph.effects,
                                  graph.size_checks, graph.whole_outputs, graph.repeated_outputs,
                                  graph.mutated_inputs, graph.fresh_views, saved, graph.input_views)
    return graph.with_nodes(graph.inputs, graph.outputs, nodes, eager_saved=saved)
