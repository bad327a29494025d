"""What a lowering function works with (frontend/lowering.py runs them): the registry of
lowerings by ATen op, ``Unsupported`` (a lowering declines: the op runs through ATen), and
``Context``, which builds IR nodes for one ATen call (constants, casts, broadcasts) and answers
questions about the sizes Dynamo recorded (equal on every call? never zero?)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node, SizeCheck, make
from ..ir.ops import Op


class Unsupported(Exception):
    """A lowering declines this call: the op runs through ATen instead."""


class ShapeDisagreement(AssertionError):
    """A lowering built another shape than the traced one (the fake kernel's). One of the two
    is wrong: the graph runs through ATen, whose results then may not have the traced shapes."""


LoweringFn = Callable[..., Any]
LOWERINGS: dict[Any, LoweringFn] = {}


def register(*targets: Any) -> Callable[[LoweringFn], LoweringFn]:
    """Register a lowering for ATen overloads (or whole packets: every overload of the op)."""
    def wrap(fn: LoweringFn) -> LoweringFn:
        for t in targets:
            LOWERINGS[t] = fn
        return fn
    return wrap


def lookup(target: Any) -> LoweringFn | None:
    fn = LOWERINGS.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = LOWERINGS.get(target.overloadpacket)
    return fn


class Context:
    """What a lowering function sees: helpers to build IR nodes for one ATen call, plus the fake
    tensors (``out``, ``arg_metas``) Dynamo recorded for it."""

    def __init__(self, device: str):
        self.device = device
        self.nodes: list[Node] = []
        self.aten: str | None = None        # the ATen op being lowered: lowerings dispatch on it
        self.origin: str | None = None      # the op the user wrote, recorded on nodes for names
        self.out: Any = None                # meta value of the current FX node
        self.arg_metas: list[Any] = []      # meta values of its positional args
        self.bindable: set[sympy.Symbol] = set()  # symbols the graph's inputs carry
        self.effects: list[Node] = []       # calls that must run though no value reads them
        self.size_checks: list[SizeCheck] = []  # eager's errors only the run-time sizes decide
        self.input_storages: set[Any] = set()  # the fake storages of the graph's tensor inputs
        self.shared_output_storages: set[Any] = set()  # those that two or more outputs return
        self.metas: dict[Node, Any] = {}    # the traced value of each op's result node
        # the current call's result is what the program writes into its first argument, an
        # input (``copy_(input, result)``: a slice written into a KV cache)
        self.written_back = False

    # ---- building -------------------------------------------------------------------------
    def make(self, op: Op, inputs: Sequence[Node] = (), arg: Any = None, **kw: Any) -> Node:
        for x in inputs:
            if x.dtype is None or x.shape is None:
                raise Unsupported(f"input of unsupported type {x!r}")
        kw.setdefault("device", self.device)
        node = make(op, inputs, arg, origin=self.origin, **kw)
        self.nodes.append(node)
        return node

    def const(self, value: Any, dtype: dt.DType) -> Node:
        if isinstance(value, Node):
            return self.cast(value, dtype)
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            value = value.node.expr
        if isinstance(value, complex):
            raise Unsupported("complex scalar")
        if isinstance(value, sympy.Basic):
            if dtype.is_float and value.is_Integer:
                value = float(value)
            elif dtype.is_bool and value.is_Integer:
                value = bool(value)
        elif dtype.is_bool:
            value = bool(value)
        elif dtype.is_int:
            if isinstance(value, float):
                if value != value or value in (float("inf"), float("-inf")):
                    raise Unsupported("non-finite value cast to an integer type")
                value = int(value)
            value = _wrapped_to(int(value), dtype)
        else:
            value = float(value)
        return self.make(Op.CONST, (), value, dtype=dtype)

    def cast(self, x: Node, dtype: dt.DType) -> Node:
        if x.dtype == dtype:
            return x
        if x.op is Op.CONST and not isinstance(x.arg, sympy.Basic):
            value = x.arg
            if dtype.is_low_precision and isinstance(value, float):  # (a cast rounds to 16 bits)
                value = float(torch.tensor(value, dtype=dt.to_torch(dtype)))
            return self.const(value, dtype)
        return self.make(Op.CAST, (x,), dtype=dtype)

    def expand_to(self, x: Node, shape: sh.Shape) -> Node:
        if sh.shapes_equal(x.shape, shape):
            return x
        if 0 < x.rank < len(shape):
            x = self.make(Op.RESHAPE, (x,), (sympy.Integer(1),) * (len(shape) - x.rank) + x.shape)
        if x.rank:
            # a size the guards make 1 but that does not read as 1 (x[:, 1::2] of 3 columns:
            # s0 // 2) broadcasts too: spelled 1, or the expanded dim kept its stride and the
            # kernel read past the slice
            ones = tuple(sympy.Integer(1) if not sh.is_one(d) and not sh.equal(d, n)
                         and self.known_equal(d, sympy.Integer(1)) else d for d, n in zip(x.shape, shape))
            if ones != tuple(x.shape):
                x = self.make(Op.RESHAPE, (x,), ones)
        return self.make(Op.EXPAND, (x,), tuple(shape))

    def operand(self, x: Any, dtype: dt.DType, shape: sh.Shape) -> Node:
        """A tensor or Python scalar argument, cast to ``dtype`` and broadcast to ``shape``."""
        node = x if isinstance(x, Node) else self.const(x, dtype)
        return self.expand_to(self.cast(node, dtype), shape)

    def sum_of_one(self, x: Node) -> Node:
        """A sum (or a sum's scan) of one element: float elements plus 0.0, as eager's sums start
        from +0.0 (a lone -0.0 sums to 0.0; adding 0.0 changes no other value), integers as they are."""
        if not x.dtype.is_float:
            return x
        return self.make(Op.ADD, (x, self.operand(0.0, x.dtype, x.shape)))

    def reshape(self, x: Node, shape: Sequence[Any]) -> Node:
        new = sh.shape(shape)
        if sh.shapes_equal(new, x.shape):
            return x
        return self.make(Op.RESHAPE, (x,), new)

    # ---- what Dynamo recorded -------------------------------------------------------------
    @staticmethod
    def known(fact: Any) -> bool:
        """Whether a relation between recorded sizes (``meta.shape[0] == other.shape[0]``, a
        SymBool or a bool) holds on every call of this graph: proved from Dynamo's guards, adding
        none. Sizes under different symbols can be equal this way (a target's ``s0*s1`` rows and
        the logits' ``s2*s3``, checked equal by ATen while tracing) where sympy alone cannot tell."""
        return statically_known_true(fact)

    def known_equal(self, a: sympy.Expr, b: sympy.Expr) -> bool:
        """Whether two size expressions are equal on every call of this graph, where they may be
        under different symbols (proved from the shape environment's guards, adding none)."""
        if sh.equal(a, b):
            return True
        env = self._shape_env()
        if env is None:
            return False
        try:
            return env._maybe_evaluate_static(sympy.Eq(a, b)) == sympy.true
        except Exception:  # noqa: BLE001 -- a private torch API: unknown, not equal
            return False

    def known_nonzero(self, size: sympy.Expr) -> bool:
        """Whether a size is nonzero on every call: a data-dependent size (nonzero's count, a
        boolean mask's) can be 0, where a reduction without identity raises in ATen."""
        size = sympy.sympify(size)
        if size.is_Integer:
            return int(size) != 0
        env = self._shape_env()
        try:
            return env is not None and env._maybe_evaluate_static(sympy.Ne(size, 0)) == sympy.true
        except Exception:  # noqa: BLE001 -- a private torch API: unknown, maybe zero
            return False

    def _shape_env(self) -> Any:
        return shape_env_of([self.out, *self.arg_metas])

    @property
    def out_dtype(self) -> dt.DType:
        return meta_dtype(self.out)

    @property
    def out_shape(self) -> sh.Shape:
        return sh.shape(self.out.shape)

    def promoted(self, *positions: int) -> dt.DType:
        """torch's type promotion over the given positional args (tensors and scalars)."""
        vals = [self.arg_metas[i] for i in positions if i < len(self.arg_metas)]
        vals = [v for v in vals if isinstance(v, torch.Tensor | int | float | bool)]
        result = vals[0].dtype if isinstance(vals[0], torch.Tensor) else torch.result_type(
            torch.tensor(vals[0]), vals[0])
        if len(vals) > 1:
            result = torch.result_type(*vals[:2])
            for extra in vals[2:]:
                result = torch.promote_types(result, torch.result_type(vals[0], extra))
        if not dt.is_supported_torch(result):  # (complex, uint32 operands of a comparison)
            raise Unsupported(f"operands promote to {result}, which ember does not generate")
        return dt.from_torch(result)


def meta_dtype(val: Any) -> dt.DType:
    if not isinstance(val, torch.Tensor):
        raise Unsupported("not a tensor")
    if not dt.is_supported_torch(val.dtype):
        raise Unsupported(f"dtype {val.dtype}")
    return dt.from_torch(val.dtype)


def _wrapped_to(value: int, dtype: dt.DType) -> int:
    """An int scalar as an int tensor of ``dtype`` holds it: wrapped, as eager converts it
    (int8 + 300 adds 44). C wraps its casts alike; Triton's literals must be in range."""
    info = torch.iinfo(dt.to_torch(dtype))
    span = info.max - info.min + 1
    return (value - info.min) % span + info.min


def size_arg(value: Any) -> sympy.Expr:
    """An int argument of an op as a size expression: a Python int, or a SymInt, which the
    lowering receives as the scalar CONST node of its expression (glu's half, F.pad's amounts
    computed from a dynamic size, row_ids' T)."""
    if isinstance(value, Node) and value.op is Op.CONST and value.shape == ():
        return sh.expr(value.arg)
    return sh.expr(value)


def shape_env_of(values: Iterable[Any]) -> Any:
    """The shape environment of traced values (tensors, SymInts, or lists of them): where
    Dynamo's guards on their symbolic sizes live. None where every size is static."""
    for value in values:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            for d in v.shape if isinstance(v, torch.Tensor) else [v]:
                if isinstance(d, torch.SymInt):
                    return d.node.shape_env
    return None
