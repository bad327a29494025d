"""Text form of a graph, one node per line, for EMBER_DEBUG=2, ``ember.explain`` and pass tests.

    graph forward(%arg0: f32[s0, 64], %arg1: f32[64]):
      %expand_2: f32[s0, 64] = expand(%arg1, [s0, 64])
      %add_3: f32[s0, 64] = add(%arg0, %expand_2)
      return (%add_3)

A graph that writes new values into its inputs (``Graph.mutated_inputs``) says so before it
returns: ``write %arg1 <- %add_3``. A forward value a backward op reads (``Graph.eager_saved``:
read rounded, as eager saved it) ends its line with ``# saved``.
"""

from __future__ import annotations

from typing import Any

from . import shapes as sh
from .node import ArgRef, ExternCall, Graph, InputSpec, Node, TensorConst
from .ops import REDUCE_OPS, Op


def node_names(graph: Graph) -> dict[Node, str]:
    names: dict[Node, str] = {}
    for i, node in enumerate(graph.nodes):
        if node.op is Op.INPUT:
            names[node] = f"%{node.arg.name}"
        else:
            names[node] = f"%{_stem(node)}_{i}"
    return names


def _stem(node: Node) -> str:
    if node.op is Op.EXTERN:
        return node.arg.name.split(".")[-1]
    return node.op.value


def type_str(node: Node) -> str:
    if node.shape is None:
        return "tuple"
    dtype = node.dtype.short if node.dtype is not None else "opaque"
    return f"{dtype}{sh.fmt(node.shape)}"


def format_arg(node: Node, names: dict[Node, str] | None = None) -> str:
    arg = node.arg
    if node.op is Op.CONST:
        return _value(arg)
    if node.op in REDUCE_OPS:
        return f"dims={list(arg)}"
    if node.op in (Op.RESHAPE, Op.EXPAND):
        return sh.fmt(arg)
    if node.op is Op.PERMUTE:
        return str(list(arg))
    if node.op is Op.SLICE:
        dim, start, step, length = arg
        return f"dim={dim}, start={start}, step={step}, len={length}"
    if node.op is Op.IOTA:
        length, start, step = arg
        return f"len={length}, start={start}, step={step}"
    if node.op is Op.CAST:
        return node.dtype.name
    if node.op is Op.GETITEM:
        return str(arg)
    if node.op is Op.SEGMENT_REDUCE:
        return arg.value
    if node.op is Op.CHUNK_SUM:
        return f"lead={arg[0]}, chunks={arg[1]}"
    if isinstance(arg, ExternCall):
        return _template(arg.args, node, names) + (
            ", " + ", ".join(f"{k}={_template(v, node, names)}" for k, v in arg.kwargs.items())
            if arg.kwargs else "")
    if isinstance(arg, TensorConst):
        return arg.name
    return "" if arg is None else repr(arg)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _template(t: Any, node: Node, names: dict[Node, str] | None) -> str:
    if isinstance(t, ArgRef):
        src = node.inputs[t.index]
        return names[src] if names else f"in{t.index}"
    if isinstance(t, (list, tuple)):
        inner = ", ".join(_template(x, node, names) for x in t)
        return f"[{inner}]" if isinstance(t, list) else f"({inner})"
    return _value(t)


def format_node(node: Node, names: dict[Node, str]) -> str:
    if node.op is Op.INPUT:
        return f"{names[node]}: {type_str(node)}"
    parts = [names[i] for i in node.inputs] if node.op is not Op.EXTERN else []
    extra = format_arg(node, names)
    if extra:
        parts.append(extra)
    callee = node.arg.name if node.op is Op.EXTERN else node.op.value
    return f"{names[node]}: {type_str(node)} = {callee}({', '.join(parts)})"


def format_graph(graph: Graph) -> str:
    names = node_names(graph)
    params = ", ".join(_param(n, names) for n in graph.inputs)
    lines = [f"graph {graph.name}({params}):"]
    for node in graph.nodes:
        if node.op is Op.INPUT:
            continue
        lines.append("  " + format_node(node, names) + ("  # saved" if node in graph.eager_saved else ""))
    name = lambda o: "None" if o is None else names.get(o, "?")  # noqa: E731
    for i, k in sorted(graph.mutated_inputs.items()):  # (the last outputs: written, not returned)
        lines.append(f"  write {names[graph.inputs[k]]} <- {name(graph.outputs[i])}")
    returned = graph.outputs[:len(graph.outputs) - len(graph.mutated_inputs)]
    lines.append(f"  return ({', '.join(name(o) for o in returned)})")
    return "\n".join(lines)


def _param(node: Node, names: dict[Node, str]) -> str:
    spec: InputSpec = node.arg
    if spec.kind == "symint":
        return f"{names[node]}: sym = {spec.expr}"
    if spec.kind == "opaque":
        return f"{names[node]}: opaque"
    return f"{names[node]}: {type_str(node)}"
