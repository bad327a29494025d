"""CPU scatters that add: each thread adds only into the rows (or lines) it owns, no atomics.

An embedding's backward (index_put with accumulate, index_add, scatter_add of rows, an
embedding bag's) adds each source row into the destination row its index names. Threads that
split the source rows must add atomically (a compare-and-swap loop per float element on x86),
and one element at a time. Here every thread walks all source rows instead, computing only
their indices, and adds the rows whose destination it owns (destination row modulo the team):
each destination element is written by one thread, in source order (deterministic), and a row's
columns go in one simd loop.

    #pragma omp parallel
    for o0:                                  # every source row, in every thread
        <the row's index: its load, check, a bag's search>
        if (destination row % team != this thread) continue
        for o1 (simd): dst[row start + o1] += value

A scatter of single elements (``x.index_put((i, j), v, accumulate=True)``, a 1-d scatter_add)
goes the same way, each thread owning the destination's 64-byte lines in turn: every
destination element then holds the serial sum in source order, the same every call, where
atomics added in the order the threads came. Each thread reads every index, so on many cores a
scatter into many destinations costs about a serial pass (eager's CPU kernel is serial too);
ten bins of a million values took 3.3 ms here against 10-20 ms with contended atomics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from ..ir import dtypes as dt
from ..schedule.kernel_ir import Kernel, outer_var
from .cexpr import index_expr
from .layout import group_invariant, unit_step

if TYPE_CHECKING:
    from .cpp import CppKernelRenderer

# destination dtypes a plain += adds as the atomics did (16-bit results accumulate in float32)
_ADDED = frozenset({dt.float32, dt.float64, dt.int32, dt.int64})


# Elements of a scatter of single elements go to threads by the 64-byte line of their destination:
# threads adding into the same line would pass it back and forth between their caches.
LINE_BYTES = 64


def owned_elements(kernel: Kernel) -> bool:
    """Is ``kernel`` a pointwise scatter whose one store adds (index_put's +=) at an index that
    its loaded indices decide, into a destination a plain += adds to? (Its threads then add
    only into the lines they own, in source order, where atomics added in whatever order the
    threads came: a float result changed from call to call.)"""
    if kernel.n_loops or kernel.dots:
        return False
    stores = [v for v in kernel.values if v.kind == "store"]
    if len(stores) != 1 or stores[0].arg.accumulate is not True or not stores[0].arg.bindings:
        return False
    dtypes = {p.name: p.dtype for p in kernel.params}
    return dtypes[stores[0].arg.buffer] in _ADDED


def owned_rows(kernel: Kernel) -> bool:
    """Is ``kernel`` a pointwise scatter of whole rows? Its one store adds (index_put's +=) at an
    index that steps by one along the last outer dim, whose indirect part (the destination row)
    is the same along it."""
    if len(kernel.outer) < 2 or not owned_elements(kernel):
        return False
    (store,) = [v for v in kernel.values if v.kind == "store"]
    column = outer_var(len(kernel.outer) - 1)
    fixed = group_invariant(kernel, kernel.values, column)
    return all(id(s) in fixed for s in store.srcs[1:]) and unit_step(store.arg.index, column)


def render_owned_rows(r: CppKernelRenderer, condition: str) -> None:
    """``owned_rows`` kernel ``r.k``'s body, through the kernel renderer ``r``."""
    k, body = r.k, r.body
    n = len(k.outer)
    column = outer_var(n - 1)
    (store,) = [v for v in k.values if v.kind == "store"]
    fixed = group_invariant(k, k.values, column)
    per_row = [v for v in k.values if id(v) in fixed]
    per_element = [v for v in k.values if id(v) not in fixed and v is not store]
    start = sympy.sympify(body.bound_index(store)).subs(column, 0)
    width = index_expr(k.outer[-1])
    # destination rows apart: the first index's coefficient (a row's stride), so that rows go
    # to threads in turn
    spacing = sympy.expand(sympy.sympify(store.arg.index)).coeff(store.arg.bindings[0])
    spacing = index_expr(spacing) if spacing.is_positive else width
    r.emit("// a scatter of whole rows: every thread walks every source row and adds the rows whose")
    r.emit("// destination it owns (row % threads): no atomics, and a row's columns in one simd loop")
    _open_region(r, condition)
    r._open_loops(outer_var, k.outer[:-1])
    r._statements(per_row)
    r.emit(f"const int64_t ember_start = {index_expr(start)};  // where this row's columns go")
    r.emit(f"if ((ember_start / std::max<int64_t>({spacing}, 1)) % ember_team != ember_me) continue;")
    r.emit("#pragma omp simd")
    c = column.name
    r.emit(f"for (int64_t {c} = 0; {c} < {width}; ++{c}) {{")
    r.depth += 1
    r._statements(per_element)
    dtype = body.buffer_dtype[store.arg.buffer]
    ctype = body.lang.storage[dtype]
    r.emit(f"{store.arg.buffer}[ember_start + {c}] += ({ctype}){body.name(store.srcs[0])};")
    r._close_loops(n)
    r.depth -= 1
    r.emit("}")


def render_owned_elements(r: CppKernelRenderer, condition: str) -> None:
    """``owned_elements`` kernel ``r.k``'s body (not one of whole rows), through ``r``: every
    thread walks every source element and adds those whose destination line it owns."""
    k, body = r.k, r.body
    (store,) = [v for v in k.values if v.kind == "store"]
    dtype = body.buffer_dtype[store.arg.buffer]
    per_line = max(1, LINE_BYTES // dtype.itemsize)
    r.emit("// a scatter of elements: every thread walks every source element and adds those whose")
    r.emit(f"// destination's line ({per_line} elements) it owns: no atomics, each destination's adds in source order")
    _open_region(r, condition)
    r._open_loops(outer_var, k.outer)
    r._statements([v for v in k.values if v is not store])
    r.emit(f"const int64_t ember_at = {index_expr(body.bound_index(store))};")
    r.emit(f"if ((ember_at / {per_line}) % ember_team == ember_me) {{")
    r.emit(f"  {store.arg.buffer}[ember_at] += ({body.lang.storage[dtype]}){body.name(store.srcs[0])};")
    r.emit("}")
    r._close_loops(len(k.outer))
    r.depth -= 1
    r.emit("}")


def _open_region(r: CppKernelRenderer, condition: str) -> None:
    """Opens the parallel region every thread of an owned scatter walks all sources in: its
    team size and number, and its own search hints."""
    r.emit(f"#pragma omp parallel if({condition})")
    r.emit("{")
    r.depth += 1
    r.emit("const int64_t ember_team = omp_get_num_threads(), ember_me = omp_get_thread_num();")
    for hint in r.hints:
        r.emit(f"int64_t {hint} = 0;  // (each thread's own)")
