"""What the kernel builder (build.py) is given and how it answers.

A group's spec (its roots, their home points, its outer and inner domain), the buffers it reads
and writes, the exceptions the builder raises for the scheduler to adjust and retry, and the
points of a domain (where a value of a given shape is computed, which loop variables a point uses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ..ir import shapes as sh
from ..ir.node import Node
from ..ir.ops import Op
from .indexing import Point
from .kernel_ir import inner_var, is_index_var, is_indirect_var, outer_var

# nodes whose value is a buffer already (inputs, ATen results and their items, constant tensors):
# no kernel computes them
BUFFER_OPS = frozenset({Op.INPUT, Op.EXTERN, Op.GETITEM, Op.TENSOR})


class NeedsBuffer(Exception):
    def __init__(self, node: Node):
        super().__init__(f"{node!r} must be stored in a buffer")
        self.node = node


class AcrossFailed(NeedsBuffer):
    """A reduction over the kernel's rows whose result a row needs (x - x.mean()): it cannot wait
    for the last row here, so it gets a buffer and a kernel of its own."""


# Reductions a row kernel can also do over all its rows (partials per program, combined by the
# last): those with a neutral element and no position to report.
ACROSS_OPS = frozenset({Op.SUM, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL})


class Conflict(Exception):
    def __init__(self, root: Node, reader: Node):
        super().__init__(f"{reader!r} reads {root!r} at another point")
        self.root, self.reader = root, reader


@dataclass
class BufferInfo:
    name: str
    strides: tuple[sympy.Expr, ...]  # element strides of the tensor as a kernel reads it


@dataclass
class GroupSpec:
    roots: list[Node]
    homes: dict[Node, Point]
    outer: tuple[sympy.Expr, ...]
    inner: tuple[sympy.Expr, ...]
    ref: tuple | None = None  # (full shape, reduce dims) of the reduction that set the domain
    # roots whose small static dim is unrolled into one store per position (a stack of 4 box
    # coordinates): root -> that dim, which its home point holds at 0
    unrolled: dict[Node, int] = field(default_factory=dict)
    # a segment kernel: the offsets its rows (outer dim 0) take their extent from, and the
    # packed length T they index into
    segment: Node | None = None
    segment_total: sympy.Expr | None = None
    # a row kernel that also computes chunk sums (Op.CHUNK_SUM roots at home (CHUNK, inner...)):
    # its rows split into this many runs
    chunks: int | None = None
    # a row kernel that also reduces over all its rows (a loss's mean over per-row values)
    final: bool = False
    # a matmul's (outer (M, N), inner (K,)) and its epilogue: Op.MATMUL nodes become dot values
    matmul: bool = False
    # a scan kernel (inner (the scanned dim,)): Op.SCAN nodes at their home become scan values;
    # whether its loop walks the rows from their end (its scans reversed)
    scan: bool | None = None



def place(shape: tuple[sympy.Expr, ...], var) -> Point:
    """The point of a value of ``shape`` in a domain whose variables ``var(0), var(1), ...``
    run over its dims of more than one element, in order (dims of 1 at 0)."""
    point, k = [], 0
    for s in shape:
        if sh.is_one(s):
            point.append(sympy.Integer(0))
        else:
            point.append(var(k))
            k += 1
    return tuple(point)


def scan_home(shape: sh.Shape, dim: int) -> Point:
    """Where a scan kernel computes a value of ``shape`` scanned along ``dim``: r0 on that dim,
    the outer variables on the others (dims of 1 at 0)."""
    rest = place(shape[:dim] + shape[dim + 1:], outer_var)
    return (*rest[:dim], inner_var(0), *rest[dim:])


def drop_ones(shape: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
    return tuple(s for s in shape if not sh.is_one(s))


def has_indirect(e: sympy.Expr) -> bool:
    return isinstance(e, sympy.Basic) and any(is_indirect_var(s) for s in e.free_symbols)


def has_outer(e: sympy.Expr) -> bool:
    return isinstance(e, sympy.Basic) and any(s.name.startswith("o") and is_index_var(s) for s in e.free_symbols)


def has_inner(e: sympy.Expr) -> bool:
    return isinstance(e, sympy.Basic) and any(s.name.startswith("r") and is_index_var(s) for s in e.free_symbols)


def crosswise(a: tuple | None, b: tuple | None) -> bool:
    """Do two reductions (each ``(full shape, reduce dims)``) over one domain read their sources
    crosswise, one along its last dim (a row kernel's loads) and the other across it (a column
    kernel's)? Domains equal by chance, a square matrix's column sum beside its rows' reductions,
    made one of the two a strided load in every lane: the column sum of RMSNorm's backward over
    4096 x 4096 in its row kernel (row_chunks=0) took 126 ms on the CPU, against 12 for both."""
    return a is not None and b is not None and _along_last(*a) != _along_last(*b)


def _along_last(full: sh.Shape, dims: tuple) -> bool:
    """Does a reduction over ``dims`` of a ``full``-shaped source reduce its last dim (of size
    above one)?"""
    kept = [d for d, s in enumerate(full) if not sh.is_one(s)]
    return not kept or kept[-1] in {d % len(full) for d in dims}
