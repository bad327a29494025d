"""ATen FX graph (from AOTAutograd, core-ATen decomposed) -> ember IR.

Each ATen op with an entry in ``LOWERINGS`` (frontend/context.py; filled by the frontend's
aten_*.py modules, one per op family) becomes a few IR nodes; anything else (or a lowering that
declines with ``Unsupported``) becomes an EXTERN node that calls the ATen op itself inside the
compiled program. Nothing the user writes makes lowering fail. A lowering gets the call's arguments with
tensors replaced by IR nodes and returns IR node(s); ``Context`` casts and broadcasts operands,
and the result is cast to the dtype ATen would give.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._sympy.functions import FloatPow, FloatTrueDiv, ToFloat

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import (
    Graph,
    InputSpec,
    Node,
    TensorConst,
    make,
    op_name,
    record_ragged_totals,
    view_chain,
)
from ..ir.ops import Op
from .aten_calls import (
    extern_call,
    is_sym,
    is_tuple_result,
    replayed_value,
    traced_strides,
    tuple_item,
    whole_memory,
)
from .autograd_inputs import aot_input_views
from .context import Context, ShapeDisagreement, Unsupported, lookup, meta_dtype, size_arg
from .eager_strides import eager_output_strides
from .input_writes import check_not_written, writes_input, written_back, written_value
from .partition import READ_BY_BACKWARD


def _sym_dtype(val: Any) -> dt.DType:
    if isinstance(val, torch.SymBool | bool):
        return dt.bool_
    if isinstance(val, torch.SymFloat | float):
        return dt.float64
    return dt.int64


def _device_of(gm: torch.fx.GraphModule) -> str:
    """The graph's device: an accelerator if any tensor lives on one (0-d CPU tensors mix with
    GPU tensors as scalars), else the CPU."""
    devices = [str(n.meta["val"].device) for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return next((d for d in devices if d != "cpu"), "cpu")


def lower_graph(gm: torch.fx.GraphModule, name: str = "graph", donated: frozenset[int] = frozenset()) -> Graph:
    """Turn an ATen-level FX graph into an ember Graph (unsimplified; the pass pipeline follows).
    ``donated``: the placeholder indices whose memory the graph may reuse (``InputSpec.donated``)."""
    from . import (  # noqa: F401  (fill LOWERINGS)
        aten_copies,
        aten_float_bits,
        aten_indexing,
        aten_pointwise,
        aten_reductions,
        aten_reorder,
        aten_scalars,
        aten_scans,
        aten_views,
    )

    ctx = Context(_device_of(gm))
    env: dict[torch.fx.Node, Any] = {}
    inputs: list[Node] = []
    outputs: list[Node | None] = []
    scalar_outputs: set[int] = set()
    output_strides: list[sh.Shape | None] = []
    fresh_outputs: set[int] = set()
    whole_outputs: set[int] = set()  # (Graph.whole_outputs)
    repeated_outputs: dict[int, int] = {}  # (Graph.repeated_outputs)
    fresh_views: dict[int, int] = {}  # (Graph.fresh_views)
    first_return: dict[torch.fx.Node, int] = {}
    effects = ctx.effects  # checks that return nothing, sizes read with .item() (Graph.effects)
    storages: dict[Any, int] = {}  # fake storages of the inputs and the outputs so far
    ctx.shared_output_storages = _shared_output_storages(gm)
    eager_layouts: dict[torch.fx.Node, Any] = {}  # (eager_strides.py)
    written: dict[torch.fx.Node, Node] = {}  # input placeholder -> the value copy_ writes into it

    for fx_node in gm.graph.nodes:
        val = fx_node.meta.get("val")
        if val is None:
            val = replayed_value(fx_node)
        if fx_node.op == "placeholder":
            if isinstance(val, torch.Tensor) and val.is_neg():
                # (x.conj().imag passed in: ATen reads its memory negated, a kernel would not)
                raise NegativeBitInput(f"input {fx_node.name} has ATen's negative bit (a view such as "
                                       "x.conj().imag)")
            node = _placeholder(fx_node, len(inputs), val, ctx.device, len(inputs) in donated)
            ctx.bindable |= _carried_symbols(node)
            if isinstance(val, torch.Tensor):
                storages.setdefault(storage_of(val), -1)
                ctx.input_storages.add(storage_of(val))
            inputs.append(node)
            ctx.nodes.append(node)
            env[fx_node] = ctx.const(val, _sym_dtype(val)) if is_sym(val) else node
        elif fx_node.op == "get_attr":
            tensor = getattr(gm, fx_node.target)
            if not isinstance(tensor, torch.Tensor):  # a higher-order op's subgraph (cond's branches):
                env[fx_node] = tensor                 # an argument of that op's ATen call
                continue
            if tensor.dim() == 0 and tensor.device.type == "cpu" and ctx.device != "cpu":
                # a scalar the code wrote (``x[:, 0] = 7`` on a GPU): eager reads it as a number.
                # (Moved for real: AOTAutograd may still hold its fake mode.)
                from torch._subclasses.fake_tensor import unset_fake_temporarily
                with unset_fake_temporarily():
                    tensor = tensor.to(ctx.device)
            dtype = dt.from_torch(tensor.dtype) if dt.is_supported_torch(tensor.dtype) else None
            node = make(Op.TENSOR, (), TensorConst(fx_node.target, tensor), dtype=dtype,
                        shape=sh.shape(tensor.shape), device=str(tensor.device))
            ctx.nodes.append(node)
            env[fx_node] = node
        elif fx_node.op == "call_function" and writes_input(fx_node):
            metas = [getattr(a, "meta", {}).get("val") for a in fx_node.args[:2]]
            same = all(isinstance(m, torch.Tensor) for m in metas) and metas[0].dtype == metas[1].dtype
            written[fx_node.args[0]] = written_value(ctx, env[fx_node.args[0]], env[fx_node.args[1]], same)
            env[fx_node] = env[fx_node.args[0]]  # (returned: the input itself, written)
        elif fx_node.op == "call_function":
            check_not_written(fx_node, written)
            ctx.written_back = written_back(fx_node)
            env[fx_node] = _call(ctx, fx_node, env, val)
            ctx.written_back = False
            if isinstance(env[fx_node], Node) and isinstance(val, torch.Tensor):
                ctx.metas.setdefault(env[fx_node], val)
            if fx_node.target in _EFFECTS and isinstance(env[fx_node], Node):
                effects.append(env[fx_node])
        elif fx_node.op == "output":
            for i, out in enumerate(_flat_outputs(fx_node.args[0])):
                meta = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
                output_strides.append(eager_output_strides(out, meta, eager_layouts)
                                      if isinstance(meta, torch.Tensor) else None)
                if isinstance(meta, torch.Tensor):
                    if storage_of(meta) not in storages:  # (not an input's, nor an earlier output's)
                        fresh_outputs.add(i)
                        if whole_memory(meta):
                            whole_outputs.add(i)
                    elif out not in first_return and storages[storage_of(meta)] in fresh_outputs:
                        # (another view of a fresh output's memory; maybe all of it, where the
                        # output returned first is a view of it: ``return c.view(-1)[1:], c``)
                        fresh_views[i] = storages[storage_of(meta)]
                        if whole_memory(meta):
                            whole_outputs.add(i)
                    storages.setdefault(storage_of(meta), i)
                    if out in first_return:
                        repeated_outputs[i] = first_return[out]
                    first_return.setdefault(out, i)
                value = env[out] if isinstance(out, torch.fx.Node) else out
                if value is None:
                    outputs.append(None)
                elif isinstance(value, Node):
                    outputs.append(value)
                    if value.op is Op.CONST and isinstance(out, torch.fx.Node) and is_sym(out.meta.get("val")):
                        scalar_outputs.add(i)
                else:
                    node = ctx.const(value, _sym_dtype(value))
                    outputs.append(node)
                    scalar_outputs.add(i)
        else:
            raise Unsupported(f"FX node kind {fx_node.op}")
    mutated_inputs = {}
    for placeholder, value in written.items():  # (after the outputs: Graph.mutated_inputs)
        target = env[placeholder]
        mutated_inputs[len(outputs)] = inputs.index(target)
        outputs.append(value)
        output_strides.append(target.arg.strides)
    written_at = {k: j for j, k in mutated_inputs.items()}
    input_views = {}
    for i, (k, j) in aot_input_views(gm).items():
        j = j if j is not None else written_at.get(k)
        base = outputs[j] if j is not None else inputs[k]
        chain = None
        if outputs[i] is not None and base is not None and base.shape is not None and sh.shapes_equal(
                base.shape, inputs[k].shape):
            chain = view_chain(outputs[i], base)
        input_views[i] = (k, j, chain)
    return record_ragged_totals(Graph(inputs, outputs, ctx.nodes, name, frozenset(scalar_outputs), output_strides,
                                      fresh_outputs=frozenset(fresh_outputs), effects=effects,
                                      size_checks=ctx.size_checks, whole_outputs=frozenset(whole_outputs),
                                      repeated_outputs=repeated_outputs, mutated_inputs=mutated_inputs,
                                      fresh_views=fresh_views, eager_saved=_eager_saved(gm, env),
                                      input_views=input_views))


def _eager_saved(gm: torch.fx.GraphModule, env: dict[torch.fx.Node, Any]) -> frozenset[Node]:
    """The values computed in this graph that AOTAutograd traced in the forward and a backward op
    reads (``Graph.eager_saved``; marked on the joint graph: partition.mark_backward_reads):
    eager's backward reads them as its forward saved them, rounded, whether the partitioner saved
    them or recomputes them in the backward, and the forward reads them so too. Of a recomputed
    ``x * c`` read unrounded, a bfloat16 ``logcumsumexp(x * c)``'s backward
    ``exp(rev_lcse(g - out) + x * c)`` exceeded the rounded ``out`` by half its ulp, exp of up to
    16: gradients 10^6 where eager's are 10^3 (CPU fuzz seed 9801)."""
    return frozenset(env[fx_node] for fx_node in gm.graph.nodes
                     if fx_node.op == "call_function" and fx_node.meta.get(READ_BY_BACKWARD)
                     and isinstance(env.get(fx_node), Node))


class NegativeBitInput(NotImplementedError):
    """An input whose negative bit is set: the graph runs through ATen, which reads it negated."""


# ATen calls that return nothing and must still run: eager's checks of values (one_hot's class
# bounds, torch._assert_async); through ATen they raise as eager does (on a GPU, a device assert)
_EFFECTS = frozenset({torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default,
                      torch.ops.aten._assert_scalar.default})


def storage_of(tensor: torch.Tensor) -> Any:
    """A (fake or real) tensor's storage, hashable and compared by identity: views share their
    base's. A tensor subclass without a storage is its own."""
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(tensor.untyped_storage())
    except (NotImplementedError, RuntimeError):  # (a tensor subclass without one)
        return id(tensor)


def _shared_output_storages(gm: torch.fx.GraphModule) -> set[Any]:
    """The fake storages that two or more of the graph's outputs are over (``y`` and a view of
    it): a lowering that would copy one of them (a gather) declines, so that the view stays one."""
    seen: set[Any] = set()
    shared: set[Any] = set()
    for out in _flat_outputs(gm.graph.output_node().args[0]):
        meta = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
        if isinstance(meta, torch.Tensor):
            storage = storage_of(meta)
            (shared if storage in seen else seen).add(storage)
    return shared


def _flat_outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


_aten = torch.ops.aten
# ops whose indices eager moves to the indexed tensor's device (x_cuda[idx_cpu] is allowed)
_MOVES_INDICES = frozenset({_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default,
                            _aten._unsafe_index.Tensor, _aten._unsafe_index_put.default})


def _only_indexes(fx_node: torch.fx.Node) -> bool:
    """Is this input used only among the indices of ops that move indices to their tensor's device?"""
    users = list(fx_node.users)
    return bool(users) and all(
        u.op == "call_function" and u.target in _MOVES_INDICES and len(u.args) > 1
        and any(i is fx_node for i in (u.args[1] or ()))
        and all(a is not fx_node for a in (u.args[0], *u.args[2:], *u.kwargs.values()))
        for u in users)


_NUMBERED = re.compile(r"_\d+$")


def input_name(fx_name: str) -> str:
    """The name of a graph input in ember's IR and kernels. AOTAutograd names a saved value after
    its op, and the first of them has no number: a kernel parameter named ``sqrt`` hid CUDA's
    ``sqrt()`` from the kernel's own square roots ("expression preceding parentheses ... must
    have function type": GPU fuzz, the kernel fell back to ATen). Names FX numbers
    (``primals_1``, ``sqrt_1``) stay; the others, which may be any function, keyword or local
    a renderer uses (``sqrt``, ``max``, ``v0``, ``buf0``), get ``_in``."""
    return fx_name if _NUMBERED.search(fx_name) else f"{fx_name}_in"


def _placeholder(fx_node: torch.fx.Node, index: int, val: Any, device: str, donated: bool = False) -> Node:
    from .aten_scalars import checked_value_symbol  # (a lowering module: it imports this one)

    name = input_name(fx_node.name)
    if isinstance(val, torch.Tensor):
        dtype = dt.from_torch(val.dtype) if dt.is_supported_torch(val.dtype) else None
        on_host = str(val.device) == "cpu" and device != "cpu"
        # (a dense copy keeps its strides; .to() of any other layout would not)
        moved = device if on_host and (val.dim() == 0 or val.is_contiguous() and _only_indexes(fx_node)) else None
        spec = InputSpec(index, name, "tensor", traced_strides(val), to_device=moved, donated=donated and not moved,
                         item=_item_symbol(fx_node, val) or checked_value_symbol(fx_node, val))
        return make(Op.INPUT, (), spec, dtype=dtype, shape=sh.shape(val.shape), device=moved or str(val.device))
    if is_sym(val) or isinstance(val, int | float | bool):
        spec = InputSpec(index, name, "symint", expr=sh.expr(val) if is_sym(val) or isinstance(val, int) else None)
        return make(Op.INPUT, (), spec, dtype=_sym_dtype(val), shape=())
    return make(Op.INPUT, (), InputSpec(index, name, "opaque"), dtype=None, shape=None)


_SYM_ARITHMETIC: dict[Any, Callable[..., sympy.Expr]] = {
    operator.add: lambda a, b: a + b, operator.sub: lambda a, b: a - b, operator.mul: lambda a, b: a * b,
    operator.neg: lambda a: -a, operator.truediv: lambda a, b: FloatTrueDiv(ToFloat(a) if a.is_integer else a,
                                                                            ToFloat(b) if b.is_integer else b),
    operator.pow: lambda a, b: FloatPow(ToFloat(a) if a.is_integer else a, ToFloat(b) if b.is_integer else b),
    torch.sym_float: lambda a: ToFloat(a) if a.is_integer else a,
}


def _carried_symbols(node: Node) -> set[sympy.Symbol]:
    spec = node.arg
    if spec.kind == "symint":
        return sh.free_symbols([spec.expr]) if spec.expr is not None else set()
    if spec.kind != "tensor":
        return set()
    return sh.free_symbols([*node.shape, *(spec.strides or ())]) | ({spec.item} if spec.item is not None else set())


def _item_symbol(fx_node: torch.fx.Node, val: torch.Tensor) -> sympy.Symbol | None:
    """The symbol a 0-d CPU input's ``.item()`` gives in the graph, if it gives one."""
    if val.dim() != 0 or str(val.device) != "cpu":
        return None
    for user in fx_node.users:
        out = user.meta.get("val")
        if user.target is torch.ops.aten._local_scalar_dense.default and is_sym(out) and out.node.expr.is_Symbol:
            return out.node.expr
        if (user.target is torch.ops.prims.convert_element_type.default and isinstance(out, torch.Tensor)
                and out.dtype == val.dtype):  # (the decomposition of .item() copies first)
            found = _item_symbol(user, val)
            if found is not None:
                return found
    return None


def _call(ctx: Context, fx_node: torch.fx.Node, env: dict[torch.fx.Node, Any], val: Any) -> Any:
    target = fx_node.target
    args = torch.fx.node.map_arg(fx_node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(fx_node.kwargs, lambda n: env[n])
    if target is operator.getitem and isinstance(args[0], (tuple, list)):
        return args[0][args[1]]
    if target is operator.getitem and is_tuple_result(args[0]) and isinstance(args[1], int):
        return tuple_item(ctx, args[0], args[1], val)
    item_of = _bound_by_item(val) if target in _READS_A_SIZE else None
    if item_of is not None and item_of not in ctx.bindable and isinstance(args[0], Node):
        # .item() of a computed tensor (capture_scalar_outputs): a size only the data knows,
        # read by the ATen call when the program runs and used from then on. So is the storage
        # offset (or a stride) of an ATen result no other size gives: y[n:] with n from .item()
        # in training, whose offset n the forward returns for the backward.
        symbol = item_of
        node = extern_call(ctx, target, args, kwargs, None)
        object.__setattr__(node.arg, "binds", symbol)
        ctx.effects.append(node)
        ctx.bindable.add(symbol)
        return ctx.const(val, _sym_dtype(val))
    if is_sym(val):
        # Size arithmetic (sym_size, operator.mul on SymInts, ...): known from its expression.
        ctx.aten = ctx.origin = op_name(target)
        if not sh.expr(val).free_symbols <= ctx.bindable and target in _SYM_ARITHMETIC:
            # a float Dynamo specialized in the code (an optimizer's lr: -0.001 / bias correction)
            # keeps its symbol in the recorded value, which no input carries: compute it from the
            # arguments, as the code does
            if all(isinstance(a, (int, float)) or isinstance(a, Node) and a.op is Op.CONST for a in args):
                exprs = [sympy.sympify(a) if isinstance(a, float) else size_arg(a) for a in args]
                return ctx.const(_SYM_ARITHMETIC[target](*exprs), _sym_dtype(val))
        return ctx.const(val, _sym_dtype(val))
    fn = lookup(target)
    if fn is not None and any(_opaque(a) for a in [*args, *kwargs.values()]):
        # a tensor of a dtype ember has no code for (complex): the op is ATen's, whose checks
        # raise eager's errors (a lowering would read its missing dtype first)
        fn = None
    if fn is not None and _not_strided(fx_node, val):
        # a sparse operand or result (an embedding's sparse gradient added to a dense one): the op
        # is ATen's, which keeps eager's result layout; kernels read only dense memory
        fn = None
    if fn is not None and _unknown_unbacked_sizes(ctx, val):
        # a size the data decides that nothing before gives (x[:n] with n from .item(): the
        # slice's length): ATen computes the result, and the program reads the size from it
        fn = None
    if fn is not None:
        # a decomposed op's parts carry the op the user wrote (softmax, not amax/sub/exp/sum)
        original = fx_node.meta.get("original_aten")
        ctx.aten = op_name(target)
        ctx.origin = op_name(original) if isinstance(original, torch._ops.OpOverload) else ctx.aten
        ctx.out = val
        ctx.arg_metas = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in fx_node.args]
        mark = len(ctx.nodes)
        try:
            result = fn(ctx, *args, **kwargs)
            return _finish(ctx, result, val)
        except Unsupported:
            del ctx.nodes[mark:]  # drop what the declined lowering built
    # (the layouts eager handed the op, from the traced arguments themselves: an argument's
    # node may stand for a clone too, which ember lowers as no op, and keep the metadata of what
    # it cloned)
    traced = torch.fx.node.map_arg((fx_node.args, fx_node.kwargs), lambda n: n.meta.get("val"))
    return extern_call(ctx, target, args, kwargs, val, traced)


def _opaque(arg: Any) -> bool:
    """Is ``arg`` (or an element of a list of them) a node without a dtype or shape?"""
    if isinstance(arg, (list, tuple)):
        return any(_opaque(a) for a in arg)
    return isinstance(arg, Node) and (arg.dtype is None or arg.shape is None)


def _not_strided(fx_node: torch.fx.Node, val: Any) -> bool:
    """Does the op read or return a tensor that is not strided (sparse)?"""
    metas = [val, *(a.meta.get("val") for a in fx_node.all_input_nodes)]
    return any(isinstance(m, torch.Tensor) and m.layout != torch.strided for m in metas)


# ATen calls whose int result may be a size symbol only the data decides
_READS_A_SIZE = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.sym_storage_offset.default,
                 torch.ops.aten.sym_stride.int, torch.ops.aten.sym_size.int)


def _bound_by_item(val: Any) -> sympy.Symbol | None:
    """The symbol an ``.item()`` result binds: its own, or for a bool, the 0/1 integer torch
    spells it with (``Eq(u0, 1)``)."""
    if not is_sym(val):
        return None
    e = sh.expr(val)
    if e.is_Symbol:
        return e
    if isinstance(e, sympy.Eq) and e.lhs.is_Symbol and e.rhs == 1:
        return e.lhs
    return None


def _unknown_unbacked_sizes(ctx: Context, val: Any) -> bool:
    vals = val if isinstance(val, (tuple, list)) else [val]
    return any(isinstance(v, torch.Tensor) and not free_unbacked_symbols(v) <= ctx.bindable
               for v in vals)


def _finish(ctx: Context, result: Any, val: Any) -> Any:
    """Make the lowering's result match what ATen would return (dtype, shape)."""
    if isinstance(result, tuple):
        metas = val if isinstance(val, (tuple, list)) else [None] * len(result)
        return tuple(_finish(ctx, r, m) for r, m in zip(result, metas))
    if isinstance(result, Node) and isinstance(val, torch.Tensor):
        result = ctx.cast(result, meta_dtype(val))
        aten_shape = sh.shape(val.shape)
        if (not sh.shapes_equal(result.shape, aten_shape) and len(result.shape) == len(aten_shape)
                and all(ctx.known_equal(a, b) for a, b in zip(result.shape, aten_shape))):
            # a size a later guard made 1 (ones(s0 % 3 + 1).cumsum(0) called with s0 % 3 == 0):
            # ATen's spelling, which later ops broadcast as the 1 it is
            result = ctx.reshape(result, aten_shape)
        if not sh.shapes_equal(result.shape, aten_shape):
            raise ShapeDisagreement(f"lowering of {ctx.aten} built {sh.fmt(result.shape)}, "
                                    f"ATen gives {sh.fmt(sh.shape(val.shape))}")
    return result
