"""The CUDA C++ backend's transposed pointwise kernels: 2D tiles staged through shared memory.

A pointwise kernel some of whose accesses run along its second-to-last dimension (codegen/layout.py:
``x.t() * 2``, ``x.mT + y``, a permute copy) runs in square tiles (the leading dims,
flattened, by the last dim; 64 x 64 for large kernels where shared memory allows, else 32 x 32),
a block of LANES x TILE_ROWS threads each, blocks striding over the tiles. Each of those
accesses gets a shared-memory tile of its own:

1. the block reads each transposed input's tile with its lanes along the rows, where that input
   is contiguous, into shared memory;
2. the kernel's statements run with the lanes along the columns, where every other access is
   contiguous, the transposed inputs read from (and the transposed outputs written to) their
   shared tiles, each element at its own (row, column);
3. the block writes each transposed output's tile with its lanes along the rows.

Tiles are padded past their side (``_pad``), so a warp reading down a column of one touches 32
different shared-memory banks.
"""

from __future__ import annotations

from typing import Protocol

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Value, outer_var
from .cstyle import BodyRenderer
from .layout import transposed_accesses

LANES = 32             # blockDim.x: the lanes of a warp, along one side of the tile
TILE_ROWS = 8          # blockDim.y
TILES = (64, 32)       # tile sides, the largest whose shared memory fits first
TILE_SMEM_BYTES = 40 * 1024  # at most this much static shared memory for the tiles (48 KB the limit)
LARGE = 1 << 25        # elements from which a static kernel takes tiles of 64 (symbolic ones always)


def _pad(itemsize: int) -> int:
    """Elements past a tile's side in each of its rows, so that a warp reading down a column
    (row stride: an odd number of 4-byte words) touches 32 different banks (8-byte elements,
    two words each, two lanes a bank)."""
    return max(1, 4 // itemsize)


def staged_accesses(kernel: Kernel) -> list[Value]:
    """The accesses a kernel stages through shared-memory tiles; none where it has no transposed
    access or their tiles would not fit in TILE_SMEM_BYTES (it then runs as a plain pointwise
    kernel)."""
    staged = transposed_accesses(kernel)
    return staged if staged and tile_side(kernel, staged) else []


def tile_side(kernel: Kernel, staged: list[Value] | None = None) -> int:
    """The side of the kernel's square tiles, 0 where its tiles fit in no side's shared memory.
    64 where they fit and the kernel is large (each thread then has 16 elements of each access
    in flight: 2-byte elements 4 at a time are too few to cover the memory's latency), else 32.
    H100, bf16, kernel us, 64 against 32: an 8192 x 8192 transpose 118.5 against 129.2, a
    (64, 1000, 1024) permute 107.0 against 119.9; but x.mT + y over 64 x 512 x 512 (16M
    elements, 4096 tiles of 64: four waves of the GPU's blocks) 70.4 against 60.8."""
    staged = transposed_accesses(kernel) if staged is None else staged
    dtypes = {p.name: p.dtype for p in kernel.params}
    numel = sh.expr(sh.numel(kernel.outer))
    large = not numel.is_Integer or int(numel) >= LARGE
    for side in TILES if large else TILES[1:]:
        size = sum(side * (side + _pad(dtypes[v.arg.buffer].itemsize)) * dtypes[v.arg.buffer].itemsize
                   for v in staged)
        if size <= TILE_SMEM_BYTES:
            return side
    return 0


class _Renderer(Protocol):  # what this module needs of codegen/cuda.py's CudaKernelRenderer
    k: Kernel
    body: BodyRenderer

    def emit(self, line: str) -> None: ...
    def open(self, line: str) -> None: ...
    def close(self, n: int = 1) -> None: ...
    def _count(self, name: str, extents: tuple, what: str) -> None: ...
    def _decompose(self, flat: str, extents: tuple, var) -> None: ...
    def _statements(self, values: list[Value]) -> None: ...


def render_tiles(r: _Renderer, staged: list[Value], storage: dict) -> None:
    """The body of a tiled kernel (see the module docstring); ``storage``: C storage types by dtype."""
    k = r.k
    side = tile_side(k, staged)
    tiles = {id(v): f"ember_tile{i}" for i, v in enumerate(staged)}
    for v in staged:
        dtype = r.body.buffer_dtype[v.arg.buffer]
        what = "read" if v.kind == "load" else "written"
        r.emit(f"__shared__ {storage[dtype]} {tiles[id(v)]}[{side}][{side + _pad(dtype.itemsize)}];"
               f"  // {v.arg.buffer}, {what} along the rows")
    r._count("ember_rows", k.outer[:-1], "rows: the leading dims, flattened")
    r._count("ember_cols", k.outer[-1:], "columns: the last dim")
    r.emit(f"const I ember_col_tiles = (ember_cols + {side - 1}) / {side};")
    r.emit(f"const I ember_tiles = (ember_rows + {side - 1}) / {side} * ember_col_tiles;")
    r.emit("// blocks stride over the tiles")
    r.open("for (I ember_t = blockIdx.x; ember_t < ember_tiles; ember_t += gridDim.x) {")
    r.emit(f"const I ember_row0 = ember_t / ember_col_tiles * {side}, ember_col0 = ember_t % ember_col_tiles * {side};")
    loads = [v for v in staged if v.kind == "load"]
    stores = [v for v in staged if v.kind == "store"]
    # element (row0 + a, col0 + b) of a tile lives at [b][a]; a phase's lane takes a = lane or b = lane
    along_rows = "[threadIdx.y + ember_j][threadIdx.x + ember_l]"
    along_cols = "[threadIdx.x + ember_l][threadIdx.y + ember_j]"
    if loads:
        _phase(r, side, "the transposed inputs' tiles, lanes along the rows", True,
               lambda: [r.emit(f"{tiles[id(v)]}{along_rows} = {r.body.access(v)};") for v in loads])
        r.emit("__syncthreads();")
    for v in staged:
        r.body.vector_access[id(v)] = f"{tiles[id(v)]}{along_cols}"
    _phase(r, side, "the statements, lanes along the columns", False, lambda: r._statements(k.values))
    r.body.vector_access.clear()
    if stores:
        r.emit("__syncthreads();")
        _phase(r, side, "the transposed outputs' tiles, lanes along the rows", True,
               lambda: [r.emit(f"{r.body.access(v)} = {tiles[id(v)]}{along_rows};") for v in stores])
    r.emit("__syncthreads();  // the tiles are free for the block's next tile")
    r.close()


def _phase(r: _Renderer, side: int, what: str, along_rows: bool, body) -> None:
    """A pass of the block over its tile, each thread (side / LANES) x (side / TILE_ROWS) elements
    (all loads in flight together: each is predicated, none waits on another); the lanes of a
    warp along the tile's rows or along its columns."""
    k = r.k
    lanes, others = "threadIdx.x + ember_l", "threadIdx.y + ember_j"
    row, col = (lanes, others) if along_rows else (others, lanes)
    r.emit(f"// {what}")
    r.emit("#pragma unroll")
    r.open(f"for (int ember_j = 0; ember_j < {side}; ember_j += {TILE_ROWS}) {{")
    r.emit("#pragma unroll")
    r.open(f"for (int ember_l = 0; ember_l < {side}; ember_l += {LANES}) {{")
    r.emit(f"const I ember_row = ember_row0 + {row}, ember_col = ember_col0 + {col};")
    r.open("if (ember_row < ember_rows && ember_col < ember_cols) {")
    r._decompose("ember_row", k.outer[:-1], outer_var)
    r.emit(f"const int64_t {outer_var(len(k.outer) - 1).name} = (int64_t)ember_col;")
    body()
    r.close(3)
