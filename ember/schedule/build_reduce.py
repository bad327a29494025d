"""The kernel builder's reductions, scans and matmuls (a mixin of build.KernelBuilder).

Each method builds one kind of value at a point of the kernel's domain, or raises NeedsBuffer when
the value cannot live in this kernel (its loops differ, it is read at another point) so that the
scheduler gives it a buffer and a kernel of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
from torch.utils._sympy.functions import FloorDiv

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Graph, Node, view_base
from ..ir.ops import POINTWISE_OPS, VIEW_OPS, Op
from .group_spec import (
    ACROSS_OPS,
    AcrossFailed,
    NeedsBuffer,
    crosswise,
    drop_ones,
    has_indirect,
    has_inner,
    has_outer,
    scan_home,
)
from .indexing import Point, offset
from .kernel_ir import CHUNK, ReduceArg, Value, indirect_var, inner_var, outer_var

# ops whose result is one of their 16-bit operands, or its negation: exact on rounded operands
_EXACT_ON_16_BIT = frozenset({Op.WHERE, Op.NEG, Op.ABS, Op.MAX, Op.MIN})


# pointwise ops that read a 16-bit input as eager holds it (rounded): those whose result jumps
# with it (a float16 (x + 4096) % 5 of x = 1 is 4096 % 5, not 4097 % 5), and conversions
# ((x + 1000.3).float() is the bfloat16 sum, 1000.0). ISNAN too: rounding the value itself
# changes nothing, but the chain under it, rounded op by op, overflows as eager's does (float16
# (x * 100 - x * 100).isnan() of x = 1000 is inf - inf, True)
ROUNDED_FIRST = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.FLOOR, Op.CEIL, Op.ROUND, Op.TRUNC,
                           Op.SIGN, Op.ISINF, Op.ISNAN, Op.CAST, Op.FLOORDIV, Op.TRUNCDIV, Op.MOD, Op.FMOD})


# ATen calls whose result jumps with a 16-bit input's values: an order, a bucket, a count
_JUMPING_CALLS = frozenset({
    "aten.sort", "aten.topk", "aten.kthvalue", "aten.median", "aten.nanmedian", "aten.mode", "aten._unique2",
    "aten.unique_dim", "aten.unique_consecutive", "aten.searchsorted", "aten.bucketize", "aten.histc",
    "aten.max_pool2d_with_indices", "aten.max_pool3d_with_indices", "aten.nonzero"})


def jump_read(nodes: Sequence[Node], users: dict[Node, list[Node]], outputs: Sequence[Node | None] = ()
              ) -> frozenset[Node]:
    """The 16-bit nodes that something whose result jumps with their values reads from a buffer,
    directly or through views: an ATen sort, or a comparison in another kernel. Their kernels
    store them as eager holds them (rounded op by op): a buffer rounded once is an ulp off here
    and there, which a bfloat16 topk's order or a comparison in the next kernel turns into
    other indices and other bools than eager's. (A jump in the same kernel reads the chain
    rounded op by op already: _as_eager_holds.) A 16-bit max or min that a comparison reads, or
    that leaves the graph (a training forward's, which its backward compares with its values:
    x == max), is one of those values as eager holds them, bit for bit (_compared_max)."""
    leaving = {id(n) for n in outputs if n is not None}

    def jumps(reader: Node) -> bool:
        if reader.op in VIEW_OPS:
            return any(jumps(u) for u in users[reader])
        if reader.op is Op.CAST:
            return not reader.dtype.is_float  # (a conversion to another float changes smoothly)
        if reader.op is Op.EXTERN:
            return reader.arg.name in _JUMPING_CALLS
        if is_max(reader):
            return maxima(reader)
        return reader.op in ROUNDED_FIRST or reader.op in (Op.ARGMAX, Op.ARGMIN, Op.SCAN)

    def is_max(n: Node) -> bool:  # (a segment max too: ragged.segment_max's backward compares it)
        return n.op in (Op.AMAX, Op.AMIN) or n.op is Op.SEGMENT_REDUCE and n.arg in (Op.AMAX, Op.AMIN)

    def maxima(m: Node) -> bool:  # (a max's result compared, or leaving the graph, through views)
        return id(m) in leaving or any(jumps(u) or (u.op in VIEW_OPS and maxima(u)) for u in users[m])

    def leaving_under(m: Node) -> list[Node]:
        """The 16-bit values leaving the graph that a max's chain computes on its way (rounded
        op by op there): stored so too, or its backward's ``x == max`` compared the max with
        values stored rounded once, found none equal (a bfloat16 ``v.abs().amax()`` of a
        label-smoothed cross-entropy ``v`` also returned), and divided by that count: NaN."""
        found, stack, seen = [], list(m.inputs), set()
        while stack:
            n = stack.pop()
            if id(n) in seen or not (n.op in POINTWISE_OPS or n.op in VIEW_OPS):
                continue
            seen.add(id(n))
            if id(n) in leaving and n.dtype is not None and n.dtype.is_low_precision:
                found.append(n)
            stack.extend(n.inputs)
        return found

    # (views too: a view read by ATen may be the root its kernel stores)
    low = [n for n in nodes if n.dtype is not None and n.dtype.is_low_precision]
    # (maxima of any float dtype: a float32 max of a 16-bit chain, ``(x * rsqrt(ms)).float() * w``
    # an RMSNorm's, is one of the values its backward recomputes from eager's rounded ones)
    floats = [n for n in nodes if n.dtype is not None and n.dtype.is_float]
    maxes = [n for n in floats if is_max(n) and maxima(n)]
    return frozenset([n for n in low if any(jumps(u) for u in users[n])] + maxes
                     + [n for m in maxes for n in leaving_under(m)])


# ops whose result can cancel to the difference of their operands' roundings
CANCELLING = frozenset({Op.ADD, Op.SUB})


def cast_read(nodes: Sequence[Node], users: dict[Node, list[Node]]) -> frozenset[Node]:
    """The 16-bit values computed in kernels that a conversion to another float reads, directly
    or through views. The conversion reads them rounded, as eager holds them, so additions and
    subtractions read them rounded too, in whichever kernel computes them. With two forms, a float16 ``x.std(0)``'s
    backward, ``(e - e.float().mean(0).half()) / std`` of ``e = x.exp()``, subtracted a mean of
    the rounded values from an unrounded value; over two rows an ulp apart that difference is
    the ulp itself, and the gradient came out 20% off where eager's is within 3% (CPU fuzz seed
    240857403881). Other readers keep the unrounded value, off by a relative half ulp at most: a
    bf16 softmax's quotient ``e / e.float().sum()`` rounded again cost the CUDA C++ kernel 7%
    (82 -> 88 µs at 16384 x 4096 on an H200; Triton's keeps the rounded row anyway)."""

    def converted(n: Node) -> bool:
        return any(u.op is Op.CAST and u.dtype.is_float and u.dtype != n.dtype
                   or u.op in VIEW_OPS and converted(u) for u in users[n])

    return frozenset(n for n in nodes if n.op in POINTWISE_OPS and n.op is not Op.CAST
                     and n.dtype is not None and n.dtype.is_low_precision and converted(n))


def saved_read(graph: Graph) -> frozenset[Node]:
    """The 16-bit values computed in a training graph's kernels that eager holds as its forward
    saved them, so that every reader reads them rounded. A training forward's outputs are saved
    for its backward (or the user's): they leave the graph rounded, and the backward recomputes
    from them as saved. Of the unrounded value, a bf16 RMSNorm's ``x * rsqrt(ms)`` normalized
    over a dim of size 1 had a norm its backward's recomputed ``x * rsqrt`` missed by an ulp;
    the gradient, 0 by cancellation, came out 14 where eager's is within 1e-4 (CPU fuzz seed
    58612926972). ``graph.eager_saved`` adds the forward values a backward op reads in this
    graph: a backward's recomputations, and the forward values of the gradient-in-forward plan."""
    candidates = list(graph.eager_saved)
    if graph.name.startswith("forward"):
        candidates += [n for n in graph.outputs if n is not None]
    return frozenset(base for n in candidates
                     if (base := view_base(n)).op in POINTWISE_OPS and base.op is not Op.CAST
                     and base.dtype is not None and base.dtype.is_low_precision)


class ReduceBuilder:
    """Reductions (per row, over the rows, per ragged segment, per run of rows), scans and
    matmul products; the attributes and value helpers are KernelBuilder's."""

    def _reduce(self, node: Node, point: Point) -> Value:
        (x,) = node.inputs
        dims = [d for d in node.arg if not sh.is_one(x.shape[d])]
        extents = [x.shape[d] for d in dims]
        fits = (len(extents) == len(self.spec.inner)
                and all(sh.equal(a, b) for a, b in zip(extents, self.spec.inner))
                and not any(has_inner(p) or has_indirect(p) for p in point)
                and sh.equal(sh.numel(x.shape), sh.numel(self.spec.outer) * sh.numel(self.spec.inner))
                and not crosswise(self.spec.ref, (x.shape, tuple(node.arg))))
        if not fits:
            return self._across_rows(node, point, dims, extents)
        in_point = list(point)
        for j, d in enumerate(dims):
            in_point[d] = inner_var(j)
        for d in node.arg:
            if sh.is_one(x.shape[d]):
                in_point[d] = sympy.Integer(0)
        src = self._reduced(node, tuple(in_point))
        if node.op in (Op.ARGMAX, Op.ARGMIN):
            src = self._as_eager_holds(src)  # (ties as eager's rounded values make them)
        elif self._compared_max(node):
            src = self._chain_as_eager_holds(src)
        position = offset(tuple(inner_var(j) for j in range(len(dims))), sh.contiguous_strides(extents))
        return self._emit("reduce", node.dtype, (src,), ReduceArg(node.op, position))

    def _compared_max(self, node: Node) -> bool:
        """A max or min whose result a comparison reads (``x == max`` in its backward): it must
        be one of the values as eager holds them, rounded op by op, bit for bit. Of the
        unrounded chain, a bfloat16 (x - x.flip(-1) + x).amax(0) equalled none of them, and its
        backward divided by that count, 0: NaN. Read by nothing that jumps, the chain is rounded
        once, as a sum's is (twice as fast on the CPU)."""
        return node.op in (Op.AMAX, Op.AMIN) and node in self.held

    def _chain_as_eager_holds(self, v: Value) -> Value:
        """``_as_eager_holds`` of a max's source, and of the 16-bit values under a wider one: a
        float32 max of ``(x * rsqrt(ms)).float() * w`` over bfloat16 ``x`` read the unrounded
        rsqrt, its backward the rounded one it saved, and no product equalled the max in some
        rows (bfloat16 CPU fuzz seed 320218832278: NaN gradients)."""
        if v.kind != "alu":  # (a load or constant as it is; a 16-bit sum or max rounded)
            return self._as_eager_holds(v)
        if v.arg is Op.CAST:  # (a 16-bit op's rounding, or a widening of it: its chain, op by op)
            inner = self._chain_as_eager_holds(v.srcs[0])
            if inner is v.srcs[0] or inner.kind == "alu" and inner.arg is Op.CAST and inner.dtype == v.dtype:
                return v if inner is v.srcs[0] else inner  # (rounded to this dtype already)
            return self._emit("alu", v.dtype, (inner,), Op.CAST)
        if v.dtype.is_low_precision:
            return self._as_eager_holds(v)
        held, key = self._eager_held, (id(v), "chain")
        if key not in held:
            srcs = tuple(self._chain_as_eager_holds(s) for s in v.srcs)
            held[key] = v if all(a is b for a, b in zip(srcs, v.srcs)) else self._emit("alu", v.dtype, srcs, v.arg)
        return held[key]

    def _reduced(self, node: Node, point: Point) -> Value:
        """The value a reduction ``node`` reduces, at ``point`` of its input. Over no elements it
        is never read, so nothing computing it is emitted: its loads of empty inputs are constants
        (KernelBuilder.load), and an integer division of them, invariant in the loop that never
        runs, was computed before it and flagged eager's ZeroDivisionError."""
        (x,) = node.inputs
        if sh.numel(x.shape) == 0:
            return self._emit("const", x.dtype, (), 0)
        previous, self._reader = self._reader, node
        src = self.value_of(x, point)
        self._reader = previous
        return src

    def _scan(self, node: Node, point: Point) -> Value:
        """A scan at its home in a scan kernel: (o.., r0, o..) with r0 along its dim, the loop
        running in its direction (one direction a kernel). Elsewhere (read shifted, transposed,
        in a row kernel) it needs a kernel of its own."""
        (x,) = node.inputs
        arg = node.arg
        home = scan_home(node.shape, arg.dim)
        if (self.spec.scan is not arg.reverse or tuple(point) != home or len(self.spec.inner) != 1
                or not sh.equal(self.spec.inner[0], x.shape[arg.dim])):
            raise NeedsBuffer(node)
        previous, self._reader = self._reader, node
        # (a 16-bit source rounded as eager holds it: a product over a row amplified the
        # difference of each unrounded element)
        src = self._as_eager_holds(self.value_of(x, point))
        self._reader = previous
        return self._emit("scan", node.dtype, (src,), arg)

    def _as_eager_holds(self, v: Value, per_op: bool = True) -> Value:
        """A 16-bit float value rounded to its dtype, as eager holds it. ember computes 16-bit
        math in float32 and rounds where a value is stored or cast to 16 bits; conversions and
        ops whose result jumps with their input (a comparison, a rounding, an argmax's ties) read
        it rounded, or ``(x * 1000).int()`` and ``x * 1000 > 300`` differ from eager by whole
        units. With ``per_op`` the 16-bit ops under it are rounded one by one too, as eager's:
        a jump turns their differences into whole units. A conversion to float32 changes
        smoothly with its input and takes ``per_op=False``: only the value itself is rounded, so
        the chain under it is not computed twice (a bf16 softmax's exp, once for its sum in
        eager's steps and once unrounded for its quotient: 75.8 against 63 µs on an H200).
        Loads, constants and casts to 16 bits are rounded already."""
        if not v.dtype.is_low_precision or v.kind in ("load", "const") or (v.kind == "alu" and v.arg is Op.CAST):
            return v
        held = self._eager_held  # (each value of the DAG rounded once, each way)
        key = (id(v), per_op)
        if key not in held:
            rounded_srcs = v
            if v.kind == "alu" and per_op:
                # eager rounds every op, so the chain under the jump reads rounded values too: a
                # (x / s + z).round() of fake quantization rounds x / s before adding z
                srcs = tuple(self._chain_as_eager_holds(s) for s in v.srcs)
                if any(a is not b for a, b in zip(srcs, v.srcs)):
                    rounded_srcs = self._emit("alu", v.dtype, srcs, v.arg)
            # a select, a sign change or a max of rounded values is one of them: no second
            # rounding (a causal softmax's masked_fill before its float32 cast: 20% of its time)
            exact = v.kind == "alu" and v.arg in _EXACT_ON_16_BIT and all(
                s.dtype == v.dtype or not s.dtype.is_float for s in v.srcs)
            if exact and not per_op:  # (its operands were not rounded here: those of 16 bits must be already)
                exact = all(not s.dtype.is_low_precision or s.kind in ("load", "const")
                            or (s.kind == "alu" and s.arg is Op.CAST) for s in v.srcs)
            held[key] = rounded_srcs if exact else self._emit("alu", v.dtype, (rounded_srcs,), Op.CAST)
        return held[key]

    def _matmul(self, node: Node, point: Point) -> Value:
        """A matmul at its kernel's (o0, o1): a dot of its operands' loads at (o0, r0) and (r0, o1).
        Elsewhere (in a row kernel, read shifted or transposed) it needs a kernel of its own; an
        operand that is not a tensor in memory (a pointwise result) needs a buffer."""
        a, b = node.inputs
        o0, o1, k = outer_var(0), outer_var(1), inner_var(0)
        if (not self.spec.matmul or tuple(point) != (o0, o1) or len(self.spec.inner) != 1
                or not sh.equal(a.shape[1], self.spec.inner[0])):
            if node in self.spec.homes:
                # a matmul stored as its own root outside a matmul's tiles: an operand computed in
                # this kernel put a reduction under it (an RMSNorm before two projections), and the
                # operand gets the buffer (buffering the matmul again would change nothing)
                for x in (a, b):
                    if not self._loaded(view_base(x)):
                        raise NeedsBuffer(view_base(x))
            raise NeedsBuffer(node)
        previous, self._reader = self._reader, node
        operands = [self.value_of(a, (o0, k)), self.value_of(b, (k, o1))]
        self._reader = previous
        for v, x in zip(operands, (a, b)):
            if v.kind != "load" or v.arg.bindings:
                raise NeedsBuffer(view_base(x))
        return self._emit("dot", dt.float32, operands)

    def _across_rows(self, node: Node, point: Point, dims: list[int], extents: list[sympy.Expr]) -> Value:
        """A reduction over exactly this row kernel's rows (outer domain), of values per row: a
        rowreduce, finished by the last program (or raise NeedsBuffer: a kernel of its own)."""
        (x,) = node.inputs
        fits = (self.spec.inner and self.spec.chunks is None and self.spec.segment is None
                and node.op in ACROSS_OPS and len(extents) == len(self.spec.outer)
                and all(sh.equal(a, b) for a, b in zip(extents, self.spec.outer))
                and all(d in node.arg or sh.is_one(s) for d, s in enumerate(x.shape))
                and not any(has_inner(p) or has_indirect(p) or has_outer(p) for p in point))
        if not fits:
            raise NeedsBuffer(node)
        in_point = [sympy.Integer(0)] * x.rank
        for j, d in enumerate(dims):
            in_point[d] = outer_var(j)
        previous, self._reader = self._reader, node
        src = self.value_of(x, tuple(in_point))
        self._reader = previous
        if src.inner:
            raise AcrossFailed(node)
        if self._compared_max(node):
            src = self._chain_as_eager_holds(src)
        value = self._emit("rowreduce", node.dtype, (src,), ReduceArg(node.op, sympy.Integer(0)))
        self._across[id(value)] = node
        return value

    def _segment_reduce(self, node: Node, point: Point) -> Value:
        """A reduction over one row of packed values: the row (outer dim 0) reads its start and
        length from the offsets, and the inner loop walks the row from its start."""
        x, offsets = node.inputs
        fits = (self._segment is not None and self.spec.segment is offsets
                and sh.equal(x.shape[0], self.spec.segment_total) and sh.equal(point[0], self._segment[0])
                and sh.shapes_equal(drop_ones(node.shape), self.spec.outer)
                and not any(has_inner(p) or has_indirect(p) for p in point))
        if not fits:
            raise NeedsBuffer(node)
        start = self._segment[1]
        previous, self._reader = self._reader, node
        in_row, self._in_row = self._in_row, True
        src = self.value_of(x, (start + inner_var(0), *point[1:]))
        self._reader, self._in_row = previous, in_row
        if node.arg in (Op.AMAX, Op.AMIN) and node in self.held:  # (as _compared_max)
            src = self._chain_as_eager_holds(src)
        return self._emit("reduce", node.dtype, (src,), ReduceArg(node.arg, inner_var(0)))

    def _chunk_sum(self, node: Node, point: Point) -> Value:
        """Partial sums over runs of rows. In a chunked row kernel (home (CHUNK, inner...)) a
        chunksum adds the source up as the run's rows go by; on its own, a reduction over a run's
        ceil(R / chunks) rows (outer: run and kept dims, inner: the row within the run)."""
        (x,) = node.inputs
        lead, chunks = node.arg
        fused = point[0] == CHUNK
        if fused and self.spec.chunks != chunks:
            raise RuntimeError(f"ember: {node!r} placed in a kernel without its {chunks} runs")
        total = sh.numel(x.shape[:lead])
        row = sympy.expand(point[0] * FloorDiv(sympy.expand(total + chunks - 1), chunks) + inner_var(0))
        rows, o = [], 0
        flat = sympy.Min(row, sympy.Max(total - 1, 0))  # rows past the end (the last run's) read the last
        for d in range(lead):
            if sh.is_one(x.shape[d]):
                rows.append(sympy.Integer(0))
            elif fused:  # the kernel's own row
                rows.append(outer_var(o))
                o += 1
            else:
                stride = sh.numel(x.shape[d + 1:lead])
                q = flat if sh.equal(stride, 1) else FloorDiv(flat, stride)
                rows.append(q if d == 0 else sympy.Mod(q, x.shape[d]))
        previous, self._reader = self._reader, node
        src = self.value_of(x, (*rows, *point[1:]))
        self._reader = previous
        if src.dtype != node.dtype:
            src = self._emit("alu", node.dtype, (src,), Op.CAST)
        if fused:
            return self._emit("chunksum", node.dtype, (src,), ReduceArg(Op.SUM, sympy.Integer(0)))
        inside = self._emit("alu", dt.bool_, (self._emit("index", dt.int64, (), row, expr=row),
                                              self._emit("const", dt.int64, (), total)), Op.LT)
        src = self._select(inside, src, self._emit("const", node.dtype, (), 0.0), node.dtype)
        return self._emit("reduce", node.dtype, (src,), ReduceArg(Op.SUM, inner_var(0)))

    def _segment_row(self, row: sympy.Expr, offsets: Node, total: sympy.Expr) -> None:
        """Load the start and length of ``row``: the start becomes an indirect variable (ind0, the
        kernel's first), the length the kernel's inner extent. Offsets are clamped into [0, total]
        so that malformed ones (``Ragged`` validates them) never read out of bounds."""
        previous, self._reader = self._reader, offsets
        lo, hi = (self._emit("alu", dt.int64, (self.value_of(offsets, (p,)),), Op.CAST) if offsets.dtype != dt.int64
                  else self.value_of(offsets, (p,)) for p in (row, sympy.expand(row + 1)))
        self._reader = previous
        zero, end = self._emit("const", dt.int64, (), 0), self._emit("const", dt.int64, (), total)
        start = self._emit("alu", dt.int64, (self._emit("alu", dt.int64, (lo, zero), Op.MAX), end), Op.MIN)
        stop = self._emit("alu", dt.int64, (self._emit("alu", dt.int64, (hi, start), Op.MAX), end), Op.MIN)
        length = self._emit("alu", dt.int64, (stop, start), Op.SUB)
        sym = indirect_var(len(self._indirect))
        self._indirect[sym] = start
        self._segment = (row, sym, length)
