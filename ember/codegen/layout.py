"""Memory layouts a pointwise kernel's accesses imply, shared by the Triton and CUDA C++ backends.

A pointwise kernel runs over its outer domain with consecutive threads (lanes) on consecutive
elements of the last dimension. An access that is contiguous along the second-to-last dimension
instead (``x.t() * 2``, ``x.mT + b``, a permute copy) then gives each lane its own 32-byte
sector: an 8192 x 8192 bf16 transpose took 538 us on an H100, at 500 GB/s. Such kernels run in
2D tiles (rows: the leading dims flattened; columns: the last dim), each access read or written
along its own contiguous dimension: Triton does that through shared memory itself, the CUDA C++
backend stages the transposed accesses through shared memory tiles (codegen/cuda_tiles.py).
"""

from __future__ import annotations

import sympy

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Value, inner_var, is_index_var, outer_var


def varies(index: sympy.Expr) -> bool:
    """Does an access's index depend on a loop variable (not a fixed element)?"""
    return any(is_index_var(s) for s in sympy.sympify(index).free_symbols)


def transposed_accesses(kernel: Kernel) -> list[Value]:
    """The loads and stores of a pointwise kernel that are contiguous along its second-to-last
    outer dimension and strided along its last; none where the kernel cannot run in tiles: with
    gathers or accumulating stores (whose indices say nothing of a layout), with reductions or
    matmuls, or with either of the two dimensions statically shorter than 16."""
    n = len(kernel.outer)
    if (n < 2 or kernel.dots or kernel.n_loops
            or any(e.is_Integer and int(e) < 16 for e in map(sh.expr, kernel.outer[-2:]))):
        return []
    last, second = outer_var(n - 1), outer_var(n - 2)
    found = []
    for v in kernel.values:
        if v.kind not in ("load", "store"):
            continue
        if v.arg.bindings or getattr(v.arg, "accumulate", False) or (v.kind == "store" and not varies(v.arg.index)):
            return []
        index = sympy.expand(sympy.sympify(v.arg.index))
        along_last, along_second = index.coeff(last), index.coeff(second)
        if along_second == 1 and along_last != 0 and along_last != 1 and not along_last.has(second, last):
            found.append(v)
    return found


def tile_counts(kernel: Kernel) -> tuple[sympy.Expr, sympy.Expr]:
    """A tiled kernel's rows (its leading dims, flattened) and columns (its last dim): the
    outer and inner counts both backends' launchers size its grid by."""
    return sh.numel(kernel.outer[:-1]), kernel.outer[-1]


def operand_layout(v: Value, row: sympy.Symbol, col: sympy.Symbol) -> tuple[str, sympy.Expr, sympy.Expr] | None:
    """How a matmul operand's load walks memory, its index affine in ``row`` and ``col``:
    ('row', offset, row stride) when its columns are contiguous, ('col', offset, column stride)
    when its rows are, else None (no contiguous dim: no TMA). Both GPU backends' matmuls."""
    e = sympy.expand(v.arg.index)
    rs, cs = e.coeff(row), e.coeff(col)
    offset = sympy.expand(e - rs * row - cs * col)
    if offset.has(row, col):
        return None
    if cs == 1:
        return ("row", offset, rs)
    if rs == 1:
        return ("col", offset, cs)
    return None


def adjacent_rows(kernel: Kernel) -> bool:
    """Do the loops' memory accesses step by one element along the last outer dimension more often
    than along the last inner one (a reduction over a leading dimension, like x.sum(0))? Then lanes
    must take adjacent rows, not adjacent elements of one row, for coalesced accesses (and on the
    CPU, SIMD lanes: codegen/cpp_columns.py)."""
    if not kernel.inner:
        return False
    o, r = outer_var(len(kernel.outer) - 1), inner_var(len(kernel.inner) - 1)
    along_rows = along_inner = 0
    for v in kernel.values:
        if v.kind in ("load", "store") and v.inner:
            along_rows += unit_step(v.arg.index, o)
            # an access the same for every row along the last outer dim (a norm's weight; a
            # bag's indices, or an embedding's (B, L) indices, read down the bag while its rows,
            # gathered at them, step along the columns) is one broadcast read a step for lanes
            # that take rows: it says nothing about the layout
            if o in sympy.sympify(v.arg.index).free_symbols:
                along_inner += unit_step(v.arg.index, r)
    return along_rows > along_inner


def unit_step(index: sympy.Expr, var: sympy.Symbol) -> bool:
    index = sympy.sympify(index)
    if var not in index.free_symbols:
        return False
    try:
        return sympy.expand(index.subs(var, var + 1) - index) == 1
    except (TypeError, ValueError, AttributeError):  # floor divisions sympy cannot shift: not a unit step
        return False


def group_invariant(kernel: Kernel, values: list[Value], var: sympy.Symbol) -> set[int]:
    """Ids of values the same for every element of a group along ``var``: outer values of a row
    loop (computed before it), and in a pointwise kernel what reads no position along ``var``
    (an embedding's row index, a bag's id found by a search; a group never straddles two rows).
    A gather or a scatter at such an index steps along ``var`` like a plain access (CUDA C++'s
    vector groups, the CPU's scatters of owned rows: cpp_scatter.py)."""
    if var.name.startswith("r"):
        return {id(v) for v in kernel.values if not v.inner}
    fixed: set[int] = set()
    for v in kernel.values:
        if v.kind == "store" or (v.guard is not None and id(v.guard) not in fixed):
            continue
        if v.kind in ("load", "index", "search") and var in position_symbols(v):
            continue
        if all(id(s) in fixed for s in v.srcs):
            fixed.add(id(v))
    return fixed


def thread_invariant(kernel: Kernel, values: list[Value]) -> set[int]:
    """Ids of a pointwise loop's values the same at every position: constants, and what they and
    loads at fixed indices of buffers the kernel does not write compute (an optimizer step's
    count and its bias corrections). A thread computes them once, before its loop, not once a
    group (GPT-2's Adam step, CUDA C++: two powf a parameter, computed for each of a thread's
    four groups, were half its instructions). Gathers, searches and guarded values stay put."""
    written = {v.arg.buffer for v in kernel.values if v.kind == "store"}
    fixed: set[int] = set()
    for v in values:
        if v.kind in ("store", "search", "checkindex") or v.guard is not None:
            continue
        if v.kind == "load" and (v.srcs or v.arg.buffer in written or varies(v.arg.index)):
            continue
        if v.kind == "index" and varies(v.arg):
            continue
        if all(id(s) in fixed for s in v.srcs):
            fixed.add(id(v))
    return fixed


def position_symbols(v: Value) -> set[sympy.Symbol]:
    if v.kind == "index":
        return sympy.sympify(v.arg).free_symbols
    if v.kind == "search":
        return set().union(*(sympy.sympify(e).free_symbols for e in (v.arg.start, v.arg.stride, v.arg.length)))
    return sympy.sympify(v.arg.index).free_symbols
