"""CPU row kernels whose loops read along the columns: the rows loop outside, SIMD lanes on columns.

A row kernel's inner loop normally walks one row (o0, o1) down its reduced dim r0, SIMD lanes
taking consecutive r0. When the loads step by one element along the last outer dim instead
(``x.sum(1)`` of a (B, R, C) tensor; an embedding bag, whose rows are gathered at indices read
down the bag and whose columns are adjacent), each lane then reads its own cache line. Here a
thread takes a tile of up to ``tile_columns`` adjacent columns of one row of the leading dims instead:

    for o0, tile (parallel):
        <values the same for every column: the bag's bounds, its length>
        for c in tile (simd): init each column's accumulators       # stage 0
        for r0:
            <inner values the same for every column: the bag's index at r0>
            for c in tile (simd): accumulate column c               # loop 1
        for c in tile (simd): results, outer stores                 # stage 1

Each column's accumulators, and the outer values later loops read, live in small arrays (in L1);
every simd loop is over independent columns, so it needs no OpenMP reduction. A float32 sum, whose
accumulator is a double, adds ROW_BLOCK rows at a time into a float array (8 columns to a vector,
no conversions), each block's sums then into the doubles, as the row kernels' sums do.

Where the tiles are fewer than the threads (``x.sum(0)`` of a (rows, 64) tensor is one tile), the
threads share each tile's rows instead of narrowing it (``row_runs``): thread t adds up its run of
rows into its own accumulators, which a second loop combines in run order before the results.
Narrow tiles left every thread reading a slice of every row: two threads summed float32
(65536, 64) in 0.75 ms, runs of rows in 0.29. A kernel of several loops (a channels_last
BatchNorm's statistics, then its normalized rows; a softmax down the columns) takes its runs
loop by loop, each a parallel loop of its own after the combine of the loop before:

    for run, tile (parallel): stage 0, loop 1 over the run's rows, the run's accumulators kept
    for tile (parallel): the runs of loop 1 combined in run order, stage 1 (its stores)
    for run, tile (parallel): stages 0 and 1 again (no stores), loop 2 over the run's rows ...

With 16 channels a tile is all of a row, so one thread did all of it.

A loop that reduces takes ROW_UNROLL rows a simd loop, each in a block of its own that defines r0,
so each column's accumulators are read and written once for them (in row order, the same bits):

    for r0_u in rows by 4:
        for c in tile (simd): acc = acc_c[c]; { r0 = r0_u: ... } ... { r0 = r0_u + 3: ... }; acc_c[c] = acc
    for r0 in the rows left (3 or fewer): for c in tile (simd): one row
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from ..ir import shapes as sh
from ..ir.ops import Op
from ..schedule.kernel_ir import Kernel, Value, inner_var, outer_var
from .c_accumulators import acc_init, acc_type, acc_update
from .cexpr import index_expr
from .cpp_pointwise import PARALLEL_THRESHOLD
from .cpp_staging import close_strip, open_strip, staged_accesses
from .cstyle import Language
from .layout import adjacent_rows

if TYPE_CHECKING:
    from .cpp import CppKernelRenderer

# A tile's arrays (each column's accumulators and kept values) take at most TILE_BYTES, so they stay
# in L1 beside the rows streaming by; a tile spans 16 to MAX_TILE columns. Wider tiles read longer
# runs of each row: x.sum(0) over float32 4096 x 4096 took 9.6 ms in tiles of 256, 6.3 in 1024.
TILE_BYTES = 16 << 10
MAX_TILE = 1024

# Elements of a row a float sum adds up in float before its double takes the block's sum
# (cpp.py: _open_block): 128 adds a vector lane, rounding bounded by the block's length, not the
# row's. A column tile's float sums add ROW_BLOCK rows (each column is a lane): as many adds.
SUM_BLOCK = 1024
ROW_BLOCK = 16
# Rows one simd loop reduces at a time, each column's accumulators read and written once for them
# (float32 column sums 1.15-1.4x faster: _unrolled)
ROW_UNROLL = 4

# Reductions whose accumulators combine with their own update (acc_update): what runs of rows
# need. (An arg reduction's pair would need the first position among equal values.)
_COMBINABLE = (Op.SUM, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL)
# A run takes this many rows at least: its accumulators' round trip through the partials is then
# a small part of what it reads.
MIN_RUN_ROWS = 32
# ember_scratch_row's slots for the runs' accumulators (the calling thread's rows; cpp_prelude)
RUNS_SLOT = 32
_RUN = sympy.Symbol("ember_run", integer=True, nonnegative=True)


def float_partial(lang: Language, v: Value) -> bool:
    """Is ``v`` a float32 sum that accumulates in double (acc_type), whose blocks can add in float?"""
    return v.arg.op is Op.SUM and lang.compute(v.srcs[0].dtype) == "float" and acc_type(lang, v) == "double"


def tile_columns(kernel: Kernel, kept: list[Value], lang: Language) -> int:
    """The columns of ``kernel``'s tiles: as many as TILE_BYTES of arrays hold, a multiple of 16."""
    per_column = sum(_ctype_bytes(acc_type(lang, v)) for v in kernel.reductions)
    per_column += 4 * len(_partial(kernel, lang))  # (their float block sums)
    per_column += sum(_ctype_bytes(lang.compute(v.dtype)) for v in kept)
    return max(16, min(MAX_TILE, TILE_BYTES // max(per_column, 1) // 16 * 16))


def _partial(kernel: Kernel, lang: Language) -> list[Value]:
    """The float32 sums of a column tile that add up in float blocks of rows: those of a kernel
    with one reduced dim (its loop is the block's)."""
    return [v for v in kernel.reductions if float_partial(lang, v)] if len(kernel.inner) == 1 else []


def row_runs(kernel: Kernel) -> bool:
    """Can the threads share a tile's rows? Loops over one reduced dim, every row the same length,
    reductions that combine (_COMBINABLE)."""
    return (len(kernel.inner) == 1 and kernel.segment_length is None
            and bool(kernel.reductions) and all(v.arg.op in _COMBINABLE for v in kernel.reductions))


def _ctype_bytes(ctype: str) -> int:
    if ctype.startswith("EmberArg"):
        return 16  # (a value and its int64 position)
    return {"double": 8, "int64_t": 8, "uint64_t": 8, "float": 4, "int32_t": 4, "uint32_t": 4,
            "int16_t": 2, "uint16_t": 2, "_Float16": 2}.get(ctype, 1)


def column_tiles(kernel: Kernel, scalar: bool) -> bool:
    """Does ``kernel`` run in column tiles? A row kernel (no scans, chunked runs, reductions over
    the rows, scattering stores or searches: ``scalar``) whose accesses step along its last outer
    dim (layout.adjacent_rows), and whose row length is the same for every column."""
    if (not kernel.outer or not kernel.n_loops or kernel.scans or kernel.chunks or kernel.row_reductions
            or kernel.dots or scalar or not adjacent_rows(kernel)):
        return False
    length = kernel.segment_length
    return length is None or id(length) not in per_column(kernel)


def per_column(kernel: Kernel) -> set[int]:
    """Ids of the values that differ from column to column (the last outer dim): those that
    read or compute at it, every reduction (each column accumulates its own), and what uses them."""
    column = outer_var(len(kernel.outer) - 1)
    found: set[int] = set()
    for v in kernel.values:
        if (v.kind == "reduce" or any(id(s) in found for s in v.srcs)
                or (v.guard is not None and id(v.guard) in found) or column in _symbols(v)):
            found.add(id(v))
    return found


def _symbols(v: Value) -> set[sympy.Symbol]:
    if v.kind in ("load", "store"):
        return sympy.sympify(v.arg.index).free_symbols
    if v.kind == "index":
        return sympy.sympify(v.arg).free_symbols
    if v.kind == "const":
        return sympy.sympify(v.arg).free_symbols if isinstance(v.arg, sympy.Basic) else set()
    if v.kind == "search":
        a = v.arg
        return set().union(*(sympy.sympify(e).free_symbols for e in (a.start, a.stride, a.length)))
    if v.kind == "checkindex":
        return sh.expr(v.arg[0]).free_symbols
    return set()


class ColumnTiles:
    """Renders a ``column_tiles`` kernel's body through the kernel renderer ``r`` (its emit,
    loops and statements), in place of its row loops."""

    def __init__(self, r: CppKernelRenderer):
        self.r = r
        self.k = r.k
        self.body = r.body
        self.column = outer_var(len(self.k.outer) - 1).name
        self.varying = per_column(self.k)
        # outer values computed in one column loop and read in another (or by an inner value):
        # kept per column in a tile array
        outer = [v for v in self.k.values if not v.inner and id(v) in self.varying and v.kind != "store"]
        self.kept = [v for v in outer if any(u.inner or u.stage != v.stage for u in self.body.users[id(v)])]
        self.tile = tile_columns(self.k, self.kept, self.body.lang)
        self.partial = _partial(self.k, self.body.lang)
        self.runs = row_runs(self.k)
        self.row_range = ("0", index_expr(self.k.inner[0]))  # (a run's rows: render)
        # (GCC 12 left these simd loops scalar around guarded blocks: cstyle.Language)
        self.body.every_guard_a_select = True

    def render(self, condition: str) -> None:
        k, r = self.k, self.r
        n = len(k.outer)
        width = index_expr(k.outer[-1])
        r.emit(f"// columns: a thread takes up to {self.tile} adjacent {self.column} of a row at once, the loops "
               f"over {', '.join(inner_var(i).name for i in range(len(k.inner)))} outside its simd loops")
        rows = index_expr(sh.numel(k.outer[:-1]))
        runs = "1"
        if self.runs:
            runs = "ember_runs"
            length = index_expr(k.inner[0])
            r.emit(f"// runs: where the tiles are fewer than the threads, the threads share each tile's {length} "
                   f"rows, runs of {MIN_RUN_ROWS} rows at least")
            r.emit(f"const int64_t ember_tiles = {rows} * (({width} + {self.tile - 1}) / {self.tile});")
            r.emit(f"const int64_t ember_runs = !({condition}) || ember_tiles == 0 ? 1 : std::max<int64_t>(1, "
                   f"std::min<int64_t>((omp_get_max_threads() + ember_tiles - 1) / ember_tiles, "
                   f"{length} / {MIN_RUN_ROWS}));")
            # (whole blocks of ROW_BLOCK rows: float sums add the same blocks as in one run)
            r.emit(f"const int64_t ember_run_rows = (({length} + ember_runs - 1) / ember_runs + {ROW_BLOCK - 1}) "
                   f"/ {ROW_BLOCK} * {ROW_BLOCK};")
            for i, v in enumerate(k.reductions):
                ctype = self._array_type(acc_type(self.body.lang, v))
                r.emit(f"{ctype}* {self.body.lang.restrict} {self.body.acc_names[id(v)]}_r = ember_runs > 1 ? "
                       f"ember_scratch_row<{ctype}, {RUNS_SLOT + i}>(ember_runs * {rows} * {width}) : nullptr;")
        r.emit(f"// tiles of {self.tile} columns, or narrower (16 at least) where fewer rows{' and runs' * self.runs} "
               "than threads would leave")
        r.emit("// threads idle (x.sum(0): one row of tiles)")
        share = rows if not self.runs else f"{rows} * ember_runs"
        r.emit(f"const int64_t ember_per_row = (omp_get_max_threads() + {share} - 1) / std::max<int64_t>({share}, 1);")
        r.emit(f"const int64_t ember_tile = std::min<int64_t>({self.tile}, std::max<int64_t>(16, "
               f"(({width} + ember_per_row - 1) / ember_per_row + 15) / 16 * 16));")
        r.emit(f"#pragma omp parallel for collapse({n + self.runs}) schedule(static) if({condition})")
        if self.runs:
            r.emit(f"for (int64_t ember_run = 0; ember_run < {runs}; ++ember_run) {{")
            r.depth += 1
        self._open_run(width)
        for stage in range(k.n_loops + 1):
            if self.runs and stage == 1:
                r.emit(f"if ({runs} == 1) {{  // one run: every loop here")
                r.depth += 1
            self._stage(stage)
            if stage < k.n_loops:
                self._loop(stage + 1)
        if self.runs:
            r.depth -= 1
            r.emit("} else {")
            r.depth += 1
            self._keep_run(1)
            r._close_loops(1)
        r._close_loops(n + self.runs)
        if self.runs:
            r.emit("if (ember_runs > 1) {")
            r.depth += 1
            parallel = f"ember_runs * {index_expr(sh.numel(k.outer))} >= {PARALLEL_THRESHOLD}"
            for loop in range(1, k.n_loops + 1):
                if any(v.loop == loop for v in k.reductions):
                    self._combine_runs(loop, parallel, width)
                if loop < k.n_loops:
                    self._run_loop(loop + 1, condition, width)
            r._close_loops(1)

    def _open_run(self, width: str) -> None:
        """Opens the loops over the leading dims and the row's tiles (inside the run's, which
        ``render`` opened); declares the tile's arrays and, with runs, the run's rows."""
        k, r = self.k, self.r
        r._open_loops(outer_var, k.outer[:-1])
        self._open_tile(width)
        if self.runs:
            self.row_range = ("ember_r0", "ember_r1")
            r.emit("const int64_t ember_r0 = ember_run * ember_run_rows;  // this run's rows")
            r.emit(f"const int64_t ember_r1 = std::min<int64_t>(ember_r0 + ember_run_rows, {index_expr(k.inner[0])});")
        if k.segment_length is not None:
            r.emit(f"const int64_t ember_seglen = {self.body.name(k.segment_length)};  // this row's length")
        self._declare_kept()
        for v in self.partial:
            r.emit(f"float {self.body.acc_names[id(v)]}_p[{self.tile}];  // this block's sums")

    def _declare_kept(self) -> None:
        for v in self.kept:
            self.r.emit(f"{self._array_type(self.body.lang.compute(v.dtype))} {self.body.name(v)}_c[{self.tile}];")

    def _keep_run(self, loop: int) -> None:
        """Writes this run's accumulators of ``loop``'s reductions where the combine reads them."""
        accs = [self.body.acc_names[id(v)] for v in self.k.reductions if v.loop == loop]
        if accs:
            self._column_loop("each column: this run's accumulators, for the runs' combine",
                              [f"{acc}_r[{self._run_at(_RUN)}] = {acc}_c[{self.column} - ember_c0];" for acc in accs])

    def _redo_stages(self, last: int) -> None:
        """Stages 0 to ``last`` again, for the values later ones read (their stores are done): each
        done loop's accumulators from the combined ones, which run 0's place holds."""
        for stage in range(last + 1):
            if stage > 0:
                self._run0_accumulators(stage, f"each column: loop {stage}'s combined accumulators")
            self._stage(stage, stores=False)

    def _run0_accumulators(self, loop: int, what: str) -> None:
        """Each column's accumulators of ``loop``'s reductions from run 0's place (its own, or the
        runs' combined after ``_combine_runs``)."""
        first = self._run_at(sympy.Integer(0))
        accs = [self.body.acc_names[id(v)] for v in self.k.reductions if v.loop == loop]
        if accs:
            self._column_loop(what, [f"{acc}_c[{self.column} - ember_c0] = {acc}_r[{first}];" for acc in accs])

    def _run_loop(self, loop: int, condition: str, width: str) -> None:
        """Loop ``loop`` (after the first) over each run's rows, in a parallel loop of its own."""
        k, r = self.k, self.r
        r.emit(f"// loop {loop} over each run's rows, the stages before it again")
        r.emit(f"#pragma omp parallel for collapse({len(k.outer) + 1}) schedule(static) if({condition})")
        r.emit("for (int64_t ember_run = 0; ember_run < ember_runs; ++ember_run) {")
        r.depth += 1
        self._open_run(width)
        self._redo_stages(loop - 1)
        self._loop(loop)
        self._keep_run(loop)
        r._close_loops(len(k.outer) + 1)

    def _open_tile(self, width: str) -> None:
        """Opens the loop over the row's tiles; declares what every column of a tile shares (the
        values the same for every column, the accumulator arrays)."""
        k, r = self.k, self.r
        r.emit(f"for (int64_t ember_c0 = 0; ember_c0 < {width}; ember_c0 += ember_tile) {{")
        r.depth += 1
        r.emit(f"const int64_t ember_c1 = std::min<int64_t>(ember_c0 + ember_tile, {width});")
        r._statements([v for v in k.values if not v.inner and id(v) not in self.varying])
        for v in k.reductions:
            r.emit(f"{self._array_type(acc_type(self.body.lang, v))} {self.body.acc_names[id(v)]}_c[{self.tile}];")

    def _run_at(self, run: sympy.Expr) -> str:
        """Where run ``run`` keeps a column's accumulator: [run][leading outer dims][column]."""
        k = self.k
        flat = sum((outer_var(i) * sh.numel(k.outer[i + 1:-1]) for i in range(len(k.outer) - 1)), sympy.Integer(0))
        return index_expr(sympy.expand((run * sh.numel(k.outer[:-1]) + flat) * k.outer[-1])
                          + outer_var(len(k.outer) - 1))

    def _combine_runs(self, loop: int, condition: str, width: str) -> None:
        """After every run of ``loop``: each column's runs combined in run order, then the stage
        after it (its results and stores); the combined accumulators kept in run 0's place for
        the loops after."""
        k, r, body = self.k, self.r, self.body
        n = len(k.outer)
        r.emit(f"// loop {loop}: the runs' accumulators combined in run order (the same result every call), then "
               "the results")
        r.emit(f"#pragma omp parallel for collapse({n}) schedule(static) if({condition})")
        r._open_loops(outer_var, k.outer[:-1])
        self._open_tile(width)
        self._declare_kept()
        self._redo_stages(loop - 1)
        accs = [(body.acc_names[id(v)], v) for v in k.reductions if v.loop == loop]
        first = self._run_at(sympy.Integer(0))
        self._run0_accumulators(loop, "each column: the first run's accumulators")
        r.emit("for (int64_t ember_run = 1; ember_run < ember_runs; ++ember_run) {")
        r.depth += 1
        lines = []
        for acc, v in accs:
            lines += [f"{acc_type(body.lang, v)} {acc} = {self._acc_read(v, f'{acc}_c[{self.column} - ember_c0]')};",
                      acc_update(v, acc, self._acc_read(v, f"{acc}_r[{self._run_at(_RUN)}]"), "0"),
                      f"{acc}_c[{self.column} - ember_c0] = {self._acc_written(v, acc)};"]
        self._column_loop("each column: the next run's accumulators", lines)
        r._close_loops(1)
        if loop < k.n_loops:
            self._column_loop("each column: the combined accumulators, for the loops after",
                              [f"{acc}_r[{first}] = {acc}_c[{self.column} - ember_c0];" for acc, _ in accs])
        self._stage(loop)
        r._close_loops(n)

    def _array_type(self, ctype: str) -> str:
        """The type of a tile array holding values of ``ctype`` (kept values, accumulators): bools
        as bytes where the language loads them so (GCC 12 left the column loops that read or wrote
        a bool array beside floats scalar: a kept mask, an any's accumulator)."""
        return "uint8_t" if ctype == "bool" and self.body.lang.bools_as_bytes else ctype

    def _from_array(self, ctype: str, ref: str) -> str:
        return f"({ref} != 0)" if self._array_type(ctype) != ctype else ref

    def _to_array(self, ctype: str, value: str) -> str:
        return f"({value} ? 1 : 0)" if self._array_type(ctype) != ctype else value

    def _acc_read(self, v: Value, ref: str) -> str:
        return self._from_array(acc_type(self.body.lang, v), ref)

    def _acc_written(self, v: Value, value: str) -> str:
        return self._to_array(acc_type(self.body.lang, v), value)

    def _columns(self, what: str, values: list[Value]) -> list[Value]:
        """Opens the simd loop over the tile's columns that computes ``values``; returns the
        float16 accesses among them it converts a strip at a time (cpp_staging.py), which
        ``_close_columns`` finishes."""
        self.r.emit(f"// {what}")
        column = outer_var(len(self.k.outer) - 1)
        staged = staged_accesses(self.r, values, column)
        if staged:
            open_strip(self.r, column, "ember_c0", "ember_c1", staged, "", "#pragma omp simd")
            return staged
        self.r.emit("#pragma omp simd")
        c = self.column
        self.r.emit(f"for (int64_t {c} = ember_c0; {c} < ember_c1; ++{c}) {{")
        self.r.depth += 1
        return staged

    def _close_columns(self, staged: list[Value]) -> None:
        if staged:
            close_strip(self.r, outer_var(len(self.k.outer) - 1), staged)
        else:
            self.r._close_loops(1)

    def _restore(self, values: list[Value], earlier: int) -> None:
        """Reads back the kept values of stages before ``earlier`` that ``values`` use."""
        used = {id(s) for v in values for s in (*v.srcs, *((v.guard,) if v.guard is not None else ()))}
        for v in self.kept:
            if id(v) in used and v.stage < earlier:
                ctype, name = self.body.lang.compute(v.dtype), self.body.name(v)
                self.r.emit(f"const {ctype} {name} = {self._from_array(ctype, f'{name}_c[{self.column} - ember_c0]')};")

    def _stage(self, stage: int, stores: bool = True) -> None:
        k, body = self.k, self.body
        done = [v for v in k.reductions if v.loop == stage and stage > 0]
        starting = [v for v in k.reductions if v.loop == stage + 1]
        values = [v for v in k.values if not v.inner and v.kind != "reduce" and id(v) in self.varying
                  and v.stage == stage and (stores or v.kind != "store")]
        if not (done or starting or values):
            return
        staged = self._columns(f"stage {stage}: {'results, ' if done else ''}each column's values"
                               + (", accumulators start" if starting else ""), values)
        at = f"[{self.column} - ember_c0]"
        self._restore(values, stage)
        for v in done:
            acc = body.acc_names[id(v)]
            self.r.emit(f"const {acc_type(body.lang, v)} {acc} = {self._acc_read(v, f'{acc}_c{at}')};")
            self.r.emit(body.reduce_result(v))
        self.r._statements(values)
        for v in self.kept:
            if v.stage == stage:
                self.r.emit(f"{body.name(v)}_c{at} = {self._to_array(body.lang.compute(v.dtype), body.name(v))};")
        for v in starting:
            self.r.emit(f"{body.acc_names[id(v)]}_c{at} = {self._acc_written(v, acc_init(body.lang, v))};")
        self._close_columns(staged)

    def _loop(self, loop: int) -> None:
        k, body, r = self.k, self.body, self.r
        reductions = [v for v in k.reductions if v.loop == loop]
        stores = [v for v in k.values if v.kind == "store" and v.inner and v.loop == loop]
        values = k.loop_values(loop)
        names = ", ".join(v.arg.op.value for v in reductions) or "store"
        partial = [v for v in reductions if v in self.partial]
        at = f"[{self.column} - ember_c0]"
        blocked = bool(partial) and self._open_block(partial, at)
        r.emit(f"// loop {loop}: {names}")
        varying = [v for v in values if id(v) in self.varying]
        unrolled = self._unrolled(values, stores, reductions)
        rows = self._rows(partial, blocked, unrolled)
        if rows is None:
            r._open_loops(inner_var, k.inner)
        else:
            r0, (start, stop) = inner_var(0).name, rows
            if unrolled:
                r.emit("{")  # (a scope of its own: a kernel's loops each declare these)
                r.depth += 1
                r.emit(f"const int64_t {r0}_end = {stop};")
                r.emit(f"int64_t {r0}_u = {start};")
                r.emit(f"for (; {r0}_u + {ROW_UNROLL} <= {r0}_end; {r0}_u += {ROW_UNROLL}) {{")
                r.depth += 1
                self._row_body(loop, varying, stores, reductions, partial, ROW_UNROLL)
                r._close_loops(1)
                start, stop = f"{r0}_u", f"{r0}_end"
                r.emit(f"// the last {ROW_UNROLL - 1} rows or fewer, one at a time")
            r.emit(f"for (int64_t {r0} = {start}; {r0} < {stop}; ++{r0}) {{")
            r.depth += 1
        r._statements([v for v in values if id(v) not in self.varying])
        self._row_body(loop, varying, stores, reductions, partial, 1)
        r._close_loops(len(k.inner) + unrolled)
        if partial:
            self._column_loop("each column: this block's sums into the doubles",
                              [f"{body.acc_names[id(v)]}_c{at} += {body.acc_names[id(v)]}_p{at};" for v in partial])
            r._close_loops(blocked)

    def _rows(self, partial: list[Value], blocked: bool, unrolled: bool) -> tuple[str, str] | None:
        """The range of the loop over the rows (r0) where it is one loop the renderer writes
        itself (float sums' blocks, runs, or rows taken ROW_UNROLL at a time); None where
        ``_open_loops`` opens the inner loops."""
        if partial and blocked:
            r0 = inner_var(0).name
            return f"{r0}_block", f"std::min<int64_t>({r0}_block + {ROW_BLOCK}, {self.row_range[1]})"
        if partial or self.runs or unrolled:
            return self.row_range
        return None

    def _unrolled(self, values: list[Value], stores: list[Value], reductions: list[Value]) -> bool:
        """Does one simd loop take ROW_UNROLL rows at a time? Where the loop reduces (what it
        saves is the accumulators' round trips; a loop of stores alone, a BatchNorm backward's, GCC
        left scalar in 4 copies), is over one row variable (not a bag's or segment's rows), every
        value of it differs by column (nothing to compute once a row outside the simd loop), and
        nothing in it is float16 converted a strip at a time (cpp_staging.py). Four rows' strips
        converted in turn ran float16 sums 1.2x faster where the rows were in L3, 1.5-1.9x slower
        where they came from memory (bench/RESULTS.md, hundred-and-eighth session)."""
        k = self.k
        if not reductions or self.r.scalar or len(k.inner) != 1 or k.segment_length is not None:
            return False
        if any(id(v) not in self.varying for v in values):
            return False
        size = sh.static(k.inner[0])
        return (not staged_accesses(self.r, values + stores, outer_var(len(k.outer) - 1))
                and (size is None or size >= ROW_UNROLL))

    def _row_body(self, loop: int, varying: list[Value], stores: list[Value], reductions: list[Value],
                  partial: list[Value], copies: int) -> None:
        """The simd loop over the tile's columns for one row, or for ``copies`` rows from r0_u on,
        each a block of its own that defines r0: each column's accumulators are read and written
        once for all of them (in row order, as one at a time adds them)."""
        body, r = self.body, self.r
        r0 = inner_var(0)
        rows = [sympy.Symbol(f"{r0.name}_u", integer=True) + i for i in range(copies)] if copies > 1 else None
        staged = self._columns("each column" + (f", {copies} rows" if rows else ""), varying + stores)
        at = f"[{self.column} - ember_c0]"
        # a reduction may read an outer value itself (a row of length 0 made its loads constants)
        self._restore(varying + stores + reductions, loop)
        for v in reductions:
            acc = body.acc_names[id(v)]
            ctype, array = ("float", f"{acc}_p{at}") if v in partial else (acc_type(body.lang, v),
                                                                            self._acc_read(v, f"{acc}_c{at}"))
            r.emit(f"{ctype} {acc} = {array};")
        for i in range(copies):
            if rows:
                r.emit("{")
                r.depth += 1
                r.emit(f"const int64_t {r0.name} = {index_expr(rows[i])};")
            r._statements(varying)
            for v in reductions:
                r.emit(body.reduce_update(v))
            if rows:
                r._statements(stores)
                r._close_loops(1)
        for v in reductions:
            acc = body.acc_names[id(v)]
            r.emit(f"{acc}_p{at} = {acc};" if v in partial else f"{acc}_c{at} = {self._acc_written(v, acc)};")
        if not rows:
            r._statements(stores)
        self._close_columns(staged)

    def _open_block(self, partial: list[Value], at: str) -> bool:
        """Opens the loop over blocks of ROW_BLOCK rows where the rows can be more than one
        block (returns whether it did); zeroes the block's float sums."""
        r0, (start, stop) = inner_var(0).name, self.row_range
        size = sh.static(self.k.inner[0])
        blocked = size is None or size > ROW_BLOCK
        if blocked:
            self.r.emit(f"for (int64_t {r0}_block = {start}; {r0}_block < {stop}; {r0}_block += {ROW_BLOCK}) {{")
            self.r.depth += 1
        self._column_loop("each column: the block's sums start", [f"{self.body.acc_names[id(v)]}_p{at} = 0.0f;"
                                                                  for v in partial])
        return blocked

    def _column_loop(self, what: str, lines: list[str]) -> None:
        self._columns(what, [])  # (no values: nothing staged)
        for line in lines:
            self.r.emit(line)
        self._close_columns([])
