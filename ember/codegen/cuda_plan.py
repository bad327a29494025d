"""How a kernel of the CUDA backend is launched, decided from its kernel IR: its strategy (how
its domains map to blocks and threads, codegen/cuda.py), the vector forms of its loops and what
its rows keep in registers (cuda_vectors.py), whether short rows may share a block in groups of
lanes, and the meta the launcher reads (runtime/cuda_launch.py: plan_launch sizes the grid
and the blocks from it and the sizes of a call)."""

from __future__ import annotations

from typing import Any

from ..ir import shapes as sh
from ..ir.ops import Op
from ..schedule.kernel_ir import Kernel, Value
from . import cuda_scan
from .cuda_prelude import POINTWISE_THREADS, REDUCTION_THREADS, UNROLL
from .cuda_scan import chained, items_per_thread
from .cuda_tiles import LANES, TILE_ROWS, staged_accesses, tile_side
from .cuda_vectors import RowForms, VectorPlan, plan_loop, row_forms
from .layout import adjacent_rows, tile_counts
from .triton_lanes import lanes_of
from .wrapper import pexpr

# each strategy as the kernel's header comment explains it
STRATEGY_NOTES = {
    "pointwise": "pointwise -- a grid-stride loop over the flattened outer domain, "
                 f"{UNROLL} elements per thread per iteration",
    "tiles": "tiles -- square tiles of (the leading dims, flattened) x (the last dim), a block of "
             f"{LANES} x {TILE_ROWS} threads each; accesses contiguous along the rows go through shared memory",
    "rows": "rows -- one block per outer index, or for short rows a group of a warp's lanes (blocks "
            "stride over the rows); threads stride over the inner domain, reductions across the row's "
            "threads after each loop",
    "rows split": "rows -- one block per outer index, or for short rows a group of a warp's lanes (blocks "
                  "stride over the rows); threads stride over the inner domain, which few long rows split "
                  "over gridDim.y blocks (interleaved by loop steps); reductions across the block, then "
                  "the row's last block to finish combines the slices",
    "columns": "columns -- 32 adjacent outer indices per block, one per lane (their elements are "
               "adjacent in memory); the block's warps split the inner domain and combine per lane",
    "columns split": "columns -- 32 adjacent outer indices per block, one per lane (their elements are "
                     "adjacent in memory), the inner domain split over gridDim.y blocks; each block's "
                     "warps split its slice and combine per lane, the last slice's block combines the slices",
    "full": "full reduction, many blocks -- the grid strides over the inner domain; the last block "
            "to finish combines the blocks' partials and runs the epilogue",
    "scan": cuda_scan.STRATEGY,
    "scan_columns": cuda_scan.COLUMNS_STRATEGY,
    "single": "full reduction, one block -- its threads stride over the inner domain in every loop",
}


def strategy(kernel: Kernel) -> str:
    """'pointwise', or 'tiles' where some access is transposed (cuda_tiles.py); 'rows' or
    'columns' (an outer domain with reductions, a block per row or per 32 rows); 'full' (many
    blocks, combined by the last) or 'single' (one block); 'scan' or 'scan_columns' (a block per
    row, or per 32 rows whose elements are adjacent)."""
    if kernel.scans:  # codegen/cuda_scan.py
        return "scan_columns" if adjacent_rows(kernel) and not chained(kernel.loop_values(1)) else "scan"
    if kernel.n_loops == 0:
        return "tiles" if staged_accesses(kernel) else "pointwise"
    if kernel.outer:  # (chunked kernels and reductions over the rows: a block per row)
        return "columns" if adjacent_rows(kernel) and not kernel.chunks and not kernel.row_reductions else "rows"
    return "full" if multi_block(kernel) else "single"


def multi_block(kernel: Kernel) -> bool:
    """Can a full reduction run on many blocks? Partials travel through a float64 workspace, so one
    loop of float or bool reductions, no arg-reductions (as codegen/triton_loops.py's multi_program)."""
    return (kernel.n_loops == 1 and not kernel.outer
            and all(v.arg.op not in (Op.ARGMAX, Op.ARGMIN) and (v.srcs[0].dtype.is_float or v.srcs[0].dtype.is_bool)
                    for v in kernel.reductions))


def split_columns(kernel: Kernel) -> bool:
    """May a 'columns' kernel split its reduced dim over blocks (gridDim.y slices), the last
    slice's block of each group of 32 columns combining the slices' partials? One loop of float
    or bool reductions (partials travel as float64, as a full reduction's), whose stores, if
    any, are each slice's own elements (a bias gradient beside the gradient it sums)."""
    return (strategy(kernel) == "columns" and kernel.n_loops == 1 and kernel.segment_length is None
            and bool(kernel.reductions)
            and all(v.arg.op not in (Op.ARGMAX, Op.ARGMIN) and (v.srcs[0].dtype.is_float or v.srcs[0].dtype.is_bool)
                    for v in kernel.reductions))


def split_rows(kernel: Kernel) -> bool:
    """May a 'rows' kernel split each row over blocks (gridDim.y slices, interleaved by loop
    steps), the last of a row's blocks combining their partials? As ``split_columns``: one loop
    of float or bool reductions, whose stores, if any, are each slice's own elements. No run
    partials (chunks), reductions over all rows or ragged rows, which have their own blocks'
    bookkeeping. The launcher splits only few long rows (runtime/cuda_launch.py: row_slices):
    a BatchNorm's per-channel sums over an NCHW activation, 64 rows of 800K."""
    return (strategy(kernel) == "rows" and kernel.n_loops == 1 and not kernel.chunks
            and not kernel.row_reductions and kernel.segment_length is None and bool(kernel.reductions)
            and all(v.arg.op not in (Op.ARGMAX, Op.ARGMIN) and (v.srcs[0].dtype.is_float or v.srcs[0].dtype.is_bool)
                    for v in kernel.reductions))


def uses_workspace(kernel: Kernel) -> bool:
    """Partials and a finished-blocks counter: many-block full reductions, reductions over rows,
    column sums and rows split over blocks."""
    return (strategy(kernel) == "full" or bool(kernel.row_reductions) or split_columns(kernel)
            or split_rows(kernel))


def pointwise_lanes(kernel: Kernel, part: bool = False) -> list[list[Value]] | None:
    """A pointwise kernel's independent groups of stores (codegen/triton_lanes.py: a foreach
    step's parameters), each run by a row of blocks of its own (gridDim.y: the lanes), or None.
    A combo's ``part`` (codegen/cuda_combos.py) takes lanes at any size, as Triton's do."""
    if strategy(kernel) != "pointwise":
        return None
    return lanes_of(kernel, min_elements=0) if part else lanes_of(kernel)


def lane_plan(kernel: Kernel, values: list[Value]) -> VectorPlan | None:
    """The vector form of one lane of a pointwise kernel: its own buffers' alignment decides it."""
    return plan_loop(kernel, values, kernel.outer, inner=False)


def vector_plan(kernel: Kernel, loop: int, most: int | None = None) -> VectorPlan | None:
    """The vector form of loop ``loop`` of ``kernel`` (0: a pointwise kernel's one loop), or None.
    Column kernels' lanes take rows, not consecutive elements: they keep the scalar loops.
    ``most``: the widest group allowed."""
    kind = strategy(kernel)
    if kind == "pointwise":
        return plan_loop(kernel, kernel.values, kernel.outer, inner=False, most=most) if loop == 0 else None
    if kind in ("columns", "scan", "scan_columns") or loop == 0:
        return None
    stores = [v for v in kernel.values if v.kind == "store" and v.inner and v.loop == loop]
    return plan_loop(kernel, kernel.loop_values(loop) + stores, kernel.inner, inner=True, peel=kind == "rows",
                     most=most)


def kernel_row_forms(kernel: Kernel) -> RowForms:
    """A row kernel's loop plans and what its rows keep in registers (cuda_vectors.row_forms).
    A chunked kernel's loops take one group width, the narrowest of theirs: its run partials
    add up in registers only where a thread's groups are the same elements in every loop, and
    otherwise those loops go scalar, adding every row into the partials in memory (a GPT's
    LayerNorm and its backward, bf16 loads in 8s and float32 stores in 4s: 7x Triton's time)."""
    plans = {i: p for i in range(1, kernel.n_loops + 1) if (p := vector_plan(kernel, i)) is not None}
    widths = {p.width for p in plans.values()}
    if kernel.chunk_stores and len(widths) > 1:
        narrowest = min(widths)
        plans = {i: p for i in range(1, kernel.n_loops + 1) if (p := vector_plan(kernel, i, narrowest)) is not None}
    return row_forms(kernel, plans, REDUCTION_THREADS * UNROLL)


def row_groups(kernel: Kernel, width: int | None = None) -> bool:
    """May the kernel's short rows go several to a block, a group of fewer than 32 threads each
    (blockDim.x threads a row, blockDim.y rows)? Not where a block's threads work on one run of
    rows together (a chunked kernel's column sums). Nor where the rows are statically too long
    for it (the launcher's rule, runtime/cuda_launch.py: plan_launch): their reductions then
    skip the groups' branch, whose registers cost a 4096-wide softmax a block per SM.
    ``width``: the kernel's ``vector_width``, where the caller has it (planning it again costs
    milliseconds of sympy per kernel)."""
    if strategy(kernel) != "rows" or kernel.chunks:
        return False
    inner = sh.numel(kernel.inner)
    if not inner.is_number or kernel.segment_length is not None:
        return True
    return row_threads(int(inner), vector_width(kernel) if width is None else width) < 32


def row_threads(inner: int, vector: int) -> int:
    """Threads a row of ``inner`` elements asks for (before rounding to a block): each thread at
    least two unrolled steps of it, or, in groups of ``vector`` elements, one step covering the
    row (its loops then read the row once, runtime/cuda_launch.py: plan_launch)."""
    return -(-inner // (UNROLL * vector if vector > 1 else 2 * UNROLL))


def vector_width(kernel: Kernel, forms: RowForms | None = None) -> int:
    """The widest group of any of the kernel's loops (1: no vector form); the launch sizes its
    blocks and grid by it. ``forms``: a row kernel's ``kernel_row_forms``, where the caller has
    them."""
    kind = strategy(kernel)
    if kind == "rows":
        plans = list((forms or kernel_row_forms(kernel)).plans.values())
    elif kind == "pointwise" and (lanes := pointwise_lanes(kernel)):
        plans = [p for p in (lane_plan(kernel, values) for values in lanes) if p is not None]
    else:
        loops = [0] if kind == "pointwise" else range(1, kernel.n_loops + 1)
        plans = [p for p in map(lambda i: vector_plan(kernel, i), loops) if p is not None]
    return max((p.width for p in plans), default=1)


def launch_meta(kernel: Kernel) -> dict[str, Any]:
    """What the launcher needs: the strategy, the outer/inner element counts as Python expressions
    of the size symbols, the argument counts, and the entry points (32- and 64-bit indices)."""
    kind = strategy(kernel)
    width = items_per_thread(kernel) if kind == "scan" else vector_width(kernel)
    outer, inner = tile_counts(kernel) if kind == "tiles" else (sh.numel(kernel.outer), kernel.inner_hint)
    return {
        "strategy": kind,
        "outer": pexpr(outer),
        "inner": pexpr(inner),
        "sizes": [s.name for s in kernel.sizes],
        "float_sizes": [sh.is_float_symbol(s) for s in kernel.sizes],  # (doubles: x.item() of floats)
        "n_params": len(kernel.params),
        "n_reductions": len(kernel.reductions) + len(kernel.row_reductions),
        "workspace": uses_workspace(kernel),
        "split_columns": split_columns(kernel),
        "split_rows": split_rows(kernel),
        "row_reductions": len(kernel.row_reductions),
        "chunks": kernel.chunks,
        "row_groups": row_groups(kernel, width),
        "max_threads": {"pointwise": POINTWISE_THREADS, "tiles": LANES * TILE_ROWS}.get(kind, REDUCTION_THREADS),
        "vector": width,
        "lanes": len(pointwise_lanes(kernel) or ()) or 1,  # (gridDim.y of a pointwise kernel in lanes)
        "kernels": {"i32": kernel.name, "i64": f"{kernel.name}_i64"},
        **({"tile": tile_side(kernel)} if kind == "tiles" else {}),
    }
