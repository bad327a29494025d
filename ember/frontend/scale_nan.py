"""Where the gradient-in-forward plan would hide eager's NaN gradient (partition.py).

The plan computes ``K_i``, the gradient at ``u = 1``, and multiplies by the scale ``u`` after;
where the chain masks (cross-entropy's ignored rows) it keeps ``K_i``'s zeros as zeros, as eager's
mask does after scaling, because ``0 * inf`` would be NaN. But a ``K_i`` that is 0 because the
chain multiplied by a 0 (a class weight) is NaN in eager when ``u`` is inf. ``u`` is inf for
finite inputs when it divides by a value that may be 0: cross-entropy's mean with class weights
divides by the sum of the targets' weights. Such graphs keep min-cut.

The test is on the divisor's structure, not on where a weight comes from: a weight passed in,
held by a module, made in the function (``torch.tensor([0., 1])``, ``w.abs()``) or a
LayerNorm's are all factors that may be 0; what tells the class-weighted mean from a language
model's is the divisor. The GPT's mean over the tokens not ignored divides by their count, and a
count of 0 means every row is masked before any factor is met.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .linearity import _zero, is_view_op

aten = torch.ops.aten
prims = torch.ops.prims


def hidden_nan(scale: fx.Node, kept: set[fx.Node], scaled_part: Sequence[fx.Node],
               dependent: set[fx.Node]) -> str | None:
    """Why eager's gradient may be NaN where a masked plan's is 0, or None: the scale ``u``
    divides by a value finite inputs can make 0 (then u is inf) and the chain multiplies by a
    factor that may be 0 where no mask is. Cross-entropy's mean with class weights divides by
    the sum of the targets' weights, which is 0 when every target's class weighs 0, and its
    chain multiplies by those weights: eager's -0 * inf is NaN. A GPT's mean over the tokens not
    ignored divides by their count, and where that is 0 every row is masked before any factor;
    weights merely derived from parameters (a LayerNorm's) do not change that."""
    divisor = _divisor_maybe_zero(scale, kept, dependent)
    if divisor is None:
        return None
    factor = _factor_maybe_zero(scaled_part, dependent)
    if factor is None:
        return None
    return (f"the scale divides by {divisor.name}, which may be 0, and {factor.name} multiplies the masked "
            "chain by what may be 0")


def _divisor_maybe_zero(scale: fx.Node, kept: set[fx.Node], dependent: set[fx.Node]) -> fx.Node | None:
    """A divisor of the scale (in its scalar arithmetic, or in a forward scalar it multiplies by:
    a squared mean's own mean) that may be 0 while some gradient element is not masked."""
    divisors: list[Any] = []
    for node in kept:
        if node.op != "call_function":
            continue
        if node.target is aten.div.Tensor and node.args[1] not in dependent:
            divisors.append(node.args[1])
        elif node.target is aten.mul.Tensor:
            stack = [a for a in node.args if isinstance(a, fx.Node) and a not in dependent]
            seen: set[fx.Node] = set()
            while stack:  # the forward's scalar arithmetic behind the factor
                value = stack.pop()
                if value in seen or not _is_scalar(value):
                    continue
                seen.add(value)
                if value.target is aten.div.Tensor:
                    divisors.append(value.args[1])
                elif value.target is aten.reciprocal.default:
                    divisors.append(value.args[0])
                stack.extend(value.all_input_nodes)
    return next((d for d in divisors if not _nonzero(d) and not _counts_masked_rows(d, scale, dependent)), None)


def _factor_maybe_zero(scaled_part: Sequence[fx.Node], dependent: set[fx.Node]) -> fx.Node | None:
    """A node of the gradient chain that multiplies it by a forward value that may be 0: an
    operand of a product (a weight, a mask as numbers), or a floating-point operand of another op
    (a norm's weight, a softmax's output). Ops that only compare forward values (a relu's
    backward), read indices or write the chain into zeros (a scatter's backward) do not."""
    for node in scaled_part:
        if node.op != "call_function" or node.target in _COMPARING_OPS:
            continue
        product = node.target in (aten.mul.Tensor, aten.mm.default, aten.bmm.default, aten.matmul.default)
        for arg in pytree.arg_tree_leaves(*node.args, **node.kwargs):
            val = arg.meta.get("val") if isinstance(arg, fx.Node) and arg not in dependent else None
            if (isinstance(val, torch.Tensor) and (product or val.is_floating_point() and not _zero(arg))
                    and not _nonzero(arg)):  # (zeros the chain is written into are no factor)
                return node
    return None


_COMPARING_OPS = {aten.where.self, aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.threshold_backward.default,
                  aten.hardtanh_backward.default, aten.max_pool2d_with_indices_backward.default,
                  aten.max_pool3d_with_indices_backward.default}


def _nonzero(value: Any, positive: bool = False) -> bool:
    """Provably no element 0 (or, with ``positive``, every element > 0): a finite number, a size
    (Dynamo specializes sizes 0 and 1), a fill of one, a clamp to a positive minimum; through views,
    casts to floating point and (``positive``) elements picked by index, the number rounded to each
    dtype on the way (1e-50 is 0 in float32, 0.5 is 0 as an integer)."""
    node, dtypes = value, []  # the dtypes the number is rounded to, outermost first
    while isinstance(node, fx.Node) and node.op == "call_function":
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            break
        dtypes.append(val.dtype)
        if not ((is_view_op(node.target) and node.target is not aten.view.dtype)
                or node.target in _CASTS and val.dtype.is_floating_point or positive and node.target in _PICKS):
            break
        node = node.args[0]
    if not isinstance(node, fx.Node):
        number = node
    elif isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat)):
        return True
    elif node.op == "call_function" and node.target in (aten.full.default, aten.full_like.default):
        number = node.args[1]
    elif node.op == "call_function" and node.target is aten.scalar_tensor.default:
        number = node.args[0]
    elif node.op == "call_function" and node.target in (aten.clamp.default, aten.clamp_min.default):
        number, positive = (node.args[1] if len(node.args) > 1 else None), True  # (the clamp's minimum)
    else:
        return False
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
        return False
    for dtype in reversed(dtypes):
        number = torch.tensor(number, dtype=dtype).item()
    return number > 0 if positive else number != 0


_CASTS = {aten._to_copy.default, prims.convert_element_type.default}
_PICKS = {aten.gather.default, aten.index.Tensor, aten.index_select.default}


def _counts_masked_rows(divisor: Any, scale: fx.Node, dependent: set[fx.Node]) -> bool:
    """Is ``divisor`` a count of a condition's true elements (a sum of a boolean tensor, or of
    positive numbers where it holds and 0 elsewhere: class weights made with ``torch.full``) and
    every path from the scale to a gradient a ``where`` of that condition (on a view of the same
    tensor) choosing 0 elsewhere? A count of 0 then masks every element of every gradient, in
    eager and in the plan alike: cross-entropy's mean over the targets not ignored."""
    node = _through_casts(divisor)
    if not (isinstance(node, fx.Node) and node.target in (aten.sum.default, aten.sum.dim_IntList)):
        return False
    counted = _through_casts(node.args[0])
    if (isinstance(counted, fx.Node) and counted.target is aten.where.self and _zero(counted.args[2])
            and _nonzero(counted.args[1], positive=True)):
        counted = counted.args[0]
    if not isinstance(counted, fx.Node) or getattr(counted.meta.get("val"), "dtype", None) is not torch.bool:
        return False
    stack, seen = [scale], set()
    while stack:
        for user in stack.pop().users:
            if user.op == "output":
                return False
            if user in seen:
                continue
            seen.add(user)
            cond, chosen, other = (user.args[:3] if user.target is aten.where.self else (None, None, None))
            if (isinstance(cond, fx.Node) and cond not in dependent and chosen in dependent and _zero(other)
                    and _within(cond, counted)):
                continue  # masked: all 0 when the count is
            stack.append(user)
    return True


def _within(cond: fx.Node, counted: fx.Node) -> bool:
    """Is every element of condition ``cond`` one of ``counted``'s: the same node, or the same
    comparison with a number of the same tensor, seen through views that keep its elements
    (``cond`` may also expand it)?"""
    cond, counted = _elements(cond, expand=True), _elements(counted)
    if cond is counted:
        return True
    return (cond.op == counted.op == "call_function" and cond.target is counted.target
            and cond.target in _SCALAR_COMPARISONS and cond.kwargs == counted.kwargs
            and len(cond.args) == len(counted.args) == 2 and isinstance(cond.args[0], fx.Node)
            and isinstance(counted.args[0], fx.Node) and not isinstance(cond.args[1], fx.Node)
            and cond.args[1] == counted.args[1]
            and _elements(cond.args[0], expand=True) is _elements(counted.args[0]))


_SCALAR_COMPARISONS = {aten.ne.Scalar, aten.eq.Scalar, aten.gt.Scalar, aten.ge.Scalar, aten.lt.Scalar,
                       aten.le.Scalar}
# views with the same elements as their base (a slice has fewer; an expand repeats them)
_SAME_ELEMENTS = {aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
                  aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default,
                  aten.permute.default, aten.t.default, aten.transpose.int}


def _elements(node: fx.Node, expand: bool = False) -> fx.Node:
    while node.op == "call_function" and (node.target in _SAME_ELEMENTS
                                          or expand and node.target is aten.expand.default):
        node = node.args[0]
    return node


def _through_casts(value: Any) -> Any:
    while isinstance(value, fx.Node) and value.op == "call_function" and value.target in _CASTS:
        value = value.args[0]
    return value


def _is_scalar(node: fx.Node) -> bool:
    """A size, or a tensor of one element by static sizes."""
    val = node.meta.get("val")
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    return isinstance(val, torch.Tensor) and all(type(d) is int and d == 1 for d in val.shape)
