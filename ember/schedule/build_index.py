"""Reads and writes at computed positions, for KernelBuilder: indices checked against their
bounds (gathers, embeddings, index_put), searches, ragged row ids inside their row's segment
kernel, concatenations and padding (a where chain over clamped reads). The attributes and value
helpers are KernelBuilder's (build.py)."""

from __future__ import annotations

import functools

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node, row_ids_offsets
from ..ir.ops import Op
from .group_spec import Conflict, NeedsBuffer, has_inner
from .indexing import Point, offset
from .kernel_ir import Access, SearchArg, Value, indirect_var, is_index_var, is_indirect_var

# the error codes (runtime/program.py) of reads at indices that name their op in eager's error
_INDEX_ERROR_CODES = {"aten.embedding": 8, "aten.index_select": 9}


@functools.lru_cache(maxsize=4096)
def clamped(position: sympy.Expr, size: sympy.Expr) -> sympy.Expr:
    """``position`` clamped into [0, size): a padded or concatenated read's index. sympy's Max
    and Min compare their arguments through assumptions, milliseconds each, and a pooling
    window's reads ask the same few again and again (a 5 x 5 window over 5 layouts: 25% of a
    graph's compile). Its value counts only inside [0, size), where no clamp applies: the C++
    backend may read it as a remainder instead (loops.split_inner_by_divisor)."""
    return sympy.Max(0, sympy.Min(position, size - 1))


class IndexBuilder:
    """Indexed reads and writes, searches, cat and pad; the attributes and value helpers are
    KernelBuilder's."""

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
        # a * var + b (a slice's positions, start b, step a: slice_scatter written into an input;
        # a step of -1: a flip's, b - var. Checked, a flip's index made NVVM spin for minutes on
        # a reflection pad's kernel, GPU fuzz seed 927498836294)
        a, b = sympy.expand(expr).as_independent(var, as_Add=True)[::-1]
        a = sympy.expand(a / var)
        if not a.is_Integer or int(a) == 0:
            return None
        last = sympy.expand(a * (extent - 1) + b)
        low, high = (b, last) if int(a) > 0 else (last, b)
        fits = sh.nonnegative(low) and sh.nonnegative(bound - 1 - high)
        return expr if fits else None

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
