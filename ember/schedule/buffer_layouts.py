"""Layouts of the buffers only ember's kernels read: the order of the tensors they are computed from.

A buffer nothing outside the program sees (a value one kernel stores and another loads) has no
layout eager prescribes, and was laid out contiguously. In a channels_last network that made its
store a scatter, and split the loops of the kernel storing it: a BatchNorm backward's kernel
walks its rows with the channels in its SIMD lanes, as its channels_last inputs lie, and stored
the gradient it passes on at a stride of H * W elements a lane, in loops over the batch and the
pixels apart where one loop over both would do. Such a buffer now takes the dim order of the
first tensor of its shape it is computed from through pointwise ops (an input, an ATen result, an
earlier buffer), as eager's TensorIterator lays out the result of a pointwise op; contiguous where
that order is the contiguous one, or not known (symbolic strides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..ir import shapes as sh
from ..ir.node import Node
from ..ir.ops import POINTWISE_OPS


def dense_in_order_of(shape: sh.Shape, strides: Sequence[Any]) -> tuple[int, ...] | None:
    """Dense strides for ``shape`` with its dims in the order ``strides`` lays them out (largest
    stride outermost; dims of size 1 and ties keep their place); None where that order is the
    contiguous one, or strides or sizes are symbolic."""
    sizes = [sh.static(s) for s in shape]
    steps = [sh.static(s) for s in strides]
    if len(steps) != len(sizes) or any(v is None for v in (*sizes, *steps)):
        return None
    # (size-1 dims move no element: they stay where they are, outside the dims after them)
    placed = [d for d in range(len(sizes)) if sizes[d] != 1]
    order = sorted(placed, key=lambda d: (-steps[d], d))
    if order == placed:
        return None
    dense, step = [0] * len(sizes), 1
    for d in reversed(order):
        dense[d] = step
        step *= sizes[d]
    for d in range(len(sizes) - 1, -1, -1):  # size-1 dims: the stride of the dims inside them
        if sizes[d] == 1:
            inner = [dense[e] * sizes[e] for e in range(d + 1, len(sizes)) if sizes[e] != 1]
            dense[d] = max(inner, default=1)
    return tuple(dense)


def operand_order(node: Node, strides_of: Callable[[Node], Sequence[Any] | None]) -> tuple[int, ...] | None:
    """Strides for the buffer of pointwise ``node`` in the dim order of the first tensor of its
    shape it is computed from through pointwise ops whose strides ``strides_of`` knows, where that
    order is not the contiguous one; else None."""
    if node.shape is None or len(node.shape) < 2 or node.op not in POINTWISE_OPS:
        return None
    seen: set[int] = set()
    stack = list(reversed(node.inputs))
    while stack:
        x = stack.pop()
        if id(x) in seen or x.shape is None or len(x.shape) != len(node.shape):
            continue
        seen.add(id(x))
        if not all(sh.equal(a, b) for a, b in zip(x.shape, node.shape)):
            continue
        strides = strides_of(x)
        if strides is not None:
            return dense_in_order_of(node.shape, strides)  # (the first tensor's order, as TensorIterator's)
        if x.op in POINTWISE_OPS:
            stack.extend(reversed(x.inputs))
    return None
