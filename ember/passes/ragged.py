"""Writes of packed ragged rows into a dense tensor, as gathers.

``dense[r.row_ids(), r.positions()] = values`` (``index_put``, or ``index_put(accumulate=True)``
as the backward of the gather ``dense[r.row_ids(), r.positions()]``) puts each packed row t of
sequence b at (b, t - offsets[b]): the rows of sequence b fill the prefix of length
offsets[b+1] - offsets[b] of dense[b], and no two rows share a place. Written as a scatter it
needs the whole tensor filled first (a kernel of its own), then a kernel over the T packed rows
storing by index (atomic adds when accumulating: float32 partials, and one more kernel to round
them to a 16-bit dtype). Written as what it is, it is a gather over the dense tensor:

    out[b, n, ...] = n < length[b] ? values[offsets[b] + n, ...] (+ dense[b, n, ...]) : dense[b, n, ...]

one kernel, no atomics and no fill, in which the values' producers (a loss's gradient) fuse: a
padded place costs two loads of the offsets and a store. Its grid is (B, N), not T, so it needs
no ragged total from the host either.

Eager raises IndexError when a sequence is longer than N; the gather keeps that check by reading
each length through ``iota(N + 1)`` at the length itself, an index the kernel checks.

The dense tensor's R rows and the B sequences are often counted by different size symbols (a
batch size that changes between calls, or dense rows static while the offsets are dynamic).
Then row b reads its extent at offsets[min(b, B)] .. offsets[min(b + 1, B)]: rows past B are
empty, as in eager. Sequences past R that have rows would be written out of bounds, where eager
raises IndexError; their rows, offsets[B] - offsets[min(R, B)], join every length's check.
"""

from __future__ import annotations

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Graph, Node, make, positions_offsets, rewrite, row_ids_offsets
from ..ir.ops import Op


def ragged_writes_as_gathers(graph: Graph) -> Graph:
    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        if node.op is not Op.INDEX_PUT or node.arg[0] != 0 or len(inputs) != 4 or isinstance(node.arg[1], str):
            return None
        dense, values, rows, positions = inputs
        offsets = row_ids_offsets(rows)
        if offsets is None or positions_offsets(positions) is not offsets or dense.rank < 2:
            return None
        if any(sh.static(d) == 0 for d in dense.shape[:2]):
            return None  # no place of the plane runs the checks (symbolic sizes are never 0)
        return _gather(dense, values, offsets, accumulate=bool(node.arg[1]), origin=node.origin)

    return rewrite(graph, rule)


def _gather(dense: Node, values: Node, offsets: Node, *, accumulate: bool, origin: str | None) -> Node:
    rows, width = dense.shape[:2]
    batch = sympy.expand(offsets.shape[0] - 1)
    total = values.shape[0]
    feature = dense.shape[2:]
    plane = (rows, width)

    def node(op: Op, *inputs: Node, arg: object = None, dtype: dt.DType | None = None) -> Node:
        return make(op, inputs, arg, dtype=dtype, device=dense.device, origin=origin)

    def const(value: object, dtype: dt.DType, shape: tuple) -> Node:
        c = node(Op.CONST, arg=value, dtype=dtype)
        return node(Op.EXPAND, c, arg=shape) if shape else c

    def on_plane(x: Node, shape: tuple) -> Node:
        return node(Op.EXPAND, node(Op.RESHAPE, x, arg=shape), arg=plane)

    def int64(x: Node) -> Node:
        return x if x.dtype == dt.int64 else node(Op.CAST, x, dtype=dt.int64)

    def offsets_at(index: Node) -> Node:
        return int64(node(Op.INDEX, offsets, index, arg=0))

    if sh.equal(rows, batch):
        starts = int64(node(Op.SLICE, offsets, arg=(0, sympy.Integer(0), sympy.Integer(1), batch)))
        ends = int64(node(Op.SLICE, offsets, arg=(0, sympy.Integer(1), sympy.Integer(1), batch)))
        lengths = node(Op.SUB, ends, starts)
    else:
        b = node(Op.IOTA, arg=(rows, 0, 1), dtype=dt.int64)
        last = const(batch, dt.int64, (rows,))
        starts = offsets_at(node(Op.MIN, b, last))
        ends = offsets_at(node(Op.MIN, node(Op.ADD, b, const(1, dt.int64, (rows,))), last))
        lengths = node(Op.SUB, ends, starts)
        if not sh.equal(sympy.Max(rows, batch), rows):
            # the rows of sequences past R push every length past N + 1: the check below raises
            end = node(Op.INDEX, offsets, const(batch, dt.int64, ()), arg=0)
            kept = node(Op.INDEX, offsets, const(sympy.Min(rows, batch), dt.int64, ()), arg=0)
            lost = int64(node(Op.SUB, end, kept))
            lengths = node(Op.ADD, lengths, node(Op.MUL, node(Op.EXPAND, lost, arg=(rows,)),
                                                 const(sympy.expand(width + 1), dt.int64, (rows,))))
    # a length above N raises, as eager's write past the end does: iota(N + 1)[length] is the
    # length itself, read through an index the kernel checks
    checked = node(Op.INDEX, node(Op.IOTA, arg=(sympy.expand(width + 1), 0, 1), dtype=dt.int64), lengths, arg=0)
    place = on_plane(node(Op.IOTA, arg=(width, 0, 1), dtype=dt.int64), (1, width))
    inside = node(Op.LT, place, on_plane(checked, (rows, 1)))
    row = node(Op.ADD, on_plane(starts, (rows, 1)), place)
    # outside a sequence the gather is not computed (a where's untaken branch), but its index is
    # checked: point it at one row of padding, so that T = 0 stays in range too
    row = node(Op.WHERE, inside, row, const(total, dt.int64, plane))
    padding = tuple((sympy.Integer(0), sympy.Integer(1 if d == 0 else 0)) for d in range(values.rank))
    zero = False if values.dtype.is_bool else 0.0 if values.dtype.is_float else 0
    padded = node(Op.PAD, values, const(zero, values.dtype, ()), arg=padding)
    gathered = node(Op.INDEX, padded, row, arg=0)
    if accumulate:
        gathered = node(Op.ADD, dense, gathered)
    cond = node(Op.EXPAND, node(Op.RESHAPE, inside, arg=(*plane, *(sympy.Integer(1),) * len(feature))),
                arg=dense.shape)
    return node(Op.WHERE, cond, gathered, dense)
