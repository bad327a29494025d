"""ember's one node type, the graph that holds nodes, and the shape/dtype rules of every op.

Nodes are values: a pass never edits one, it builds new nodes (``rewrite`` below is the engine all
passes share). Shapes are symbolic (see ``shapes.py``); broadcasting is explicit in the IR, so every
pointwise node's inputs have exactly its shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from . import dtypes as dt
from . import shapes as sh
from .ops import (
    BINARY_OPS,
    LEAF_OPS,
    PREDICATE_OPS,
    REDUCE_OPS,
    TERNARY_OPS,
    UNARY_OPS,
    VIEW_OPS,
    Op,
)


@dataclass(frozen=True)
class InputSpec:
    """A graph input. ``kind`` is 'tensor', 'symint' (a size passed as a Python int) or 'opaque'
    (anything else, passed through to ATen calls untouched)."""

    index: int
    name: str
    kind: str = "tensor"
    strides: tuple[sympy.Expr, ...] | None = None  # tensors: element strides, possibly symbolic
    expr: sympy.Expr | None = None                 # symints: the size expression it carries
    # a CPU tensor in a GPU graph where eager allows one (a 0-d tensor as a scalar, the indices of
    # x[idx] and x[idx] = v): moved to this device first
    to_device: str | None = None
    # a backward's saved tensor that nothing else can see (AOTAutograd's donated buffers): once
    # read for the last time, a kernel may write its output over it
    donated: bool = False
    # a 0-d CPU tensor whose value the graph reads as this symbol (Dynamo passes the Python floats
    # of a dynamic=True compile, an optimizer's lr, as such tensors and calls .item() on them)
    item: sympy.Symbol | None = None


SCAN_COMBINES = ("sum", "prod", "logsumexp", "max", "min")  # (max, min: cummax, cummin's values)


@dataclass(frozen=True)
class ScanArg:
    """Op.SCAN's arg: ``combine`` (one of SCAN_COMBINES) accumulated along ``dim``, from its last
    element down when ``reverse`` (a cumsum of a flipped tensor, flipped back: its gradient)."""

    combine: str
    dim: int
    reverse: bool = False

    def __str__(self) -> str:
        return f"{'reversed ' if self.reverse else ''}{self.combine} along {self.dim}"


@dataclass(frozen=True)
class ArgRef:
    """Placeholder for the i-th tensor input of an EXTERN node inside its argument template."""

    index: int


@dataclass(frozen=True, eq=False)
class ExternCall:
    """An ATen call run as-is inside the compiled program (matmul, convolution, unknown ops)."""

    target: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    impure: bool = False  # random ops: never merged by CSE
    binds: Any = None     # ``.item()`` of a computed tensor: the size symbol its result is
    # per tensor input (ArgRef index): the strides eager gave it where they are not contiguous
    # (a channels_last activation into max_pool2d, whose result takes its input's layout)
    input_strides: tuple[Any, ...] = ()
    # the strides of tensor results eager lays out channels_last (a convolution of a channels_last
    # input, its backward's gradients), by their path into the result (() for a lone tensor):
    # kernels read them so, rather than from a contiguous copy
    output_strides: dict[tuple[int, ...], tuple[Any, ...]] = field(default_factory=dict)
    # ember's own check on the host (aten_scalars.raise_unless_fits), not an op eager runs:
    # never among a report's ATen calls
    host_check: bool = False

    @property
    def name(self) -> str:
        return op_name(self.target)


@dataclass(frozen=True)
class SizeCheck:
    """A check of sizes eager makes on the host (Graph.size_checks): ``value`` (a size
    expression, or a 0/1 test of a Python float an input carries: frontend/aten_scalars.py) must
    lie within [low, high], else the program raises ``error`` (a builtin exception's name, eager's
    type) with ``message``, or warns it where ``warn`` (a builtin warning's name: var's degrees
    of freedom)."""

    value: sympy.Expr
    low: int
    high: int
    error: str
    message: str
    warn: bool = False


@dataclass(frozen=True, eq=False)
class TensorConst:
    name: str
    value: Any  # a torch.Tensor


def op_name(target: Any) -> str:
    """'aten.mm' for torch.ops.aten.mm.default, for reports and kernel names."""
    name = getattr(target, "__name__", None) or str(target)
    if hasattr(target, "_schema"):  # OpOverload
        ns = getattr(target, "namespace", "aten")
        base = target._schema.name.split("::")[-1]
        return f"{ns}.{base}"
    return name


class Node:
    """One IR value: ``op`` applied to ``inputs`` with an op-specific ``arg``.

    ``origin`` names the ATen op the node came from, so kernels can say what they fused.
    """

    __slots__ = ("op", "inputs", "arg", "dtype", "shape", "device", "origin")

    def __init__(self, op: Op, inputs: tuple[Node, ...], arg: Any, dtype: dt.DType | None,
                 shape: sh.Shape | None, device: str, origin: str | None = None):
        self.op = op
        self.inputs = inputs
        self.arg = arg
        self.dtype = dtype
        self.shape = shape
        self.device = device
        self.origin = origin

    @property
    def rank(self) -> int:
        assert self.shape is not None
        return len(self.shape)

    def __repr__(self) -> str:
        shape = sh.fmt(self.shape) if self.shape is not None else "?"
        dtype = self.dtype.short if self.dtype else "?"
        return f"<{self.op.value} {dtype}{shape} @{id(self) & 0xffff:04x}>"


# ---------------------------------------------------------------------------------------------
# shape and dtype rules
# ---------------------------------------------------------------------------------------------

class IRError(ValueError):
    """An op built with inputs its rule rejects: a bug in whatever built it."""


def infer(op: Op, inputs: Sequence[Node], arg: Any, dtype: dt.DType | None) -> tuple[dt.DType, sh.Shape]:
    """The result dtype and shape of ``op`` over ``inputs``; ``dtype`` is required for CAST and
    for leaves."""
    if op in UNARY_OPS or op in BINARY_OPS or op in TERNARY_OPS:
        arity = 1 if op in UNARY_OPS else 2 if op in BINARY_OPS else 3
        if len(inputs) != arity:
            raise IRError(f"{op.value} takes {arity} inputs, got {len(inputs)}")
        first = inputs[0].shape
        for x in inputs[1:]:
            if not sh.shapes_equal(x.shape, first):
                raise IRError(f"{op.value}: input shapes {sh.fmt(first)} and {sh.fmt(x.shape)} differ "
                              "(broadcasts are explicit EXPAND nodes)")
        if op is Op.CAST:
            if dtype is None:
                raise IRError("cast needs a target dtype")
            return dtype, first
        if op is Op.WHERE:
            if not inputs[0].dtype.is_bool:
                raise IRError("where: condition must be bool")
            if inputs[1].dtype != inputs[2].dtype:
                raise IRError(f"where: branches {inputs[1].dtype} and {inputs[2].dtype} differ")
            return inputs[1].dtype, first
        if op in BINARY_OPS and inputs[0].dtype != inputs[1].dtype:
            raise IRError(f"{op.value}: input dtypes {inputs[0].dtype} and {inputs[1].dtype} differ")
        if op in PREDICATE_OPS:
            return dt.bool_, first
        return inputs[0].dtype, first
    if op in REDUCE_OPS:
        (x,) = inputs
        dims = tuple(arg)
        if any(d < 0 or d >= x.rank for d in dims) or list(dims) != sorted(set(dims)):
            raise IRError(f"{op.value}: bad reduce dims {dims} for rank {x.rank}")
        if op is Op.SUM and x.dtype.is_bool:
            # (a kernel would add in a bool accumulator, whose partials combine to invalid bool
            # bytes: a sum into bool is lowered as any, aten_reductions._sum)
            raise IRError("sum of bools: make it any")
        out_shape = tuple(sympy.Integer(1) if i in dims else s for i, s in enumerate(x.shape))
        if op in (Op.ARGMAX, Op.ARGMIN):
            return dt.int64, out_shape
        if op in (Op.ANY, Op.ALL):
            return dt.bool_, out_shape
        return x.dtype, out_shape
    if op in VIEW_OPS:
        (x,) = inputs
        return x.dtype, _view_shape(op, x, arg)
    if op is Op.CONST:
        return dtype, ()
    if op is Op.CAT:
        dim = arg
        first = inputs[0]
        for x in inputs[1:]:
            if x.rank != first.rank or x.dtype != first.dtype or any(
                    i != dim and sh.provably_different(a, b) for i, (a, b) in enumerate(zip(x.shape, first.shape))):
                raise IRError(f"cat: inputs {[sh.fmt(i.shape) for i in inputs]} do not concatenate on dim {dim}")
        total = sum((x.shape[dim] for x in inputs), sympy.Integer(0))
        return first.dtype, first.shape[:dim] + (total,) + first.shape[dim + 1:]
    if op is Op.PAD:
        x, value = inputs
        if value.rank != 0 or value.dtype != x.dtype or len(arg) != x.rank:
            raise IRError("pad: a 0-d value of the input's dtype and a (lo, hi) pair per dim")
        return x.dtype, tuple(sympy.expand(s + lo + hi) for s, (lo, hi) in zip(x.shape, arg))
    if op is Op.GATHER:
        x, index = inputs
        dim = arg
        if x.rank != index.rank or not 0 <= dim < max(x.rank, 1) and x.rank:
            raise IRError(f"gather: index rank {index.rank} must equal input rank {x.rank}")
        if not index.dtype.is_int:
            raise IRError(f"gather: index must be an integer tensor, got {index.dtype}")
        return x.dtype, index.shape
    if op is Op.INDEX:
        x, *indices = inputs
        start = arg
        if not indices or any(i.shape != indices[0].shape or not i.dtype.is_int for i in indices):
            raise IRError("index: integer index tensors of one shape")
        if not 0 <= start <= x.rank - len(indices):
            raise IRError(f"index: {len(indices)} indices from dim {start} of a rank-{x.rank} input")
        return x.dtype, x.shape[:start] + indices[0].shape + x.shape[start + len(indices):]
    if op is Op.INDEX_PUT:
        x, src, *indices = inputs
        start = arg[0]
        if not indices or any(i.shape != indices[0].shape or not i.dtype.is_int for i in indices):
            raise IRError("index_put: integer index tensors of one shape")
        if not 0 <= start <= x.rank - len(indices):
            raise IRError(f"index_put: {len(indices)} indices from dim {start} of a rank-{x.rank} input")
        want = x.shape[:start] + indices[0].shape + x.shape[start + len(indices):]
        if src.dtype != x.dtype or not sh.shapes_equal(src.shape, want):
            raise IRError(f"index_put: values must be {x.dtype} of shape {sh.fmt(want)}, got "
                          f"{src.dtype} of shape {sh.fmt(src.shape)}")
        return x.dtype, x.shape
    if op is Op.SCAN:
        (x,) = inputs
        if (not isinstance(arg, ScanArg) or arg.combine not in SCAN_COMBINES or not 0 <= arg.dim < x.rank
                or x.dtype.is_bool or arg.combine == "logsumexp" and not x.dtype.is_float):
            raise IRError(f"scan: a ScanArg over a dim of a rank-{x.rank} {x.dtype} input (numbers; "
                          "logsumexp of floats)")
        return x.dtype, x.shape
    if op is Op.SEGMENT_REDUCE:
        x, offsets = inputs
        if arg not in (Op.SUM, Op.AMAX, Op.AMIN) or x.rank < 1 or offsets.rank != 1 or not offsets.dtype.is_int:
            raise IRError("segment_reduce: sum/amax/amin of packed rows (rank >= 1) by 1-d integer offsets")
        return x.dtype, (sympy.expand(offsets.shape[0] - 1), *x.shape[1:])
    if op is Op.CHUNK_SUM:
        (x,) = inputs
        lead, chunks = arg
        if not 0 < lead < x.rank or not isinstance(chunks, int) or chunks < 1 or not x.dtype.is_float:
            raise IRError("chunk_sum: float rows (at least one leading and one kept dim) in >= 1 chunks")
        return dtype or x.dtype, (sympy.Integer(chunks), *x.shape[lead:])
    if op is Op.MATMUL:
        a, b = inputs
        if (a.rank != 2 or b.rank != 2 or a.dtype != b.dtype or a.dtype not in (dt.float16, dt.bfloat16)
                or sh.provably_different(a.shape[1], b.shape[0])):
            raise IRError(f"matmul: (M, K) @ (K, N) of one 16-bit float dtype, got {a.dtype.short}"
                          f"{sh.fmt(a.shape)} @ {b.dtype.short}{sh.fmt(b.shape)}")
        return dt.float32, (a.shape[0], b.shape[1])
    if op is Op.SEARCH:
        seq, values = inputs
        # (a sequence of rank > 1 is a batch of them: values' leading dims pick the row searched)
        leading = zip(seq.shape[:-1], values.shape[:-1])
        if seq.rank == 0 or seq.dtype != values.dtype or (
                seq.rank > 1 and (values.rank != seq.rank or any(sh.provably_different(a, b) for a, b in leading))):
            raise IRError("search: sorted sequences (one, or one per leading index of the values) "
                          "of the values' dtype")
        return dtype or dt.int64, values.shape
    if op is Op.IOTA:
        length, _start, _step = arg
        return dtype, (sh.expr(length),)
    raise IRError(f"no shape rule for {op.value}; pass dtype and shape explicitly")


def _view_shape(op: Op, x: Node, arg: Any) -> sh.Shape:
    if op is Op.RESHAPE:
        new = sh.shape(arg)
        if sh.provably_different(sh.numel(new), sh.numel(x.shape)):
            raise IRError(f"reshape {sh.fmt(x.shape)} -> {sh.fmt(new)} changes the element count")
        return new
    if op is Op.PERMUTE:
        dims = tuple(arg)
        if sorted(dims) != list(range(x.rank)):
            raise IRError(f"permute: {dims} is not a permutation of rank {x.rank}")
        return tuple(x.shape[d] for d in dims)
    if op is Op.EXPAND:
        new = sh.shape(arg)
        if x.rank == 0:
            return new  # a scalar broadcast to any shape
        if len(new) != x.rank:
            raise IRError("expand: rank must not change (reshape first)")
        for old, size in zip(x.shape, new):
            # (sizes that may differ by their symbols are equal when ATen validated them: a
            # loss's targets (s0, s1) flattened against logits' (s2*s3, V) rows)
            if not sh.is_one(old) and sh.provably_different(old, size):
                raise IRError(f"expand {sh.fmt(x.shape)} -> {sh.fmt(new)}")
        return new
    if op is Op.SLICE:
        dim, _start, _step, length = arg
        if not 0 <= dim < x.rank:
            raise IRError(f"slice: dim {dim} out of range for rank {x.rank}")
        return x.shape[:dim] + (sh.expr(length),) + x.shape[dim + 1:]
    raise AssertionError(op)


def make(op: Op, inputs: Sequence[Node] = (), arg: Any = None, *, dtype: dt.DType | None = None,
         shape: sh.Shape | None = None, device: str | None = None, origin: str | None = None) -> Node:
    """Build a node, inferring dtype and shape from the op's rule unless given (EXTERN, INPUT)."""
    inputs = tuple(inputs)
    if shape is None and op not in (Op.EXTERN, Op.GETITEM, Op.INPUT, Op.TENSOR):
        dtype, shape = infer(op, inputs, arg, dtype)
    if device is None:
        device = inputs[0].device if inputs else "cpu"
    return Node(op, inputs, arg, dtype, shape, device, origin)


# ---------------------------------------------------------------------------------------------
# graphs
# ---------------------------------------------------------------------------------------------

# A chain of views as plain data: (op, arg, shape) of each view from a base up, which passes that
# rewrite the nodes cannot change (``Graph.input_views``).
ViewChain = tuple[tuple[Op, Any, sh.Shape], ...]
InputView = tuple[int, int | None, ViewChain | None]  # (Graph.input_views)


class Graph:
    """Inputs in calling order, outputs in return order, and every node in topological order.

    ``outputs`` may hold None (e.g. gradients of inputs that need none); positions listed in
    ``scalar_outputs`` are returned as Python numbers (sizes a forward graph hands to backward).
    ``output_strides[i]``: the strides eager gives output i (None: any). A forward graph's outputs
    saved for backward must have them: the backward graph was traced assuming them.
    ``totals``: ragged total lengths recorded before passes could remove what revealed them (see
    ``ragged_totals``), size symbol -> position of the offsets among the inputs.
    ``fresh_outputs``: outputs that eager returns in memory of their own (a clone, a new result),
    sharing it with no input and no other output, though ember's IR may have made them the same
    node as an input or another output (a clone is the value it copies; CSE merges equal values).
    ``whole_outputs``: the fresh outputs (and views of one, ``fresh_views``) eager returns as all
    of their memory (a clone, a new result), not as a view into a larger intermediate
    (``x.cumsum(0)[-1]``): returned as a view of a larger buffer of ember's, they are copied
    (``codegen/outputs.py``).
    ``repeated_outputs``: {output i: the earlier output j that is the same tensor in eager} (AOTAutograd's
    forward returns a tensor saved for the backward that the user also gets twice: as an output
    and as a saved tensor). Where output j is copied, output i must come back over that copy:
    autograd checks the version of what is saved, which the user's in-place change must reach.
    ``effects``: ATen calls that return nothing but must run, in graph order (the checks of
    ``torch._assert_async``: one_hot's class bounds).
    ``mutated_inputs``: {output i: input k} for the last outputs, which are no outputs of the
    function but the values it writes into its inputs (AOTAutograd's ``copy_`` of an updated
    buffer into it: BatchNorm's running stats, an optimizer's state): the program writes output
    i into input k's memory, in place where it can, and returns the outputs before them.
    ``fresh_views``: {output i: the fresh output j whose memory eager returns it in} (``out =
    x.clone(); return out[1:], out``): where ember's IR makes that memory an input's, the outputs
    come back as views of one copy of it.
    ``size_checks``: eager's errors that only the run-time sizes decide (an int64 arange whose
    count overflows), checked by the host program before a kernel reads those sizes.
    ``input_views``: {output i: (input k, the output j holding the value the function writes
    into k, or None, output i's chain of views of that value or of input k as lowered, or None)}
    for outputs eager returns as views of input k: AOTAutograd rebuilds each from input k with
    the strides and offset of the tensor the program returns where the sizes are symbolic, so
    the program returns the same views of input k (``x.mul_(2).reshape(-1)``: not of the written
    value; ``x[..., 1::3].reshape(-1)``: not a copy). The chain is kept as data: passes fold it
    (``x.reshape(-1).zero_()``: output i became a broadcast zero of its own).
    ``eager_saved``: the values of a training graph that eager's backward reads as its forward
    saved them, rounded to their dtype (a backward's recomputation of a forward value, or a
    forward value the gradient-in-forward plan reads): ``schedule/build_reduce.saved_read``.
    """

    def __init__(self, inputs: Sequence[Node], outputs: Sequence[Node | None], nodes: Sequence[Node],
                 name: str = "graph", scalar_outputs: frozenset[int] = frozenset(),
                 output_strides: Sequence[sh.Shape | None] = (), totals: dict[sympy.Symbol, int] | None = None,
                 fresh_outputs: frozenset[int] = frozenset(), effects: Sequence[Node] = (),
                 size_checks: Sequence[SizeCheck] = (), whole_outputs: frozenset[int] = frozenset(),
                 repeated_outputs: dict[int, int] | None = None, mutated_inputs: dict[int, int] | None = None,
                 fresh_views: dict[int, int] | None = None, eager_saved: frozenset[Node] = frozenset(),
                 input_views: dict[int, InputView] | None = None):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.nodes = list(nodes)
        self.name = name
        self.scalar_outputs = scalar_outputs
        self.output_strides = tuple(output_strides)
        self.totals = dict(totals or {})
        self.fresh_outputs = fresh_outputs
        self.effects = tuple(effects)
        self.size_checks = tuple(size_checks)
        self.whole_outputs = whole_outputs
        self.repeated_outputs = dict(repeated_outputs or {})
        self.mutated_inputs = dict(mutated_inputs or {})
        self.fresh_views = dict(fresh_views or {})
        self.eager_saved = eager_saved
        self.input_views = dict(input_views or {})

    @classmethod
    def from_outputs(cls, inputs: Sequence[Node], outputs: Sequence[Node | None], name: str = "graph",
                     scalar_outputs: frozenset[int] = frozenset(),
                     output_strides: Sequence[sh.Shape | None] = (),
                     totals: dict[sympy.Symbol, int] | None = None,
                     fresh_outputs: frozenset[int] = frozenset(), effects: Sequence[Node] = (),
                     size_checks: Sequence[SizeCheck] = (), whole_outputs: frozenset[int] = frozenset(),
                     repeated_outputs: dict[int, int] | None = None,
                     mutated_inputs: dict[int, int] | None = None, fresh_views: dict[int, int] | None = None,
                     eager_saved: frozenset[Node] = frozenset(),
                     input_views: dict[int, InputView] | None = None) -> Graph:
        """A graph holding exactly the nodes the outputs and effects need (plus all inputs)."""
        return cls(inputs, outputs, toposort(list(inputs) + [o for o in outputs if o is not None] + list(effects)),
                   name, scalar_outputs, output_strides, totals, fresh_outputs, effects, size_checks, whole_outputs,
                   repeated_outputs, mutated_inputs, fresh_views, eager_saved, input_views)

    def users(self) -> dict[Node, list[Node]]:
        result: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                result[i].append(n)
        return result

    def with_nodes(self, inputs: Sequence[Node], outputs: Sequence[Node | None], nodes: Sequence[Node],
                   effects: Sequence[Node] | None = None, eager_saved: frozenset[Node] | None = None) -> Graph:
        return Graph(inputs, outputs, nodes, self.name, self.scalar_outputs, self.output_strides, self.totals,
                     self.fresh_outputs, self.effects if effects is None else effects, self.size_checks,
                     self.whole_outputs, self.repeated_outputs, self.mutated_inputs, self.fresh_views,
                     self.eager_saved if eager_saved is None else eager_saved, self.input_views)

    def __str__(self) -> str:
        from .printer import format_graph
        return format_graph(self)


def toposort(roots: Sequence[Node], seen: set[Node] | None = None) -> list[Node]:
    """Nodes reachable from ``roots``, inputs before users; nodes already in ``seen`` (which is
    updated) are skipped."""
    order: list[Node] = []
    seen = set() if seen is None else seen
    for root in roots:
        if root in seen:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if i < len(node.inputs):
                stack.append((node, i + 1))
                child = node.inputs[i]
                if child not in seen:
                    stack.append((child, 0))
            elif node not in seen:
                seen.add(node)
                order.append(node)
    return order


Rule = Callable[[Node, tuple[Node, ...]], Node | None]


def rewrite(graph: Graph, rule: Rule) -> Graph:
    """The rewrite engine every pass uses: visit nodes in order with their inputs already rewritten;
    ``rule(old, new_inputs)`` returns the replacement, or None to keep the op with the new inputs.
    Leaves (inputs, constants) are offered to the rule too."""
    mapping: dict[Node, Node] = {}
    new_nodes: list[Node] = []
    seen: set[Node] = set()
    for node in graph.nodes:
        new_inputs = tuple(mapping[i] for i in node.inputs)
        replacement = rule(node, new_inputs)
        if replacement is None:
            if new_inputs == node.inputs:
                replacement = node
            else:
                replacement = Node(node.op, new_inputs, node.arg, node.dtype, node.shape,
                                   node.device, node.origin)
        mapping[node] = replacement
        # A rule may return a small new subgraph: place any of its nodes not yet placed.
        new_nodes.extend(toposort([replacement], seen))
    inputs = [mapping[i] for i in graph.inputs]
    outputs = [mapping[o] if o is not None else None for o in graph.outputs]
    saved = frozenset(mapping[n] for n in graph.eager_saved if n in mapping)
    return graph.with_nodes(inputs, outputs, new_nodes, [mapping[e] for e in graph.effects], saved)


def aten_result_strides(node: Node) -> tuple[Any, ...] | None:
    """The channels_last strides eager gives an ATen call's result (an EXTERN node, or a GETITEM
    of one), as ``ExternCall.output_strides`` records them; None: contiguous, as kernels read it."""
    if node.op is Op.EXTERN:
        return node.arg.output_strides.get(())
    if node.op is Op.GETITEM and node.inputs[0].op is Op.EXTERN:
        path = node.arg if isinstance(node.arg, tuple) else (node.arg,)
        return node.inputs[0].arg.output_strides.get(path)
    return None


def view_base(node: Node) -> Node:
    """The node a chain of views starts from (``node`` itself when it is no view)."""
    while node.op in VIEW_OPS:
        node = node.inputs[0]
    return node


def view_chain(node: Node, base: Node) -> ViewChain | None:
    """The views from ``base`` up to ``node``; None when ``node`` is not ``base`` or a chain of
    views of it."""
    links = []
    while node is not base:
        if node.op not in VIEW_OPS or not node.inputs:
            return None
        links.append((node.op, node.arg, node.shape))
        node = node.inputs[0]
    return tuple(reversed(links))


def is_leaf(node: Node) -> bool:
    return node.op in LEAF_OPS


def fill_value(node: Node) -> float | int | bool | None:
    """The number a tensor is filled with, when it is a broadcast constant (``zeros``)."""
    while node.op in (Op.EXPAND, Op.RESHAPE, Op.CAST):
        node = node.inputs[0]
    if node.op is Op.CONST and isinstance(node.arg, (int, float, bool)):
        return node.arg
    return None


def is_plus_zero(value: object) -> bool:
    """Is ``value`` the number +0 (``False`` and integer 0 included)? -0.0 == 0 in Python, but a
    fill of -0.0 is no zero fill: ``zero_()`` or dropping an addition of it loses its sign bit."""
    return isinstance(value, (int, float)) and value == 0 and math.copysign(1.0, value) > 0


def row_ids_offsets(index: Node) -> Node | None:
    """The offsets ``index`` is the row ids of, when it is ``ragged.row_ids()``:
    searchsorted(offsets[1:], arange(T), right=True) of offsets a Ragged validated (the SEARCH's
    arg says so: (right, ragged)), through casts. Inside a segment kernel over those offsets the
    row id of a position of the row is the row itself, and a sum by row ids is a segment sum.
    A hand-written search of the same form may search offsets of another start or end: it stays
    a search."""
    while index.op is Op.CAST:
        index = index.inputs[0]
    if index.op is not Op.SEARCH or not index.arg[1]:
        return None
    seq, values = index.inputs
    while values.op is Op.CAST:
        values = values.inputs[0]
    if seq.op is not Op.SLICE or tuple(seq.arg[:3]) != (0, 1, 1) or values.op is not Op.IOTA:
        return None
    offsets = seq.inputs[0]
    if offsets.rank != 1 or not sh.equal(seq.shape[0], offsets.shape[0] - 1) or tuple(values.arg[1:]) != (0, 1):
        return None
    return offsets


def positions_offsets(index: Node) -> Node | None:
    """The offsets ``index`` is the positions of, when it is ``ragged.positions()``: iota(T) -
    offsets[:-1][row ids], through casts and indexing's wrap of negative indices (``where(p <
    0, p + n, p)``, never taken: positions are not negative)."""
    while index.op is Op.CAST:
        index = index.inputs[0]
    if index.op is Op.WHERE:
        cond, wrapped, p = index.inputs
        if not (cond.op is Op.LT and cond.inputs[0] is p and fill_value(cond.inputs[1]) == 0
                and wrapped.op is Op.ADD and wrapped.inputs[0] is p):
            return None
        index = p
        while index.op is Op.CAST:
            index = index.inputs[0]
    if index.op is not Op.SUB:
        return None
    iota, taken = index.inputs
    while taken.op is Op.CAST:
        taken = taken.inputs[0]
    if iota.op is not Op.IOTA or tuple(iota.arg[1:]) != (0, 1) or taken.op is not Op.INDEX or taken.arg != 0:
        return None
    starts, *rows = taken.inputs
    offsets = row_ids_offsets(rows[0]) if len(rows) == 1 else None
    if (offsets is None or starts.op is not Op.SLICE or tuple(starts.arg[:3]) != (0, 0, 1)
            or starts.inputs[0] is not offsets or not sh.equal(iota.shape[0], rows[0].shape[0])):
        return None
    return offsets


def ragged_totals(graph: Graph) -> dict[sympy.Symbol, Node]:
    """Size symbols that are a ragged tensor's total length T, each with the graph input holding
    its offsets: T is the length of ``ragged.row_ids()``'s arange, and a ``Ragged``'s offsets end
    at T, so a kernel can read T from ``offsets[-1]`` on the device instead of taking it from the
    host. One launch then serves every T up to the one its grid was sized for (CUDA graphs).
    Pairs recorded in ``graph.totals`` (``record_ragged_totals``) count too."""
    found = {s: graph.inputs[i] for s, i in graph.totals.items()}
    for n in graph.nodes:
        offsets = row_ids_offsets(n) if n.op is Op.SEARCH else None
        if offsets is None or offsets.op is not Op.INPUT:
            continue
        total = sh.expr(n.shape[0])
        if isinstance(total, sympy.Symbol) and total not in found:
            found[total] = offsets
    return found


def record_ragged_totals(graph: Graph) -> Graph:
    """``graph`` with its ragged totals recorded, so that they survive passes that remove the
    row-ids searches revealing them (passes/ragged.py turns writes at row ids into gathers): T
    is still offsets[-1] once nothing searches the offsets."""
    totals = {s: graph.inputs.index(n) for s, n in ragged_totals(graph).items()}
    return Graph(graph.inputs, graph.outputs, graph.nodes, graph.name, graph.scalar_outputs,
                 graph.output_strides, totals, graph.fresh_outputs, graph.effects, graph.size_checks,
                 graph.whole_outputs, graph.repeated_outputs, graph.mutated_inputs, graph.fresh_views,
                 graph.eager_saved, graph.input_views)
