"""Launch geometry of the CUDA backend's kernels (runtime/cuda_backend.py): blocks sized so each
thread has a few unrolled steps, grids that stride over tiles in at most WAVES waves of the device,
short rows several to a block, and few long rows or columns split over blocks (gridDim.y). Pure
arithmetic on sizes and the device's SM count and occupancy: tests check it on any machine."""

from __future__ import annotations

from collections.abc import Callable

from ..codegen import cuda, cuda_scan
from ..codegen.cuda_plan import row_threads

BLOCKS_PER_SM = 32               # resident blocks per SM on Hopper/Ampere (bounds the grids below)
THREADS_PER_SM = 2048


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# A grid-stride kernel gives each block one tile (a row, or a pointwise block's iteration) while
# the tiles fill at most this many waves of the device; more tiles go several to a block.
WAVES = 16


def balanced_grid(tiles: int, resident: int) -> int:
    """Blocks for ``tiles`` tiles of work when the device runs ``resident`` blocks at once.

    A grid of one wave gives each block tiles/resident tiles in turn; where that does not divide,
    the blocks with one tile more keep the GPU busy a whole tile longer with most SMs idle (8-9%
    of softmax over 16384 rows of 4096, measured on an H100). One tile per block lets the
    hardware hand the next tile to whichever SM frees up first. Past WAVES waves of tiles, each
    block takes the fewest tiles that keep the grid there: the last tiles then cost at most
    about 1/WAVES of the kernel."""
    per_block = max(1, tiles // (max(1, resident) * WAVES))
    return max(1, cdiv(tiles, per_block))


SLICE_ROWS = 256  # the shortest slice of a split column kernel's inner domain


def column_slices(outer: int, inner: int, sms: int) -> int:
    """Slices of a column kernel's inner domain, a block each (gridDim.y): with fewer groups of 32
    rows than two per SM, enough for about four blocks per SM, at most 256, each slice at least
    SLICE_ROWS long. A bias gradient's sums over 8192 rows of 4096 columns were 128 blocks; a
    channels_last BatchNorm's backward sums over 64 channels (2 groups) of 800K rows, in 64
    slices, were 128 blocks of 16 warps, one an SM (ResNet-18 step, bf16, H200: 1869 us in
    those kernels, where Triton's, in 256 slices, took 652)."""
    groups = cdiv(outer, 32)
    if groups >= 2 * sms:
        return 1
    slices = min(_pow2_ceil(cdiv(4 * sms, groups)), 256)
    while slices > 1 and inner < slices * SLICE_ROWS:
        slices //= 2
    return slices


SLICE_ELEMENTS = 8192  # the shortest slice of a split row


def row_slices(outer: int, inner: int, sms: int) -> int:
    """Slices of each row of a row kernel, a block each (gridDim.y): with fewer rows than two per
    SM, enough for about four blocks per SM, at most 64, each slice at least SLICE_ELEMENTS
    long. A BatchNorm's sums over a (64, 64, 112, 112) activation were 64 blocks on 132 SMs,
    each walking 800K elements."""
    if outer >= 2 * sms or outer == 0:
        return 1
    slices = min(_pow2_ceil(cdiv(4 * sms, outer)), 64)
    while slices > 1 and inner < slices * SLICE_ELEMENTS:
        slices //= 2
    return slices


def plan_launch(strategy: str, outer: int, inner: int, sms: int, max_threads: int,
                vector: int = 1, occupancy: Callable[[int], int] | None = None,
                row_groups: bool = False, tile: int = 64,
                split: bool = False, lanes: int = 1) -> tuple[bool, int | tuple[int, int], int | tuple[int, int]]:
    """(64-bit indices?, grid, block) of one launch. Blocks are powers of two from 32 threads up to
    the kernel's limit, sized so that each thread has a few unrolled steps of work (of ``vector``
    elements each, where the kernel has a vector form); grids stride. ``occupancy(block)``: the
    blocks of that size the device runs at once, by the kernel's registers (the driver's
    occupancy); without it (or where it gives 0), by threads and blocks per SM alone.
    ``row_groups``: a row kernel whose short rows may go several to a block; the block is then
    (threads a row, rows a block) where a row needs fewer than 32 threads. ``tile``: a tiled
    kernel's tile side (codegen/cuda_tiles.py). ``split``: a column kernel that may split its
    inner domain into slices (codegen/cuda_plan.py: split_columns), or a row kernel its rows
    (split_rows); its grid is then (groups of 32 rows, or rows, then slices) where
    ``column_slices`` or ``row_slices`` gives more than one. ``lanes``: a pointwise kernel's
    independent lanes (codegen/cuda_plan.py: pointwise_lanes), a row of blocks each (gridDim.y),
    which share the device."""
    big = outer * inner >= 2**31
    limit = max(32, min(_pow2_floor(max_threads), cuda.REDUCTION_THREADS))
    step = cuda.UNROLL * vector  # elements a thread takes per iteration

    def threads(elements: int, most: int = limit) -> int:
        return min(max(32, _pow2_ceil(elements)), most)

    def resident(block: int) -> int:  # blocks of this size the whole device holds at once
        return (occupancy(block) if occupancy else 0) or sms * min(BLOCKS_PER_SM, THREADS_PER_SM // block)

    if strategy == "combo":  # independent kernels in one launch: their blocks (codegen/cuda_combos.py)
        return big, outer, threads(cuda.POINTWISE_THREADS, min(limit, cuda.POINTWISE_THREADS))
    if strategy == "pointwise":
        block = threads(cuda.POINTWISE_THREADS, min(limit, cuda.POINTWISE_THREADS))
        if lanes > 1:
            return big, (balanced_grid(cdiv(outer, block * step), max(1, resident(block) // lanes)), lanes), block
        return big, balanced_grid(cdiv(outer, block * step), resident(block)), block
    if strategy == "tiles":  # outer rows by inner columns, in square tiles of a fixed block each
        tiles = cdiv(outer, tile) * cdiv(inner, tile)
        return big, balanced_grid(tiles, resident(cuda.LANES * cuda.TILE_ROWS)), (cuda.LANES, cuda.TILE_ROWS)
    if strategy == "rows":  # one row per block: at least two unrolled steps per thread; in groups,
        # one step covering the row where the block can (its loops then read the row once)
        slices = row_slices(outer, inner, sms) if split else 1
        if slices > 1:  # few long rows: each over several blocks, a slice of its loop steps each
            block = threads(row_threads(cdiv(inner, slices), vector))
            return big, (balanced_grid(outer, resident(block)), slices), block
        need = row_threads(inner, vector)
        if row_groups and need < 32:  # short rows: a group of lanes each, ROW_GROUP_THREADS a block
            group, total = _pow2_ceil(need), min(cuda.ROW_GROUP_THREADS, limit)
            return big, balanced_grid(cdiv(outer, total // group), resident(total)), (group, total // group)
        block = threads(need)
        return big, balanced_grid(outer, resident(block)), block
    if strategy == "scan":  # a block per row, ``vector`` elements a thread per chunk (codegen/cuda_scan.py)
        block = threads(cdiv(inner, vector))
        return big, balanced_grid(outer, resident(block)), block
    if strategy == "scan_columns":  # 32 rows per block, a warp per segment of at least 32 of the scanned dim
        block = 32 * min(max(1, _pow2_floor(max(1, inner // 32))), cuda_scan.COLUMN_SEGMENTS, limit // 32)
        return big, balanced_grid(cdiv(outer, 32), resident(block)), block
    if strategy == "columns":  # 32 rows per block, warps split the inner domain (or its slice)
        slices = column_slices(outer, inner, sms) if split else 1
        block = 32 * min(max(1, _pow2_ceil(cdiv(cdiv(inner, slices), 4 * cuda.COLUMN_UNROLL))), limit // 32)
        grid = max(1, min(cdiv(outer, 32), resident(block)))
        return big, (grid, slices) if slices > 1 else grid, block
    block = threads(cdiv(inner, step))
    if strategy == "full":  # a full device of blocks, at most MAX_BLOCKS partials to combine
        return big, max(1, min(cdiv(inner, block * step), resident(block), cuda.MAX_BLOCKS)), block
    return big, 1, block  # 'single': one block runs every loop
