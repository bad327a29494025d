"""Kernel domains: the loops a root of the fusion plan (schedule/fusion.py) is computed in.

A root's domain is (outer extents, inner extents, home point, reduction ref): the outer loop
runs over rows, the inner loops over what a row reduces, and the home point says where in those
loops the root's own element is. A reduction sets its rows and reduce extent; a pointwise root
joins a matmul's (M, N) tiles or a reduction group over the same full shape when there is one,
and a row kernel's rows when it is computed from that kernel's per-row results; ragged values
take segment rows (their extent read from the offsets); per-row values over long rows make a row
kernel; anything else is a flat pointwise kernel over its shape. ``DomainRules`` is the part of
the planner that decides them.
"""

from __future__ import annotations

import sympy
from torch.utils._sympy.functions import FloorDiv

from ..config import Config
from ..ir import shapes as sh
from ..ir.node import Node, row_ids_offsets
from ..ir.ops import POINTWISE_OPS, REDUCE_OPS, VIEW_OPS, Op
from .group_spec import ACROSS_OPS, GroupSpec, place, scan_home
from .indexing import Point, map_reshape
from .kernel_ir import CHUNK, SEGMENT_LENGTH, indirect_var, inner_var, outer_var

MAX_UNROLL = 8  # widest stacked dim stored position by position
# A pointwise kernel reading per-row values walks its rows as a row kernel when they are this
# long (shorter rows: a flat kernel), and no longer (a row kernel without reductions cannot split
# a row over programs: a few very long rows would leave the GPU idle), with rows enough to fill it
LONG_ROW, LONGEST_ROW, MIN_ROWS = 1024, 65536, 256
# On a GPU, a row kernel of this few rows, each at least this long, takes each pass over its rows
# (a BatchNorm's mean, then its variance, then the normalized values) on a program per row (or
# per 16 columns of a channels_last tensor): 64 programs for 64 channels, on 132 SMs. Its passes
# become kernels of their own: the reductions split each row over many programs
# (codegen/triton_loops.py: split_rows), and what reads their results is a pointwise kernel.
# Not below PASS_SPLIT_ELEMENTS in all, where launching the kernels costs more than the passes
# (a softmax over 4 rows of 4096). Rows that are contiguous runs (a reduction over trailing dims,
# a LayerNorm's) split only where they are too long to stay in a program's registers and too few
# to fill the GPU: a LayerNorm over 512 rows of 8192 reads each row once, in one kernel. A
# symbolic size counts as its value in the compile's example.
FEW_ROWS, PASS_SPLIT_ROW, PASS_SPLIT_ELEMENTS, SYMBOLIC_GUESS = 1024, 4096, 1 << 20, 32
FEW_CONTIGUOUS_ROWS, REGISTER_ROW = 256, 16384

Domain = tuple[tuple, tuple, Point, tuple | None]


class DomainRules:
    """The planner's domain decisions: a mixin of ``fusion.Planner``, whose ``subtree`` and
    ``reads`` it uses and whose state it records (which roots unroll a dim, walk segment rows,
    finish a row kernel's rows, or are a matmul's epilogue)."""

    cfg: Config
    unrolled: dict[Node, int]
    segment_of: dict[Node, tuple[Node, sympy.Expr]]
    not_across: set[Node]
    _across: dict[Node, GroupSpec]
    matmul_roots: set[Node]
    scan_roots: dict[Node, bool]
    gpu: bool  # planned for GPU kernels (few_long_rows applies)
    hints: dict[sympy.Symbol, int]  # symbolic sizes' example values

    def domain(self, root: Node, groups: list[GroupSpec]) -> Domain:
        """(outer extents, inner extents, home point, (F, reduce dims) or None)."""
        self.unrolled.pop(root, None)
        self.segment_of.pop(root, None)
        self._across.pop(root, None)
        self.matmul_roots.discard(root)
        self.scan_roots.pop(root, None)
        if root.op is Op.INDEX_PUT:  # a pointwise kernel over the values written
            return self._pointwise_domain(root, root.inputs[1].shape)
        if root.op is Op.CHUNK_SUM:
            return self._chunk_domain(root, groups)
        segments = [n for n in [*self.subtree(root), root] if n.op is Op.SEGMENT_REDUCE]
        # rows of a ragged tensor: one outer iteration per (row, feature), inner loops over the
        # row, whose extent the kernel reads from the offsets
        inner = (SEGMENT_LENGTH,)
        if segments:
            (x, offsets), outer = segments[-1].inputs, _drop_ones(segments[-1].shape)
            if sh.shapes_equal(_drop_ones(root.shape), outer):
                self.segment_of[root] = (offsets, x.shape[0])
                return outer, inner, place(root.shape, outer_var), None
            if self._row_wise(root, offsets, x.shape[0], outer):
                self.segment_of[root] = (offsets, x.shape[0])
                return outer, inner, _row_home(root.shape), None
        for g in groups:
            if g.segment is not None and self._row_wise(root, g.segment, g.segment_total, g.outer):
                # packed values computed per row (softmax's e / sum[row]): stored by the row's
                # kernel as it walks the row, at the row's start + r0
                self.segment_of[root] = (g.segment, g.segment_total)
                return g.outer, g.inner, _row_home(root.shape), None
        scans = [n for n in [*self.subtree(root), root] if n.op is Op.SCAN]
        if scans and sh.shapes_equal(root.shape, scans[-1].shape) and root.op not in REDUCE_OPS:
            # a scan and what is computed from it, element for element: rows along the scanned
            # dim walked in order (a reduction or another scan that does not fit gets a buffer;
            # a root that reduces, to the scan's shape by chance, loops over its own input)
            scan = scans[-1]
            dim = scan.arg.dim
            self.scan_roots[root] = scan.arg.reverse  # (a kernel's loop runs one way)
            outer = tuple(s for d, s in enumerate(scan.shape) if d != dim and not sh.is_one(s))
            return outer, (scan.shape[dim],), scan_home(root.shape, dim), None
        reductions = [n for n in [*self.subtree(root), root] if n.op in REDUCE_OPS]
        matmuls = [n for n in [*self.subtree(root), root] if n.op is Op.MATMUL]
        home = _matmul_home(root, matmuls[-1].shape) if matmuls and not reductions else None
        if home is not None:
            # a matmul and its epilogue: tiles of (M, N), each summing over K
            self.matmul_roots.add(root)
            return tuple(matmuls[-1].shape), (matmuls[-1].inputs[0].shape[1],), home, None
        if reductions:
            # The reduction nearest the root sets the loops; earlier ones that do not fit them
            # get buffers of their own (softmax statistics, then a sum over the result).
            red = reductions[-1]
            full, dims = red.inputs[0].shape, tuple(red.arg)
            outer, inner = reduction_rows(red)
            if root is red or not sh.shapes_equal(root.shape, full):
                if not outer:
                    rows = self._rows_group(root, reductions, groups)
                    if rows is not None:  # reduced over a row kernel's rows: it finishes them
                        self._across[root] = rows
                        return rows.outer, rows.inner, place(root.shape, outer_var), rows.ref
                if sh.shapes_equal(_drop_ones(root.shape), outer):
                    return outer, inner, place(root.shape, outer_var), (full, dims)
                regrouped = _regrouped_rows(root, full, dims)
                if regrouped is not None:
                    return regrouped
            else:
                return outer, inner, _inner_home(full, dims), (full, dims)
        # pure pointwise: join a matmul's epilogue over its (M, N), or a reduction group over the
        # same full shape, when there is one
        for g in groups:
            home = _matmul_home(root, g.outer) if g.matmul and not reductions and not matmuls else None
            if home is not None:
                self.matmul_roots.add(root)
                return g.outer, g.inner, home, None
        for g in groups:
            ref = g.ref
            if ref is not None and sh.shapes_equal(root.shape, ref[0]) and not reductions:
                return g.outer, g.inner, _inner_home(*ref), ref
        if not reductions and not matmuls:
            # a per-row value computed from a row kernel's per-row results (a BatchNorm's new
            # running mean from the batch mean it also returns): one of the kernel's epilogues,
            # not a kernel of its own that reads them back
            read = self.reads(root)
            for g in groups:
                if (g.ref is not None and g.outer and g.segment is None and g.chunks is None and not g.matmul
                        and sh.shapes_equal(_drop_ones(root.shape), g.outer)
                        and any(r in read and sh.shapes_equal(_drop_ones(r.shape), g.outer) for r in g.roots)):
                    return g.outer, g.inner, place(root.shape, outer_var), g.ref
        if not reductions and not matmuls:
            rows = self._row_domain(root) or self._broadcast_rows(root)
            if rows is not None:
                return rows
        return self._pointwise_domain(root, root.shape)

    def split_passes(self, groups: list[GroupSpec]) -> set[Node]:
        """Values a GPU kernel would compute from a finished pass over few long rows
        (``few_long_rows``): the mean a variance reads, the statistics a normalization reads,
        wherever a root broadcasts them back over the rows. Each gets a buffer, so that its
        reductions end a kernel of their own and what reads it is another kernel's."""
        if not self.gpu or not self.cfg.fusion:
            return set()
        found: set[Node] = set()
        for g in groups:
            for root in g.roots:
                for n in self.subtree(root):
                    if n.op is not Op.EXPAND:
                        continue
                    src = n.inputs[0]
                    while src.op in VIEW_OPS and src not in self.buffered:
                        src = src.inputs[0]
                    if src in self.buffered or src.op not in REDUCE_OPS | POINTWISE_OPS or src in found:
                        continue
                    if any(m.op in REDUCE_OPS and few_long_rows(*reduction_rows(m), self.hints,
                                                                 _trailing(m.inputs[0].shape, m.arg))
                           for m in (src, *self.subtree(src))):
                        found.add(src)
        return found

    def second_pass(self, root: Node, group: GroupSpec) -> bool:
        """Would ``root`` make a GPU kernel over few long rows take a second pass over them: does
        it read a root of that kernel computed from the kernel's reductions?"""
        trailing = group.ref is not None and _trailing(*group.ref)
        if not self.gpu or not few_long_rows(group.outer, group.inner, self.hints, trailing):
            return False
        if not self._has_reduction(root) and sh.shapes_equal(_drop_ones(root.shape), group.outer):
            return False  # a per-row epilogue (a running mean): computed once its row is done
        read = self.reads(root)
        return any(r in read and self._has_reduction(r) for r in group.roots)

    def _broadcast_rows(self, root: Node) -> tuple[tuple, tuple, Point, tuple] | None:
        """A pointwise value over long rows that reads per-row values (cross-entropy's gradient:
        each row's max, log-sum and target, broadcast along the row) as a row kernel with one
        loop and no reduction: what depends on the row alone is computed once per row, not once
        per element as in a flat pointwise kernel (CE's backward on an H200: 301 -> 278 µs)."""
        shape = root.shape
        if not self.cfg.fusion or root.rank < 2:
            return None
        last = root.rank - 1
        n, rows = sh.static(shape[last]), sh.static(sh.numel(shape[:last]))
        if n is None or not LONG_ROW <= n <= LONGEST_ROW or (rows is not None and rows < MIN_ROWS):
            return None
        per_row = any(x.op is Op.EXPAND and x.inputs[0].rank == root.rank and sh.is_one(x.inputs[0].shape[last])
                      and not all(sh.is_one(s) for s in x.inputs[0].shape)
                      and sh.shapes_equal(x.shape, shape) for x in [root, *self.subtree(root)])
        if not per_row:
            return None
        ref = (shape, (last,))
        return _drop_ones(shape[:last]), (shape[last],), _inner_home(*ref), ref

    def _row_domain(self, root: Node) -> tuple[tuple, tuple, Point, None] | None:
        """A packed (T, *feature) value that reads the row ids of a ragged tensor (a segment
        mean's gradient, the row's value broadcast over its rows): computed row by row, as a
        segment kernel over (B, *feature) whose programs read their row's start and length
        once, instead of a pointwise kernel searching the offsets for every element."""
        if not self.cfg.fusion or root.rank < 1 or not root.dtype.is_float:
            return None
        for n in [root, *self.subtree(root)]:
            offsets = row_ids_offsets(n) if n.op is Op.SEARCH else None
            if offsets is not None and sh.equal(n.shape[0], root.shape[0]):  # row ids of root's rows
                self.segment_of[root] = (offsets, root.shape[0])
                outer = (sympy.expand(offsets.shape[0] - 1), *_drop_ones(root.shape[1:]))
                return outer, (SEGMENT_LENGTH,), _row_home(root.shape), None
        return None

    def _rows_group(self, root: Node, reductions: list[Node], groups: list[GroupSpec]) -> GroupSpec | None:
        """The row kernel whose rows a scalar root's full reductions (a loss's mean over per-row
        values) reduce over, when it can finish them: partials per program, combined by the last."""
        full = [r for r in reductions if all(sh.is_one(s) for s in r.shape)]
        # (only a scalar: what runs after every row has no loops over a root of its own shape.
        # Not over no rows, nor rows of no elements: the rows' roots, all empty, or a max over
        # an empty batch's segments, leave that kernel no loop to reduce in)
        if (not self.cfg.fusion or not full or not all(sh.is_one(s) for s in root.shape)
                or any(r in self.not_across or r.op not in ACROSS_OPS or sh.static(sh.numel(r.inputs[0].shape)) == 0
                       for r in full)
                or root in self.not_across):
            return None
        for g in groups:
            if (g.inner and g.outer and g.segment is None and g.chunks is None and g.scan is None
                    and sh.static(sh.numel(g.inner)) != 0
                    and all(sh.shapes_equal(_drop_ones(r.inputs[0].shape), g.outer) for r in full)):
                return g
        return None

    def _chunk_domain(self, root: Node, groups: list[GroupSpec]) -> Domain:
        """Partial column sums: computed by a row kernel over the same rows and columns (a
        reduction over the kept dims of the same shape) when there is one, else on their own,
        runs of rows reduced in an inner loop."""
        (x,) = root.inputs
        lead, chunks = root.arg
        kept = frozenset(d for d in range(lead, x.rank) if not sh.is_one(x.shape[d]))
        for g in groups:
            if (g.ref is not None and g.segment is None and not g.final and self.cfg.fusion
                    and sh.shapes_equal(g.ref[0], x.shape)
                    and frozenset(d for d in g.ref[1] if not sh.is_one(x.shape[d])) == kept):
                home = (CHUNK, *place(x.shape[lead:], inner_var))
                return g.outer, g.inner, home, g.ref
        total = sh.numel(x.shape[:lead])
        per = FloorDiv(sympy.expand(total + chunks - 1), chunks)
        return _drop_ones(root.shape), (per,), place(root.shape, outer_var), None

    def _row_wise(self, root: Node, offsets: Node, total: sympy.Expr, outer: tuple) -> bool:
        """Is ``root`` a (T, *feature) value that reads the row ids of ``offsets`` (so it can be
        computed row by row, by the kernel reducing those rows)?"""
        shape = root.shape
        if not shape or not sh.equal(shape[0], total) or not sh.shapes_equal(_drop_ones(shape[1:]), outer[1:]):
            return False
        if root.op is Op.SCAN or root.op in REDUCE_OPS:
            # a segment kernel computes neither (its one loop walks the row): a cumsum over the
            # packed rows, or a sum over each token's features, stored as a root there asked for
            # the buffer it had, and planning was stuck (the graph ran through ATen)
            return False
        return any(n.op is Op.SEARCH and row_ids_offsets(n) is offsets
                   for n in [root, *self.subtree(root), *self.reads(root)])

    def _pointwise_domain(self, root: Node, shape: sh.Shape) -> tuple[tuple, tuple, Point, None]:
        """A pointwise root's domain: its shape, less a dim it unrolls."""
        d = self._unroll_dim(root, shape)
        if d is not None:
            self.unrolled[root] = d
            shape = shape[:d] + (sympy.Integer(1),) + shape[d + 1:]
        return _drop_ones(shape), (), place(shape, outer_var), None

    def _unroll_dim(self, root: Node, shape: sh.Shape) -> int | None:
        """The last dim, when it is small, static and stacked from parts (``torch.stack`` of box
        coordinates): one store per part lets the parts share what they compute in common,
        where a loop over the dim would recompute all of it for every part."""
        dims = [d for d, s in enumerate(shape) if not sh.is_one(s)]
        if len(dims) < 2 or not self.cfg.fusion:  # a lone dim of 4 is not worth a kernel shape
            return None
        d = dims[-1]
        n = sh.static(shape[d])
        if n is None or n > MAX_UNROLL:
            return None
        # the stack itself, or one gathered into the root's leading dims (a ragged gradient
        # written into a dense (B, N, 4) tensor: passes/ragged.py), its last dim the root's
        last = d == len(shape) - 1
        stacked = any(x.op is Op.CAT and (x.arg == d and sh.shapes_equal(x.shape, shape) or last and x.rank
                                          and x.arg == x.rank - 1 and sh.equal(x.shape[-1], shape[d]))
                      for x in [root, *self.subtree(root)])
        return d if stacked else None


def reduction_rows(red: Node) -> tuple[tuple, tuple]:
    """A reduction's (rows, reduced extents), size-1 dims left out."""
    full, dims = red.inputs[0].shape, tuple(red.arg)
    return (tuple(s for d, s in enumerate(full) if d not in dims and not sh.is_one(s)),
            tuple(s for d, s in enumerate(full) if d in dims and not sh.is_one(s)))


def _trailing(full: tuple, dims: tuple) -> bool:
    """Does a reduction over ``dims`` of ``full`` reduce its trailing dims (each row one run)?"""
    kept = [d for d, s in enumerate(full) if d not in dims and not sh.is_one(s)]
    return all(d < min(dims, default=len(full)) for d in kept)


def few_long_rows(outer: tuple, inner: tuple, hints: dict[sympy.Symbol, int], contiguous: bool = False) -> bool:
    """Are these rows too few to fill a GPU with a program each, and long enough that splitting
    each over programs pays for another kernel (``FEW_ROWS``)? ``contiguous``: each row is one
    run of memory (``FEW_CONTIGUOUS_ROWS``). Symbolic sizes count as their ``hints`` (this
    compile's example), else as SYMBOLIC_GUESS."""
    def guess(extents: tuple) -> int | None:
        try:
            e = sh.expr(sh.numel(extents)).subs(hints)
            return int(e.subs({s: SYMBOLIC_GUESS for s in e.free_symbols}))
        except (TypeError, ValueError, ZeroDivisionError):  # (an extent sympy cannot evaluate, or
            # one dividing by a size the guess makes 0: leave the kernel whole)
            return None

    rows, length = guess(outer), guess(inner)
    if rows is None or length is None or contiguous and (rows >= FEW_CONTIGUOUS_ROWS or length <= REGISTER_ROW):
        return False
    return rows <= FEW_ROWS and length >= PASS_SPLIT_ROW and rows * length >= PASS_SPLIT_ELEMENTS


def _drop_ones(shape: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
    return tuple(s for s in shape if not sh.is_one(s))


def _matmul_home(root: Node, mn: tuple[sympy.Expr, ...]) -> Point | None:
    """Where a root of a matmul's kernel is computed, in the tile's (o0, o1): its (M, N) itself,
    or a (..., N) view of it (a linear layer over (batch, tokens, features) flattens the tokens
    into M rows: its epilogue sees row o0 as (o0 // tokens, o0 % tokens))."""
    shape = root.shape
    if sh.shapes_equal(shape, mn):
        return place(shape, outer_var)
    if len(shape) > 2 and sh.equal(shape[-1], mn[1]) and sh.equal(sh.numel(shape[:-1]), mn[0]):
        return map_reshape((outer_var(0), outer_var(1)), mn, shape)
    return None


def _row_home(shape: tuple[sympy.Expr, ...]) -> Point:
    """Where a segment kernel computes a packed (T, *feature) value: at its row's start (the
    kernel's first indirect variable) + r0, its features on the outer dims after the row."""
    return (indirect_var(0) + inner_var(0), *place(shape[1:], lambda i: outer_var(i + 1)))


def _regrouped_rows(root: Node, full: sh.Shape, dims: tuple[int, ...]) -> tuple[tuple, tuple, Point, tuple] | None:
    """A reshape of values over the reduction's domain that regroups only its rows (softmax's
    (B, H, T, T) probabilities as (B*H, T, T), for a batched matmul): a row kernel over the
    root's own rows, whose reductions read each row at its (b, h) again, so the statistics and
    the normalized values come from one pass over the row, not from two kernels."""
    k = len(dims)
    if (root.op is not Op.RESHAPE or root.rank <= k or sorted(dims) != list(range(len(full) - k, len(full)))
            or not sh.shapes_equal(root.inputs[0].shape, full)
            or not sh.shapes_equal(root.shape[root.rank - k:], full[len(full) - k:])):
        return None
    ref = (tuple(root.shape), tuple(range(root.rank - k, root.rank)))
    outer = _drop_ones(ref[0][:root.rank - k])
    inner = tuple(s for s in ref[0][root.rank - k:] if not sh.is_one(s))
    return outer, inner, _inner_home(*ref), ref


def _inner_home(full: tuple[sympy.Expr, ...], dims: tuple[int, ...]) -> Point:
    point, o, r = [], 0, 0
    for d, s in enumerate(full):
        if sh.is_one(s):
            point.append(sympy.Integer(0))
        elif d in dims:
            point.append(inner_var(r))
            r += 1
        else:
            point.append(outer_var(o))
            o += 1
    return tuple(point)
