"""Reductions across the blocks of a CUDA C++ kernel: a full reduction's blocks, a row
kernel's reductions over all its rows (a loss's mean), and the slices of a column kernel's
inner domain or of a row kernel's rows split over blocks. Each block writes its partials to a
float64 workspace and counts itself done on a counter; the last block to finish combines every
block's partials and runs what comes after (codegen/cuda.py renders the rest of the kernel)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir.ops import Op
from ..schedule.kernel_ir import Value
from .c_accumulators import acc_init, acc_type

if TYPE_CHECKING:
    from .cuda import CudaKernelRenderer

COMBINE = {Op.SUM: "EmberSumOp", Op.PROD: "EmberProdOp", Op.AMAX: "EmberMaxOp", Op.AMIN: "EmberMinOp",
           Op.ARGMAX: "EmberArgMaxOp", Op.ARGMIN: "EmberArgMinOp", Op.ANY: "EmberAnyOp", Op.ALL: "EmberAllOp"}


def combine_rows(r: CudaKernelRenderer) -> None:
    """Each block's share of the reductions over all rows (every thread holds it) to the
    workspace; the last block to finish combines them and computes (and thread 0 stores) what
    comes after all rows."""
    k = r.k
    first = "threadIdx.x == 0"
    if r.row_groups:
        _combine_groups(r, k.row_reductions)
        first = "threadIdx.x == 0 && threadIdx.y == 0"
    _last_block_combines(r, k.row_reductions, first)
    inputs, after = k.after_rows()
    r._statements(inputs + [v for v in after if v.kind != "store"])
    r.open(f"if ({first}) {{")
    r._statements([v for v in after if v.kind == "store"])
    r.emit("*counter = 0;  // ready for the next launch")
    r.close(2)


def _combine_groups(r: CudaKernelRenderer, values: list[Value]) -> None:
    """A block of row groups (short rows): each group holds its own rows' share of ``values``;
    every thread gets the block's, combined in group order through shared memory."""
    acc = r.body.acc_names
    r.open("if (blockDim.y > 1) {  // row groups: each holds its rows' share, combined in group order")
    r.open("if (threadIdx.x == 0) {")
    for i, v in enumerate(values):
        r.emit(f"ember_groups{i}[threadIdx.y] = {acc[id(v)]};")
    r.close()
    r.emit("__syncthreads();")
    for i, v in enumerate(values):
        r.emit(f"{acc[id(v)]} = ember_groups{i}[0];")
    r.open("for (unsigned ember_y = 1; ember_y < blockDim.y; ++ember_y) {")
    for i, v in enumerate(values):
        r.emit(f"{acc[id(v)]} = {COMBINE[v.arg.op]}()({acc[id(v)]}, ember_groups{i}[ember_y]);")
    r.close(2)


def combine_blocks(r: CudaKernelRenderer, reductions: list[Value]) -> None:
    """Block partials to the workspace; the last block to finish combines them and goes on
    with the epilogue."""
    r.emit("// this block's partials go to the workspace; the last block to finish combines them")
    for v in reductions:
        r.emit(r._reduce_line(v))
    _last_block_combines(r, reductions)


def _last_block_combines(r: CudaKernelRenderer, values: list[Value], first: str = "threadIdx.x == 0") -> None:
    """The ``first`` thread writes the accumulators of ``values`` (this block's partials) to the
    workspace; opens ``if (ember_last) {``, in which the last block to finish strides over
    every block's partials and reduces them across the block (each row group of it, where
    it has groups), so every thread holds the totals."""
    acc = r.body.acc_names
    r.open(f"if ({first}) {{")
    for i, v in enumerate(values):
        r.emit(f"workspace[{i} * EMBER_MAX_BLOCKS + blockIdx.x] = (double){acc[id(v)]};")
    r.emit("__threadfence();  // the partials are visible to every block before the count says so")
    r.emit("ember_last = atomicAdd(counter, 1) == (int)gridDim.x - 1;")
    r.close()
    r.emit("__syncthreads();")
    r.open("if (ember_last) {")
    if values:
        _add_partials(r, values, "for (unsigned ember_b = threadIdx.x; ember_b < gridDim.x; ember_b += blockDim.x) {",
                      "{i} * EMBER_MAX_BLOCKS + ember_b")
        r._block_reduce(values)


def _add_partials(r: CudaKernelRenderer, values: list[Value], loop: str, slot: str) -> None:
    """The accumulators of ``values`` restarted, then ``loop`` combining into each value ``i``
    its partials at ``workspace[slot]`` (``slot`` formatted with i), read past L1 (other
    blocks wrote them)."""
    acc = r.body.acc_names
    r.emit("__threadfence();")
    for v in values:
        r.emit(f"{acc[id(v)]} = {acc_init(r.body.lang, v)};")
    r.open(loop)
    for i, v in enumerate(values):
        part = f"({acc_type(r.body.lang, v)})__ldcg(&workspace[{slot.format(i=i)}])"
        r.emit(f"{acc[id(v)]} = {COMBINE[v.arg.op]}()({acc[id(v)]}, {part});")
    r.close()


def combine_slices(r: CudaKernelRenderer, reductions: list[Value]) -> None:
    """A kernel split over gridDim.y slices: a column kernel's inner domain
    (cuda_plan.split_columns), or a row kernel's rows (cuda_plan.split_rows). The block's partials
    (each lane's, every warp holding them; or the row's, every thread holding them) go to the
    workspace, a slot per reduction, slice and row; a counter per group of 32 columns, or per row,
    counts the slices' blocks; the last to finish adds them up in slice order (the same result
    whichever finishes last) and goes on to the outer stage, the others to their next rows."""
    acc = r.body.acc_names
    slot = "(({{i}} * gridDim.y + {s}) * (size_t)ember_rows + ember_row)"
    columns = r.strategy == "columns"
    if not reductions:
        return
    what = "the warps' partials of each row" if columns else "the threads' partials"
    r.emit(f"// combine {what}; every thread gets them")
    for v in reductions:
        r.emit(r._reduce_line(v))
    r.open("if (gridDim.y > 1) {  // this slice's partials; the last of its blocks combines them")
    # (the launcher splits only rows a block each, never short rows in groups: blockDim.y is 1)
    r.open(f"if ({'ember_active && ember_warp == 0' if columns else 'threadIdx.x == 0'}) {{")
    for i, v in enumerate(reductions):
        r.emit(f"workspace[{slot.format(s='blockIdx.y').format(i=i)}] = (double){acc[id(v)]};")
    r.close()
    r.emit("__threadfence();  // the partials are visible to every block before the count says so")
    r.emit("__syncthreads();")
    r.open("if (threadIdx.x == 0) {")
    count = "counter[ember_rows0 / 32]" if columns else "counter[ember_row]"
    r.emit(f"ember_last = atomicAdd(&{count}, 1) == (int)gridDim.y - 1;")
    r.emit(f"if (ember_last) {count} = 0;  // ready for the next launch")
    r.close()
    r.emit("__syncthreads();")
    r.emit("if (!ember_last) continue;")
    _add_partials(r, reductions, "for (unsigned ember_s = 0; ember_s < gridDim.y; ++ember_s) {",
                  slot.format(s="ember_s"))
    r.close()
    for v in reductions:
        r.emit(r.body.reduce_result(v))
