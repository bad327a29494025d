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

import functools
from collections.abc import Sequence
from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node, row_ids_offsets, view_base
from ..ir.ops import POINTWISE_OPS, REDUCE_OPS, VIEW_OPS, Op
from ..ir.strides import Strided, compose_strided
from .build_reduce import CANCELLING, ROUNDED_FIRST, ReduceBuilder
from .group_spec import AcrossFailed, BufferInfo, Conflict, GroupSpec, NeedsBuffer, has_indirect, has_inner
from .indexing import Point, map_view, offset, recombine
from .kernel_ir import (
    CHUNK,
    FINAL_STAGE,
    SEGMENT_LENGTH,
    Access,
    Kernel,
    Param,
    SearchArg,
    Value,
    indirect_var,
    is_index_var,
    is_indirect_var,
    outer_var,
    reachable,
    stage_needs,
)

# Nodes that say nothing about what a kernel does (constants, index remapping).
_UNNAMED = frozenset({Op.CONST, Op.IOTA}) | VIEW_OPS
# the error codes (runtime/program.py) of reads at indices that name their op in eager's error
_INDEX_ERROR_CODES = {"aten.embedding": 8, "aten.index_select": 9}


@functools.lru_cache(maxsize=4096)
def clamped(position: sympy.Expr, size: sympy.Expr) -> sympy.Expr:
    """``position`` clamped into [0, size): a padded or concatenated read's index. sympy's Max
    and Min compare their arguments through assumptions, milliseconds each, and a pooling
    window's reads ask the same few again and again (a 5 x 5 window over 5 layouts: 25% of a
    graph's compile)."""
    return sympy.Max(0, sympy.Min(position, size - 1))


class KernelBuilder(ReduceBuilder):
    def __init__(self, spec: GroupSpec, buffers: dict[Node, BufferInfo], name: str,
                 held: frozenset[Node] = frozenset(), converted: frozenset[Node] = frozenset(),
                 saved: frozenset[Node] = frozenset()):
        self.spec = spec
        self.held = held  # roots stored as eager holds them (jump_read)
        self.converted = converted  # 16-bit values differences read rounded (cast_read)
        self.saved = saved  # 16-bit values every reader reads rounded (saved_read)
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
        self._depth = 0  # of compute's recursion (deep chains: _operands_first)
        self._indirect: dict[sympy.Symbol, Value] = {}
        self._segment: tuple[sympy.Expr, sympy.Symbol, Value] | None = None  # (row, start var, length)
        self._in_row = False  # building what only a segment row's elements need (not a per-row result)
        self._across: dict[int, Node] = {}  # rowreduce values -> their nodes
        self._eager_held: dict[tuple[int, bool], Value] = {}  # (a 16-bit value, per op) -> it rounded as eager holds it

    # ---- value construction (hash-consed) -------------------------------------------------
    def _emit(self, kind: str, dtype: dt.DType, srcs: Sequence[Value] = (), arg: Any = None,
              expr: sympy.Expr | None = None) -> Value:
        key = (kind, dtype, tuple(id(s) for s in srcs), _key(arg))
        found = self._cse.get(key)
        if found is not None:
            return found
        inner = any(s.inner for s in srcs) or (expr is not None and has_inner(expr))
        if kind in ("reduce", "rowreduce", "dot"):
            inner = False
        elif kind == "scan":
            inner = True  # a running value along the row, even of a source constant along it
        elif kind == "chunksum":
            inner = True  # a column: one partial sum per inner position
        value = Value(kind, dtype, tuple(srcs), arg, inner=inner)
        self._cse[key] = value
        self.values.append(value)
        return value

    def load(self, node: Node, index: sympy.Expr) -> Value:
        if sh.numel(node.shape) == 0:
            # nothing to read: the domain reading it is empty. Its index may have lost the loop
            # variables (a sum over (4, 0) rows reads "element 0"), which would put the load
            # before a loop that never runs, reading past an empty buffer
            return self._emit("const", node.dtype, (), 0)
        if index.has(FloorDiv):  # rows split into dims and joined again: (o0 // 3, o0 % 3) is o0
            index = recombine(index)
        info = self.buffers[node]
        self._reads[info.name] = node.dtype
        bound = tuple(sorted((s for s in index.free_symbols if is_indirect_var(s)), key=lambda s: s.name))
        srcs = tuple(self._indirect[s] for s in bound)
        return self._emit("load", node.dtype, srcs, Access(info.name, index, bound), expr=index)

    def index_value(self, expr: sympy.Expr, dtype: dt.DType) -> Value:
        """An index expression as a value. Indirect variables in it (a position inside a ragged
        row: its loaded start + r0) are loaded values, added as such."""
        expr = sympy.expand(expr)
        if not has_indirect(expr):
            return self._emit("index", dtype, (), expr, expr=expr)
        if expr.is_Symbol:
            term = self._indirect[expr]
            return term if term.dtype == dtype else self._emit("alu", dtype, (term,), Op.CAST)
        if isinstance(expr, (sympy.Add, sympy.Mul)):
            # sums and products of loaded values, with the terms that load nothing as one index
            fixed = expr.func(*(a for a in expr.args if not has_indirect(a)))
            parts = [self.index_value(a, dtype) for a in expr.args if has_indirect(a)]
            if fixed != (0 if expr.is_Add else 1):
                parts.append(self.index_value(fixed, dtype) if expr.is_Add else self._emit("const", dtype, (), fixed))
            value = parts[0]
            for part in parts[1:]:
                value = self._emit("alu", dtype, (value, part), Op.ADD if expr.is_Add else Op.MUL)
            return value
        if isinstance(expr, (*sh.MAXES, *sh.MINS)):
            # a pad's clamped point at a loaded place (the gather of packed rows reads row T,
            # its padding, where a sequence ends): positions computed there must clamp too
            parts = [self.index_value(a, dtype) for a in expr.args]
            value = parts[0]
            for part in parts[1:]:
                value = self._emit("alu", dtype, (value, part), Op.MAX if isinstance(expr, sh.MAXES) else Op.MIN)
            return value
        if isinstance(expr, (FloorDiv, ModularIndexing)):
            # a reshape's point at a loaded place (a gather from a view of a cat or a pad): the
            # position is x // d, or (x // d) % m along a split dim; never negative
            value = self._emit("alu", dtype, (self.index_value(expr.args[0], dtype),
                                              self.index_value(expr.args[1], dtype)), Op.FLOORDIV)
            if isinstance(expr, ModularIndexing):
                value = self._emit("alu", dtype, (value, self.index_value(expr.args[2], dtype)), Op.MOD)
            return value
        raise RuntimeError(f"index {expr} has no form ember computes from its loaded values")

    def indirect(self, index: Value, bound: sympy.Expr, label: str, error: int = 2) -> sympy.Symbol:
        """An index variable holding ``index``, checked against [0, bound); ``error`` is the code
        flagged when it is not (2: gather's RuntimeError, 3: indexing's IndexError, 4 and 7:
        index_add's RuntimeError and IndexError, 5: a loss's target class, IndexError, 6:
        scatter's RuntimeError, 8-10: embedding's, index_select's and index_copy's IndexError,
        11: index_select's RuntimeError along dim 1; runtime/program.py raises them)."""
        position = self._position_within(index, bound)
        if position is not None:
            return position
        # (in a segment kernel, an index only a row's elements read, for a segment reduction or
        # a per-element result: eager never reads it for an empty row, and the codegen checks it
        # only where the row has elements; a per-row result's lookups are checked for every row)
        checked = self._emit("checkindex", dt.int64, (index,), (bound, label, error, self._in_row))
        for sym, value in self._indirect.items():
            if value is checked:
                return sym
        sym = indirect_var(len(self._indirect))
        self._indirect[sym] = checked
        return sym

    def _position_within(self, index: Value, bound: sympy.Expr) -> sympy.Expr | None:
        """An index that is the loop's own position along a dim no longer than ``bound`` (an arange
        expanded beside the indices of a scatter_add or an embedding's backward, for the dims
        it does not index), or a fixed position below it: that position itself, never out of
        range, so the access stays affine in the loop (vector loads and stores, no check)."""
        wide = (dt.int32, dt.int64)  # (a narrower integer wraps: arange(300).to(uint8))
        while index.kind == "alu" and index.arg is Op.CAST and index.dtype in wide and index.srcs[0].dtype in wide:
            index = index.srcs[0]
        if index.kind != "index" or index.dtype not in wide:
            return None
        expr = sympy.sympify(index.arg)
        bound = sympy.sympify(bound)
        if expr.is_Integer:
            return expr if 0 <= int(expr) and bound.is_Integer and int(expr) < int(bound) else None
        loop_vars = [s for s in expr.free_symbols if is_index_var(s)]
        if len(loop_vars) != 1 or loop_vars[0].name[0] not in "or":
            return None
        var = loop_vars[0]
        # (a segment row's r0 counts from the row's start: no extent of its own)
        dims = self.spec.outer if var.name[0] == "o" else () if self.spec.segment is not None else self.spec.inner
        if int(var.name[1:]) >= len(dims):
            return None
        extent = sympy.sympify(dims[int(var.name[1:])])
        if expr == var:
            fits = sh.equal(extent, bound) or (extent.is_Integer and bound.is_Integer and int(extent) <= int(bound))
            return expr if fits else None
        # a * var + b (a slice's positions, start b, step a: slice_scatter written into an input)
        a, b = sympy.expand(expr).as_independent(var, as_Add=True)[::-1]
        a = sympy.expand(a / var)
        last = sympy.expand(a * (extent - 1) + b)
        fits = a.is_Integer and int(a) >= 1 and sh.nonnegative(b) and sh.nonnegative(bound - 1 - last)
        return expr if fits else None

    # ---- evaluation -----------------------------------------------------------------------
    def value_of(self, node: Node, point: Point) -> Value:
        if node in self.spec.homes:
            if node in self.spec.unrolled or tuple(point) != tuple(self.spec.homes[node]):
                raise Conflict(node, self._reader or node)
            return self.compute(node, point)
        if self._loaded(node):
            return self.load(node, offset(point, self.buffers[node].strides))
        return self.compute(node, point)

    def _loaded(self, node: Node) -> bool:
        """Is ``node`` read from its buffer? Positions stored for an ATen call (torch.arange for
        an embedding) are recomputed from the loop's index instead: a causal mask comparing
        them loaded 8 bytes an element."""
        return node in self.buffers and node.op is not Op.IOTA

    def compute(self, node: Node, point: Point) -> Value:
        key = (node, tuple(point))
        found = self._memo.get(key)
        if found is not None:
            return found
        if self._depth > 64 and (node.op in POINTWISE_OPS or node.op in VIEW_OPS):
            self._operands_first(node, key[1])
        self._depth += 1
        try:
            value = self._compute(node, tuple(point))
        finally:
            self._depth -= 1
        self._memo[key] = value
        if node.origin and node.origin not in self.origins and node.op not in _UNNAMED:
            self.origins.append(node.origin)
        return value

    def _operands_first(self, node: Node, point: Point) -> None:
        """Compute what ``node`` reads through pointwise ops and views, deepest first, in the
        order (and under the reader) the recursion would. For deep recursions only: a chain of
        hundreds of them (an unrolled loop) recursed three Python frames each, past Python's
        recursion limit."""
        def operands(n: Node, at: Point) -> list[tuple[Node, Point]]:  # those value_of computes
            if n.op in VIEW_OPS:
                reads = [] if self.strided(n) is not None else [(n.inputs[0], tuple(map_view(n, at)))]
            else:
                reads = [(i, at) for i in n.inputs]
            return [(i, p) for i, p in reads if (i.op in POINTWISE_OPS or i.op in VIEW_OPS)
                    and i not in self.spec.homes and not self._loaded(i) and (i, p) not in self._memo]

        # entries: (node, point, the reader while it is computed, what it reads); views leave
        # the reader as it was, pointwise ops read as themselves
        stack = [(node, point, self._reader, iter(operands(node, point)))]
        seen = {(node, point)}
        while stack:
            top, at, reader, reads = stack[-1]
            for key in reads:
                if key not in seen:
                    seen.add(key)
                    below = top if top.op in POINTWISE_OPS else reader
                    stack.append((*key, below, iter(operands(*key))))
                    break
            else:
                stack.pop()
                if stack:  # (``node`` itself is the caller's)
                    previous, self._reader = self._reader, reader
                    self.compute(top, at)
                    self._reader = previous

    def _compute(self, node: Node, point: Point) -> Value:
        op = node.op
        if op is Op.CONST:
            return self._emit("const", node.dtype, (), node.arg)
        if op is Op.IOTA:
            _length, start, step = node.arg
            if node.dtype.is_low_precision:  # a 16-bit arange holds 16-bit values (bfloat16 257 is 256)
                exact = self.index_value(sympy.expand(start + point[0] * step), dt.float32)
                return self._emit("alu", node.dtype, (exact,), Op.CAST)
            return self.index_value(sympy.expand(start + point[0] * step), node.dtype)
        if op in POINTWISE_OPS:
            previous, self._reader = self._reader, node
            srcs = [self.value_of(i, point) for i in node.inputs]
            self._reader = previous
            if op in ROUNDED_FIRST:
                # (a conversion to another float changes smoothly: only its operand is rounded, but
                # op by op where a jump reads that operand too, so both see one value: bf16
                # ``y.half().bfloat16() >= y`` was False where the conversion's y was an ulp off)
                smooth = op is Op.CAST and node.dtype.is_float
                # (op by op also under widening casts and float32 ops: fp16 ``x == x.amin(0)`` of
                # ``x = lerp(a, log(|a| + 1e-3).half(), 0.3)``, its float32 lerp between two
                # 16-bit ops, compared an unrounded sum's log with the max's rounded one: no
                # element equalled it, and its backward divided by that count, 0: NaN)
                srcs = [self._chain_as_eager_holds(s) if not smooth or view_base(i) in self.held
                        else self._as_eager_holds(s, False) for i, s in zip(node.inputs, srcs)]
            else:  # (what a conversion reads rounded, a difference reads rounded: cast_read; what a
                # training forward saves, every op reads rounded: saved_read. Each reads the value
                # as it is stored: op by op where a jump reads it too, or bf16 softsign's
                # ``s >= maximum(s, x)`` compared two roundings of s, False where eager's is True)
                srcs = [self._as_eager_holds(s, per_op=view_base(i) in self.held)
                        if view_base(i) in self.saved or op in CANCELLING and view_base(i) in self.converted
                        else s for i, s in zip(node.inputs, srcs)]
            return self._emit("alu", node.dtype, srcs, op)
        if op in VIEW_OPS:
            strided = self.strided(node)
            if strided is not None:
                base, (strides, off) = strided
                return self.load(base, offset(point, strides, off))
            return self.value_of(node.inputs[0], map_view(node, point))
        if op in REDUCE_OPS:
            if self.spec.scan is not None:  # (a scan kernel has one loop, accumulating nothing else)
                raise NeedsBuffer(node)
            return self._reduce(node, point)
        if op is Op.SCAN:
            return self._scan(node, point)
        if op is Op.CAT:
            return self._cat(node, point)
        if op is Op.PAD:
            return self._pad(node, point)
        if op is Op.GATHER:
            x, index = node.inputs
            dim = node.arg
            previous, self._reader = self._reader, node
            idx = self.value_of(index, point)
            # a loss's target class out of range is eager's IndexError; any other gather's, RuntimeError
            origin = node.origin or ""
            error = 5 if "nll_loss" in origin else 6 if "scatter" in origin else 2
            sym = self.indirect(idx, x.shape[dim], f"{node.origin or 'gather'} dim {dim}", error)
            value = self.value_of(x, point[:dim] + (sym,) + point[dim + 1:])
            self._reader = previous
            return value
        if op is Op.INDEX:
            return self._index(node, point)
        if op is Op.SEARCH:
            return self._search(node, point)
        if op is Op.SEGMENT_REDUCE:
            return self._segment_reduce(node, point)
        if op is Op.CHUNK_SUM:
            return self._chunk_sum(node, point)
        if op is Op.MATMUL:
            return self._matmul(node, point)
        raise NeedsBuffer(node)  # EXTERN, INPUT, TENSOR: always buffers

    def _index(self, node: Node, point: Point) -> Value:
        x, *indices = node.inputs
        start, m = node.arg, indices[0].rank
        at = point[start:start + m]
        previous, self._reader = self._reader, node
        # (an embedding's or index_select's bad index is eager's IndexError naming that op)
        error = _INDEX_ERROR_CODES.get(node.origin or "", 3)
        if error == 9 and start == 1 and x.rank > 1:
            error = 11  # eager's index_select along dim 1 takes a fast path: a RuntimeError
        syms = tuple(self._known_row(i, at, x.shape[start + j])
                     or self.indirect(self.value_of(i, at), x.shape[start + j], f"index dim {start + j}", error)
                     for j, i in enumerate(indices))
        value = self.value_of(x, point[:start] + syms + point[start + m:])
        self._reader = previous
        return value

    def _search(self, node: Node, point: Point) -> Value:
        row = self._row_of(node, point)
        if row is not None:
            return self.index_value(row, node.dtype)
        seq, values = node.inputs
        strided = self.strided(seq)
        if strided is None and seq.op is Op.IOTA and seq in self.buffers and seq not in self.spec.homes:
            strided = (seq, (self.buffers[seq].strides, sympy.Integer(0)))  # (stored for the search)
        if strided is None:
            if seq in self.spec.homes:  # this kernel computes the sequence; the search needs all of it
                raise Conflict(seq, node)
            raise NeedsBuffer(seq)
        base, (strides, start) = strided
        info = self.buffers[base]
        self._reads[info.name] = base.dtype
        previous, self._reader = self._reader, node
        value = self.value_of(values, point)
        self._reader = previous
        # a batched search (seq of shape (..., N), values of shape (..., M)) searches the row of
        # seq at the point's leading coordinates
        last = seq.rank - 1
        start = start + sum((p * st for p, st in zip(point[:last], strides[:last])), sympy.Integer(0))
        arg = SearchArg(info.name, sympy.expand(start), sympy.expand(strides[last]), seq.shape[last],
                        bool(node.arg[0]))
        # (the row searched may move along the inner loop where the value, broadcast, does not)
        return self._emit("search", node.dtype, (value,), arg, expr=arg.start)

    def _known_row(self, index: Node, point: Point, size: sympy.Expr) -> sympy.Expr | None:
        """A row id used as an index into a (B, ...) tensor inside that row's segment kernel:
        the row itself, so the value indexed is the row's own (computed here, not gathered)."""
        if self.spec.segment is None or not sh.equal(size, self.spec.segment.shape[0] - 1):
            return None
        return self._row_of(index, point)

    def _row_of(self, node: Node, point: Point) -> sympy.Expr | None:
        """``ragged.row_ids()`` at a position of the row this segment kernel is reducing: that row,
        with no search."""
        if self._segment is None or row_ids_offsets(node) is not self.spec.segment:
            return None
        row, start, _length = self._segment
        within = sympy.expand(point[0] - start)
        if all(has_inner(s) for s in within.free_symbols):
            return row
        return None

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
        position = self.index_value(p, dt.int64)
        previous, self._reader = self._reader, node
        value = None
        for x, s in zip(reversed(node.inputs), reversed(starts)):
            local = clamped(p - s, x.shape[dim])
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
        if any(sh.static(size) == 0 for size in x.shape):  # padding only: no element to load
            return self.value_of(fill, ())
        previous, self._reader = self._reader, node
        inside: Value | None = None
        in_point = []
        for p, size, (lo, _hi) in zip(point, x.shape, node.arg):
            q = sympy.expand(p - lo)
            if sh.equal(lo, 0) and sh.equal(_hi, 0):
                in_point.append(q)
                continue
            in_point.append(clamped(q, size))
            pos = self.index_value(q, dt.int64)
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
        if self._loaded(node) and node not in self.spec.homes:
            result = (node, (self.buffers[node].strides, sympy.Integer(0)))
        elif node.op in VIEW_OPS and node not in self.spec.homes:
            below = self.strided(node.inputs[0])
            if below is not None:
                composed = compose_strided(node, below[1])
                result = (below[0], composed) if composed is not None else None
        self._strided[node] = result
        return result

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
        if sh.numel(root.shape) == 0:  # no element to write: every index is flagged out of range
            return
        index = offset(home[:start] + syms + home[start + m:], info.strides)
        bound = tuple(sorted((s for s in index.free_symbols if is_indirect_var(s)), key=lambda s: s.name))
        self._emit("store", root.dtype, (value, *(self._indirect[s] for s in bound)),
                   Access(info.name, index, bound, accumulate if isinstance(accumulate, str) else bool(accumulate)),
                   expr=index)

    def build(self) -> Kernel:
        if self.spec.segment is not None:  # first: the row's start is ind0, as homes expect
            self._segment_row(outer_var(0), self.spec.segment, self.spec.segment_total)
        for root in self.spec.roots:
            for home in self._homes(root):
                # a root stored per element of a segment row (not per row): all it reads, the
                # row's elements read
                self._in_row = self.spec.segment is not None and any(has_inner(p) for p in home)
                if root.op is Op.INDEX_PUT:
                    self._put(root, home)
                    continue
                info = self.buffers[root]
                self._writes[info.name] = root.dtype
                if sh.numel(root.shape) == 0:
                    # no element to store: what would compute one runs over no element either,
                    # and its loads of empty inputs are constants (a float16 softmax over
                    # (3, 0, 37) read back a value no loop had computed)
                    continue
                value = self.compute(root, home)
                if root in self.held:
                    value = self._as_eager_holds(value)
                index = offset(home, info.strides)
                bound = tuple(sorted((s for s in index.free_symbols if is_indirect_var(s)), key=lambda s: s.name))
                self._emit("store", root.dtype, (value, *(self._indirect[s] for s in bound)),
                           Access(info.name, index, bound), expr=index)
        self.values = self._live_values()
        params = [Param(n, d, False) for n, d in self._reads.items() if n not in self._writes]
        params += [Param(n, d, True) for n, d in self._writes.items()]
        symbols: set[sympy.Symbol] = set()
        for v in self.values:
            for e in _exprs(v):
                symbols |= {s for s in e.free_symbols if not is_index_var(s)}
        for e in self.spec.outer + self.spec.inner:
            symbols |= sh.expr(e).free_symbols
        symbols.discard(SEGMENT_LENGTH)
        symbols.discard(CHUNK)
        kernel = Kernel(self.name, params, sorted(symbols, key=lambda s: s.name), self.spec.outer,
                        self.spec.inner, self.values, origins=self.origins, chunks=self.spec.chunks)
        if self.spec.segment is not None:
            offsets = self.spec.segment
            kernel.segment_length = self._segment[2]
            rows = sympy.Max(offsets.shape[0] - 1, 1)
            kernel.segment_hint = FloorDiv(sympy.expand(self.spec.segment_total + rows - 1), rows)
        assign_loops(kernel)
        if self.spec.scan is not None and (kernel.n_loops != 1
                                           or any(v.kind == "store" and not v.inner for v in kernel.values)):
            # (its roots are all stored along the scanned rows, and nothing else accumulates)
            raise RuntimeError(f"ember: a scan kernel of {kernel.n_loops} loops")
        self._check_final(kernel)
        return kernel

    def _live_values(self) -> list[Value]:
        """The values something uses: what stores, index checks (which flag a bad index) and a
        segment's length need, with their guards. A 16-bit chain rounded again as eager holds it
        (build_reduce._as_eager_holds), or a position no longer checked, leaves its first form
        unused: compilers warn of it (nvcc's #177-D), and readers wonder."""
        roots = [v for v in self.values if v.kind in ("store", "checkindex")]
        if self._segment is not None:
            roots.append(self._segment[2])
        live = reachable(roots)
        return [v for v in self.values if id(v) in live]

    def _check_final(self, kernel: Kernel) -> None:
        """Results over all rows are for the epilogue only: a row (or another reduction over the
        rows) that needs one sends its reduction to a kernel of its own."""
        outer = {outer_var(i) for i in range(len(kernel.outer))}
        for v in kernel.values:
            late = [s for s in v.srcs if s.stage == FINAL_STAGE and not s.inner]
            if late and (v.inner or v.kind in ("reduce", "chunksum", "rowreduce") or v.stage != FINAL_STAGE
                         or self._reads_a_row(kernel, v, outer)):
                raise AcrossFailed(self._across_source(late[0]))

    @staticmethod
    def _reads_a_row(kernel: Kernel, v: Value, outer: set[sympy.Symbol]) -> bool:
        """Does ``v``, computed after all rows, need a value of one row (a load or position at an
        outer index)? The epilogue has no row: a column sum's kernel (outer: the columns) had
        ``w * w.sum() + (dy * xhat).sum(0)``, a LayerNorm weight's gradient beside a sum over the
        same columns, store each column after all of them: C++ that did not build, and on Triton
        every column's value written at the last block's."""
        before = [s for s in (*v.srcs, *((v.guard,) if v.guard is not None else ())) if s.stage != FINAL_STAGE]
        needed = reachable(before)
        of_a_row = [u for u in kernel.values if id(u) in needed and (u.inner or any(e.free_symbols & outer
                                                                                    for e in _exprs(u)))]
        return bool(of_a_row) or any(e.free_symbols & outer for e in _exprs(v))

    def _across_source(self, v: Value) -> Node:
        """The node of a rowreduce that ``v`` (a value after all rows) is computed from."""
        stack = [v]
        while stack:
            u = stack.pop()
            if id(u) in self._across:
                return self._across[id(u)]
            stack.extend(u.srcs)
        raise AssertionError("a value after all rows without a reduction over them")


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


def _key(arg: Any) -> Any:
    if isinstance(arg, float):
        return ("f", repr(arg))
    return arg


def assign_loops(kernel: Kernel) -> None:
    """Place reductions and stores into inner loops, and outer values into stages.

    An inner value can only use outer values computed before its loop, so a reduction whose input
    needs the result of loop k runs in loop k+1 (softmax: max in loop 1, sum in 2, store in 3).
    """
    needs = stage_needs()  # read as stages are assigned, in topological order
    n_loops = 0
    used = {id(s) for v in kernel.values for s in (*v.srcs, *((v.guard,) if v.guard is not None else ()))}
    for v in kernel.values:
        if v.kind in ("reduce", "dot"):
            v.loop = max(needs(s) for s in v.srcs) + 1
            v.stage = v.loop
            n_loops = max(n_loops, v.loop)
        elif v.kind == "scan":  # (its stores, in the same loop, read it)
            v.loop = needs(v.srcs[0]) + 1
            n_loops = max(n_loops, v.loop)
        elif v.kind == "chunksum":  # added up in the loop that computes its source
            v.loop = needs(v.srcs[0]) + 1
            n_loops = max(n_loops, v.loop)
        elif v.kind == "checkindex" and v.inner and id(v) not in used:
            # a check whose load became a constant (a gather from an empty dim: every index is
            # out of range) still runs, in the loop its index is known in
            v.loop = needs(v.srcs[0]) + 1
            n_loops = max(n_loops, v.loop)
        elif v.kind == "rowreduce":  # known once every row is done
            v.stage = FINAL_STAGE
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
