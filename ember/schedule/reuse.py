"""What the fusion planner (fusion.py) keeps from one attempt to the next.

Planning retries after each ``NeedsBuffer`` and ``Conflict`` (a graph with a dozen GroupNorms
takes tens of attempts), and each attempt groups every root and builds every kernel again. The
planner reuses what an attempt cannot have changed: a root's subtree while no buffer or view
changed (``CountedSet``, ``CountedDict``), and a kernel whose group, subtrees and buffer lookups
(``RecordedReads``) are an earlier attempt's. Its dependency walk skips nodes that reach no target
(``reach_sets``).
"""

from __future__ import annotations

from ..ir.node import Graph, Node
from .group_spec import BufferInfo


class CountedSet(set):
    """A set that counts its changes: what is derived from it (the planner's subtrees) is kept
    until it changes."""

    changes = 0

    def add(self, x: object) -> None:
        if x not in self:
            self.changes += 1
            super().add(x)

    def discard(self, x: object) -> None:
        if x in self:
            self.changes += 1
            super().discard(x)

    def __ior__(self, other: object) -> CountedSet:
        self.changes += 1
        return super().__ior__(other)

    def __isub__(self, other: object) -> CountedSet:
        self.changes += 1
        return super().__isub__(other)

    def remove(self, x: object) -> None:
        raise NotImplementedError("use discard")  # (so every change is counted)

    update = difference_update = pop = clear = intersection_update = symmetric_difference_update = remove


class CountedDict(dict):
    """A dict that counts its changes (the planner's replayed views, which only grow)."""

    changes = 0

    def __setitem__(self, key: object, value: object) -> None:
        if key not in self or self[key] is not value:
            self.changes += 1
            super().__setitem__(key, value)

    def _uncounted(self, *args: object) -> None:
        raise NotImplementedError("the planner's views only grow")

    __delitem__ = pop = popitem = clear = update = setdefault = _uncounted


# Graphs up to this many nodes get reach sets (N^2 / 16 bytes on average: 25 MB at the limit)
REACH_LIMIT = 20000


def reach_sets(graph: Graph) -> dict[Node, int]:
    """node -> the bits of it and every node it reads, directly or not (bit i: graph.nodes[i])."""
    reach: dict[Node, int] = {}
    for i, node in enumerate(graph.nodes):
        bits = 1 << i
        for x in node.inputs:
            bits |= reach[x]
        reach[node] = bits
    return reach


class RecordedReads:
    """A build's view of the buffer table, recording what it looked up: a later attempt whose
    table answers the same reuses the build (the builder reads nothing else of it)."""

    def __init__(self, infos: dict[Node, BufferInfo]):
        self.infos = infos
        self.read: dict[Node, BufferInfo | None] = {}

    def __contains__(self, node: Node) -> bool:
        self.read[node] = self.infos.get(node)
        return node in self.infos

    def __getitem__(self, node: Node) -> BufferInfo:
        self.read[node] = self.infos.get(node)
        return self.infos[node]
