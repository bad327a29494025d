"""Is a joint graph's backward linear in its incoming gradient?

The gradient-in-forward plan (partition.py) computes each gradient with the incoming gradient set
to one and multiplies by the real one afterwards: ``grad(u) = u * grad(1)``. That holds when every
op between the incoming gradient and the gradients is linear in it, as the backward of any
differentiable op is. A tensor hook or a custom ``autograd.Function`` may put anything there
(``g.clamp(-c, c)``, ``g.sign()``, ``g / g.norm()``): for those the plan would be wrong, so it
is not used.

Each op is checked against its rule: an op linear in one argument (views, sums, casts, the
backward ops of the forward's ops) may read the gradient there only; a product (``mul``, ``mm``)
in one operand; a sum (``add``, ``cat``, ``where``, scatters) in every operand that is not
identically zero. Ops outside the rules are taken as not linear.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten
prims = torch.ops.prims

# linear in their first argument (the others are indices, sizes, or forward values)
_FIRST = {
    aten.clone.default, aten.neg.default,
    aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.cumsum.default,
    aten.flip.default, aten.roll.default, aten.repeat.default, aten.index_select.default,
    aten.gather.default, aten.index.Tensor, aten.embedding.default, aten.mul.Scalar, aten.div.Scalar,
    aten.alias.default, aten.lift_fresh_copy.default, aten.squeeze.default,
    aten.unsqueeze.default, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int,
    aten.tensor_split.sections, aten.chunk.default,
    # backward ops: linear in the incoming gradient, their first argument
    aten.threshold_backward.default, aten.gelu_backward.default, aten.silu_backward.default,
    aten.sigmoid_backward.default, aten.tanh_backward.default, aten.hardtanh_backward.default,
    aten.leaky_relu_backward.default, aten.elu_backward.default, aten.softplus_backward.default,
    aten.hardswish_backward.default, aten.hardsigmoid_backward.default, aten.mish_backward.default,
    aten._softmax_backward_data.default, aten._log_softmax_backward_data.default,
    aten.nll_loss_backward.default, aten.nll_loss2d_backward.default, aten.mse_loss_backward.default,
    aten.smooth_l1_loss_backward.default, aten.huber_loss_backward.default,
    aten.binary_cross_entropy_backward.default, aten.native_layer_norm_backward.default,
    aten.native_group_norm_backward.default, aten.native_batch_norm_backward.default,
    aten.convolution_backward.default, aten.max_pool2d_with_indices_backward.default,
    aten.max_pool3d_with_indices_backward.default, aten.avg_pool2d_backward.default,
    aten.avg_pool3d_backward.default, aten._adaptive_avg_pool2d_backward.default,
    aten._adaptive_avg_pool3d_backward.default, aten.embedding_dense_backward.default,
    aten.upsample_nearest2d_backward.default, aten.upsample_bilinear2d_backward.default,
    aten.select_backward.default, aten.slice_backward.default, aten.index_select_backward.default,
    aten.masked_fill.Scalar, aten.masked_fill.Tensor,
    aten.constant_pad_nd.default,
}
# linear in either operand, with the other not read from the gradient
_PRODUCTS = {aten.mul.Tensor, aten.mm.default, aten.bmm.default, aten.matmul.default}
# sums of their tensor operands (alpha scales one): each operand a gradient or zero
_SUMS = {aten.add.Tensor, aten.sub.Tensor, aten.cat.default, aten.stack.default}
# writes of a source into a base at indices: base and source each a gradient or zero
_WRITES = {aten.scatter.src: (0, 3), aten.scatter_add.default: (0, 3), aten.index_add.default: (0, 3),
           aten.index_copy.default: (0, 3), aten.index_put.default: (0, 2), aten._unsafe_index_put.default: (0, 2),
           aten.slice_scatter.default: (0, 1), aten.select_scatter.default: (0, 1),
           aten.diagonal_scatter.default: (0, 1), aten.as_strided_scatter.default: (0, 1)}
# results that do not depend on their argument's values, and are zero (or unset) at any scale of
# it; a fill of another constant (ones_like, full_like(g, 0.1)) is no multiple of the gradient
_SHAPE_ONLY = {aten.zeros_like.default, aten.empty_like.default, aten.new_zeros.default,
               aten.new_empty.default, aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int}
# casts: linear only from one floating dtype into another of at least float32's exponent range
_CASTS = {aten._to_copy.default, prims.convert_element_type.default}
_ZERO_FILLS = {aten.full.default: 1, aten.full_like.default: 1, aten.new_full.default: 2,
               aten.scalar_tensor.default: 0}


# ops that select between the gradient and zero, or write it into zeros: with an incoming gradient
# of inf or NaN, eager's zeros stay zeros (cross-entropy's ignored rows, the elements a cummax or
# a topk did not pick, a relu's negatives) where the plan's product with them is NaN
_MASKS = {aten.where.self, aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.nll_loss_backward.default,
          aten.nll_loss2d_backward.default, aten.threshold_backward.default, aten.hardtanh_backward.default,
          aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default,
          aten.select_backward.default, aten.slice_backward.default, aten.index_select_backward.default,
          aten.embedding_dense_backward.default, aten.constant_pad_nd.default, *_WRITES}


def nonlinear_op(nodes: Iterable[fx.Node], dependent: set[fx.Node]) -> str | None:
    """The first of ``nodes`` (each computed from the incoming gradient: ``dependent`` holds them
    all) that is not linear in it, as "op (node)", or None when all are."""
    for node in nodes:
        if node.op != "call_function" or _linear(node, dependent):
            continue
        return f"{node.target} ({node.name})"
    return None


def masks_gradient(nodes: Iterable[fx.Node]) -> bool:
    """Does any of ``nodes`` select between the gradient and zeros (a ``where`` with a zero
    branch, a masked fill)? A ``where`` between two multiples of the gradient (the Huber loss's
    backward) masks nothing."""
    return any(node.op == "call_function" and node.target in _MASKS
               and (node.target is not aten.where.self or any(_zero(a) for a in node.args[1:3]))
               for node in nodes)


def _linear(node: fx.Node, dependent: set[fx.Node]) -> bool:
    target = node.target
    if any(_reads(v, dependent) for v in node.kwargs.values()):
        return target in _SHAPE_ONLY
    reads = [i for i, a in enumerate(node.args) if _reads(a, dependent)]
    if target is operator.getitem or target in _SHAPE_ONLY:
        return True
    if target is aten.view.dtype:  # the gradient's bits read as another dtype
        return _dtype(node) == _dtype(node.args[0])
    source = next((_dtype(a) for a in node.args if isinstance(a, fx.Node) and a in dependent), None)
    if not _widening(source, _dtype(node)):  # a dtype= that narrows (g.cumsum(1, dtype=torch.float16))
        return False
    if target in _ZERO_FILLS:  # a fill shaped like the gradient: linear if it is a fill of 0
        return _zero(node)
    if target in _CASTS:  # (a widening one: checked above)
        return reads == [0] and None not in (_dtype(node.args[0]), _dtype(node))
    if target in _FIRST or is_view_op(target):
        if target is aten.huber_loss_backward.default and _dtype(node.args[1]) != _dtype(node.args[2]):
            # (kept for ATen, whose kernel refuses the mix: in the forward, eager's backward error
            # would come from the forward call)
            return False
        if target in (aten.masked_fill.Scalar, aten.constant_pad_nd.default):
            return reads == [0] and _literal_zero(node.args[2] if len(node.args) > 2 else 0)
        if target is aten.masked_fill.Tensor:
            return reads == [0] and _zero(node.args[2])
        return reads == [0]
    if target in _PRODUCTS:
        return len(reads) == 1
    if target in (aten.div.Tensor,):
        return reads == [0]
    if target in _SUMS:
        pieces = node.args[0] if target in (aten.cat.default, aten.stack.default) else node.args[:2]
        return all(_gradient_or_zero(p, dependent) for p in pieces)
    if target in (aten.add.Scalar, aten.sub.Scalar):
        return _literal_zero(node.args[1])
    if target is aten.where.self:
        cond, a, b = node.args[:3]
        return cond not in dependent and _gradient_or_zero(a, dependent) and _gradient_or_zero(b, dependent)
    if target in _WRITES:
        base, source = (node.args[i] for i in _WRITES[target])
        index_args = [a for i, a in enumerate(node.args) if i not in _WRITES[target]]
        return (_gradient_or_zero(base, dependent) and _gradient_or_zero(source, dependent)
                and not any(_reads(a, dependent) for a in index_args))
    return False


def _widening(source: torch.dtype | None, result: torch.dtype | None) -> bool:
    """Does a result of dtype ``result`` computed from the gradient in ``source`` keep a multiple
    of the gradient a multiple (a cast, or an op's ``dtype=``)? The same dtype, or float to float
    into a dtype with float32's exponent range (bfloat16, float32, float64). Integer and bool
    results truncate; in float16 the gradient at scale one overflows or flushes to zero where the
    scaled one (a GradScaler's loss scale) would not. Unknown dtypes (a tuple result) pass."""
    if source is None or result is None or result == source:
        return True
    return source.is_floating_point and result.is_floating_point and (
        result.itemsize >= 4 or result is torch.bfloat16)


def _dtype(arg: Any) -> torch.dtype | None:
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None


def _reads(arg: Any, dependent: set[fx.Node]) -> bool:
    if isinstance(arg, (list, tuple)):
        return any(_reads(a, dependent) for a in arg)
    return isinstance(arg, fx.Node) and arg in dependent


def _gradient_or_zero(arg: Any, dependent: set[fx.Node]) -> bool:
    return _zero(arg) or (isinstance(arg, fx.Node) and arg in dependent)


def _zero(arg: Any) -> bool:
    """Identically zero: a fill of 0, or a view or cast of one."""
    if _literal_zero(arg):
        return True
    if not isinstance(arg, fx.Node) or arg.op != "call_function":
        return False
    target = arg.target
    if target in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default):
        return True
    if target in _ZERO_FILLS:
        position = _ZERO_FILLS[target]
        return len(arg.args) > position and _literal_zero(arg.args[position])
    if is_view_op(target) or target in (prims.convert_element_type.default, aten._to_copy.default, aten.clone.default):
        return _zero(arg.args[0])
    return False


def _literal_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def is_view_op(target: Any) -> bool:
    """An op whose result aliases an input (a view), by its schema."""
    return isinstance(target, torch._ops.OpOverload) and any(
        r.alias_info is not None and not r.alias_info.is_write for r in target._schema.returns)
