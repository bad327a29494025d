"""ATen calls inside a lowered graph: the EXTERN nodes of the ops ember does not generate (or
whose lowering declined), the items of their tuple results, and the sizes only their results
know. Also how a traced tensor's layout is read (the strides eager gave it)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._sympy.functions import Max

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import ArgRef, ExternCall, Node, make, op_name
from ..ir.ops import Op

if TYPE_CHECKING:
    from .context import Context


def traced_strides(meta: torch.Tensor) -> sh.Shape:
    """A fake tensor's strides. torch writes a contiguous stride as max(1, the sizes after it):
    the 1 matters only where those sizes are 0, and then nothing is stored there."""
    return tuple(st.replace(lambda e: isinstance(e, Max) and 1 in e.args,
                            lambda e: Max(*[a for a in e.args if a != 1]))
                 for st in sh.shape(meta.stride()))


def whole_memory(meta: torch.Tensor) -> bool:
    """Does eager's traced result hold all of its memory (a clone, a new result), not a view into
    a larger intermediate? Symbolic sizes answer only where no size value could change it."""
    if meta.is_sparse or meta.layout != torch.strided:
        return False
    try:
        nbytes = meta.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):  # (a tensor subclass without a storage)
        return False
    empty = any(statically_known_true(n == 0) for n in meta.shape)
    extent = 0 if empty else (
        1 + sum((n - 1) * st for n, st in zip(meta.shape, meta.stride()))) * meta.element_size()
    # (and every element of that memory one of its own: a strided view of a fresh result,
    # ``x.repeat(1)[::3]``, spans all its memory and holds a third of it)
    distinct = 0 if empty else math.prod(n for n, st in zip(meta.shape, meta.stride())
                                         if not statically_known_true(st == 0)) * meta.element_size()
    return (statically_known_true(meta.storage_offset() == 0) and statically_known_true(nbytes == extent)
            and statically_known_true(nbytes == distinct))


def eager_layout(meta: Any) -> sh.Shape | None:
    """A traced tensor's strides where they are not row-major (size-1 dims aside), else None."""
    if not isinstance(meta, torch.Tensor) or meta.is_sparse or meta.layout != torch.strided:
        return None
    strides, shape = traced_strides(meta), sh.shape(meta.shape)
    if all(sh.equal(a, b) or sh.is_one(n) for a, b, n in zip(strides, sh.contiguous_strides(shape), shape)):
        return None
    return strides


def channels_last_layout(meta: Any) -> sh.Shape | None:
    """A traced 4-d or 5-d tensor's strides where they are channels_last's (dense, the channels
    innermost; size-1 dims aside), else None."""
    strides = eager_layout(meta)
    if strides is None or meta.dim() not in (4, 5):
        return None
    shape = sh.shape(meta.shape)
    order = [1, *range(meta.dim() - 1, 1, -1), 0]  # (innermost first: C, then W, H, (D), N)
    expected, step = [0] * meta.dim(), sympy.Integer(1)
    for d in order:
        expected[d] = step
        step = step * shape[d]
    if all(sh.equal(a, b) or sh.is_one(n) for a, b, n in zip(strides, expected, shape)):
        return strides
    return None


def _channels_last_results(val: Any, path: tuple[int, ...]) -> dict[tuple[int, ...], sh.Shape]:
    """``channels_last_layout`` of each tensor in a result, by its path into it."""
    if isinstance(val, torch.Tensor):
        strides = channels_last_layout(val)
        return {} if strides is None else {path: strides}
    found: dict[tuple[int, ...], sh.Shape] = {}
    if isinstance(val, (tuple, list)):
        for i, v in enumerate(val):
            found.update(_channels_last_results(v, (*path, i)))
    return found


def is_sym(val: Any) -> bool:
    return isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool)


# torch.distributed's functional collectives (and their waits)
_COLLECTIVES = frozenset({"_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})


def is_tuple_result(x: Any) -> bool:
    """An ATen call's result that is a tuple ember did not unpack (a higher-order op such as
    run_and_save_rng_state, whose node carries no fake result), or an item of one that is."""
    return isinstance(x, Node) and x.op in (Op.EXTERN, Op.GETITEM) and x.shape is None


def replayed_value(fx_node: torch.fx.Node) -> Any:
    """The fake result of a ``run_with_rng_state`` node (a checkpointed random op replayed in
    the backward), which the partitioner leaves without one: the replayed op's, from the traced
    arguments. A replayed rand_like had none, and the ATen call reading it (an alias) found no
    result to read: the whole backward ran eagerly. None for any other node."""
    if fx_node.target is not torch.ops.higher_order.run_with_rng_state or len(fx_node.args) < 2:
        return None
    op = fx_node.args[1]
    args, kwargs = torch.fx.node.map_arg((fx_node.args[2:], fx_node.kwargs), lambda n: n.meta.get("val"))
    mode = torch._guards.detect_fake_mode((args, kwargs))
    if not isinstance(op, torch._ops.OpOverload) or mode is None:
        return None
    with mode:
        return op(*args, **kwargs)


def tuple_item(ctx: Context, result: Node, index: int, val: Any) -> Node:
    """Item ``index`` of a tuple result: a GETITEM of the ATen call at a path, nested tuples
    included (checkpointed dropout: (rng state, (output, mask)))."""
    call, path = result, ()
    if result.op is Op.GETITEM:
        call, path = result.inputs[0], result.arg if isinstance(result.arg, tuple) else (result.arg,)
    return _getitem(ctx, call, (*path, index), val)


def _getitem(ctx: Context, call: Node, path: tuple[int, ...], val: Any) -> Node:
    """The item of ATen call ``call``'s result at ``path`` (an int arg for a top-level item),
    typed by its fake value ``val``: a tensor, or a tuple whose items are taken later."""
    tensor = isinstance(val, torch.Tensor)
    dtype = dt.from_torch(val.dtype) if tensor and dt.is_supported_torch(val.dtype) else None
    node = make(Op.GETITEM, (call,), path[0] if len(path) == 1 else path, dtype=dtype,
                shape=sh.shape(val.shape) if tensor else None, device=str(val.device) if tensor else call.device,
                origin=call.origin)
    ctx.nodes.append(node)
    return node


def extern_call(ctx: Context, target: Any, args: Any, kwargs: Any, val: Any,
                traced: tuple[Any, Any] | None = None, host_check: bool = False) -> Node | tuple[Node, ...]:
    """An ATen call of ``args`` and ``kwargs`` (nodes where tensors go); ``traced``: the traced
    values of the FX node's (args, kwargs), the layouts eager gave the tensors; ``host_check``:
    ember's own check on the host instead (ExternCall.host_check)."""
    tensors: list[Node] = []
    metas: list[Any] = []

    def template(x: Any, meta: Any = None) -> Any:
        if isinstance(x, Node):
            if x.op is Op.CONST and isinstance(x.arg, sympy.Basic) and x.shape == ():
                return x.arg  # a size: evaluated when the program runs
            tensors.append(x)
            metas.append(meta if isinstance(meta, torch.Tensor) else ctx.metas.get(x))
            return ArgRef(len(tensors) - 1)
        if isinstance(x, (list, tuple)):
            same = isinstance(meta, (list, tuple)) and len(meta) == len(x)
            items = [template(i, meta[k] if same else None) for k, i in enumerate(x)]
            return items if isinstance(x, list) else tuple(items)
        if isinstance(x, dict):
            return {k: template(v, meta.get(k) if isinstance(meta, dict) else None) for k, v in x.items()}
        if is_sym(x):
            return x.node.expr
        return x

    t_args = template(tuple(args), tuple(traced[0]) if traced is not None else None)
    t_kwargs = template(dict(kwargs), dict(traced[1]) if traced is not None else None)
    # random ops, mutations and collectives (each rank must issue the same ones, in one order)
    impure = isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable
        or target.namespace in _COLLECTIVES)
    call = ExternCall(target, t_args, t_kwargs, impure=impure, input_strides=tuple(eager_layout(m) for m in metas),
                      output_strides=_channels_last_results(val, ()), host_check=host_check)
    origin = op_name(target)
    device = str(val.device) if isinstance(val, torch.Tensor) else ctx.device
    if isinstance(val, (tuple, list)):
        node = make(Op.EXTERN, tensors, call, dtype=None, shape=None, device=device, origin=origin)
        ctx.nodes.append(node)

        def items(vals: Any, path: tuple[int, ...]) -> tuple[Any, ...]:
            # nested results too: run_and_save_rng_state (checkpointed dropout) returns
            # (rng state, (output, mask)); a GETITEM's arg is its path into the result
            outs = []
            for i, v in enumerate(vals):
                if isinstance(v, torch.Tensor):
                    outs.append(_getitem(ctx, node, (*path, i), v))
                    _binds_sizes(ctx, outs[-1])
                elif isinstance(v, (tuple, list)):
                    outs.append(items(v, (*path, i)))
                else:
                    outs.append(v)
            return tuple(outs)

        return items(val, ())
    if isinstance(val, torch.Tensor):
        dtype = dt.from_torch(val.dtype) if dt.is_supported_torch(val.dtype) else None
        shape = sh.shape(val.shape)
    else:
        dtype, shape = None, None
    node = make(Op.EXTERN, tensors, call, dtype=dtype, shape=shape, device=device, origin=origin)
    ctx.nodes.append(node)
    if shape is not None:
        _binds_sizes(ctx, node)
    return node


def _binds_sizes(ctx: Context, node: Node) -> None:
    """The program reads sizes only this ATen result knows (nonzero's count) from it. Where it
    is the first to know one, it must run even if only that size is used (``x * nz.shape[0]``):
    it is kept as an effect."""
    new = sh.free_symbols(node.shape) - ctx.bindable
    if new:
        ctx.bindable |= new
        ctx.effects.append(node)
