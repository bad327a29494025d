"""CUDA C++: scan kernels (``Kernel.scans``: cumsum, cumprod, logcumsumexp, cummax/cummin and what
they fuse), and the helpers the CUDA prelude gets for them.

Three kinds of kernel: scans along rows, a block per row (``cuda_scan_rows.py``); a kernel where a
scan reads another scan (whose inputs need the first scan's results), which walks chunks of
blockDim.x elements, a thread an element, a block-wide scan per element (``_striped``); and
scans along a dim whose elements are far apart in memory, lanes taking adjacent rows
(``_columns``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Value, inner_var, outer_var
from .c_accumulators import scan_acc_type, scan_combine, scan_init
from .cexpr import index_expr
from .cuda_scan_rows import SCAN_ITEMS, render_rows, scan_inputs

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
        render_rows(r)


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
    inputs = scan_inputs(values)
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
