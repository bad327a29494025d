"""Group of IR nodes -> one kernel (kernel_ir.Kernel).

The builder evaluates each root of the group at its *home point* (loop variables placed on its
dimensions) and recursively evaluates inputs at mapped points: pointwise ops at the same point,
views at the point they map to, reductions once per outer iteration with the reduced dims bound to
the inner loop variables. Nodes stored in a buffer (by another kernel, by ATen, or graph inputs)
become loads. Values are hash-consed, so anything needed twice is computed once.

When something cannot live in this kernel the builder raises, and the scheduler adjusts and
retries: ``NeedsBuffer`` (a reduction whose loops don't match this kernel's) or ``Conflict``
(a root read at a point other than the one this kernel computes it at).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node
from ..ir.ops import POINTWISE_OPS, REDUCE_OPS, VIEW_OPS, Op
from .indexing import Point, Strided, compose_strided, map_view, offset
from .kernel_ir import (
    Access,
    Kernel,
    Param,
    ReduceArg,
    SearchArg,
    Value,
    indirect_var,
    inner_var,
    is_index_var,
    is_indirect_var,
)

# Nodes that say nothing about what a kernel does (constants, index remapping).
_UNNAMED = frozenset({Op.CONST, Op.IOTA}) | VIEW_OPS


class NeedsBuffer(Exception):
    def __init__(self, node: Node):
        super().__init__(f"{node!r} must be stored in a buffer")
        self.node = node


class Conflict(Exception):
    def __init__(self, root: Node, reader: Node):
        super().__init__(f"{reader!r} reads {root!r} at another point")
        self.root, self.reader = root, reader


@dataclass
class BufferInfo:
    name: str
    strides: tuple[sympy.Expr, ...]  # element strides of the tensor as a kernel reads it


@dataclass
class GroupSpec:
    roots: list[Node]
    homes: dict[Node, Point]
    outer: tuple[sympy.Expr, ...]
    inner: tuple[sympy.Expr, ...]
    ref: tuple | None = None  # (full shape, reduce dims) of the reduction that set the domain
    # roots whose small static dim is unrolled into one store per position (a stack of 4 box
    # coordinates): root -> that dim, which its home point holds at 0
    unrolled: dict[Node, int] = field(default_factory=dict)


class KernelBuilder:
    def __init__(self, spec: GroupSpec, buffers: dict[Node, BufferInfo], name: str):
        self.spec = spec
        self.buffers = buffers
        self.name = name
        self.values: list[Value] = []
        self._cse: dict[Any, Value] = {}
        self._memo: dict[tuple[Node, Point], Value] = {}
        self._strided: dict[Node, Strided | None] = {}
        self._reads: dict[str, dt.DType] = {}
        self._writes: dict[str, dt.DType] = {}
        self.origins: list[str] = []
        self._reader: Node | None = None
        self._indirect: dict[sympy.Symbol, Value] = {}

    # ---- value construction (hash-consed) -------------------------------------------------
    def _emit(self, kind: str, dtype: dt.DType, srcs: Sequence[Value] = (), arg: Any = None,
              expr: sympy.Expr | None = None) -> Value:
        key = (kind, dtype, tuple(id(s) for s in srcs), _key(arg))
        found = self._cse.get(key)
        if found is not None:
            return found
        inner = any(s.inner for s in srcs) or (expr is not None and _has_inner(expr))
        if kind == "reduce":
            inner = False
        value = Value(kind, dtype, tuple(srcs), arg, inner=inner)
        self._cse[key] = value
        self.values.append(value)
        return value

    def load(self, node: Node, index: sympy.Expr) -> Value:
        info = self.buffers[node]
        self._reads[info.name] = node.dtype
        bound = tuple(sorted((s for s in index.free_symbols if is_indirect_var(s)), key=lambda s: s.name))
        srcs = tuple(self._indirect[s] for s in bound)
        return self._emit("load", node.dtype, srcs, Access(info.name, index, bound), expr=index)

    def indirect(self, index: Value, bound: sympy.Expr, label: str, error: int = 2) -> sympy.Symbol:
        """An index variable holding ``index``, checked against [0, bound); ``error`` is the code
        flagged when it is not (2: gather's RuntimeError, 3: indexing's IndexError)."""
        checked = self._emit("checkindex", dt.int64, (index,), (bound, label, error))
        for sym, value in self._indirect.items():
            if value is checked:
                return sym
        sym = indirect_var(len(self._indirect))
        self._indirect[sym] = checked
        return sym

    # ---- evaluation -----------------------------------------------------------------------
    def value_of(self, node: Node, point: Point) -> Value:
        if node in self.spec.homes:
            if node in self.spec.unrolled or tuple(point) != tuple(self.spec.homes[node]):
                raise Conflict(node, self._reader or node)
            return self.compute(node, point)
        if node in self.buffers:
            return self.load(node, offset(point, self.buffers[node].strides))
        return self.compute(node, point)

    def compute(self, node: Node, point: Point) -> Value:
        key = (node, tuple(point))
        found = self._memo.get(key)
        if found is not None:
            return found
        value = self._compute(node, tuple(point))
        self._memo[key] = value
        if node.origin and node.origin not in self.origins and node.op not in _UNNAMED:
            self.origins.append(node.origin)
        return value

    def _compute(self, node: Node, point: Point) -> Value:
        op = node.op
        if op is Op.CONST:
            return self._emit("const", node.dtype, (), node.arg)
        if op is Op.IOTA:
            _length, start, step = node.arg
            expr = sympy.expand(start + point[0] * step)
            return self._emit("index", node.dtype, (), expr, expr=expr)
        if op in POINTWISE_OPS:
            previous, self._reader = self._reader, node
            srcs = [self.value_of(i, point) for i in node.inputs]
            self._reader = previous
            return self._emit("alu", node.dtype, srcs, op)
        if op in VIEW_OPS:
            strided = self.strided(node)
            if strided is not None:
                base, (strides, off) = strided
                return self.load(base, offset(point, strides, off))
            return self.value_of(node.inputs[0], map_view(node, point))
        if op in REDUCE_OPS:
            return self._reduce(node, point)
        if op is Op.CAT:
            return self._cat(node, point)
        if op is Op.PAD:
            return self._pad(node, point)
        if op is Op.GATHER:
            x, index = node.inputs
            dim = node.arg
            previous, self._reader = self._reader, node
            idx = self.value_of(index, point)
            sym = self.indirect(idx, x.shape[dim], f"{node.origin or 'gather'} dim {dim}")
            value = self.value_of(x, point[:dim] + (sym,) + point[dim + 1:])
            self._reader = previous
            return value
        if op is Op.INDEX:
            return self._index(node, point)
        if op is Op.SEARCH:
            return self._search(node, point)
        raise NeedsBuffer(node)  # EXTERN, INPUT, TENSOR: always buffers

    def _index(self, node: Node, point: Point) -> Value:
        x, *indices = node.inputs
        start, m = node.arg, indices[0].rank
        at = point[start:start + m]
        previous, self._reader = self._reader, node
        syms = tuple(self.indirect(self.value_of(i, at), x.shape[start + j], f"index dim {start + j}", 3)
                     for j, i in enumerate(indices))
        value = self.value_of(x, point[:start] + syms + point[start + m:])
        self._reader = previous
        return value

    def _search(self, node: Node, point: Point) -> Value:
        seq, values = node.inputs
        strided = self.strided(seq)
        if strided is None:
            raise NeedsBuffer(seq)
        base, (strides, start) = strided
        info = self.buffers[base]
        self._reads[info.name] = base.dtype
        previous, self._reader = self._reader, node
        value = self.value_of(values, point)
        self._reader = previous
        arg = SearchArg(info.name, sympy.expand(start), sympy.expand(strides[0]), seq.shape[0], bool(node.arg))
        return self._emit("search", node.dtype, (value,), arg)

    def _select(self, cond: Value, a: Value, b: Value, dtype: dt.DType) -> Value:
        return self._emit("alu", dtype, (cond, a, b), Op.WHERE)

    def _cat(self, node: Node, point: Point) -> Value:
        """Each input evaluated where its segment holds the point; indices clamped into each input
        so no read leaves it, and a where chain picks the segment."""
        dim = node.arg
        starts, start = [], sympy.Integer(0)
        for x in node.inputs:
            starts.append(start)
            start = start + x.shape[dim]
        p = point[dim]
        if p.is_Integer and all(s.is_Integer for s in starts):  # a fixed position: segment known now
            for x, s in zip(reversed(node.inputs), reversed(starts)):
                if int(p) >= int(s):
                    return self.value_of(x, point[:dim] + (p - s,) + point[dim + 1:])
        position = self._emit("index", dt.int64, (), p, expr=p)
        previous, self._reader = self._reader, node
        value = None
        for x, s in zip(reversed(node.inputs), reversed(starts)):
            local = sympy.Max(0, sympy.Min(p - s, x.shape[dim] - 1))
            here = self.value_of(x, point[:dim] + (local,) + point[dim + 1:])
            if value is None:
                value = here
            else:  # here wins below the next segment's start
                end = self._emit("const", dt.int64, (), sympy.expand(s + x.shape[dim]))
                value = self._select(self._emit("alu", dt.bool_, (position, end), Op.LT), here, value, node.dtype)
        self._reader = previous
        return value

    def _pad(self, node: Node, point: Point) -> Value:
        x, fill = node.inputs
        previous, self._reader = self._reader, node
        inside: Value | None = None
        in_point = []
        for p, size, (lo, _hi) in zip(point, x.shape, node.arg):
            q = sympy.expand(p - lo)
            if sh.equal(lo, 0) and sh.equal(_hi, 0):
                in_point.append(q)
                continue
            in_point.append(sympy.Max(0, sympy.Min(q, size - 1)))
            pos = self._emit("index", dt.int64, (), q, expr=q)
            zero = self._emit("const", dt.int64, (), 0)
            bound = self._emit("const", dt.int64, (), size)
            ok = self._emit("alu", dt.bool_, (self._emit("alu", dt.bool_, (pos, zero), Op.GE),
                                              self._emit("alu", dt.bool_, (pos, bound), Op.LT)), Op.AND)
            inside = ok if inside is None else self._emit("alu", dt.bool_, (inside, ok), Op.AND)
        value = self.value_of(x, tuple(in_point))
        if inside is not None:
            value = self._select(inside, value, self.value_of(fill, ()), node.dtype)
        self._reader = previous
        return value

    def strided(self, node: Node) -> tuple[Node, Strided] | None:
        """A view chain ending at a buffer of another kernel, as strides over that buffer."""
        if node in self._strided:
            return self._strided[node]
        result = None
        if node in self.buffers and node not in self.spec.homes:
            result = (node, (self.buffers[node].strides, sympy.Integer(0)))
        elif node.op in VIEW_OPS and node not in self.spec.homes:
            below = self.strided(node.inputs[0])
            if below is not None:
                composed = compose_strided(node, below[1])
                result = (below[0], composed) if composed is not None else None
        self._strided[node] = result
        return result

    def _reduce(self, node: Node, point: Point) -> Value:
        (x,) = node.inputs
        dims = [d for d in node.arg if not sh.is_one(x.shape[d])]
        extents = [x.shape[d] for d in dims]
        fits = (len(extents) == len(self.spec.inner)
                and all(sh.equal(a, b) for a, b in zip(extents, self.spec.inner))
                and not any(_has_inner(p) or _has_indirect(p) for p in point)
                and sh.equal(sh.numel(x.shape), sh.numel(self.spec.outer) * sh.numel(self.spec.inner)))
        if not fits:
            raise NeedsBuffer(node)
        in_point = list(point)
        for j, d in enumerate(dims):
            in_point[d] = inner_var(j)
        for d in node.arg:
            if sh.is_one(x.shape[d]):
                in_point[d] = sympy.Integer(0)
        previous, self._reader = self._reader, node
        src = self.value_of(x, tuple(in_point))
        self._reader = previous
        position = offset(tuple(inner_var(j) for j in range(len(dims))), sh.contiguous_strides(extents))
        return self._emit("reduce", node.dtype, (src,), ReduceArg(node.op, position))

    # ---- the kernel ------------------------------------------------------------------------
    def _homes(self, root: Node) -> list[Point]:
        """Where the kernel evaluates a root: its home point, or one point per position of its
        unrolled dim (the values of all positions share what they have in common)."""
        home = tuple(self.spec.homes[root])
        d = self.spec.unrolled.get(root)
        if d is None:
            return [home]
        shape = root.inputs[1].shape if root.op is Op.INDEX_PUT else root.shape
        return [home[:d] + (sympy.Integer(j),) + home[d + 1:] for j in range(int(shape[d]))]

    def _put(self, root: Node, home: Point) -> None:
        """A write at indices: the kernel runs over the written values (``home`` is a point of
        ``src``) and stores (or adds) each where its indices point; the wrapper has filled the
        buffer with the tensor written into."""
        x, src, *indices = root.inputs
        start, accumulate, error = root.arg
        m = indices[0].rank
        previous, self._reader = self._reader, root
        value = self.value_of(src, home)
        at = home[start:start + m]
        syms = tuple(self.indirect(self.value_of(i, at), x.shape[start + j],
                                   f"{root.origin or 'index_put'} dim {start + j}", error)
                     for j, i in enumerate(indices))
        self._reader = previous
        if root.origin and root.origin not in self.origins:
            self.origins.append(root.origin)
        info = self.buffers[root]
        self._writes[info.name] = root.dtype
        index = offset(home[:start] + syms + home[start + m:], info.strides)
        bound = tuple(sorted((s for s in index.free_symbols if is_indirect_var(s)), key=lambda s: s.name))
        self._emit("store", root.dtype, (value, *(self._indirect[s] for s in bound)),
                   Access(info.name, index, bound, bool(accumulate)), expr=index)

    def build(self) -> Kernel:
        for root in self.spec.roots:
            for home in self._homes(root):
                if root.op is Op.INDEX_PUT:
                    self._put(root, home)
                    continue
                value = self.compute(root, home)
                info = self.buffers[root]
                self._writes[info.name] = root.dtype
                index = offset(home, info.strides)
                self._emit("store", root.dtype, (value,), Access(info.name, index), expr=index)
        params = [Param(n, d, False) for n, d in self._reads.items() if n not in self._writes]
        params += [Param(n, d, True) for n, d in self._writes.items()]
        symbols: set[sympy.Symbol] = set()
        for v in self.values:
            for e in _exprs(v):
                symbols |= {s for s in e.free_symbols if not is_index_var(s)}
        for e in self.spec.outer + self.spec.inner:
            symbols |= sh.expr(e).free_symbols
        kernel = Kernel(self.name, params, sorted(symbols, key=lambda s: s.name), self.spec.outer,
                        self.spec.inner, self.values, origins=self.origins)
        assign_loops(kernel)
        return kernel


def _exprs(v: Value) -> list[sympy.Expr]:
    if v.kind in ("load", "store"):
        return [v.arg.index]
    if v.kind == "checkindex":
        return [sh.expr(v.arg[0])]
    if v.kind == "search":
        return [sh.expr(e) for e in (v.arg.start, v.arg.stride, v.arg.length)]
    if v.kind in ("const", "index") and isinstance(v.arg, sympy.Basic):
        return [v.arg]
    return []


def _has_indirect(e: sympy.Expr) -> bool:
    return isinstance(e, sympy.Basic) and any(is_indirect_var(s) for s in e.free_symbols)


def _has_inner(e: sympy.Expr) -> bool:
    return isinstance(e, sympy.Basic) and any(s.name.startswith("r") and is_index_var(s) for s in e.free_symbols)


def _key(arg: Any) -> Any:
    if isinstance(arg, float):
        return ("f", repr(arg))
    return arg


def assign_loops(kernel: Kernel) -> None:
    """Place reductions and stores into inner loops, and outer values into stages.

    An inner value can only use outer values computed before its loop, so a reduction whose input
    needs the result of loop k runs in loop k+1 (softmax: max in loop 1, sum in 2, store in 3).
    """
    need: dict[int, int] = {}  # inner value -> the latest stage of any outer value it uses

    def needs(v: Value) -> int:
        if not v.inner:
            return v.stage
        if id(v) not in need:
            need[id(v)] = max((needs(s) for s in v.srcs), default=0)
        return need[id(v)]

    n_loops = 0
    for v in kernel.values:
        if v.kind == "reduce":
            v.loop = needs(v.srcs[0]) + 1
            v.stage = v.loop
            n_loops = max(n_loops, v.loop)
        elif v.kind == "store":
            if v.inner or v.srcs[0].inner:
                v.inner = True
                v.loop = needs(v.srcs[0]) + 1
                n_loops = max(n_loops, v.loop)
            else:
                v.stage = v.srcs[0].stage
        elif not v.inner:
            v.stage = max((s.stage for s in v.srcs), default=0)
    kernel.n_loops = n_loops
