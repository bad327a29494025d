"""CUDA C++: scans along rows (``cuda_scan.render_scan``'s kernels whose scans read no scan).

A block per row (blocks stride over the rows). The block walks its row in chunks, in order (from
the row's end when the kernel's scans are reversed). Each lane takes SCAN_ITEMS elements of a
chunk, in one of three layouts:

- Grouped (``_group_runs``), where the row's loads and stores along it are aligned to 16 bytes
  (tested once per kernel call) and the elements are 16-bit, or the combine costs more than an
  add, or rows are wide: the lane's elements are consecutive, loaded and stored in vectors of up
  to 16 bytes, and scanned in its registers (one combine an element); the warp scans its lanes'
  totals (shuffles), the block its warps' (shared memory).
- Shuffled (``_shuffled_runs``: sums over rows up to 8192 wide): the warp loads its elements 32 at
  a time (lane l at element l of each 32: coalesced); each run of 32 is scanned across the warp
  (five shuffles and combines an element), after the warp's earlier runs; then the block's warps.
- Transposed (``_transposed_runs``: costlier combines and wide rows, not aligned): loaded 32 at a
  time as shuffled, but written to the warp's shared memory, where each lane scans SCAN_ITEMS
  consecutive of them in its registers, as grouped; the lanes write the scans back.

Each layout then computes every value again, now with its scan, and stores; the carry takes in
the chunk's total. Recomputing the first step's values costs arithmetic and L1 hits, not memory
traffic; keeping them would cost registers for every value a consumer reads. Elements past the
row's end scan the combine's neutral and store nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Value, inner_var, outer_var
from .c_accumulators import scan_acc_type, scan_combine, scan_init
from .cexpr import index_expr
from .cuda_vectors import VectorPlan, plan_loop

if TYPE_CHECKING:
    from .cstyle import BodyRenderer
    from .cuda import CudaKernelRenderer

SCAN_ITEMS = 8  # elements a thread takes per chunk (loaded 32 apart, scanned 8 consecutive)
RUN_SLOTS = 32 * SCAN_ITEMS + SCAN_ITEMS  # shared memory a warp's chunk takes, per scan (skewed)
RUN_WARPS = 8  # warps of a transposed scan's block at most (H200: 256 threads beat 512 but for logcumsumexp's 2%)
RUN_BYTES = 32 * 1024  # shared memory a block's runs take at most (fewer warps where more)


def render_rows(r: CudaKernelRenderer) -> None:
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


def scan_inputs(values: list[Value]) -> list[Value]:
    """The values of a scan kernel's loop that no scan precedes (computed before the scans' step)."""
    after_scan: set[int] = set()
    for v in values:
        if v.kind == "scan" or any(id(s) in after_scan for s in v.srcs) or (
                v.guard is not None and id(v.guard) in after_scan):
            after_scan.add(id(v))
    return [v for v in values if id(v) not in after_scan]


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
    inputs = scan_inputs(values)
    stores = [v for v in k.values if v.kind == "store" and v.inner]
    grouped = {id(v) for v in plan.values}
    _open_chunks(r, items, f" (a multiple of {width} here)")
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
        _lanes_before(r, v, items)
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
            r.emit(f"ember_store_vec<{ctype}, {width}>({_group_address(body, v, width)}, {body.name(v)}_vec[ember_g]);")
    r.close(3)
    body.vector_access.clear()
    _close_chunks(r)


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
                   f"{name}[ember_g] = ember_load_vec<{ctype}, {width}>({_group_address(body, v, width)});")
        body.vector_access[id(v)] = f"{name}[ember_k / {width}].v[ember_k % {width}]"
    r.emit("#pragma unroll")
    r.open(f"for (int ember_k = 0; ember_k < {items}; ++ember_k) {{")
    r.emit("const bool ember_in = ember_first + ember_k < ember_n;")
    r.emit(f"const int64_t {inner_var(0).name} = "
           f"ember_in ? ember_first + ember_k : ember_n - {width} + ember_k % {width};")


def _group_address(body: BodyRenderer, v: Value, width: int) -> str:
    """Where vector ``ember_g`` of the lane's elements starts (the row's last where it is past the
    end); a gather's indirect variables named by the values they hold (a flipped row's index)."""
    at = f"(ember_first + ember_g * {width} < ember_n ? ember_first + ember_g * {width} : ember_n - {width})"
    at_var = sympy.Symbol("ember_at", integer=True)
    index = index_expr(sympy.sympify(body.bound_index(v)).xreplace({inner_var(0): at_var}))
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
    inputs = scan_inputs(values)
    _open_chunks(r, SCAN_ITEMS)
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
    _store_items(r, "with their scans", shuffled=True)


def _transposed_runs(r: CudaKernelRenderer) -> None:
    k = r.k
    body = r.body
    values = k.loop_values(1)
    inputs = scan_inputs(values)
    warps = run_warps(r)
    r.block_limit = 32 * warps
    for v in k.scans:
        r.emit(f"__shared__ {scan_acc_type(body.lang, v)} {_runs(body, v)}[{warps * RUN_SLOTS}];  "
               f"// each warp's {32 * SCAN_ITEMS} inputs, then their scans ({RUN_SLOTS} a warp: skewed)")
    r.emit(f"const int ember_lane = (int)(threadIdx.x & 31), ember_run0 = (int)(threadIdx.x >> 5) * {RUN_SLOTS};")
    _open_chunks(r, SCAN_ITEMS)
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
        ctype, items, runs = scan_acc_type(body.lang, v), _items(body, v), _runs(body, v)
        at = f"ember_run0 + ember_skew(ember_lane * {SCAN_ITEMS} + ember_j)"
        r.emit(f"{ctype} {items}[{SCAN_ITEMS}];")
        r.emit("#pragma unroll")
        r.emit(f"for (int ember_j = 0; ember_j < {SCAN_ITEMS}; ++ember_j) {items}[ember_j] = {runs}[{at}];")
        _lanes_before(r, v, SCAN_ITEMS)
        r.emit("#pragma unroll")
        r.emit(f"for (int ember_j = 0; ember_j < {SCAN_ITEMS}; ++ember_j) "
               f"{runs}[{at}] = {scan_combine(v, f'{items}_before', f'{items}[ember_j]')};")
    r.emit("__syncwarp();")
    _store_items(r, "with their scans from shared memory", shuffled=False)


def run_warps(r: CudaKernelRenderer) -> int:
    """Warps a block of this scan kernel has at most: as many as a row kernel's, fewer where the
    scans' shared memory would pass RUN_BYTES (8-byte accumulators, several scans)."""
    from .cuda_prelude import REDUCTION_THREADS  # (the prelude imports cuda_scan, which imports this module)

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


def _open_chunks(r: CudaKernelRenderer, items: int, length_note: str = "") -> None:
    """Open the loops over the block's rows and over each row's chunks of ``items`` elements a
    thread (two levels), each row's scans' carries declared between them."""
    k = r.k
    r.emit(f"const I ember_rows = (I)({index_expr(sh.numel(k.outer))});")
    r.emit(f"const int64_t ember_n = {index_expr(k.inner[0])};  // each row's length{length_note}")
    r.emit("__shared__ double ember_scan_slots[32];  // warps' totals (8 bytes each at most)")
    r.emit(f"const int64_t ember_chunk = (int64_t)blockDim.x * {items};")
    r.open("for (I ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x) {")
    r._decompose("ember_row", k.outer, outer_var)
    r._statements([v for v in k.values if not v.inner and v.kind != "store"])
    for v in k.scans:
        r.emit(r.body.scan_decl(v) + "  // the carry: the row's scan so far")
    r.open("for (int64_t ember_base = 0; ember_base < ember_n; ember_base += ember_chunk) {")


def _close_chunks(r: CudaKernelRenderer) -> None:
    """Close ``_open_chunks``'s loops, each carry taking in its chunk's total."""
    for v in r.k.scans:
        acc = r.body.acc_names[id(v)]
        r.emit(f"{acc} = {scan_combine(v, acc, f'{_items(r.body, v)}_total')};")
    r.close(2)


def _lanes_before(r: CudaKernelRenderer, v: Value, items: int) -> None:
    """The lane's ``items`` inputs of scan ``v`` (its array) scanned in its registers, and what the
    lanes and warps before it hold, after the carry: ``<array>_before``, ``<array>_total``."""
    body = r.body
    ctype, name, acc, op = scan_acc_type(body.lang, v), _items(body, v), body.acc_names[id(v)], _op(v)
    none = scan_init(body.lang, v)
    slots = f"reinterpret_cast<{ctype}*>(ember_scan_slots)"
    r.emit("#pragma unroll")
    r.emit(f"for (int ember_k = 1; ember_k < {items}; ++ember_k) "
           f"{name}[ember_k] = {scan_combine(v, f'{name}[ember_k - 1]', f'{name}[ember_k]')};")
    r.emit(f"const {ctype} {name}_lanes = ember_warp_scan<{ctype}>({name}[{items - 1}], {op});")
    r.emit(f"const {ctype} {name}_up = ember_shfl_up({name}_lanes, 1);  // (every lane shuffles)")
    before = f"ember_warps_before<{ctype}>(ember_shfl({name}_lanes, 31), {op}, {none}, {slots}, &{name}_total)"
    r.emit(f"{ctype} {name}_total;")
    r.emit(f"const {ctype} {name}_warps = {scan_combine(v, acc, before)};")
    lane_before = f"((threadIdx.x & 31) == 0 ? {none} : {name}_up)"
    r.emit(f"const {ctype} {name}_before = {scan_combine(v, f'{name}_warps', lane_before)};")


def _store_items(r: CudaKernelRenderer, scans_from: str, shuffled: bool) -> None:
    """Step 3 of the shuffled and transposed layouts: every value at the lane's elements again,
    each scan from where the layout left it, and the stores; then the chunk's end."""
    r.emit(f"// 3. every value at this lane's elements, {scans_from}, and the stores")
    r.body.scan_line = lambda v: _item_line(r, v, shuffled=shuffled)
    _each_item(r)
    r._statements(r.k.loop_values(1))
    r.open("if (ember_in) {")
    r._statements([v for v in r.k.values if v.kind == "store" and v.inner])
    r.close(2)
    _close_chunks(r)
