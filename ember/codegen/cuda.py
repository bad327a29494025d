"""GPU backend: kernel IR -> CUDA C++, rendered by the same C-style renderer as the CPU backend.

Values are the statements cstyle.py writes for C++ too; only indexing, launch geometry and
intrinsics differ. The kernel IR's domains map to the GPU like codegen/triton.py maps them:

* pointwise (no inner loop): the outer domain is flattened; a grid-stride loop gives each thread
  EMBER_UNROLL elements per iteration, blockDim.x apart (coalesced, several loads in flight).
  Independent groups of stores (a foreach step's parameters, triton_lanes.py) run as lanes, a
  row of blocks each (gridDim.y), and small kernels of static sizes can be parts of one combo
  launch (cuda_combos.py), each body then taking its block and lane as arguments;
* rows (outer domain with reductions): one block per outer index, blocks striding over the rows;
  in each IR loop the block's threads stride over the inner domain, then a block-wide reduction
  (warp shuffles + shared memory) gives every thread the loop's results. Rows too short for a
  warp take a group of consecutive lanes each instead (blockDim.x lanes a row, blockDim.y rows a
  block), reducing with shuffles among the group's lanes. Few long rows read in one loop of
  float reductions split each over gridDim.y blocks, which take turns at the row's loop steps;
  the last of a row's blocks to finish combines their partials (cuda_combine.combine_slices).
  When the loops' accesses are adjacent along the outer domain instead (x.sum(0)), 'columns': a
  block takes 32 rows, one per lane, its warps split the inner domain and combine per lane
  through shared memory; with
  few groups of 32 rows, the inner domain also splits over gridDim.y blocks, the last of each
  group's to finish combining the slices' partials (cuda_combine.combine_slices);
* full reductions (no outer domain): with one loop of float/bool reductions, a grid of blocks
  strides over the inner domain and writes per-block partials to a float64 workspace; the last
  block to finish (an atomic counter) combines them and runs the epilogue (cuda_combine.py).
  Anything else runs as one block that does every loop.

Every strided loop gives each thread EMBER_UNROLL elements per iteration, each behind its own
bounds check, so the loads are predicated and in flight together. Where a loop's accesses step
by one element along its fastest dimension, it also has a vector form (cuda_vectors.py): groups
of consecutive elements, an access a 16-byte load or store per group, taken where the kernel
finds every group aligned (rows of a length that is no multiple of the group peel a head and a
tail off each row); row kernels whose loops read a row alike keep the first loop's groups
in registers for the others when a block's one iteration covers the row, and rows too long for
that take a softmax's max and sum in one loop (cuda_online.py). Each kernel's body is a device
function template over its index type ``I``; two ``extern "C"``
entry points instantiate it: ``<name>`` with 32-bit unsigned flat indices (launched when
outer * inner < 2^31) and ``<name>_i64`` with 64-bit ones. A compile builds one of them:
``<name>`` by default, ``<name>_i64`` with ``EMBER_WIDE_INDEX`` defined, which the CUDA backend
does only when a launch first needs it. Only the flat-index arithmetic (the
loop counters and their / and % decomposition) uses ``I``; addresses are always int64.

The source compiles with NVRTC (no headers at all) and with plain ``nvcc -cubin``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.ops import Op
from ..schedule.kernel_ir import CHUNK, Kernel, Value, inner_var, outer_var
from . import cuda_online, cuda_scan
from .c_accumulators import acc_init, acc_type
from .cexpr import device_size_lines, index_expr
from .cstyle import BodyRenderer, Language
from .cuda_combine import COMBINE, combine_blocks, combine_rows, combine_slices
from .cuda_groups import vector_groups
from .cuda_lanes import render_lanes
from .cuda_plan import (  # noqa: F401 (cuda.launch_meta: the backend's name for it)
    STRATEGY_NOTES,
    kernel_row_forms,
    lane_plan,
    launch_meta,
    pointwise_lanes,
    row_groups,
    split_columns,
    split_rows,
    strategy,
    uses_workspace,
    vector_plan,
    vector_width,
)
from .cuda_prelude import (  # noqa: F401 (cuda.MAX_BLOCKS, cuda.ROW_GROUP_THREADS, cuda.COLUMN_UNROLL)
    COLUMN_UNROLL,
    MAX_BLOCKS,
    POINTWISE_THREADS,
    PRELUDE,
    REDUCTION_THREADS,
    ROW_GROUP_THREADS,
    UNROLL,
)
from .cuda_tiles import LANES, TILE_ROWS, render_tiles, staged_accesses
from .cuda_vectors import RowForms, VectorPlan
from .layout import group_invariant, thread_invariant
from .online_softmax import terms_lost_below_one

# float32 math spelled with CUDA's float functions (IEEE-accurate or within a few ulp), so nothing
# silently promotes to double; exp and division as Triton computes them (cuda_prelude.py).
_F32_MATH = {
    Op.EXP: "ember_exp_approx", Op.DIV: "ember_div_full", Op.EXP2: "exp2f", Op.EXPM1: "expm1f",
    Op.LOG: "logf", Op.LOG2: "log2f",
    Op.LOG10: "log10f", Op.LOG1P: "log1pf", Op.SQRT: "sqrtf", Op.RSQRT: "rsqrtf", Op.SIN: "sinf",
    Op.COS: "cosf", Op.TAN: "tanf", Op.ASIN: "asinf", Op.ACOS: "acosf", Op.ATAN: "atanf",
    Op.SINH: "sinhf", Op.COSH: "coshf", Op.TANH: "tanhf", Op.ASINH: "asinhf", Op.ACOSH: "acoshf",
    Op.ATANH: "atanhf", Op.ERF: "erff", Op.ERFC: "erfcf", Op.FLOOR: "floorf", Op.CEIL: "ceilf",
    Op.TRUNC: "truncf", Op.ROUND: "rintf", Op.ATAN2: "atan2f", Op.FMOD: "fmodf", Op.POW: "powf",
    Op.HYPOT: "hypotf", Op.COPYSIGN: "copysignf", Op.NEXTAFTER: "nextafterf",
}
_BINARY = (Op.ATAN2, Op.FMOD, Op.POW, Op.DIV, Op.HYPOT, Op.COPYSIGN, Op.NEXTAFTER)

CUDA = Language(
    name="cuda",
    # no CUDA headers: 16-bit floats are their bit patterns, converted by the prelude's helpers
    storage={dt.float16: "unsigned short", dt.bfloat16: "unsigned short", dt.float32: "float",
             dt.float64: "double", dt.int8: "int8_t", dt.int16: "int16_t", dt.int32: "int32_t",
             dt.int64: "int64_t", dt.uint8: "uint8_t", dt.bool_: "bool"},
    math_prefix="",
    fast_f32={op: f"{fn}({{}}, {{}})" if op in _BINARY else f"{fn}({{}})" for op, fn in _F32_MATH.items()},
    sum_acc_f32="float",       # partial sums per thread, then a tree across the block
    checks_indices=False,      # no error flag on the GPU: an index out of range is a device-side
    asserts_indices=True,      # assert, as in eager's CUDA kernels (and Inductor's)
    flags_int_division=False,  # no error flag on the GPU: integer division by zero gives 0
    search_hints=False,        # a thread handles too few elements for a hint to help
)
# a combo's parts (codegen/cuda_combos.py), and a kernel of many short lanes: one function holds
# every part or lane, so what each inlines multiplies; powf is called (cuda_prelude.py: ember_powf_call)
CUDA_PART = dataclasses.replace(CUDA, fast_f32={**CUDA.fast_f32, Op.POW: "ember_powf_call({}, {})"})
# Lanes from which a pointwise kernel whose lanes take one block step each unrolls once and calls
# powf (CudaKernelRenderer)
MANY_LANES = 8



# grid-stride loops: block b starts at its tile of blockDim.x * EMBER_UNROLL elements
_GRID_START = "(I)blockIdx.x * blockDim.x * EMBER_UNROLL + threadIdx.x"
_GRID_STRIDE = "(I)gridDim.x * blockDim.x * EMBER_UNROLL"


class CudaKernelRenderer:
    def __init__(self, kernel: Kernel, part: bool = False):
        self.k = kernel
        # a combo's part (codegen/cuda_combos.py): a pointwise body whose block, block count and
        # lane are arguments, the combo's block b - (the blocks of the parts before it)
        self.part = part
        self.strategy = strategy(kernel)
        # many lanes of at most a block's step each (a GPT-2 Adam step's 74 parameters of 768
        # elements): one step, unrolled once, powf called (the launch's one block a lane covers
        # the lane either way); unrolled 4 times, powf inlined, nvcc took 52 of the step's 72 s
        many_lanes = not part and len(pointwise_lanes(kernel) or ()) > MANY_LANES
        elements = sympy.Mul(*kernel.outer)
        one_step = many_lanes and elements.is_Integer and int(elements) <= POINTWISE_THREADS * 4
        self.body = BodyRenderer(kernel, CUDA_PART if part or one_step else CUDA)
        # a column kernel's inner domain, or a row kernel's rows, in gridDim.y slices
        self.split = split_columns(kernel) or split_rows(kernel)
        self.lines: list[str] = []
        self.depth = 0
        forms = kernel_row_forms(kernel) if self.strategy == "rows" else RowForms({}, {}, {}, ())
        self.plans = forms.plans
        self.first_loop = forms.first_loop
        self.kept = forms.kept
        self.row_groups = self.strategy == "rows" and row_groups(kernel, vector_width(kernel, forms))
        self.flag_tests = forms.flag_tests
        self.row_width = next(iter(self.plans.values())).width if self.plans else 0  # one width, when kept
        self.cached = {key: f"ember_cache{i}" for i, key in enumerate(self.first_loop)}
        # a peeled row's head and tail elements kept too, where the first loop reading them peels
        self.tails = {key: f"ember_tail{i}" for i, key in enumerate(self.first_loop)
                      if self.plans[self.first_loop[key]].peel_from}
        # online softmax (cuda_online.py): sum -> the max it accumulates with, in the max's loop
        self.online = cuda_online.row_pairs(kernel, self.strategy, vector_width(kernel, forms),
                                            bool(self.first_loop), self.row_groups)
        self.online_sums: dict[int, list[Value]] = {}  # a max's id -> the sums accumulated with it
        for total, m in self.online.items():
            self.online_sums.setdefault(id(m), []).append(total)
        self.maxima: list[tuple[Value, list[Value]]] = []  # the loop being rendered's online maxima, their sums
        self.in_group = False  # rendering a vector group's element loop
        self.hoisted: set[int] = set()  # values a pointwise group computed once, before its elements
        self.thread_hoisted: set[int] = set()  # values a pointwise loop's thread computed before it
        self.loop = 0  # the inner loop being rendered
        # elements a thread takes per iteration of a strided loop (a column kernel's lanes: rows;
        # a combo's part: its own, codegen/cuda_combos.py)
        self.unroll = ("EMBER_COMBO_UNROLL" if part else "1" if one_step else
                       "EMBER_COLUMN_UNROLL" if self.strategy == "columns" else "EMBER_UNROLL")

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def open(self, line: str) -> None:
        self.emit(line)
        self.depth += 1

    def close(self, n: int = 1) -> None:
        for _ in range(n):
            self.depth -= 1
            self.emit("}")

    # ---- signature ------------------------------------------------------------------------
    def params(self) -> list[str]:
        out = []
        for p in self.k.params:
            const = "" if p.is_output else "const "
            out.append(f"{const}{CUDA.storage[p.dtype]}* {CUDA.restrict} {p.name}")
        out += [f"{sh.size_ctype(s)} {s.name}" for s in self.k.sizes]
        if uses_workspace(self.k):
            out += ["double* __restrict__ workspace", "int* __restrict__ counter"]
        return out

    def arguments(self) -> list[str]:
        names = [p.name for p in self.k.params] + [s.name for s in self.k.sizes]
        return names + (["workspace", "counter"] if uses_workspace(self.k) else [])

    def render_body(self) -> None:
        """The header comments and the kernel's body, a device function templated on the index type."""
        k = self.k
        self.emit(f"// {k.name}: fuses {', '.join(k.origins) or '-'}")
        self.emit(f"// outer {sh.fmt(k.outer)}, inner {sh.fmt(k.inner)}, {k.n_loops} inner loop(s)")
        self.emit(f"// strategy: {STRATEGY_NOTES[self.strategy + (' split' if self.split else '')]}")
        if not self.part:
            self.emit(f"// flat index type I: uint32_t in {k.name} (outer * inner < 2^31), int64_t in {k.name}_i64")
        params = ", ".join(self.params() + (["const I ember_block", "const I ember_blocks", "const unsigned ember_lane"]
                                            if self.part else []))
        self.emit("template <typename I>")
        self.open(f"__device__ __forceinline__ void {k.name}_body({params}) {{")
        for line in device_size_lines(k):
            self.emit(line)
        if self.strategy == "pointwise":
            self._pointwise()
        elif self.strategy == "tiles":
            render_tiles(self, staged_accesses(k), CUDA.storage)
        elif self.strategy in ("rows", "columns"):
            self._rows()
        elif self.strategy in ("scan", "scan_columns"):
            cuda_scan.render_scan(self)
        else:
            self._full()
        self.close()

    def render(self) -> str:
        k = self.k
        self.render_body()
        params = ", ".join(self.params())
        threads = getattr(self, "block_limit", None) or {  # (a scan's shared memory may need smaller blocks)
            "pointwise": POINTWISE_THREADS, "tiles": LANES * TILE_ROWS}.get(self.strategy, REDUCTION_THREADS)
        args = ", ".join(self.arguments())
        # One entry point per compile: the 64-bit one is built (with EMBER_WIDE_INDEX defined) only
        # when a launch needs it, so a cold start compiles each body once, not twice
        entry = f'extern "C" __global__ void __launch_bounds__({threads}) {k.name}{{}}({params}) {{{{'
        self.emit("#ifndef EMBER_WIDE_INDEX")
        self.emit(entry.format(""))
        self.emit(f"  {k.name}_body<uint32_t>({args});")
        self.emit("}")
        self.emit("#else")
        self.emit(entry.format("_i64"))
        self.emit(f"  {k.name}_body<int64_t>({args});")
        self.emit("}")
        self.emit("#endif")
        return "\n".join(self.lines)

    # ---- index setup ----------------------------------------------------------------------
    def _count(self, name: str, extents: tuple[sympy.Expr, ...], what: str) -> None:
        self.emit(f"const I {name} = {_as_index(sh.numel(extents))};  // {what}")

    def _decompose(self, flat: str, extents: tuple[sympy.Expr, ...], var) -> None:
        """Row-major decomposition of a flat index (type I) into int64 per-dimension variables."""
        for i in range(len(extents)):
            stride = sh.numel(extents[i + 1:])
            expr = flat if stride == 1 else f"{flat} / {_as_index(stride)}"
            if i > 0:
                expr = f"{expr if stride == 1 else f'({expr})'} % {_as_index(extents[i])}"
            self.emit(f"const int64_t {var(i).name} = (int64_t){expr if expr.isidentifier() else f'({expr})'};")

    def _statements(self, values: list[Value]) -> None:
        skip = self.hoisted | self.thread_hoisted
        for line in self.body.statements([v for v in values if id(v) not in skip]):
            self.emit(line)

    def _group_invariants(self, plan: VectorPlan, extents: tuple[sympy.Expr, ...], first: list[sympy.Symbol],
                          values: list[Value]) -> None:
        """A pointwise group's values that are the same for all its elements (layout.group_invariant:
        an embedding's row index, a bag's id found by a search), computed once at the group's
        start, before its gathers and scatters of whole rows need them."""
        fixed = group_invariant(self.k, values, outer_var(len(extents) - 1))
        values = [v for v in values if id(v) in fixed and id(v) not in self.thread_hoisted]
        if all(v.kind == "const" for v in values):
            return
        self.emit("// the same for every element of the group: once a group")
        text = "\n".join(self.body.statements(values))
        for i in range(len(extents) - 1):
            if re.search(rf"\b{outer_var(i).name}\b", text):
                self.emit(f"const int64_t {outer_var(i).name} = {first[i].name};")
        self._statements(values)
        self.hoisted = {id(v) for v in values}

    def _unrolled(self, flat: str, count: str, start: str, spacing: str, stride: str, what: str,
                  unit: str = "elements") -> None:
        """Open a loop giving each thread EMBER_UNROLL elements ``spacing`` apart per iteration, each
        guarded (predicated loads, in flight together), then moving on by ``stride``; the body goes
        at the current depth, inside three blocks."""
        self.emit(f"// {what}: {self.unroll} {unit} {spacing} apart per thread and iteration")
        self.open(f"for (I {flat}_tile = {start}; {flat}_tile < {count}; {flat}_tile += {stride}) {{")
        self.emit("#pragma unroll")
        self.open(f"for (int ember_u = 0; ember_u < {self.unroll}; ++ember_u) {{")
        self.emit(f"const I {flat} = {flat}_tile + (I)ember_u * {spacing};")
        self.open(f"if ({flat} < {count}) {{")

    # ---- strategies -----------------------------------------------------------------------
    def _strided(self, flat: str, count: str, start: str, spacing: str, stride: str, what: str,
                 plan: VectorPlan | None, extents: tuple[sympy.Expr, ...], var: Callable[[int], sympy.Symbol],
                 body: Callable[[], None], values: list[Value] | None = None) -> None:
        """A strided loop over ``count`` elements (``extents`` flattened, decomposed into ``var``s)
        running ``body``, the statements of one element; with a vector ``plan``, its vector form
        where the plan's conditions hold (the same in every thread) and this loop elsewhere.
        ``values``: a pointwise loop's values (a lane's), whose group invariants go first."""
        if plan is not None:
            test = " && ".join(plan.conditions) or "true"
            self.emit(f"// vector form where every group of {plan.width} is aligned: "
                      f"{', '.join(sorted({v.arg.buffer for v in plan.values}))}")
            self.open(f"if ({test}) {{")
            vector_groups(self, flat, count, start, spacing, stride, what, plan, extents, var, body, values)
            self.depth -= 1
            self.open("} else {")
        self._unrolled(flat, count, start, spacing, stride, what)
        self._decompose(flat, extents, var)
        body()
        self.close(3)
        if plan is not None:
            self.close()

    def _pointwise(self) -> None:
        self._count("ember_n", self.k.outer, "elements")
        lanes = pointwise_lanes(self.k, self.part)
        if not lanes:
            self._pointwise_loop(self.k.values, vector_plan(self.k, 0))
            return
        # (a foreach step's parameters: a block streams one parameter's tensors, not a slice of each)
        lane = "ember_lane" if self.part else "blockIdx.y"
        self.emit(f"// {len(lanes)} independent lanes (codegen/triton_lanes.py): lane {lane}, on the blocks of its row")
        bodies = []
        for values in lanes:  # each as a switch's case would hold it (cuda_lanes.py shares them)
            mark, self.depth = len(self.lines), self.depth + 2
            self._pointwise_loop(values, lane_plan(self.k, values))
            self.depth -= 2
            bodies.append(self.lines[mark:])
            del self.lines[mark:]
        render_lanes(self, bodies, lane, CUDA.storage)

    def _pointwise_loop(self, values: list[Value], plan: VectorPlan | None) -> None:
        start, stride = (g.replace("EMBER_UNROLL", self.unroll) for g in (_GRID_START, _GRID_STRIDE))
        if self.part:  # the combo's block numbers, not the grid's
            start = f"(I)ember_block * blockDim.x * {self.unroll} + threadIdx.x"
            stride = f"(I)ember_blocks * blockDim.x * {self.unroll}"
        once = [v for v in values if id(v) in thread_invariant(self.k, values)]
        if any(v.kind != "const" for v in once):  # (constants the compiler folds where they are)
            self.emit("// the same at every position: once a thread, before its loop (layout.thread_invariant)")
            self.open(f"if ({start} < ember_n) {{")
            self._statements(once)
            self.thread_hoisted = {id(v) for v in once}
        self._strided("ember_i", "ember_n", start, "blockDim.x", stride,
                      "grid-stride loop over the elements", plan, self.k.outer, outer_var,
                      lambda: self._statements(values), values)
        if self.thread_hoisted:
            self.close()
            self.thread_hoisted = set()

    def _rows(self) -> None:
        smem = "EMBER_SMEM_BYTES" if self.strategy == "rows" else "EMBER_COLUMN_SMEM_BYTES"
        self.emit(f"__shared__ __align__(16) unsigned char ember_smem[{smem}];")
        if self.k.row_reductions or (self.split and self.strategy == "rows"):
            self.emit("__shared__ bool ember_last;  // is this the last block to finish?")
        if self.k.row_reductions:
            if self.row_groups:
                for i, v in enumerate(self.k.row_reductions):
                    self.emit(f"__shared__ {acc_type(CUDA, v)} ember_groups{i}[{ROW_GROUP_THREADS}];"
                              "  // each row group's share")
            self.emit("// reductions over all rows: every thread adds each row (the same values)")
            for v in self.k.row_reductions:
                self.emit(self.body.reduce_decl(v))
        self._count("ember_rows", self.k.outer, "rows: the outer domain")
        if self.k.segment_length is None:  # a segment kernel's rows each load their own
            self._count("ember_inner", self.k.inner, "elements of a row: the inner domain")
        if self.flag_tests:
            tests = self.flag_tests
            self.emit("// every loop in groups, one iteration per thread (its block covers a row): the first loop")
            self.emit("// reading a group keeps it in registers for the later loops, and the row is read once;")
            self.emit("// the thread's share of the run's partial sums stays in registers too")
            if self.tails:  # (a head and a tail hold up to two groups less one element each)
                tests = (*tests, f"(I)blockDim.x * EMBER_UNROLL >= {2 * self.row_width - 2}")
            self.emit(f"const bool ember_cached = (I)blockDim.x * EMBER_UNROLL * {self.row_width} >= ember_inner"
                      f"{''.join(f' && {t}' for t in tests)};")
        if self.strategy == "rows":
            if self.k.chunks:
                self._chunk_rows()
            elif self.row_groups:
                self.emit("// a row per block, or, for short rows, per group of blockDim.x threads (blockDim.y")
                self.emit("// groups a block); blocks stride over the rows")
                self.open("for (I ember_row = (I)blockIdx.x * blockDim.y + threadIdx.y; ember_row < ember_rows; "
                          "ember_row += (I)gridDim.x * blockDim.y) {")
            else:
                self.emit("// one block per row; blocks stride over the rows")
                self.open("for (I ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x) {")
            for (buffer, _), name in self.cached.items():
                self.emit(f"EmberVec<{CUDA.storage[self.body.buffer_dtype[buffer]]}, {self.row_width}> "
                          f"{name}[EMBER_UNROLL];")
            for (buffer, _), name in self.tails.items():
                self.emit(f"{CUDA.storage[self.body.buffer_dtype[buffer]]} {name}[EMBER_UNROLL];")
        else:
            self.emit("const unsigned ember_lane = threadIdx.x & 31u, ember_warp = threadIdx.x >> 5;")
            self.emit("const unsigned ember_warps = blockDim.x >> 5;")
            if self.split:
                self.emit("__shared__ bool ember_last;  // is this the last slice's block to finish?")
                self.emit("// the inner domain in gridDim.y slices of whole loop steps (few groups of rows: more")
                self.emit("// blocks), each slice's block its partials; the last to finish combines them")
                self.emit("const I ember_step = (I)ember_warps * EMBER_COLUMN_UNROLL;")
                self.emit("const I ember_slice = ((ember_inner + gridDim.y - 1) / gridDim.y + ember_step - 1) "
                          "/ ember_step * ember_step;")
                self.emit("const I ember_r_begin = (I)blockIdx.y * ember_slice;")
                self.emit("const I ember_r_end = ember_r_begin + ember_slice < ember_inner ? ember_r_begin + "
                          "ember_slice : ember_inner;  // (an empty slice past the end: begin > end)")
            self.emit("// 32 rows per block, one per lane; blocks stride over the groups of 32")
            self.open("for (I ember_rows0 = (I)blockIdx.x * 32; ember_rows0 < ember_rows; "
                      "ember_rows0 += (I)gridDim.x * 32) {")
            self.emit("const bool ember_active = ember_rows0 + ember_lane < ember_rows;")
            self.emit("// lanes past the last row repeat it (valid addresses, same barriers) and store nothing")
            self.emit("const I ember_row = ember_active ? ember_rows0 + ember_lane : ember_rows - 1;")
        self._decompose("ember_row", self.k.outer, outer_var)
        self._stages()
        self.close()
        if self.kept:
            self._store_kept_partials()
        if self.k.row_reductions:
            combine_rows(self)

    def _chunk_rows(self) -> None:
        """Block c walks run c of the rows (rows c, c + chunks, ...: the grid is a block per run),
        its threads adding each row into the run's partial column sums, the same elements for
        every row (so no thread reads another's), zeroed first. Runs of consecutive rows
        (++row) had NVVM split every group's 16-byte store into 2-byte stores (a LayerNorm
        backward's dx: eight times the L2 write traffic, 358 us where Triton takes 179; H100)."""
        self.emit(f"const int64_t {CHUNK.name} = (int64_t)blockIdx.x;  // the run: a block each")
        self._unrolled("ember_r", "ember_inner", "(I)threadIdx.x", "blockDim.x", "(I)blockDim.x * EMBER_UNROLL",
                       "the run's partial sums start at zero")
        self._decompose("ember_r", self.k.inner, inner_var)
        for v in self.k.chunk_stores:
            self.emit(f"{self.body.access(v)} = 0;")
        self.close(3)
        if self.kept:
            self.emit("__syncthreads();  // the run's end stores the partials in groups, not in this loop's order")
        for v in self.k.chunk_stores:
            if id(v) in self.kept:
                ctype = CUDA.compute(self.body.buffer_dtype[v.arg.buffer])
                self.emit(f"{ctype} {self.kept[id(v)]}[EMBER_UNROLL][{self.row_width}] = {{}};  // its partials")
        self.open("for (I ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x) {")

    def _store_kept_partials(self) -> None:
        """After the run: the partial sums kept in registers to the partials buffer, each thread
        its groups (those of its one iteration of the loops)."""
        width = self.row_width
        self.open("if (ember_cached) {  // the run's partials, from registers")
        self.emit("#pragma unroll")
        self.open("for (int ember_u = 0; ember_u < EMBER_UNROLL; ++ember_u) {")
        self.emit("const I ember_r_group = (I)threadIdx.x + (I)ember_u * blockDim.x;")
        self.open(f"if (ember_r_group < ember_inner / {width}) {{")
        self.emit("#pragma unroll")
        self.open(f"for (int ember_k = 0; ember_k < {width}; ++ember_k) {{")
        self.emit(f"const I ember_r = ember_r_group * {width} + ember_k;")
        self._decompose("ember_r", self.k.inner, inner_var)
        for v in self.k.chunk_stores:
            if id(v) in self.kept:
                value = CUDA.store(self.body.buffer_dtype[v.arg.buffer], f"{self.kept[id(v)]}[ember_u][ember_k]")
                self.emit(f"{self.body.access(v)} = {value};")
        self.close(4)

    def _full(self) -> None:
        self.emit("__shared__ __align__(16) unsigned char ember_smem[EMBER_SMEM_BYTES];")
        if self.strategy == "full":
            self.emit("__shared__ bool ember_last;  // is this the last block to finish?")
        self._count("ember_inner", self.k.inner, "the reduction domain")
        self._stages()

    def _stages(self) -> None:
        """Outer values stage by stage, with each IR loop and its reduction across threads between."""
        k = self.k
        outer_values = [v for v in k.values if not v.inner and v.kind != "reduce"]
        for stage in range(k.n_loops + 1):
            if stage > 0:
                reductions = [v for v in k.reductions if v.loop == stage and v not in self.online]
                if self.strategy == "full":
                    combine_blocks(self, reductions)  # opens `if (ember_last) {`
                elif self.split:
                    combine_slices(self, reductions)  # across the warps (or threads), then the slices
                else:
                    self._block_reduce(reductions)
            self._outer(stage, [v for v in outer_values if v.stage == stage])
            for v in k.row_reductions:  # this row's share of a reduction over the rows
                if v.srcs[0].stage == stage:
                    self.emit(self.body.reduce_update(v))
            if stage == 0 and k.segment_length is not None:
                self.emit(f"const I ember_inner = (I){self.body.name(k.segment_length)};  // this row's length")
            if stage < k.n_loops:
                self._inner_loop(stage + 1)
        if self.strategy == "full":
            self.emit("if (threadIdx.x == 0) *counter = 0;  // ready for the next launch")
            self.close()

    def _outer(self, stage: int, values: list[Value]) -> None:
        """A stage's outer values, computed by every thread; its outer stores, by one thread."""
        self._statements([v for v in values if v.kind != "store"])
        stores = [v for v in values if v.kind == "store"]
        if not stores:
            return
        guard = {"columns": "ember_active && ember_warp == 0"}.get(self.strategy, "threadIdx.x == 0")
        if self.split and self.strategy == "rows" and stage == 0:
            guard += " && blockIdx.y == 0"  # (a row's later stages run in its last block only)
        if self.strategy == "full" and stage == 0:
            guard = "blockIdx.x == 0 && threadIdx.x == 0"
        self.open(f"if ({guard}) {{  // outer results: one thread writes them")
        self._statements(stores)
        self.close()

    def _inner_loop(self, loop: int) -> None:
        k = self.k
        self.loop = loop
        reductions = [v for v in k.reductions if v.loop == loop and v not in self.online]
        stores = [v for v in k.values if v.kind == "store" and v.inner and v.loop == loop]
        if not reductions and not stores:
            return  # its only work, an online softmax sum, moved into the loop before
        self.maxima = [(m, self.online_sums[id(m)]) for m in reductions if id(m) in self.online_sums]
        for v in reductions + [s for _, sums in self.maxima for s in sums]:
            self.emit(self.body.reduce_decl(v))
        online = {id(m): sums for m, sums in self.maxima}
        what = f"loop {loop}: {', '.join(v.arg.op.value for v in reductions) or 'store'}" + (
            " and its online softmax sum" if self.maxima else "")
        if self.strategy == "full":
            loop_args = (_GRID_START, "blockDim.x", _GRID_STRIDE, f"{what} -- the grid strides over the inner domain")
        elif self.strategy == "columns" and self.split:
            loop_args = ("ember_r_begin + (I)ember_warp", "ember_warps", "ember_step",
                         f"{what} -- the block's warps stride over its slice of the inner domain")
        elif self.strategy == "columns":
            loop_args = ("(I)ember_warp", "ember_warps", "(I)ember_warps * EMBER_COLUMN_UNROLL",
                         f"{what} -- the block's warps stride over the inner domain")
        elif self.split:  # (rows) slice y of a row: loop steps y, y + gridDim.y, ... of the row
            loop_args = ("(I)threadIdx.x + (I)blockIdx.y * blockDim.x * EMBER_UNROLL", "blockDim.x",
                         "(I)gridDim.y * blockDim.x * EMBER_UNROLL",
                         f"{what} -- the row's blocks (gridDim.y) take turns at its loop steps, each block's "
                         "threads striding over a step")
        else:
            loop_args = ("(I)threadIdx.x", "blockDim.x", "(I)blockDim.x * EMBER_UNROLL",
                         f"{what} -- the block's threads stride over the inner domain")

        def body() -> None:
            self._statements(k.loop_values(loop))
            for v in reductions:
                if id(v) not in online:
                    self.emit(self.body.reduce_update(v))
                elif self.in_group:
                    cuda_online.group_element(self, v)
                else:
                    cuda_online.element_update(self, v, online[id(v)])
            if stores and self.strategy == "columns":
                self.open("if (ember_active) {")
                self._statements(stores)
                self.close()
            else:
                self._statements(stores)

        plan = self.plans.get(loop) if self.strategy == "rows" else vector_plan(k, loop)
        bound = "ember_r_end" if self.split and self.strategy == "columns" else "ember_inner"
        # a softmax's terms, only added up next to its max's 1: one ex2.approx.ftz each
        self.body.spelled = {id(e): f"ember_exp_ftz({self.body.name(e.srcs[0])})"
                             for e in terms_lost_below_one(k, loop)}
        self._strided("ember_r", bound, *loop_args, plan, k.inner, inner_var, body)
        self.body.spelled = {}
        self.maxima = []

    def _reduce_line(self, v: Value) -> str:
        acc = self.body.acc_names[id(v)]
        if self.strategy == "columns":
            return f"{acc} = ember_column_reduce({acc}, {COMBINE[v.arg.op]}(), ember_smem);"
        fn = "ember_row_reduce" if self.row_groups else "ember_block_reduce"
        return f"{acc} = {fn}({acc}, {COMBINE[v.arg.op]}(), {acc_init(CUDA, v)}, ember_smem);"

    def _block_reduce(self, reductions: list[Value]) -> None:
        if not reductions:
            return
        what = "the warps' partials of each row" if self.strategy == "columns" else "the threads' partials"
        self.emit(f"// combine {what}; every thread gets the results")
        for v in reductions:
            if id(v) in self.online_sums:
                cuda_online.combine_threads(self, v, self.online_sums[id(v)], self._reduce_line)
                continue
            self.emit(self._reduce_line(v))
            self.emit(self.body.reduce_result(v))

def _as_index(e: sympy.Expr) -> str:
    """A size expression converted to the flat index type ``I``."""
    text = index_expr(e)
    return f"(I){text}" if text.isidentifier() or text.isdigit() else f"(I)({text})"


def render_kernel(kernel: Kernel) -> str:
    return CudaKernelRenderer(kernel).render()


def render_module(kernels: list[Kernel], sources: list[str] | None = None) -> str:
    """One translation unit holding a graph's kernels (``sources``: theirs, rendered already)."""
    sources = sources if sources is not None else [render_kernel(k) for k in kernels]
    return PRELUDE + "\n" + "\n\n".join(sources) + "\n"
