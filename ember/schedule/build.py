"""Group of IR nodes -> one kernel (kernel_ir.Kernel).

The builder evaluates each root of the group at its *home point* (loop variables placed on its
dimensions) and recursively evaluates inputs at mapped points: pointwise ops at the same point,
views at the point they map to, reductions once per outer iteration with the reduced dims bound to
the inner loop variables. Nodes stored in a buffer (by another kernel, by ATen, or graph inputs)
become loads. Values are hash-consed, so anything needed twice is computed once.

When something cannot live in this kernel the builder raises, and the scheduler adjusts and
retries: ``NeedsBuffer`` (a reduction whose loops don't match this kernel's, or a value inlined at
so many points that the kernel grew past ``MAX_KERNEL_VALUES``) or ``Conflict`` (a root read at a
point other than the one this kernel computes it at).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node, view_base
from ..ir.ops import POINTWISE_OPS, REDUCE_OPS, VIEW_OPS, Op
from ..ir.strides import Strided, compose_strided
from .build_index import IndexBuilder
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
    Value,
    is_index_var,
    is_indirect_var,
    outer_var,
    reachable,
    stage_needs,
)

# Nodes that say nothing about what a kernel does (constants, index remapping).
_UNNAMED = frozenset({Op.CONST, Op.IOTA}) | VIEW_OPS
# A kernel of more values than this, most of them one value inlined and recomputed at several
# points, stores that value instead (a load a point). Stencils over stencils multiply: a layer
# norm read through a circular pad by a 3x3 pool was recomputed at 81 points, a kernel of 1500
# lines that ptxas took 70-90 s to compile (each new size again). Of the test suite's 8356
# kernels 15 hold more, the largest 1422 (a slice_scatter chain) and pools over 20-25 windows
# 700-850; none has a repeat that large.
MAX_KERNEL_VALUES = 400
# Nodes that can take a buffer of their own in place of being inlined
_STORABLE = POINTWISE_OPS | frozenset({Op.PAD, Op.CAT})


class KernelBuilder(ReduceBuilder, IndexBuilder):
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
        self._made: list[str] = []  # origins of constants and aranges: the names of a kernel of only those
        self._reader: Node | None = None
        self._depth = 0  # of compute's recursion (deep chains: _operands_first)
        self._indirect: dict[sympy.Symbol, Value] = {}
        self._segment: tuple[sympy.Expr, sympy.Symbol, Value] | None = None  # (row, start var, length)
        self._in_row = False  # building what only a segment row's elements need (not a per-row result)
        self._across: dict[int, Node] = {}  # rowreduce values -> their nodes
        self._eager_held: dict[tuple[int, bool], Value] = {}  # (a 16-bit value, per op) -> it rounded as eager holds it
        self._inlined: dict[Node, list[int]] = {}  # node -> [points computed at, values emitted there]

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
        emitted = len(self.values)
        try:
            value = self._compute(node, tuple(point))
        finally:
            self._depth -= 1
        counts = self._inlined.setdefault(node, [0, 0])
        counts[0] += 1
        counts[1] += len(self.values) - emitted  # (with what it read that nothing had computed yet)
        self._memo[key] = value
        if node.origin and node.origin not in self.origins and node.op not in _UNNAMED:
            self.origins.append(node.origin)
        elif node.origin and node.op in (Op.CONST, Op.IOTA) and node.origin not in self._made:
            self._made.append(node.origin)
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
        if len(self.values) > MAX_KERNEL_VALUES:
            self._store_the_costliest_repeat()
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
                        self.spec.inner, self.values, origins=self.origins or self._made, chunks=self.spec.chunks)
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

    def _store_the_costliest_repeat(self) -> None:
        """Raise NeedsBuffer for the inlined node whose recomputation at several points emitted
        the most values, where that is most of the kernel (a load a point replaces them)."""
        best, saved = None, len(self.values) // 2
        for node, (points, emitted) in self._inlined.items():
            if (points > 1 and emitted - points > saved and node.op in _STORABLE
                    and node not in self.spec.homes and node not in self.buffers):
                best, saved = node, emitted - points
        if best is not None:
            raise NeedsBuffer(best)

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
