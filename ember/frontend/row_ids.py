"""Ragged row ids in training graphs: recomputed in the backward, never saved.

``Ragged.row_ids()`` is searchsorted(offsets[1:], arange(T), right=True). AOTAutograd's min-cut
partitioner may only recompute ops on its allowlist, and searchsorted is not on it, so by default
the forward saves the row ids (8 bytes a packed row, written and read again) and the backward
sees an opaque tensor where it needs the pattern: inside a segment kernel over the offsets, a row
id is the row itself, and an add by row ids is a segment sum (no atomics). Marking the row ids
and what they are computed from (an arange and a slice of the offsets, both free) for
recomputation keeps the pattern visible in the backward graph. The mark is the one activation
checkpointing uses (``node.meta["recompute"]``), which the partitioner honors.
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten
prims = torch.ops.prims

_CASTS = (prims.convert_element_type.default, aten._to_copy.default)


def _strip_casts(node: object) -> object:
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in _CASTS:
        node = node.args[0]
    return node


def row_ids_nodes(node: fx.Node) -> list[fx.Node] | None:
    """``node`` and the nodes it is computed from, when it is searchsorted(offsets[1:],
    arange(T), right=True) of a graph input's offsets; else None."""
    if node.op != "call_function" or node.target is not aten.searchsorted.Tensor:
        return None
    if not node.kwargs.get("right", False) or node.kwargs.get("sorter") is not None or len(node.args) != 2:
        return None
    seq, values = node.args
    arange = _strip_casts(values)
    if not (isinstance(seq, fx.Node) and seq.target is aten.slice.Tensor and tuple(seq.args[1:3]) == (0, 1)
            and (len(seq.args) < 5 or seq.args[4] == 1) and isinstance(seq.args[0], fx.Node)
            and seq.args[0].op == "placeholder"):
        return None
    if not (isinstance(arange, fx.Node) and arange.target in (aten.arange.start_step, aten.arange.default)):
        return None
    start_step = arange.args[0] if arange.target is aten.arange.start_step else 0
    step = arange.args[2] if len(arange.args) > 2 else 1
    if start_step != 0 or step != 1:
        return None
    cone, x = [node, seq], values
    while isinstance(x, fx.Node) and x is not arange:
        cone.append(x)
        x = x.args[0]
    return [*cone, arange]


def mark_row_ids_for_recompute(joint: fx.GraphModule) -> int:
    """Mark every row-ids computation of ``joint`` (a joint forward+backward graph) to be
    recomputed in the backward; returns how many were marked."""
    from torch.utils.checkpoint import CheckpointPolicy

    marked = 0
    for node in joint.graph.nodes:
        cone = row_ids_nodes(node)
        if cone is None:
            continue
        for n in cone:
            n.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
        marked += 1
    return marked
