"""Ragged row ids and positions in training graphs: recomputed in the backward, never saved.

``Ragged.row_ids()`` is ``ember::row_ids`` (searchsorted(offsets[1:], arange(T), right=True) of
offsets a Ragged validated). AOTAutograd's min-cut partitioner may only recompute ops on its
allowlist, and that op is not on it, so by default
the forward saves the row ids (8 bytes a packed row, written and read again) and the backward
sees an opaque tensor where it needs the pattern: inside a segment kernel over the offsets, a row
id is the row itself, and an add by row ids is a segment sum (no atomics). Marking the row ids
for recomputation keeps the pattern visible in the backward graph. The mark is the one activation
checkpointing uses (``node.meta["recompute"]``), which the partitioner honors.

``Ragged.positions()`` (arange(T) - offsets[:-1][row_ids]) gets the same mark: saved, it is 8 more
bytes a row; recomputed, the backward sees that a write at (row ids, positions) fills each row's
prefix of a dense (B, N, ...) tensor, which passes/ragged.py turns into a gather with no
atomics and no zero fill.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ragged import ops as _ragged_ops  # noqa: F401 -- registers torch.ops.ember.row_ids

aten = torch.ops.aten
prims = torch.ops.prims
_ROW_IDS = torch.ops.ember.row_ids.default

_CASTS = (prims.convert_element_type.default, aten._to_copy.default)


def _strip_casts(node: object) -> object:
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in _CASTS:
        node = node.args[0]
    return node


def _arange_end(node: object) -> object:
    """The end of ``arange(end)`` / ``arange(0, end, 1)``; None for anything else."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    if node.target is aten.arange.default:
        return node.args[0]
    if node.target is aten.arange.start_step and node.args[0] == 0 and (len(node.args) < 3 or node.args[2] == 1):
        return node.args[1]
    return None


def _row_ids(node: object) -> tuple[fx.Node, object] | None:
    """(offsets placeholder, T) when ``node`` is ``ember::row_ids(offsets, T)`` of a graph input."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is _ROW_IDS):
        return None
    offsets = node.args[0]
    if not (isinstance(offsets, fx.Node) and offsets.op == "placeholder"):
        return None
    return offsets, node.args[1]


def row_ids_nodes(node: fx.Node) -> list[fx.Node] | None:
    """``[node]`` when it is ``Ragged.row_ids()`` (``ember::row_ids``) of a graph input's offsets;
    else None. (A hand-written searchsorted may search offsets of another start or end: it is
    no row ids, and gets no special treatment.)"""
    return [node] if _row_ids(node) is not None else None


def positions_nodes(node: fx.Node) -> list[fx.Node] | None:
    """``node`` and the nodes it is computed from, when it is arange(T) - offsets[:-1][row_ids]
    (``Ragged.positions()``) of a graph input's offsets, through casts; else None."""
    if node.op != "call_function" or node.target is not aten.sub.Tensor or len(node.args) != 2:
        return None
    arange, taken = (_strip_casts(a) for a in node.args)
    if not (isinstance(taken, fx.Node) and taken.op == "call_function" and taken.target is aten.index.Tensor):
        return None
    starts, indices = taken.args
    if not (isinstance(starts, fx.Node) and starts.target is aten.slice.Tensor and len(indices) == 1
            and tuple(starts.args[1:3]) == (0, 0) and (len(starts.args) < 5 or starts.args[4] == 1)
            and isinstance(starts.args[0], fx.Node) and starts.args[0].op == "placeholder"
            and isinstance(indices[0], fx.Node)):
        return None
    rows = _strip_casts(indices[0])
    found = _row_ids(rows)
    end = _arange_end(arange)
    if found is None or found[0] is not starts.args[0] or end is None or end != found[1]:
        return None
    cone = [node, taken, starts, arange, rows]
    for a in node.args:  # the casts between
        while isinstance(a, fx.Node) and a not in cone:
            cone.append(a)
            a = a.args[0]
    return cone


def mark_row_ids_for_recompute(joint: fx.GraphModule) -> int:
    """Mark every row-ids and positions computation of ``joint`` (a joint forward+backward
    graph) to be recomputed in the backward; returns how many were marked."""
    from torch.utils.checkpoint import CheckpointPolicy

    marked = 0
    for node in joint.graph.nodes:
        cone = row_ids_nodes(node) or positions_nodes(node)
        if cone is None:
            continue
        for n in cone:
            n.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
        marked += 1
    return marked
