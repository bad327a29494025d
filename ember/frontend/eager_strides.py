"""The strides eager gives a pointwise op's result, where torch's fake tensors trace others.

Eager lays a pointwise result out with TensorIterator: its dims ordered by its operands'
strides, the first operand deciding where they tie. Several ops' meta functions are Python
decompositions (``copysign`` a ``where`` over ``signbit(b)``, ``xlogy``, ``floor_divide``,
``hardtanh_backward``) that follow another operand, so a fake result of a contiguous ``a`` and a
transposed ``b`` comes out transposed where eager's is contiguous. A graph's outputs are
returned with the strides recorded here (codegen/outputs.py), so they are computed as eager does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._prims_common import make_contiguous_strides_for
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..ir import shapes as sh
from .aten_calls import traced_strides

aten = torch.ops.aten

# TensorIterator ops without ATen's pointwise tag (their results' layouts are computed alike)
_ITERATOR_OPS = frozenset({
    aten.floor_divide.default, aten.softplus_backward.default, aten.hardtanh_backward.default,
    aten.elu_backward.default, aten.hardsigmoid_backward.default, aten.hardswish_backward.default,
    aten.gelu_backward.default, aten.silu_backward.default, aten.mish_backward.default,
    aten.binary_cross_entropy.default,  # (reduction='none'; a reduced loss is 0-d)
})
# pointwise-tagged ops whose eager kernels order their operands otherwise (masked_fill's result
# follows its mask where they tie, threshold_backward's its input): traced as eager lays them out
_OWN_ORDER = frozenset({aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.threshold_backward.default})

Layout = tuple[tuple[Any, ...], tuple[Any, ...]]  # (sizes, strides) as traced: ints or SymInts


def eager_output_strides(out: torch.fx.Node, meta: torch.Tensor,
                         memo: dict[torch.fx.Node, Layout]) -> sh.Shape:
    """The strides eager gives ``out`` (a graph output traced as ``meta``): those traced, but
    for a pointwise op's fresh result laid out from its operands' eager layouts."""
    shape, strides = _layout(out, memo)
    if all(statically_known_true(a == b) or statically_known_true(n == 1)
           for a, b, n in zip(strides, meta.stride(), shape)):
        return traced_strides(meta)
    return sh.shape(strides)


def _layout(node: torch.fx.Node, memo: dict[torch.fx.Node, Layout]) -> Layout:
    """``node``'s (sizes, strides) as eager has them. Iterative: graphs are long chains."""
    stack = [node]
    while stack:
        top = stack[-1]
        if top in memo:
            stack.pop()
            continue
        operands = _operands(top) or _permuted(top)
        missing = [x for x in operands if x not in memo]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        meta = top.meta["val"]
        layout = (tuple(meta.shape), tuple(meta.stride()))
        if _complex_angle(top):  # (eager writes it into a fresh contiguous tensor; the meta follows z)
            layout = (layout[0], make_contiguous_strides_for(layout[0]))
        elif operands and top.target in _PERMUTES:  # (a view: its operand's strides, reordered)
            layout = (layout[0], tuple(memo[operands[0]][1][d] for d in _dims(top)))
        elif operands:
            computed = iterator_strides(tuple(meta.shape), [memo[x] for x in operands])
            if computed is not None:
                layout = (layout[0], computed)
        memo[top] = layout
    return memo[node]


def _complex_angle(node: torch.fx.Node) -> bool:
    """Is ``node`` angle of a complex tensor? Eager's ``angle(z)`` resizes an empty result (contiguous)
    where torch's meta function lays it out like ``z``."""
    return (node.op == "call_function" and node.target is aten.angle.default
            and isinstance(node.args[0], torch.fx.Node)
            and isinstance(node.args[0].meta.get("val"), torch.Tensor) and node.args[0].meta["val"].is_complex())


_PERMUTES = frozenset({aten.permute.default, aten.t.default, aten.transpose.int})


def _permuted(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The operand of a view that reorders dims (``copysign(a, b).t()``), whose layout it keeps."""
    if node.op != "call_function" or node.target not in _PERMUTES or not isinstance(node.args[0], torch.fx.Node):
        return []
    x = node.args[0].meta.get("val")
    return [node.args[0]] if isinstance(x, torch.Tensor) and x.layout == torch.strided else []


def _dims(node: torch.fx.Node) -> list[int]:
    """The operand's dim each dim of a permuting view is."""
    rank = node.args[0].meta["val"].dim()
    if node.target is aten.permute.default:
        return [d % rank for d in node.args[1]]
    dims = list(range(rank))
    if node.target is aten.transpose.int:
        a, b = node.args[1] % rank, node.args[2] % rank
        dims[a], dims[b] = dims[b], dims[a]
        return dims
    return dims[::-1]  # (t: a matrix's dims swapped, a vector's kept)


def _operands(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The tensor operands TensorIterator lays ``node``'s result out from, in order; none where
    the result is not a fresh pointwise one (then it keeps its traced strides)."""
    target = node.target
    meta = node.meta.get("val")
    if (node.op != "call_function" or not isinstance(target, torch._ops.OpOverload)
            or not isinstance(meta, torch.Tensor) or meta.layout != torch.strided
            or not (torch.Tag.pointwise in target.tags or target in _ITERATOR_OPS) or target in _OWN_ORDER):
        return []
    schema = target._schema
    if len(schema.returns) != 1 or schema.returns[0].alias_info is not None or any(
            a.alias_info is not None for a in schema.arguments):
        return []  # (a view, an in-place op, copy_: their results are no fresh layout)
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return []  # (clone(memory_format=...): traced as asked)
    values = [*node.args, *(node.kwargs[a.name] for a in schema.arguments[len(node.args):]
                            if a.name in node.kwargs)]
    operands = [v for v in values if isinstance(v, torch.fx.Node)
                and isinstance(v.meta.get("val"), torch.Tensor) and v.meta["val"].layout == torch.strided]
    return operands


def iterator_strides(shape: tuple[Any, ...], operands: list[Layout]) -> tuple[Any, ...] | None:
    """TensorIterator's result strides for ``shape`` from its operands' layouts (reorder_dimensions
    and then dense strides in that order); None where a comparison of symbolic sizes is unknown."""
    ndim = len(shape)
    if ndim <= 1:
        return None
    strides = []
    for sizes, st in operands:
        lead = ndim - len(sizes)
        if lead < 0:
            return None
        # a broadcast dim (size 1 in the operand, not in the result) has stride 0 there
        strides.append([0] * lead + [0 if _known(n == 1) and not _known(m == 1) else s
                                     for n, s, m in zip(sizes, st, shape[lead:])])

    def should_swap(dim0: int, dim1: int) -> int | None:
        for st in strides:
            a, b = st[dim0], st[dim1]
            if _known(a == 0) or _known(b == 0):
                continue
            if not (_known(a == b) or _known(a < b) or _known(a > b)):
                return None
            if _known(a < b):
                return -1
            if _known(a > b):
                return 1
            if _known(shape[dim0] > shape[dim1]):  # (equal strides: the smaller dim goes inner)
                return 1
            if not _known(shape[dim0] <= shape[dim1]):
                return None
        return 0

    perm = list(range(ndim - 1, -1, -1))  # innermost first
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            order = should_swap(perm[dim0], perm[dim1])
            if order is None:
                return None
            if order > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif order < 0:
                break
    out: list[Any] = [0] * ndim
    step: Any = 1
    for d in perm:
        out[d] = step
        step = step * shape[d]
    return tuple(out)


def _known(cond: Any) -> bool:
    return bool(cond) if isinstance(cond, bool) else statically_known_true(cond)


def is_iterator_op(op: Any) -> bool:
    """Does eager compute ``op``'s result with TensorIterator: a pointwise op (or one of the
    backward ops that are) returning one fresh tensor, no view and no in-place write?"""
    if (not isinstance(op, torch._ops.OpOverload) or op in _OWN_ORDER
            or not (torch.Tag.pointwise in op.tags or op in _ITERATOR_OPS)):
        return False
    schema = op._schema
    return (len(schema.returns) == 1 and schema.returns[0].alias_info is None
            and all(a.alias_info is None for a in schema.arguments)
            and not any(a.name == "memory_format" for a in schema.arguments))


def restrided(decomposition: Any, eager_strides: Any) -> Any:
    """``decomposition`` with its result copied into the strides eager gives it,
    ``eager_strides(out, *args, **kwargs)`` (None: unknown, kept as it is), where they may differ:
    what the graph traces after it, and returns, then has eager's strides. A copy in the traced
    graph is no op in ember's IR: a kernel just writes that layout. (Strides are compared only
    where known: comparing symbolic ones would guard on sizes.)"""
    def decompose(*args: Any, **kwargs: Any) -> Any:
        out = decomposition(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.layout != torch.strided:
            return out  # (NotImplemented too: the op stays, ATen computes it)
        strides = eager_strides(out, *args, **kwargs)
        if strides is None or all(_known(a == b) or _known(n == 1)
                                  for a, b, n in zip(strides, out.stride(), out.shape)):
            return out
        # (functional: decompositions run where AOTAutograd no longer removes mutations)
        return aten.copy.default(torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device), out)
    return decompose


def _iterator_result_strides(out: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, ...] | None:
    operands = [(tuple(a.shape), tuple(a.stride())) for a in (*args, *kwargs.values())
                if isinstance(a, torch.Tensor) and a.layout == torch.strided]
    return iterator_strides(tuple(out.shape), operands)


def in_eager_layout(op: Any, decomposition: Any) -> Any:
    """``decomposition`` of the TensorIterator op ``op``, its result in eager's layout where the
    decomposition's ops laid it out otherwise (xlogy's ``where`` over ``isnan(other)`` follows
    ``other``)."""
    return restrided(decomposition, _iterator_result_strides)
