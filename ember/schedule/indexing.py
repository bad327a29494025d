"""Index arithmetic for views.

A *point* is a tuple of index expressions, one per dimension of a node, written in the kernel's
loop variables. Evaluating a view at a point means evaluating its input at a mapped point. When a
chain of views ends at a buffer, the chain is composed into strides instead (as torch does for
views), so loads through permutes, slices and compatible reshapes stay plain affine offsets.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ..ir import shapes as sh
from ..ir.node import Node
from ..ir.ops import Op
from ..ir.strides import Strided, compose_strided, reshape_groups

Point = tuple[sympy.Expr, ...]


def offset(point: Point, strides: Sequence[sympy.Expr], base: sympy.Expr = sympy.Integer(0)) -> sympy.Expr:
    return sympy.expand(base + sum((p * s for p, s in zip(point, strides)), sympy.Integer(0)))


def recombine(e: sympy.Expr) -> sympy.Expr:
    """``k * c * (x // c) + k * (x % c)`` as ``k * x``: a flat index split into dims and joined again (a matmul
    kernel's row o0 seen as (batch, position) by its epilogue, then as a row by the matmul)."""
    e = sympy.expand(e)
    if not isinstance(e, sympy.Add):
        return e
    for term in e.args:
        for f in sympy.Mul.make_args(term):
            if not isinstance(f, FloorDiv):
                continue
            x, c = f.args
            scale = sympy.cancel(term / (c * f))  # term = scale * c * (x // c)
            rest = sympy.expand(scale * ModularIndexing(x, sympy.Integer(1), c))
            if rest in e.args:
                return recombine(e - term - rest + sympy.expand(scale * x))
    return e


def map_reshape(point: Point, out_shape: Sequence[sympy.Expr], in_shape: Sequence[sympy.Expr]) -> Point:
    # an empty input has no element to read: its sizes of 0 count as 1 in the divisions, which
    # would divide by 0 (its dims stay in the point, which still moves with the loops: a point
    # fixed at 0 would be hoisted out of them, a load of an empty tensor's first element)
    nonzero = [sympy.Integer(1) if sh.equal(n, 0) else n for n in in_shape]
    groups = reshape_groups(out_shape, in_shape) or [(list(range(len(out_shape))), list(range(len(in_shape))))]
    result: list[sympy.Expr] = [sympy.Integer(0)] * len(in_shape)
    for outs, ins in groups:
        outs = [i for i in outs if not sh.is_one(out_shape[i])]
        ins = [j for j in ins if not sh.is_one(in_shape[j])]  # size-1 dims stay at index 0
        linear = recombine(offset(tuple(point[i] for i in outs), sh.contiguous_strides([out_shape[i] for i in outs])))
        strides = sh.contiguous_strides([nonzero[j] for j in ins])
        for k, j in enumerate(ins):
            if len(ins) == 1:
                result[j] = linear
            elif k == 0:
                result[j] = FloorDiv(linear, strides[k])
            else:
                result[j] = ModularIndexing(linear, strides[k], nonzero[j])
    return tuple(result)


def map_view(node: Node, point: Point) -> Point:
    """The point of ``node.inputs[0]`` that view ``node`` shows at ``point``."""
    x = node.inputs[0]
    if node.op is Op.PERMUTE:
        result = [sympy.Integer(0)] * x.rank
        for i, d in enumerate(node.arg):
            result[d] = point[i]
        return tuple(result)
    if node.op is Op.EXPAND:
        if x.rank == 0:
            return ()
        return tuple(sympy.Integer(0) if sh.is_one(s) else p for s, p in zip(x.shape, point))
    if node.op is Op.SLICE:
        dim, start, step, _length = node.arg
        return point[:dim] + (start + point[dim] * step,) + point[dim + 1:]
    if node.op is Op.RESHAPE:
        return map_reshape(point, node.shape, x.shape)
    raise AssertionError(node.op)


def base_layout(view: Node, base: Node, strides: Sequence[sympy.Expr]) -> sh.Shape | None:
    """Dense strides for ``base`` under which the chain of views from it up to ``view`` has
    ``strides`` (eager's, for an output replayed from a buffer: ``y.unsqueeze(0).expand(3, n, m)``
    of a transposed ``y`` is transposed too), tried over the orders of base's dims; None where
    no order gives them (or there are too many orders to try)."""
    chain: list[Node] = []
    n = view
    while n is not base:
        chain.append(n)
        n = n.inputs[0]
    dims = [d for d in range(base.rank) if not sh.is_one(base.shape[d])]
    if len(dims) > 5:
        return None
    for order in itertools.permutations(dims):  # (outermost first: row-major is tried first)
        layout = [sympy.Integer(1)] * base.rank
        size: sympy.Expr = sympy.Integer(1)
        for d in reversed(order):
            layout[d] = size
            size = size * base.shape[d]
        strided: Strided | None = (tuple(layout), sympy.Integer(0))
        for v in reversed(chain):
            strided = compose_strided(v, strided) if strided is not None else None
        if strided is not None and all(sh.equal(a, b) or sh.is_one(m)
                                       for a, b, m in zip(strided[0], strides, view.shape)):
            return tuple(layout)
    return None


# Sizes given to every size symbol when asking whether a chain of views copies: two unrelated
# values, so that a chain copies at both only when its sizes do not happen to line up.
VIEW_SAMPLES = (61, 97)


def replay_copies(view: Node, base: Node) -> bool:
    """Whether ATen, replaying the views from a contiguous ``base`` up to ``view``, would copy: a
    reshape merges dims that are not adjacent in memory (attention's heads, (B, T, H, D) permuted
    to (B, H, T, D) and flattened to (B*H, T, D) for ``bmm``). Judged by ATen's view rule with the
    size symbols at sample values, and only where both samples copy: where that is wrong, a copy
    is made that a view could have been, never a different value."""
    chain: list[Node] = []
    n = view
    while n is not base:
        chain.append(n)
        n = n.inputs[0]
    return all(_replay_copies_at(chain[::-1], base, sample) for sample in VIEW_SAMPLES)


def _replay_copies_at(steps: list[Node], base: Node, sample: int) -> bool:
    def size(e: object) -> int:
        e = sh.expr(e)
        return int(e.subs({s: sample for s in e.free_symbols}))

    copies = False
    try:
        shape = [size(d) for d in base.shape]
        strides = _contiguous(shape)
        for v in steps:
            new = [size(d) for d in v.shape]
            if v.op is Op.RESHAPE:
                viewed = _view_strides(shape, strides, new)
                copies = copies or viewed is None
                strides = viewed or _contiguous(new)
            elif v.op is Op.PERMUTE:
                strides = [strides[d] for d in v.arg]
            elif v.op is Op.EXPAND:
                lead = len(new) - len(shape)
                strides = [0] * lead + [0 if old == 1 and n != 1 else st
                                        for old, n, st in zip(shape, new[lead:], strides)]
            else:
                dim, _start, step, _length = v.arg
                strides = strides[:dim] + [strides[dim] * size(step)] + strides[dim + 1:]
            shape = new
    except (TypeError, ValueError, ZeroDivisionError):  # a size the sample does not make an
        # integer, or one dividing by a size it makes 0 (x.reshape(-1, 1000) at 61): cannot tell
        return False
    return copies


def _contiguous(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def _view_strides(shape: list[int], strides: list[int], new: list[int]) -> list[int] | None:
    """The strides of ``new`` as a view of a tensor of ``shape`` and ``strides``, or None where
    torch's ``view`` refuses (a merged run of dims that are not adjacent in memory)."""
    if 0 in shape or not shape:
        return _contiguous(new)
    out = [0] * len(new)
    view_d = len(new) - 1
    chunk_stride, tensor_numel, view_numel = strides[-1], 1, 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        # a chunk of dims ends where the next one out is not laid right after it
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * chunk_stride
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_stride, tensor_numel, view_numel = strides[d - 1], 1, 1
    return out if view_d == -1 else None
