"""CUDA C++: scan kernels (``Kernel.scans``: cumsum, cumprod, logcumsumexp and what they fuse).

A block per row (blocks stride over the rows). The block walks its row in chunks, in order (from
the row's end when the kernel's scans are reversed). Each warp takes SCAN_ITEMS x 32 consecutive
elements of a chunk, loading them 32 at a time (lane l at element l of each 32: coalesced), in
one of two layouts. Shuffled (``_shuffled_runs``: sums over rows up to 8192 wide):

1. the scans' inputs at each 32 elements, scanned across the warp (shuffles), each after the
   totals of the warp's earlier 32s, kept in registers;
2. one block-wide scan of the warps' totals through shared memory gives each warp what the warps
   before it hold, and the chunk's total;
3. each element again, now with its scan (carry, then the warps before, then its own), and the
   stores; the carry takes in the chunk's total.

Transposed (``_transposed_runs``: costlier combines, wider rows): step 1 writes the inputs to the
warp's shared memory instead, and each lane scans SCAN_ITEMS consecutive of them in its registers
(one combine an element, not five), the warp its lanes' totals, the block its warps'; the lanes
write the scans back, and step 3 reads them there.

Where the row's loads and stores along it are aligned to 16 bytes (tested once per kernel
call), a third form replaces both (``_group_runs``): each lane takes a group of consecutive
elements, loaded and stored at once, and scans it in its registers.

Recomputing step 1's values in step 3 costs arithmetic and L1 hits, not memory traffic; keeping
them would cost registers for every value a consumer reads. Elements past the row's end scan the
combine's neutral and store nothing. A kernel where a scan reads another scan (whose
inputs need the first scan's results) walks chunks of blockDim.x elements, a thread an element,
a block-wide scan per element (``_striped``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Value, inner_var, outer_var
from .cexpr import index_expr
from .cstyle import scan_acc_type, scan_combine, scan_init
from .cuda_vectors import VectorPlan, plan_loop

if TYPE_CHECKING:
    from .cuda import CudaKernelRenderer

# (appended to the CUDA prelude: every translation unit has them)
SCAN_PRELUDE = r"""
// ---- scans ----
// logcumsumexp's step, as eager's: x the next element, y the running value
EMBER_FN float ember_logaddexp(float x, float y) {
  float lo = y != y ? y : (y < x ? y : x), hi = y != y ? y : (x < y ? y : x);
  if (lo != hi || lo - lo == 0.0f) return log1pf(expf(lo - hi)) + hi;
  return x;
}
EMBER_FN double ember_logaddexp(double x, double y) {
  double lo = y != y ? y : (y < x ? y : x), hi = y != y ? y : (x < y ? y : x);
  if (lo != hi || lo - lo == 0.0) return log1p(exp(lo - hi)) + hi;
  return x;
}
// combines of an earlier value a and a later b
struct EmberScanSum { template <typename T> EMBER_FN T operator()(T a, T b) const { return a + b; } };
struct EmberScanProd { template <typename T> EMBER_FN T operator()(T a, T b) const { return a * b; } };
// cummax's and cummin's step, as eager's: the later element replaces the best where it is NaN, or
// the best is not and it is >= (<=) the best (b: an 8- or 16-bit integer's shuffle gives int32)
template <typename T, typename U> EMBER_FN T ember_scan_max(T a, U b) {
  return b != b || (a == a && b >= a) ? (T)b : a;
}
template <typename T, typename U> EMBER_FN T ember_scan_min(T a, U b) {
  return b != b || (a == a && b <= a) ? (T)b : a;
}
struct EmberScanMax { template <typename T> EMBER_FN T operator()(T a, T b) const { return ember_scan_max(a, b); } };
struct EmberScanMin { template <typename T> EMBER_FN T operator()(T a, T b) const { return ember_scan_min(a, b); } };
struct EmberScanLogsumexp {
  template <typename T> EMBER_FN T operator()(T a, T b) const { return ember_logaddexp(b, a); }
};
EMBER_FN float ember_shfl_up(float v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
EMBER_FN double ember_shfl_up(double v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
EMBER_FN int64_t ember_shfl_up(int64_t v, int d) { return (int64_t)__shfl_up_sync(0xffffffffu, (long long)v, d); }
EMBER_FN int32_t ember_shfl_up(int32_t v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
EMBER_FN float ember_shfl(float v, int l) { return __shfl_sync(0xffffffffu, v, l); }
EMBER_FN double ember_shfl(double v, int l) { return __shfl_sync(0xffffffffu, v, l); }
EMBER_FN int64_t ember_shfl(int64_t v, int l) { return (int64_t)__shfl_sync(0xffffffffu, (long long)v, l); }
EMBER_FN int32_t ember_shfl(int32_t v, int l) { return __shfl_sync(0xffffffffu, v, l); }
// The inclusive scan of v over the warp's lanes
template <typename T, typename Op> EMBER_FN T ember_warp_scan(T v, Op op) {
  const unsigned lane = threadIdx.x & 31u;
  for (int d = 1; d < 32; d <<= 1) { T up = ember_shfl_up(v, d); if (lane >= (unsigned)d) v = op(up, v); }
  return v;
}
// What the warps before this one hold (``none`` in warp 0), given each warp's total v in all of
// its lanes, and in *total the block's (blockDim.x a multiple of 32; every thread calls it;
// slots: 32 values of shared memory).
template <typename T, typename Op> EMBER_FN T ember_warps_before(T v, Op op, T none, T* slots, T* total) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = (blockDim.x + 31u) >> 5;
  if (lane == 0u) slots[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = slots[lane < warps ? lane : 0u];
    for (int d = 1; d < 32; d <<= 1) { T up = ember_shfl_up(w, d); if (lane >= (unsigned)d) w = op(up, w); }
    if (lane < warps) slots[lane] = w;
  }
  __syncthreads();
  const T before = warp > 0 ? slots[warp - 1] : none;
  *total = slots[warps - 1];
  __syncthreads();  // (the slots serve the next scan)
  return before;
}
// The inclusive scan of v over the block's threads in threadIdx.x order (blockDim.x a multiple
// of 32; every thread calls it); slots: 32 values of shared memory.
template <typename T, typename Op> EMBER_FN T ember_block_scan(T v, Op op, T* slots) {
  v = ember_warp_scan(v, op);
  T total;
  // (T spelled out: ember_shfl of an 8- or 16-bit integer gives the int32_t it promotes to)
  const T before = ember_warps_before<T>(ember_shfl(v, 31), op, v, slots, &total);  // (v: warp 0's, unused)
  return (threadIdx.x >> 5) > 0 ? op(before, v) : v;
}
// A warp's chunk in shared memory: element e at e + e / 32, so that lanes reading 8 consecutive
// elements each (at 8 * lane + j) hit 32 different banks, as lanes reading a run of 32 do
EMBER_FN int ember_skew(int e) { return e + (e >> 5); }
// thread ``last``'s v, in every thread of the block
template <typename T> EMBER_FN T ember_block_pick(T v, int last, T* slots) {
  if ((int)threadIdx.x == last) slots[0] = v;
  __syncthreads();
  T out = slots[0];
  __syncthreads();
  return out;
}
"""

SCAN_ITEMS = 8  # elements a thread takes per chunk (loaded 32 apart, scanned 8 consecutive)
RUN_SLOTS = 32 * SCAN_ITEMS + SCAN_ITEMS  # shared memory a warp's chunk takes, per scan (skewed)
RUN_WARPS = 8  # warps of a transposed scan's block at most (H200: 256 threads beat 512 but for logcumsumexp's 2%)
RUN_BYTES = 32 * 1024  # shared memory a block's runs take at most (fewer warps where more)
COLUMN_SEGMENTS = 16  # warps of a column scan's block at most: segments of the scanned dim

STRATEGY = ("scan -- a block per row (blocks stride over the rows), walking it in chunks of "
            f"{SCAN_ITEMS} x blockDim.x elements, {SCAN_ITEMS} runs of 32 a warp: scanned across the warp "
            f"(shuffles) or, transposed through shared memory, {SCAN_ITEMS} consecutive a lane; then the block's "
            "warps' totals, after the earlier chunks' carry. Where the rows' accesses are aligned, each lane "
            "takes a group of consecutive elements instead, loaded and stored at once (16 bytes)")


def items_per_thread(kernel: Kernel) -> int:
    """Elements of a chunk each thread takes (the launcher sizes blocks by it)."""
    return 1 if chained(kernel.loop_values(1)) else SCAN_ITEMS


COLUMNS_STRATEGY = ("scan columns -- 32 adjacent rows per block, one per lane (their elements are adjacent "
                    "in memory); the block's warps take consecutive segments of the scanned dim: each lane "
                    "adds up its segment, takes the segments before it from shared memory, then scans its "
                    "segment in order")


def render_scan(r: CudaKernelRenderer) -> None:
    """The body of a scan kernel (one loop; every store along the rows)."""
    if r.strategy == "scan_columns":
        _columns(r)
    elif chained(r.k.loop_values(1)):
        _striped(r)
    else:
        _warp_runs(r)


def chained(values: list[Value]) -> bool:
    """Does some scan's input depend on a scan (``cumsum(cumsum(x))`` in one kernel)?"""
    after_scan: set[int] = set()
    for v in values:  # (in dependency order)
        if any(id(s) in after_scan for s in v.srcs) or v.guard is not None and id(v.guard) in after_scan:
            if v.kind == "scan":
                return True
            after_scan.add(id(v))
        if v.kind == "scan":
            after_scan.add(id(v))
    return False


def _scan_inputs(values: list[Value]) -> list[Value]:
    """The values of a scan kernel's loop that no scan precedes (computed before the scans' step)."""
    after_scan: set[int] = set()
    for v in values:
        if v.kind == "scan" or any(id(s) in after_scan for s in v.srcs) or (
                v.guard is not None and id(v.guard) in after_scan):
            after_scan.add(id(v))
    return [v for v in values if id(v) not in after_scan]


def _warp_runs(r: CudaKernelRenderer) -> None:
    plan = _group_plan(r.k)
    if plan is not None:
        test = " && ".join(plan.conditions) or "true"
        r.emit(f"// vector form where every group of {plan.width} is aligned: "
               f"{', '.join(sorted({v.arg.buffer for v in plan.values}))}")
        r.open(f"if ({test}) {{")
        _group_runs(r, plan)
        r.depth -= 1
        r.open("} else {")
    if _transposed(r.k):
        _transposed_runs(r)
    else:
        _shuffled_runs(r)
    if plan is not None:
        r.close()


def _group_plan(kernel: Kernel) -> VectorPlan | None:
    """The vector form of a scan kernel's loop (cuda_vectors.py), where it reads or writes along
    the rows a group at a time; none for reversed scans (a lane's group would go backwards), nor
    for sums of 4- or 8-byte elements over rows the warp shuffles take (H200, float32 cumsum
    16384 x 4096: 143 us shuffled, 169 in groups; bfloat16: 127 shuffled, 85 in groups)."""
    if kernel.scan_reverse:
        return None
    stores = [v for v in kernel.values if v.kind == "store" and v.inner]
    plan = plan_loop(kernel, kernel.loop_values(1) + stores, kernel.inner, inner=True)
    if plan is None or plan.width <= 4 and not _transposed(kernel):
        return None
    return plan


def _group_runs(r: CudaKernelRenderer, plan: VectorPlan) -> None:
    """Each lane takes SCAN_ITEMS consecutive elements, in vectors of ``plan.width`` (its loads and
    stores up to 16 bytes at once, coalesced across the warp), and scans them in its registers;
    the warp scans its lanes' totals, the block its warps'. Where a row's 2-byte elements went
    one at a time, a warp moved 64 bytes a load: a bfloat16 cumsum took 1.9x Triton's time."""
    k, body, width = r.k, r.body, plan.width
    items = max(width, SCAN_ITEMS)
    values = k.loop_values(1)
    inputs = _scan_inputs(values)
    stores = [v for v in k.values if v.kind == "store" and v.inner]
    grouped = {id(v) for v in plan.values}
    r.emit(f"const I ember_rows = (I)({index_expr(sh.numel(k.outer))});")
    r.emit(f"const int64_t ember_n = {index_expr(k.inner[0])};  // each row's length (a multiple of {width} here)")
    r.emit("__shared__ double ember_scan_slots[32];  // warps' totals (8 bytes each at most)")
    r.emit(f"const int64_t ember_chunk = (int64_t)blockDim.x * {items};")
    r.open("for (I ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x) {")
    r._decompose("ember_row", k.outer, outer_var)
    r._statements([v for v in k.values if not v.inner and v.kind != "store"])
    for v in k.scans:
        r.emit(body.scan_decl(v) + "  // the carry: the row's scan so far")
    r.open("for (int64_t ember_base = 0; ember_base < ember_n; ember_base += ember_chunk) {")
    r.emit(f"const int64_t ember_first = ember_base + (int64_t)threadIdx.x * {items};  // this lane's elements")
    for v in k.scans:
        r.emit(f"{scan_acc_type(body.lang, v)} {_items(body, v)}[{items}];")
    r.emit(f"// 1. the scans' inputs, {width} at a time, scanned in the lane's registers")
    _open_group(r, plan, [v for v in plan.values if v.kind == "load" and id(v) in {id(u) for u in inputs}], items)
    r._statements(inputs)
    for v in k.scans:
        x = f"ember_in ? ({scan_acc_type(body.lang, v)}){body.name(v.srcs[0])} : {scan_init(body.lang, v)}"
        r.emit(f"{_items(body, v)}[ember_k] = {x};")
    r.close(2)
    body.vector_access.clear()
    r.emit("// 2. what the lanes and warps before this one hold, after the earlier chunks' carry")
    for v in k.scans:
        ctype, name, acc, op = scan_acc_type(body.lang, v), _items(body, v), body.acc_names[id(v)], _op(v)
        none = scan_init(body.lang, v)
        slots = f"reinterpret_cast<{ctype}*>(ember_scan_slots)"
        r.emit("#pragma unroll")
        r.emit(f"for (int ember_k = 1; ember_k < {items}; ++ember_k) "
               f"{name}[ember_k] = {scan_combine(v, f'{name}[ember_k - 1]', f'{name}[ember_k]')};")
        r.emit(f"const {ctype} {name}_lanes = ember_warp_scan<{ctype}>({name}[{items - 1}], {op});")
        r.emit(f"const {ctype} {name}_up = ember_shfl_up({name}_lanes, 1);  // (every lane shuffles)")
        before = (f"ember_warps_before<{ctype}>(ember_shfl({name}_lanes, 31), {op}, {none}, {slots}, "
                  f"&{name}_total)")
        r.emit(f"{ctype} {name}_total;")
        r.emit(f"const {ctype} {name}_warps = {scan_combine(v, acc, before)};")
        lane_before = f"((threadIdx.x & 31) == 0 ? {none} : {name}_up)"
        r.emit(f"const {ctype} {name}_before = {scan_combine(v, f'{name}_warps', lane_before)};")
    r.emit("// 3. every value of the lane's elements, with their scans, and the stores")
    body.scan_line = lambda v: _group_line(r, v)
    used = {id(v) for v in (*values, *stores)}
    _open_group(r, plan, [v for v in plan.values if id(v) in used], items)
    r._statements(values)
    r._statements([v for v in stores if id(v) in grouped])  # (into the lane's vectors)
    if any(id(v) not in grouped for v in stores):
        r.open("if (ember_in) {")
        r._statements([v for v in stores if id(v) not in grouped])
        r.close()
    r.close()
    r.emit("#pragma unroll")
    r.open(f"for (int ember_g = 0; ember_g < {items // width}; ++ember_g) {{")
    r.open(f"if (ember_first + ember_g * {width} < ember_n) {{")
    for v in plan.values:
        if v.kind == "store":
            ctype = body.lang.storage[body.buffer_dtype[v.arg.buffer]]
            r.emit(f"ember_store_vec<{ctype}, {width}>({_group_address(v, width)}, {body.name(v)}_vec[ember_g]);")
    r.close(3)
    body.vector_access.clear()
    for v in k.scans:
        acc, name = body.acc_names[id(v)], _items(body, v)
        r.emit(f"{acc} = {scan_combine(v, acc, f'{name}_total')};")
    r.close(2)


def _open_group(r: CudaKernelRenderer, plan: VectorPlan, accesses: list[Value], items: int) -> None:
    """Open a scope with the lane's vectors of ``accesses`` (loads read, stores declared; a
    vector past the row's end reads the row's last) and the unrolled loop over its elements
    (two levels)."""
    body, width = r.body, plan.width
    r.open("{")
    for v in accesses:
        ctype, name = body.lang.storage[body.buffer_dtype[v.arg.buffer]], f"{body.name(v)}_vec"
        r.emit(f"EmberVec<{ctype}, {width}> {name}[{items // width}];")
        if v.kind == "load":
            r.emit("#pragma unroll")
            r.emit(f"for (int ember_g = 0; ember_g < {items // width}; ++ember_g) "
                   f"{name}[ember_g] = ember_load_vec<{ctype}, {width}>({_group_address(v, width)});")
        body.vector_access[id(v)] = f"{name}[ember_k / {width}].v[ember_k % {width}]"
    r.emit("#pragma unroll")
    r.open(f"for (int ember_k = 0; ember_k < {items}; ++ember_k) {{")
    r.emit("const bool ember_in = ember_first + ember_k < ember_n;")
    r.emit(f"const int64_t {inner_var(0).name} = "
           f"ember_in ? ember_first + ember_k : ember_n - {width} + ember_k % {width};")


def _group_address(v: Value, width: int) -> str:
    """Where vector ``ember_g`` of the lane's elements starts (the row's last where it is past the end)."""
    at = f"(ember_first + ember_g * {width} < ember_n ? ember_first + ember_g * {width} : ember_n - {width})"
    index = index_expr(sympy.sympify(v.arg.index).xreplace({inner_var(0): sympy.Symbol("ember_at", integer=True)}))
    return f"{v.arg.buffer} + ({index.replace('ember_at', at)})"


def _group_line(r: CudaKernelRenderer, v: Value) -> str:
    items, compute = _items(r.body, v), r.body.lang.compute(v.dtype)
    return f"const {compute} {r.body.name(v)} = ({compute})({scan_combine(v, f'{items}_before', f'{items}[ember_k]')});"




def _transposed(kernel: Kernel) -> bool:
    """Do the kernel's scans go through shared memory (each lane scanning consecutive elements)
    rather than across the warp, a run of 32 at a time (five shuffles and combines an element)?
    Where a combine costs more than an add, or rows are wide. H200, µs, shuffled / transposed:
    logcumsumexp f32 4096 x 4096 163 / 115, cumprod 61 / 49, softmax + cumsum over 1024 x 32000
    130 / 117; but cumsum f32 16384 x 4096 145 / 160, 4096 x 4096 41 / 46."""
    wide = _static_width(kernel) > 8192
    return wide or any(v.arg.combine != "sum" for v in kernel.scans)


def _static_width(kernel: Kernel) -> int:
    """The scanned length where it is a number (symbolic: taken as narrow)."""
    n = kernel.inner[0]
    return int(n) if getattr(n, "is_number", False) else 0


def _shuffled_runs(r: CudaKernelRenderer) -> None:
    k = r.k
    body = r.body
    values = k.loop_values(1)
    inputs = _scan_inputs(values)
    r.emit(f"const I ember_rows = (I)({index_expr(sh.numel(k.outer))});")
    r.emit(f"const int64_t ember_n = {index_expr(k.inner[0])};  // each row's length")
    r.emit("__shared__ double ember_scan_slots[32];  // warps' totals (8 bytes each at most)")
    r.emit(f"const int64_t ember_chunk = (int64_t)blockDim.x * {SCAN_ITEMS};")
    r.open("for (I ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x) {")
    r._decompose("ember_row", k.outer, outer_var)
    r._statements([v for v in k.values if not v.inner and v.kind != "store"])
    for v in k.scans:
        r.emit(body.scan_decl(v) + "  // the carry: the row's scan so far")
    r.open("for (int64_t ember_base = 0; ember_base < ember_n; ember_base += ember_chunk) {")
    r.emit(f"const int64_t ember_first = ember_base + (int64_t)(threadIdx.x >> 5) * {32 * SCAN_ITEMS} "
           "+ (threadIdx.x & 31);  // this lane's first element")
    for v in k.scans:
        ctype, items = scan_acc_type(body.lang, v), _items(body, v)
        r.emit(f"{ctype} {items}[{SCAN_ITEMS}];")
        r.emit(f"{ctype} {items}_warp = {scan_init(body.lang, v)};  // the warp's runs so far")
    r.emit("// 1. the scans' inputs, each run of 32 scanned across the warp after the warp's earlier runs")
    _each_item(r)
    r._statements(inputs)
    for v in k.scans:
        ctype, items, op = scan_acc_type(body.lang, v), _items(body, v), _op(v)
        x = f"ember_in ? ({ctype}){body.name(v.srcs[0])} : {scan_init(body.lang, v)}"
        r.emit(f"const {ctype} {items}_run = ember_warp_scan<{ctype}>({x}, {op});")
        r.emit(f"{items}[ember_j] = {scan_combine(v, f'{items}_warp', f'{items}_run')};")
        r.emit(f"{items}_warp = {scan_combine(v, f'{items}_warp', f'ember_shfl({items}_run, 31)')};")
    r.close()
    r.emit("// 2. what the warps before this one hold, after the earlier chunks' carry")
    for v in k.scans:
        ctype, items, acc, op = scan_acc_type(body.lang, v), _items(body, v), body.acc_names[id(v)], _op(v)
        slots = f"reinterpret_cast<{ctype}*>(ember_scan_slots)"
        before = f"ember_warps_before<{ctype}>({items}_warp, {op}, {scan_init(body.lang, v)}, {slots}, &{items}_total)"
        r.emit(f"{ctype} {items}_total;")
        r.emit(f"const {ctype} {items}_before = {scan_combine(v, acc, before)};")
    r.emit("// 3. every value at this lane's elements, with their scans, and the stores")
    body.scan_line = lambda v: _item_line(r, v, shuffled=True)
    _each_item(r)
    r._statements(values)
    stores = [v for v in k.values if v.kind == "store" and v.inner]
    r.open("if (ember_in) {")
    r._statements(stores)
    r.close(2)
    for v in k.scans:
        acc, items = body.acc_names[id(v)], _items(body, v)
        r.emit(f"{acc} = {scan_combine(v, acc, f'{items}_total')};")
    r.close(2)


def _transposed_runs(r: CudaKernelRenderer) -> None:
    k = r.k
    body = r.body
    values = k.loop_values(1)
    inputs = _scan_inputs(values)
    warps = run_warps(r)
    r.block_limit = 32 * warps
    r.emit(f"const I ember_rows = (I)({index_expr(sh.numel(k.outer))});")
    r.emit(f"const int64_t ember_n = {index_expr(k.inner[0])};  // each row's length")
    r.emit("__shared__ double ember_scan_slots[32];  // warps' totals (8 bytes each at most)")
    for v in k.scans:
        r.emit(f"__shared__ {scan_acc_type(body.lang, v)} {_runs(body, v)}[{warps * RUN_SLOTS}];  "
               f"// each warp's {32 * SCAN_ITEMS} inputs, then their scans ({RUN_SLOTS} a warp: skewed)")
    r.emit(f"const int64_t ember_chunk = (int64_t)blockDim.x * {SCAN_ITEMS};")
    r.emit(f"const int ember_lane = (int)(threadIdx.x & 31), ember_run0 = (int)(threadIdx.x >> 5) * {RUN_SLOTS};")
    r.open("for (I ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x) {")
    r._decompose("ember_row", k.outer, outer_var)
    r._statements([v for v in k.values if not v.inner and v.kind != "store"])
    for v in k.scans:
        r.emit(body.scan_decl(v) + "  // the carry: the row's scan so far")
    r.open("for (int64_t ember_base = 0; ember_base < ember_n; ember_base += ember_chunk) {")
    r.emit(f"const int64_t ember_first = ember_base + (int64_t)(threadIdx.x >> 5) * {32 * SCAN_ITEMS} "
           "+ ember_lane;  // this lane's first element")
    r.emit("__syncwarp();  // (the last chunk's reads of the runs are done)")
    r.emit("// 1. the scans' inputs, a run of 32 at a time (coalesced), into the warp's shared memory")
    _each_item(r)
    r._statements(inputs)
    for v in k.scans:
        x = f"ember_in ? ({scan_acc_type(body.lang, v)}){body.name(v.srcs[0])} : {scan_init(body.lang, v)}"
        r.emit(f"{_runs(body, v)}[ember_run0 + ember_skew(ember_j * 32 + ember_lane)] = {x};")
    r.close()
    r.emit("__syncwarp();")
    r.emit(f"// 2. each lane scans {SCAN_ITEMS} consecutive inputs in its registers, the warp its lanes' totals, "
           "the block its warps' (after the earlier chunks' carry)")
    for v in k.scans:
        ctype, items, runs, acc, op = (scan_acc_type(body.lang, v), _items(body, v), _runs(body, v),
                                       body.acc_names[id(v)], _op(v))
        none = scan_init(body.lang, v)
        slots = f"reinterpret_cast<{ctype}*>(ember_scan_slots)"
        at = f"ember_run0 + ember_skew(ember_lane * {SCAN_ITEMS} + ember_j)"
        r.emit(f"{ctype} {items}[{SCAN_ITEMS}];")
        r.emit("#pragma unroll")
        r.emit(f"for (int ember_j = 0; ember_j < {SCAN_ITEMS}; ++ember_j) {items}[ember_j] = {runs}[{at}];")
        r.emit("#pragma unroll")
        r.emit(f"for (int ember_j = 1; ember_j < {SCAN_ITEMS}; ++ember_j) "
               f"{items}[ember_j] = {scan_combine(v, f'{items}[ember_j - 1]', f'{items}[ember_j]')};")
        r.emit(f"const {ctype} {items}_lanes = ember_warp_scan<{ctype}>({items}[{SCAN_ITEMS - 1}], {op});")
        r.emit(f"const {ctype} {items}_up = ember_shfl_up({items}_lanes, 1);  // (every lane shuffles)")
        before = (f"ember_warps_before<{ctype}>(ember_shfl({items}_lanes, 31), {op}, {none}, {slots}, "
                  f"&{items}_total)")
        r.emit(f"{ctype} {items}_total;")
        r.emit(f"const {ctype} {items}_warps = {scan_combine(v, acc, before)};")
        lane_before = f"(ember_lane == 0 ? {none} : {items}_up)"
        r.emit(f"const {ctype} {items}_before = {scan_combine(v, f'{items}_warps', lane_before)};")
        r.emit("#pragma unroll")
        r.emit(f"for (int ember_j = 0; ember_j < {SCAN_ITEMS}; ++ember_j) "
               f"{runs}[{at}] = {scan_combine(v, f'{items}_before', f'{items}[ember_j]')};")
    r.emit("__syncwarp();")
    r.emit("// 3. every value at this lane's elements, with their scans from shared memory, and the stores")
    body.scan_line = lambda v: _item_line(r, v)
    _each_item(r)
    r._statements(values)
    stores = [v for v in k.values if v.kind == "store" and v.inner]
    r.open("if (ember_in) {")
    r._statements(stores)
    r.close(2)
    for v in k.scans:
        acc, items = body.acc_names[id(v)], _items(body, v)
        r.emit(f"{acc} = {scan_combine(v, acc, f'{items}_total')};")
    r.close(2)


def run_warps(r: CudaKernelRenderer) -> int:
    """Warps a block of this scan kernel has at most: as many as a row kernel's, fewer where the
    scans' shared memory would pass RUN_BYTES (8-byte accumulators, several scans)."""
    from .cuda_prelude import REDUCTION_THREADS  # (the prelude takes this module's)

    sizes = {"double": 8, "int64_t": 8, "uint64_t": 8}
    per_warp = RUN_SLOTS * sum(sizes.get(scan_acc_type(r.body.lang, v), 4) for v in r.k.scans)
    warps = min(RUN_WARPS, REDUCTION_THREADS // 32)
    while warps > 1 and warps * per_warp > RUN_BYTES:
        warps //= 2
    return warps


def _op(v: Value) -> str:
    return f"EmberScan{v.arg.combine.capitalize()}()"


def _items(body, v: Value) -> str:
    return f"ember_items_{body.name(v)}"


def _each_item(r: CudaKernelRenderer) -> None:
    """Open the unrolled loop over this lane's elements of the chunk, one in each run of 32."""
    k = r.k
    r.emit("#pragma unroll")
    r.open(f"for (int ember_j = 0; ember_j < {SCAN_ITEMS}; ++ember_j) {{")
    r.emit("const int64_t ember_i = ember_first + 32 * ember_j;")
    r.emit("const bool ember_in = ember_i < ember_n;")
    at = "(ember_in ? ember_i : ember_n - 1)"
    r.emit(f"const int64_t {inner_var(0).name} = {f'ember_n - 1 - {at}' if k.scan_reverse else at};")


def _item_line(r: CudaKernelRenderer, v: Value, shuffled: bool = False) -> str:
    compute = r.body.lang.compute(v.dtype)
    if shuffled:
        items = _items(r.body, v)
        scan = scan_combine(v, f"{items}_before", f"{items}[ember_j]")
    else:
        scan = f"{_runs(r.body, v)}[ember_run0 + ember_skew(ember_j * 32 + ember_lane)]"
    return f"const {compute} {r.body.name(v)} = ({compute})({scan});"


def _runs(body, v: Value) -> str:
    return f"ember_runs_{body.name(v)}"


def _striped(r: CudaKernelRenderer) -> None:
    k = r.k
    r.body.scan_line = lambda v: _scan_line(r, v)
    r.emit(f"const I ember_rows = (I)({index_expr(sh.numel(k.outer))});")
    r.emit(f"const int64_t ember_n = {index_expr(k.inner[0])};  // each row's length")
    r.emit("__shared__ double ember_scan_slots[32];  // warps' totals (8 bytes each at most)")
    r.open("for (I ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x) {")
    r._decompose("ember_row", k.outer, outer_var)
    r._statements([v for v in k.values if not v.inner and v.kind != "store"])
    for v in k.scans:
        r.emit(r.body.scan_decl(v) + "  // the carry: the row's scan so far")
    r.open("for (int64_t ember_base = 0; ember_base < ember_n; ember_base += blockDim.x) {")
    r.emit("const int64_t ember_i = ember_base + threadIdx.x;")
    r.emit("const bool ember_in = ember_i < ember_n;")
    r.emit("const int ember_last = (int)(ember_n - ember_base < (int64_t)blockDim.x ? ember_n - ember_base : "
           "(int64_t)blockDim.x) - 1;  // the chunk's last thread")
    at = "(ember_in ? ember_i : ember_n - 1)"
    r.emit(f"const int64_t {inner_var(0).name} = {f'ember_n - 1 - {at}' if k.scan_reverse else at};")
    r._statements(k.loop_values(1))
    stores = [v for v in k.values if v.kind == "store" and v.inner]
    r.open("if (ember_in) {")
    r._statements(stores)
    r.close(3)


def _scan_line(r: CudaKernelRenderer, v: Value) -> str:
    acc = r.body.acc_names[id(v)]
    ctype = scan_acc_type(r.body.lang, v)
    name, src = r.body.name(v), r.body.name(v.srcs[0])
    op = f"EmberScan{v.arg.combine.capitalize()}()"
    slots = f"reinterpret_cast<{ctype}*>(ember_scan_slots)"
    compute = r.body.lang.compute(v.dtype)
    return (f"{ctype} {name}_run = ember_block_scan<{ctype}>(({ctype}){src}, {op}, {slots}); "
            f"{name}_run = {scan_combine(v, acc, f'{name}_run')}; "
            f"{acc} = ember_block_pick<{ctype}>({name}_run, ember_last, {slots}); "
            f"const {compute} {name} = ({compute}){name}_run;")


def _columns(r: CudaKernelRenderer) -> None:
    """A scan along a dim whose elements are far apart in memory (``x.cumsum(0)``): lanes take
    adjacent rows, whose elements at each step are adjacent (coalesced), and walk them in order,
    each carrying its row's running value; no shuffles. So that more threads than rows keep
    loads in flight, a block's warps split the scanned dim into segments: each lane adds up its
    segment (step 1), takes the totals of the segments before it (step 2, shared memory), and
    scans its segment again from there, storing (step 3). The dim is read twice, written once."""
    k, body = r.k, r.body
    values = k.loop_values(1)
    inputs = _scan_inputs(values)
    r.emit(f"const I ember_rows = (I)({index_expr(sh.numel(k.outer))});")
    r.emit(f"const int64_t ember_n = {index_expr(k.inner[0])};  // the scanned dim's length")
    r.emit(f"__shared__ double ember_scan_slots[{COLUMN_SEGMENTS} * 32];  // each segment's totals, per lane")
    r.emit("const int ember_segment = (int)(threadIdx.x >> 5);")
    r.emit("const int64_t ember_per = (ember_n + (int64_t)(blockDim.x >> 5) - 1) / (int64_t)(blockDim.x >> 5);")
    r.emit("const int64_t ember_lo = ember_segment * ember_per;")
    r.emit("const int64_t ember_hi = ember_lo + ember_per < ember_n ? ember_lo + ember_per : ember_n;")
    r.open("for (I ember_group = (I)blockIdx.x * 32; ember_group < ember_rows; ember_group += (I)gridDim.x * 32) {")
    r.emit("const I ember_row = ember_group + (I)(threadIdx.x & 31);")
    r.emit("const bool ember_active = ember_row < ember_rows;  // (lanes past the rows idle, but meet the barriers)")
    r.emit("const I ember_at = ember_active ? ember_row : ember_rows - 1;")
    r._decompose("ember_at", k.outer, outer_var)
    r._statements([v for v in k.values if not v.inner and v.kind != "store"])
    for v in k.scans:
        r.emit(body.scan_decl(v) + "  // the segment's total, then the running value")
    rows = "ember_n - 1 - ember_i" if k.scan_reverse else "ember_i"
    r.emit("// 1. each segment's totals")
    r.emit("#pragma unroll 4")
    r.open("for (int64_t ember_i = ember_lo; ember_i < ember_hi; ++ember_i) {")
    r.emit(f"const int64_t {inner_var(0).name} = {rows};")
    r._statements(inputs)
    for v in k.scans:
        acc = body.acc_names[id(v)]
        r.emit(f"{acc} = {scan_combine(v, acc, f'({scan_acc_type(body.lang, v)}){body.name(v.srcs[0])}')};")
    r.close()
    r.emit("// 2. the segments before this one, in order")
    for v in k.scans:
        ctype, acc = scan_acc_type(body.lang, v), body.acc_names[id(v)]
        slots = f"reinterpret_cast<{ctype}*>(ember_scan_slots)"
        r.emit(f"{slots}[threadIdx.x] = {acc};")
        r.emit("__syncthreads();")
        r.emit(f"{acc} = {scan_init(body.lang, v)};")
        r.emit(f"for (int ember_s = 0; ember_s < ember_segment; ++ember_s) "
               f"{acc} = {scan_combine(v, acc, f'{slots}[ember_s * 32 + (threadIdx.x & 31)]')};")
        r.emit("__syncthreads();  // (the slots serve the next scan)")
    r.emit("// 3. the segment scanned from there, and the stores")
    r.emit("#pragma unroll 4")
    r.open("for (int64_t ember_i = ember_lo; ember_i < ember_hi; ++ember_i) {")
    r.emit(f"const int64_t {inner_var(0).name} = {rows};")
    r._statements(values)
    r.open("if (ember_active) {")
    r._statements([v for v in k.values if v.kind == "store" and v.inner])
    r.close(3)
