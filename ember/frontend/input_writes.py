"""AOTAutograd's writes into graph inputs (``copy_(input, value)`` at a graph's end: BatchNorm's
running stats, an optimizer's state) as the lowering sees them: which calls are such writes,
what value each leaves in its input, and the in-place calls ember does not lower."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..ir.node import Node, op_name
from ..ir.ops import Op

if TYPE_CHECKING:
    from .context import Context


class InputWriteError(NotImplementedError):
    """An in-place write into a graph input that ember does not lower (the graph then runs
    through ATen, which makes it)."""


def writes_input(fx_node: torch.fx.Node) -> bool:
    """Is this AOTAutograd's write of an input's new value into it, ``copy_(input, value)``
    (kept in the graph: ``keep_inference_input_mutations``; the graph may return its result,
    the input)? Other in-place calls on an input (``set_`` of FSDP's parameters), or whose
    result nothing reads, raise: as an ATen call no value needs, the write would be dropped."""
    target = fx_node.target
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return False
    first = fx_node.args[0] if fx_node.args else None
    into_input = isinstance(first, torch.fx.Node) and first.op == "placeholder"
    if (target is torch.ops.aten.copy_.default and into_input and not fx_node.kwargs
            and all(user.op == "output" for user in fx_node.users)):
        return True
    if into_input or not fx_node.users:
        raise InputWriteError(f"{op_name(target)} writes {'input ' if into_input else ''}{first} in place")
    return False


def written_back(fx_node: torch.fx.Node) -> bool:
    """Does the graph write this call's result into its first argument, one of its inputs?"""
    first = fx_node.args[0] if fx_node.args else None
    return (isinstance(first, torch.fx.Node) and first.op == "placeholder"
            and any(user.target is torch.ops.aten.copy_.default and user.args[:2] == (first, fx_node)
                    and writes_input(user) for user in fx_node.users))


def written_value(ctx: Context, target: Any, value: Any, same_dtype: bool = False) -> Node:
    """What ``copy_(target, value)`` leaves in the input ``target``: ``value`` in its dtype and
    broadcast to its shape."""
    if (isinstance(target, Node) and target.op is Op.INPUT and target.dtype is None and isinstance(value, Node)
            and value.dtype is None and value.shape is not None and value.shape == target.shape
            and same_dtype):
        return value  # (complex or float8: ATen's result, of the input's dtype and shape, copied in)
    if not (isinstance(target, Node) and target.op is Op.INPUT and target.dtype is not None
            and isinstance(value, Node) and value.dtype is not None and value.shape is not None):
        raise InputWriteError(f"copy_ into input {target!r} of a value ember holds no tensor of")
    ctx.aten = ctx.origin = "copy_"
    return ctx.expand_to(ctx.cast(value, target.dtype), target.shape)


def check_not_written(fx_node: torch.fx.Node, written: dict[torch.fx.Node, Node]) -> None:
    """The program writes an input at its end: nothing may read it after its write."""
    for arg in fx_node.all_input_nodes:
        if arg in written:
            raise InputWriteError(f"{fx_node.name} reads input {arg.name} after copy_ wrote it")
