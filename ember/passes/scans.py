"""Reversed scans: ``flip(scan(flip(x)))`` along the scan's dim is x scanned from its end.

That is the gradient of a cumsum (AOTAutograd's ``reversed_cumsum``: flip, cumsum, flip), and
of logcumsumexp. As three ops, the kernel storing the flipped result read the scan at the other
end of its row, so the scan needed a buffer and a kernel of its own; as one reversed scan
(``ScanArg.reverse``) the kernel walks the row from its end, storing as it goes. Scans chained
between the two flips (``flip(cumprod(cumsum(flip(x))))``) reverse together: ``scan(flip(y))`` is
``flip(reversed scan(y))``, so each flip moves out through the chain until it meets the other.

Padded scans: ``cat([zeros(1), lengths.cumsum(0)])`` (a ragged batch's offsets from its lengths)
or ``F.pad(x.cumsum(-1), (1, 0))`` is the scan of the input with the zeros put before it: the
combine's neutral element leaves every later value unchanged. As a cat of a scan, the kernel
storing the cat read the scan one place off, so the scan had a kernel of its own; as the scan of a
cat, the cat is a producer the scan kernel reads (one kernel).
"""

from __future__ import annotations

import math
from dataclasses import replace

import sympy

from ..ir import shapes as sh
from ..ir.node import Graph, Node, make, rewrite
from ..ir.ops import Op
from .fold import scalar_value


def reversed_scans(graph: Graph) -> Graph:
    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        scan = inputs[0] if inputs else None
        if scan is None or scan.op is not Op.SCAN or flipped_dim(node, scan) != scan.arg.dim:
            return None
        return _unflipped(scan, scan.arg.dim)

    return rewrite(graph, rule)


def _unflipped(node: Node, dim: int) -> Node | None:
    """A node ``m`` with ``node == flip(m)`` along ``dim``: the flip's input where ``node`` is a
    flip along ``dim``, or, where ``node`` scans along ``dim`` an input that has one, ``m``
    scanned the other way; else None. (A loop, not recursion: a chain may be long.)"""
    chain: list[Node] = []  # the scans along dim above the flip, outermost first
    while flipped_dim(node, node.inputs[0] if node.inputs else None) != dim:
        if node.op is not Op.SCAN or node.arg.dim != dim:
            return None
        chain.append(node)
        node = node.inputs[0]
    out = node.inputs[0]
    for scan in reversed(chain):
        out = make(Op.SCAN, (out,), replace(scan.arg, reverse=not scan.arg.reverse), origin=scan.origin)
    return out


def flipped_dim(node: Node, x: Node | None) -> int | None:
    """The one dim ``node`` flips of its input ``x`` (frontend/aten_reorder.py's flip: x indexed
    along that dim at arange(n - 1, -1, -1)), or None when it is no such flip."""
    if x is None or node.op is not Op.INDEX or len(node.inputs) != 2 or not sh.shapes_equal(node.shape, x.shape):
        return None
    d, index = node.arg, node.inputs[1]
    while index.op in (Op.RESHAPE, Op.EXPAND) and index.rank == 1:
        index = index.inputs[0]
    if index.op is not Op.IOTA or index.rank != 1 or not 0 <= d < x.rank:
        return None
    n = x.shape[d]
    length, start, step = index.arg
    if not (sh.equal(length, n) and sh.equal(start, n - 1) and sh.equal(step, -1)):
        return None
    return d


# each combine's neutral element: a prefix of it leaves the scan's later values unchanged
_NEUTRAL = {"sum": 0, "prod": 1, "logsumexp": -math.inf, "max": -math.inf, "min": math.inf}


def padded_scans(graph: Graph) -> Graph:
    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        if node.op is Op.CAT and len(inputs) == 2:
            dim = node.arg
            for scan, pad, first in ((inputs[1], inputs[0], True), (inputs[0], inputs[1], False)):
                # (a reversed scan's neutral goes after it: it walks the row from its end)
                if _pads(node, scan, pad, dim) and scan.arg.reverse is not first:
                    parts = (pad, scan.inputs[0]) if first else (scan.inputs[0], pad)
                    return make(Op.SCAN, (make(Op.CAT, parts, dim, origin=node.origin),), scan.arg, origin=scan.origin)
            return None
        if node.op is Op.PAD and inputs[0].op is Op.SCAN:
            scan, value = inputs
            dim = scan.arg.dim
            lo, hi = node.arg[dim]
            # (a negative amount crops the scan's result: the scan of a cropped input differs)
            before = sh.equal(hi, 0) and _non_negative(lo) and not scan.arg.reverse
            after = sh.equal(lo, 0) and _non_negative(hi) and scan.arg.reverse
            others = all(sh.equal(a, 0) and sh.equal(b, 0) for d, (a, b) in enumerate(node.arg) if d != dim)
            if (before or after) and others and _pads(node, scan, value, dim):
                padded = make(Op.PAD, (scan.inputs[0], value), node.arg, origin=node.origin)
                return make(Op.SCAN, (padded,), scan.arg, origin=scan.origin)
        return None

    return rewrite(graph, rule)


def _non_negative(amount: object) -> bool:
    return bool(sh.expr(amount).is_nonnegative)


def _pads(node: Node, scan: Node, pad: Node, dim: int) -> bool:
    """Is ``pad`` the neutral of ``scan``'s combine, ``scan`` along ``dim``, all of one dtype
    (a cast between them would change what the scan adds up)? A pad of -0.0 is no sum's neutral:
    the scan starts from 0.0, so its first value would be 0.0 where eager's pad stays -0.0."""
    value = scalar_value(pad)
    return (scan.op is Op.SCAN and scan.arg.dim == dim and value is not None
            and not isinstance(value, sympy.Basic) and value == _NEUTRAL[scan.arg.combine]
            and not (isinstance(value, float) and math.copysign(1.0, value) < 0 and value == 0)
            and node.dtype == scan.dtype == scan.inputs[0].dtype == pad.dtype)
