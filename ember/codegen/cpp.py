"""CPU backend: kernel IR -> C++ with OpenMP.

The outer domain is a ``#pragma omp parallel for`` (or, for a full reduction, each inner loop is
split across threads); inner loops are ``#pragma omp simd`` so GCC vectorizes them, with
OpenMP reductions (a float max/min in a simd loop: the hardware's max and a NaN flag, _flagged;
elsewhere NaN-propagating declared reductions). Kernels are plain
``extern "C"`` functions over raw pointers: no torch headers, so a build takes a fraction of a
second and the .so loads with ctypes.
"""

from __future__ import annotations

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.ops import TRANSCENDENTAL_OPS, Op
from ..schedule.kernel_ir import CHUNK, SCRATCH_ROW, SEGMENT_LENGTH, Kernel, Value, inner_var, outer_var
from ..schedule.loops import stash_recomputed
from .c_accumulators import acc_update
from .cexpr import device_size_lines, index_expr
from .cpp_columns import SUM_BLOCK, ColumnTiles, column_tiles, float_partial
from .cpp_pointwise import PARALLEL_THRESHOLD, PointwiseLoops
from .cpp_prelude import PRELUDE
from .cpp_scatter import owned_elements, owned_rows, render_owned_elements, render_owned_rows
from .cpp_staging import ROW_SLOT, SHARED_SLOT, close_strip, convert_once, converted_once, open_strip, staged_accesses
from .cpp_team import close_team, needs_team, open_team
from .cstyle import BodyRenderer, Language

CPP = Language(
    name="cpp",
    storage={dt.float16: "_Float16", dt.bfloat16: "uint16_t", dt.float32: "float",
             dt.float64: "double", dt.int8: "int8_t", dt.int16: "int16_t", dt.int32: "int32_t",
             dt.int64: "int64_t", dt.uint8: "uint8_t", dt.bool_: "bool"},
    math_prefix="std::",
    # float32 math without libm calls, so simd loops vectorize (codegen/cpp_math.py)
    fast_f32={**{op: f"ember_{op.value}({{}})" for op in (
        Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.TANH, Op.ERF, Op.SINH, Op.COSH,
        Op.ATAN, Op.ASIN, Op.ACOS, Op.SIN, Op.COS, Op.TAN)}, Op.ATAN2: "ember_atan2({}, {})",
        Op.POW: "((float)ember_pow_narrow((double){}, (double){}))"},
    fast_f64={op: f"ember_{op.value}_f64({{}})" for op in (Op.EXP, Op.EXPM1, Op.TANH, Op.LOG, Op.LOG1P)},
    narrowed_pow="ember_pow_narrow({}, {})",
    sum_acc_f32="double",
    float_to_int="ember_float_to_int",
    bools_as_bytes=True,
    sinks_bools=True,
    guards_as_selects=True,
)


def _argred_decls(kernels: list[Kernel]) -> str:
    """Declared OpenMP reductions for the argmax/argmin accumulator types the kernels use."""
    out = []
    seen = set()
    for v in [r for k in kernels for r in k.reductions]:
        if v.arg.op not in (Op.ARGMAX, Op.ARGMIN):
            continue
        ctype = CPP.compute(v.srcs[0].dtype)
        fn = "ember_argmax_step" if v.arg.op is Op.ARGMAX else "ember_argmin_step"
        name = f"{'eargmax' if v.arg.op is Op.ARGMAX else 'eargmin'}_{ctype}"
        if name in seen:
            continue
        seen.add(name)
        out.append(f"#pragma omp declare reduction({name} : EmberArg<{ctype}> : "
                   f"{fn}(omp_out, omp_in.v, omp_in.i)) initializer(omp_priv = omp_orig)")
    return "\n".join(out)


def _clause(v: Value) -> str:
    op = v.arg.op
    ctype = CPP.compute(v.srcs[0].dtype)
    if op is Op.SUM:
        sym = "+"
    elif op is Op.PROD:
        sym = "*"
    elif op is Op.ANY:
        sym = "||"
    elif op is Op.ALL:
        sym = "&&"
    elif op in (Op.AMAX, Op.AMIN):
        if ctype in ("float", "double"):
            sym = "emax" if op is Op.AMAX else "emin"
        else:
            sym = "max" if op is Op.AMAX else "min"
    else:
        sym = f"{'eargmax' if op is Op.ARGMAX else 'eargmin'}_{ctype}"
    return sym


class CppKernelRenderer(PointwiseLoops):
    """One kernel's C++ source; the loops of pointwise kernels are ``PointwiseLoops``
    (codegen/cpp_pointwise.py)."""

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.cost = cost_per_element(kernel)
        self.body = BodyRenderer(kernel, CPP)
        self.lines: list[str] = []
        self.depth = 0
        self.hints = [f"{self.body.name(v)}_hint" for v in kernel.values if v.kind == "search"]
        self._share = False  # the innermost loop runs over this thread's share (ember_lo, ember_hi)
        self.converted_once: set[int] = set()  # float16 loads converted whole (cpp_staging.py)
        self._own_rows: list[Value] = []  # of those, the ones converted at each row's start
        self.owned = owned_rows(kernel)  # a scatter of whole rows, each thread adding its own rows
        # (or of elements: each thread adding into the destination lines it owns)
        self.owned_elements = not self.owned and owned_elements(kernel)
        # writes at indices scatter: no vector stores (and atomics stay out of simd loops)
        self.scalar = not self.owned and (bool(self.hints) or any(v.kind == "store" and v.arg.bindings
                                                                  for v in kernel.values))
        for v in kernel.values:  # the thread's scratch row (SCRATCH_ROW), of the value it keeps
            if v.kind == "store" and v.arg.buffer == SCRATCH_ROW:
                self.body.buffer_dtype[SCRATCH_ROW] = v.dtype

    def emit(self, line: str) -> None:
        if line.startswith("#pragma omp") and self.scalar:
            # a search's hint is carried from element to element: each thread keeps its own,
            # and the loop stays scalar (the search does not vectorize anyway)
            if line.startswith("#pragma omp simd"):
                return
            line = line.replace(" simd", "")
            if " parallel" in line and self.hints:
                line = line.replace(" schedule(", f" firstprivate({', '.join(self.hints)}) schedule(", 1)
        self.lines.append("  " * self.depth + line)

    def signature(self) -> str:
        params = []
        for p in self.k.params:
            const = "" if p.is_output else "const "
            params.append(f"{const}{CPP.storage[p.dtype]}* {CPP.restrict} {p.name}")
        params += [f"{sh.size_ctype(s)} {s.name}" for s in self.k.sizes]
        if self.body.uses_err:
            params.append("int32_t* ember_err")
        return f'extern "C" void {self.k.name}({", ".join(params) or "void"})'

    def render(self) -> str:
        k = self.k
        origins = ", ".join(k.origins) or "-"
        self.emit(f"// {k.name}: fuses {origins}")
        self.emit(f"// outer {sh.fmt(k.outer)}, inner {sh.fmt(k.inner)}, {k.n_loops} inner loop(s)")
        self.emit(self.signature() + " {")
        self.depth += 1
        for line in device_size_lines(k):
            self.emit(line)
        for hint in [] if self.owned or self.owned_elements else self.hints:
            self.emit(f"int64_t {hint} = 0;")
        if self.owned:
            render_owned_rows(self, f"{index_expr(sh.numel(k.outer) * self.cost)} >= {PARALLEL_THRESHOLD}")
        elif self.owned_elements:
            render_owned_elements(self, f"{index_expr(sh.numel(k.outer) * self.cost)} >= {PARALLEL_THRESHOLD}")
        elif k.n_loops == 0:
            self._pointwise()
        elif not k.outer:
            self._stages(parallel_inner=True)
        elif k.chunks:
            self._chunked_rows()
        elif column_tiles(k, self.scalar):
            work = index_expr(sh.numel(k.outer) * k.inner_hint * self.cost)
            ColumnTiles(self).render(f"{work} >= {PARALLEL_THRESHOLD}")
        else:
            n = len(k.outer)
            work = index_expr(sh.numel(k.outer) * k.inner_hint * self.cost)
            collapse = f" collapse({n})" if n > 1 else ""
            across = k.row_reductions  # reduced over the rows too: OpenMP reductions of the row loop
            for v in across:
                self.emit(self.body.reduce_decl(v))
            # (float ones combine in thread order: cpp_team.py)
            team = needs_team(across) and not _serial(sh.numel(k.outer) * k.inner_hint * self.cost)
            shared, self._own_rows = converted_once(self, k)
            convert_once(self, k, shared, SHARED_SLOT, "float16 rows every row reads alike")
            clauses = "".join(f" reduction({_clause(v)}:{self.body.acc_names[id(v)]})" for v in across)
            if team:
                open_team(self, across, [], f"{work} >= {PARALLEL_THRESHOLD}",
                          [f"#pragma omp for{collapse} schedule(static) nowait"])
            else:
                self.emit(f"#pragma omp parallel for{collapse} schedule(static){clauses} "
                          f"if({work} >= {PARALLEL_THRESHOLD})")
            self._open_loops(outer_var, k.outer)
            self._stages(parallel_inner=False)
            self._close_loops(n)
            if team:
                close_team(self, across, [])
            if across:
                self.emit("// after every row")
                for v in across:
                    self.emit(self.body.reduce_result(v))
                inputs, final = k.after_rows()
                self._statements(inputs + final)
        self.depth -= 1
        self.emit("}")
        return "\n".join(self.lines)

    def _chunked_rows(self) -> None:
        """Rows in ``chunks`` runs, a thread per run: each run's partial column sums live in its
        row of the partials buffer (in cache while the run's rows go by), zeroed first."""
        k = self.k
        work = index_expr(sh.numel(k.outer) * k.inner_hint * self.cost)
        self.emit(f"const int64_t ember_rows = {index_expr(sh.numel(k.outer))};")
        self.emit(f"const int64_t ember_per = (ember_rows + {k.chunks - 1}) / {k.chunks};  // rows per run")
        self.emit(f"#pragma omp parallel for schedule(static) if({work} >= {PARALLEL_THRESHOLD})")
        self.emit(f"for (int64_t {CHUNK.name} = 0; {CHUNK.name} < {k.chunks}; ++{CHUNK.name}) {{")
        self.depth += 1
        self.emit("// this run's partial sums start at zero")
        self._open_loops(inner_var, k.inner[:-1])
        self._simd_innermost("", False)
        for v in k.chunk_stores:
            self.emit(f"{self.body.access(v)} = 0;")
        self._close_loops(len(k.inner))
        self.emit(f"const int64_t ember_end = std::min(ember_rows, ({CHUNK.name} + 1) * ember_per);")
        self.emit(f"for (int64_t ember_row = {CHUNK.name} * ember_per; ember_row < ember_end; ++ember_row) {{")
        self.depth += 1
        for i, extent in enumerate(k.outer):
            stride = sh.numel(k.outer[i + 1:])
            flat = "ember_row" if sh.equal(stride, 1) else f"(ember_row / ({index_expr(stride)}))"
            value = flat if i == 0 else f"{flat} % ({index_expr(extent)})"
            self.emit(f"const int64_t {outer_var(i).name} = {value};")
        self._stages(parallel_inner=False)
        self._close_loops(2)

    def _open_loops(self, var, extents) -> None:
        for i, extent in enumerate(extents):
            self.emit(f"for (int64_t {var(i).name} = 0; {var(i).name} < {index_expr(extent)}; ++{var(i).name}) {{")
            self.depth += 1

    def _close_loops(self, n: int) -> None:
        for _ in range(n):
            self.depth -= 1
            self.emit("}")

    def _statements(self, values: list[Value]) -> None:
        for line in self.body.statements(values):
            self.emit(line)

    def _stages(self, parallel_inner: bool) -> None:
        k = self.k
        outer_values = [v for v in k.values if not v.inner and v.kind != "reduce"]
        for stage in range(k.n_loops + 1):
            for v in k.reductions:
                if v.loop == stage and stage > 0:
                    self.emit(self.body.reduce_result(v))
            self._statements([v for v in outer_values if v.stage == stage])
            for v in k.row_reductions:  # this row's share of a reduction over the rows
                if v.srcs[0].stage == stage:
                    self.emit(self.body.reduce_update(v))
            if stage == 0 and k.segment_length is not None:
                length = self.body.name(k.segment_length)
                self.emit(f"const int64_t {SEGMENT_LENGTH.name} = {length};  // this row's length")
            if stage == 0:
                convert_once(self, k, self._own_rows, ROW_SLOT, "this row, which its loops read")
            if stage < k.n_loops:
                self._inner_loop(stage + 1, parallel_inner)

    def _inner_loop(self, loop: int, parallel: bool) -> None:
        k = self.k
        if k.scans:
            self._scan_loop(loop)
            return
        reductions = [v for v in k.reductions if v.loop == loop]
        stores = [v for v in k.values if v.kind == "store" and v.inner and v.loop == loop]
        for v in reductions:
            self.emit(self.body.reduce_decl(v))
        has_arg = any(v.arg.op in (Op.ARGMAX, Op.ARGMIN) for v in reductions)
        # float sums add up in float over blocks of the row, each block's sum into the double
        partial = [] if has_arg or self.scalar else [v for v in reductions if float_partial(CPP, v)]
        # float maxima and minima in simd loops: the hardware's max and a NaN flag (_flagged)
        flagged = [] if has_arg or self.scalar else [v for v in reductions if _flagged(v)]
        for v in flagged:
            self.emit(f"{self.flag_type(v)} {self.body.acc_names[id(v)]}_nan = 0;")
        n = len(k.inner)
        work = index_expr(sh.numel(k.inner) * self.cost)
        later = {v.arg.buffer for v in k.values if v.kind == "store" and v.inner and v.loop > loop}
        kept = [f"; keeps {self.body.name(v.srcs[0])} in {v.arg.buffer} for loop {k.n_loops}"
                for v in stores if v.arg.buffer in later]  # (stash_recomputed)
        for v in stores:
            if v.arg.buffer == SCRATCH_ROW:
                kept.append(f"; keeps {self.body.name(v.srcs[0])} in this thread's scratch row for loop {k.n_loops}")
                self.emit(f"{CPP.storage[v.dtype]}* {CPP.restrict} {SCRATCH_ROW} = "
                          f"ember_scratch_row<{CPP.storage[v.dtype]}>({index_expr(sh.numel(k.inner))});")
        self.emit(f"// loop {loop}: {', '.join(v.arg.op.value for v in reductions) or 'store'}{''.join(kept)}")
        acc = {id(v): self.body.acc_names[id(v)] + ("_part" if v in partial else "") for v in reductions}
        clauses = " ".join(_clauses(v, acc[id(v)], v in flagged) for v in reductions)
        var = inner_var(n - 1)
        staged = staged_accesses(self, k.loop_values(loop) + stores, var)  # (cpp_staging.py)
        # float reductions over the threads combine in thread order (cpp_team.py)
        team = parallel and needs_team(reductions) and not _serial(sh.numel(k.inner) * self.cost)
        # the innermost loop itself spread over the threads: the parallel pragma is its own
        spread = parallel and n == 1 and not partial and not team
        pragma = ""
        if parallel:
            collapse = f" collapse({n - 1})" if n > 2 else ""
            simd = "" if has_arg or n > 1 or partial or staged else " simd"
            totals = " ".join(_clauses(v, self.body.acc_names[id(v)], v in flagged) for v in reductions)
            pragma = f"#pragma omp parallel for{simd}{collapse} schedule(static) {totals}".rstrip()
            pragma = f"{pragma} if({work} >= {PARALLEL_THRESHOLD})"
            if team:
                # the only loop: each thread's contiguous share in one simd loop (blocks restarting
                # the lanes took a float product of values near 1 to 8x eager's error)
                share = [] if n > 1 or partial else _share_lines(index_expr(k.inner[0]))
                open_team(self, reductions, flagged, f"{work} >= {PARALLEL_THRESHOLD}",
                          share or [f"#pragma omp for{collapse} schedule(static) nowait"])
                self._share = bool(share)
            elif not (spread and staged):
                self.emit(pragma)
        self._open_loops(inner_var, k.inner[:-1])
        blocked = bool(partial) and self._open_block(partial, parallel and n == 1)
        if staged:
            start, stop = self._innermost_range(blocked)
            simd = "" if has_arg else f"#pragma omp simd {clauses}".rstrip()
            open_strip(self, var, start, stop, staged, pragma if spread else "", simd)
        elif spread:
            self._open_loops(inner_var, k.inner)  # (the parallel for simd above is its pragma)
        else:
            self._simd_innermost(clauses, has_arg, blocked)
        self._statements(k.loop_values(loop))
        for v in reductions:
            x = self.body.name(v.srcs[0])
            if v in flagged:
                a, more = acc[id(v)], ">" if v.arg.op is Op.AMAX else "<"
                self.emit(f"{a} = {x} {more} {a} ? {x} : {a};")
                self.emit(f"{a}_nan |= {x} != {x};")
            else:
                self.emit(acc_update(v, acc[id(v)], x, index_expr(v.arg.position)))
        self._statements(stores)
        if staged:
            close_strip(self, var, staged)
        else:
            self._close_loops(1)
        for v in partial:
            self.emit(f"{self.body.acc_names[id(v)]} += {acc[id(v)]};")
        self._close_loops(n - 1 + blocked)
        if team:
            close_team(self, reductions, flagged)
            self._share = False
        for v in flagged:  # (NaN wins, as in eager's maximum)
            name = self.body.acc_names[id(v)]
            self.emit(f"if ({name}_nan) {name} = ({CPP.compute(v.srcs[0].dtype)})NAN;")

    @staticmethod
    def flag_type(v: Value) -> str:
        """The C type of a flagged max's NaN flag: as wide as a lane of its values."""
        return "int64_t" if CPP.compute(v.srcs[0].dtype) == "double" else "int32_t"

    def _open_block(self, partial: list[Value], always: bool) -> bool:
        """Float sums of double accumulators (``partial``) add up in float over blocks of
        SUM_BLOCK elements of the innermost loop, 8 to a vector instead of 4 (a third faster over
        bf16 LayerNorm rows on AVX2), each block's sum then into its double, so rounding grows
        with the block, not the row. Opens the block loop where the extent can be longer than
        a block, or ``always`` (the threads share a reduction's blocks), returns whether it did;
        declares the block's float accumulators."""
        last, extent = inner_var(len(self.k.inner) - 1).name, self.k.inner[-1]
        size = sh.static(extent)
        blocked = always or size is None or size > SUM_BLOCK
        if blocked:
            self.emit(f"for (int64_t {last}_block = 0; {last}_block < {index_expr(extent)}; "
                      f"{last}_block += {SUM_BLOCK}) {{")
            self.depth += 1
        for v in partial:
            self.emit(f"float {self.body.acc_names[id(v)]}_part = 0.0f;")
        return blocked

    def _scan_loop(self, loop: int) -> None:
        """A scan kernel's one loop: the row walked in order (from its end when reversed), each
        scan's running value carried from element to element (no simd: each needs the last)."""
        k = self.k
        for v in k.scans:
            self.emit(self.body.scan_decl(v))
        r, n = inner_var(0).name, index_expr(k.inner[0])
        combines = ", ".join(f"{'reversed ' if v.arg.reverse else ''}{v.arg.combine}" for v in k.scans)
        self.emit(f"// loop {loop}: running {combines} along the row")
        if k.scan_reverse:
            self.emit(f"for (int64_t {r} = {n} - 1; {r} >= 0; --{r}) {{")
        else:
            self.emit(f"for (int64_t {r} = 0; {r} < {n}; ++{r}) {{")
        self.depth += 1
        self._statements(k.loop_values(loop))
        self._statements([v for v in k.values if v.kind == "store" and v.inner and v.loop == loop])
        self._close_loops(1)

    def _simd_innermost(self, clauses: str, has_arg: bool, blocked: bool = False) -> None:
        """Opens the innermost inner loop under ``#pragma omp simd`` (over the current block of
        SUM_BLOCK elements where ``blocked``)."""
        last = inner_var(len(self.k.inner) - 1).name
        if not has_arg:
            self.emit(f"#pragma omp simd {clauses}".rstrip())
        start, stop = self._innermost_range(blocked)
        self.emit(f"for (int64_t {last} = {start}; {last} < {stop}; ++{last}) {{")
        self.depth += 1

    def _innermost_range(self, blocked: bool) -> tuple[str, str]:
        """Where the innermost inner loop starts and stops: the row, or its current block."""
        last, extent = inner_var(len(self.k.inner) - 1).name, index_expr(self.k.inner[-1])
        if self._share:
            return "ember_lo", "ember_hi"
        if blocked:
            return f"{last}_block", f"std::min<int64_t>({last}_block + {SUM_BLOCK}, {extent})"
        return "0", extent


def _flagged(v: Value) -> bool:
    """Is ``v`` a float max or min, which a simd loop computes as ``x > acc ? x : acc`` (one
    vmaxps a vector) with a NaN flag beside it, NaN set after the loop?
    ember_max's NaN test (compare, or, blend) in the accumulator's chain took 6 cycles a vector
    where the max takes one (float16 rows' x.amax(-1): 2x faster without it, bench/RESULTS.md)."""
    return v.arg.op in (Op.AMAX, Op.AMIN) and CPP.compute(v.srcs[0].dtype) in ("float", "double")


def _share_lines(extent: str) -> list[str]:
    """This thread's contiguous share of a loop of ``extent`` steps, as a static schedule gives
    it: [ember_lo, ember_hi)."""
    return [f"const int64_t ember_per = ({extent} + omp_get_num_threads() - 1) / omp_get_num_threads();",
            f"const int64_t ember_lo = std::min<int64_t>({extent}, omp_get_thread_num() * ember_per);",
            f"const int64_t ember_hi = std::min<int64_t>({extent}, ember_lo + ember_per);"]


def _serial(work: object) -> bool:
    """Is this much work known to be below PARALLEL_THRESHOLD (one thread runs it)?"""
    size = sh.static(work)
    return size is not None and size < PARALLEL_THRESHOLD


def _clauses(v: Value, acc: str, flagged: bool) -> str:
    """OpenMP reduction clauses of accumulator ``acc`` of ``v`` (and of its NaN flag)."""
    if flagged:
        return f"reduction({'emaxnum' if v.arg.op is Op.AMAX else 'eminnum'}:{acc}) reduction(|:{acc}_nan)"
    return f"reduction({_clause(v)}:{acc})"


def cost_per_element(kernel: Kernel) -> int:
    """How many simple elements (a load, an add, a store) one element of ``kernel`` is worth:
    gathers and binary searches wait on memory, transcendentals take tens of cycles. A fused
    loss over 2000 boxes (60 ops and 8 gathers each) is worth parallelizing; 2000 adds are not."""
    weight = 0
    for v in kernel.values:
        if v.kind in ("search", "checkindex") or (v.kind == "load" and v.arg.bindings):
            weight += 8
        elif v.kind == "alu" and v.arg in TRANSCENDENTAL_OPS:
            weight += 4
        elif v.kind in ("alu", "load", "store", "reduce"):
            weight += 1
    return max(1, weight // 4)


# float32 and float64 values are stored as they are computed: a row kernel may keep one in its
# output between loops instead of computing it again (schedule/loops.py: stash_recomputed)
_STASHED = frozenset({dt.float32, dt.float64})

# The longest row a thread keeps a value of in its scratch row (elements): 256 KB of float32 stays
# in L2; rows of a size only known when called are taken to be shorter.
SCRATCH_ROW_LIMIT = 1 << 16


def render_kernel(kernel: Kernel) -> str:
    # a scratch row per thread: for kernels of rows, each walked by one thread (not in column
    # tiles, which walk many rows at once, nor one row spread over the threads)
    length = sh.static(sh.numel(kernel.inner))
    scratch = (bool(kernel.outer) and not column_tiles(kernel, False)
               and (length is None or length <= SCRATCH_ROW_LIMIT))
    source = CppKernelRenderer(stash_recomputed(kernel, _STASHED, scratch)).render()
    return source + ("\n" + packed_entry(kernel) if kernel_arguments(kernel) > MAX_CTYPES_ARGUMENTS else "")


# ctypes calls a function of at most 1024 arguments: a kernel of more (an optimizer's step over
# hundreds of parameters of one size, each with its states) has an entry taking them as one array
MAX_CTYPES_ARGUMENTS = 1024


def kernel_arguments(kernel: Kernel) -> int:
    return len(kernel.params) + len(kernel.sizes) + uses_error_flag(kernel)


def packed_entry(kernel: Kernel) -> str:
    """``<kernel>_packed(const int64_t* ember_args)``: the kernel's arguments as 64-bit words in
    order (addresses, then sizes, a float size's bits, then the error flag's address)."""
    args = [f"({'' if p.is_output else 'const '}{CPP.storage[p.dtype]}*)(intptr_t)ember_args[{i}]"
            for i, p in enumerate(kernel.params)]
    for s in kernel.sizes:
        word = f"ember_args[{len(args)}]"
        bits = f"[](int64_t w) {{ double d; __builtin_memcpy(&d, &w, sizeof d); return d; }}({word})"
        args.append(bits if sh.is_float_symbol(s) else word)
    if uses_error_flag(kernel):
        args.append(f"(int32_t*)(intptr_t)ember_args[{len(args)}]")
    body = ",\n    ".join(args)
    return (f"// {kernel.name}'s {len(args)} arguments in one array (more than ctypes passes one by one)\n"
            f'extern "C" void {kernel.name}_packed(const int64_t* ember_args) {{\n'
            f"  {kernel.name}(\n    {body});\n}}")


def render_module(kernels: list[Kernel], sources: list[str] | None = None) -> str:
    """One translation unit holding a graph's kernels (``sources``: theirs, rendered already)."""
    decls = _argred_decls(kernels)
    sources = sources if sources is not None else [render_kernel(k) for k in kernels]
    return PRELUDE + "\n" + decls + "\n\n" + "\n\n".join(sources) + "\n"


def uses_error_flag(kernel: Kernel) -> bool:
    return BodyRenderer(kernel, CPP).uses_err


