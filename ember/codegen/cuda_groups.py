"""CUDA C++: a strided loop's vector form, rendered (cuda_vectors.py plans it): groups of
consecutive elements, each access of the plan one 16-byte load or store a group, the group's
statements element by element on the vector's registers; and a peeled row's head and tail, an
element at a time. Functions of the kernel's renderer (codegen/cuda.py), as cuda_online.py's."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import sympy

from ..ir import dtypes as dt
from ..schedule.kernel_ir import Value, outer_var
from . import cuda_online
from .cexpr import index_expr
from .cuda_vectors import VectorPlan


def vector_groups(r: Any, flat: str, count: str, start: str, spacing: str, stride: str, what: str,
                  plan: VectorPlan, extents: tuple[sympy.Expr, ...], var: Callable[[int], sympy.Symbol],
                  body: Callable[[], None], values: list[Value] | None = None) -> None:
    """The loop over groups of ``plan.width`` consecutive elements: the plan's loads of a group
    at once, its elements' statements (reading and writing vector elements), its stores at once."""
    width = plan.width
    if plan.peel_from:
        r.emit("// groups where the row is aligned: its first elements up to one (its head) and those after")
        r.emit("// the last whole group (its tail) go an element at a time, after the groups")
        r.emit(f"const I {flat}_head_at = (I)(({width} - ({plan.peel_from}) % {width}) % {width});")
        r.emit(f"const I {flat}_head = {flat}_head_at < {count} ? {flat}_head_at : {count};")
        r.emit(f"const I {flat}_groups = ({count} - {flat}_head) / {width};")
    else:
        r.emit(f"const I {flat}_groups = {count} / {width};  // {count} is a multiple of {width} here")
    r._unrolled(f"{flat}_group", f"{flat}_groups", start, spacing, stride, what, f"groups of {width} elements")
    r.emit(f"const I {flat}_first = {f'{flat}_head + ' if plan.peel_from else ''}{flat}_group * {width};")
    first = [sympy.Symbol(f"{var(i).name}_g", integer=True, nonnegative=True) for i in range(len(extents))]
    r._decompose(f"{flat}_first", extents, lambda i: first[i])
    if var is outer_var:
        r._group_invariants(plan, extents, first, r.k.values if values is None else values)
    at_first = {var(i): first[i] for i in range(len(extents))}
    where = {id(v): f"{v.arg.buffer} + ({index_expr(sympy.sympify(r.body.bound_index(v)).xreplace(at_first))})"
             for v in plan.values}  # the group's first element
    for v in plan.values:
        ctype, name = r.body.lang.storage[r.body.buffer_dtype[v.arg.buffer]], f"{r.body.name(v)}_vec"
        if v.kind == "load":
            load = f"ember_load_vec<{ctype}, {width}>({where[id(v)]})"
            key = (v.arg.buffer, str(v.arg.index))
            if key in r.cached and r.first_loop[key] == r.loop:  # kept for later loops
                r.emit(f"const EmberVec<{ctype}, {width}> {name} = {load};")
                r.emit(f"if (ember_cached) {r.cached[key]}[ember_u] = {name};")
            elif key in r.cached:  # an earlier loop of this row read it
                reread = f"ember_reread<{r.loop}>({r.cached[key]}[ember_u])"
                r.emit(f"const EmberVec<{ctype}, {width}> {name} = ember_cached ? {reread} : {load};")
            else:
                r.emit(f"const EmberVec<{ctype}, {width}> {name} = {load};")
        else:
            r.emit(f"EmberVec<{ctype}, {width}> {name};")
        r.body.vector_access[id(v)] = f"{name}.v[ember_k]"
        if v.kind == "load" and r.body.buffer_dtype[v.arg.buffer] in (dt.bfloat16, dt.float16):
            half = "bf16" if r.body.buffer_dtype[v.arg.buffer] == dt.bfloat16 else "f16"
            r.body.staged[id(v)] = f"ember_{half}_at({name}, ember_k)"  # (a bf16 from its 32-bit word)
    for v in r.k.chunk_stores:
        if id(v) in r.kept and v.loop == r.loop:  # (this form runs under ember_cached)
            r.body.kept_partials[id(v)] = f"{r.kept[id(v)]}[ember_u][ember_k]"
    for m, _ in r.maxima:
        r.emit(f"float {cuda_online.group_slot(m, r)}[{width}];  // the group's x, for online softmax")
    r.emit("#pragma unroll")
    r.open(f"for (int ember_k = 0; ember_k < {width}; ++ember_k) {{")
    declared = len(r.lines)
    for i in range(len(extents)):
        r.emit(f"const int64_t {var(i).name} = {first[i].name}{' + ember_k' if i == len(extents) - 1 else ''};")
    r.in_group = True
    body()
    r.in_group = False
    used = "\n".join(r.lines[declared + len(extents):])  # vector elements need no position
    r.lines[declared:declared + len(extents)] = [
        line for i, line in zip(range(len(extents)), r.lines[declared:])
        if re.search(rf"\b{var(i).name}\b", used)]
    r.close()
    for m, sums in r.maxima:
        cuda_online.group_update(r, m, sums, width)
    for v in plan.values:
        if v.kind == "store":
            ctype = r.body.lang.storage[r.body.buffer_dtype[v.arg.buffer]]
            store = "ember_atomic_add_vec" if v.arg.accumulate else "ember_store_vec"
            r.emit(f"{store}<{ctype}, {width}>({where[id(v)]}, {r.body.name(v)}_vec);")
    r.body.vector_access.clear()
    r.body.staged.clear()
    r.hoisted = set()
    r.body.kept_partials.clear()
    r.close(3)
    if plan.peel_from:
        head_and_tail(r, flat, count, start, spacing, stride, plan, extents, var, body)

def head_and_tail(r: Any, flat: str, count: str, start: str, spacing: str, stride: str, plan: VectorPlan,
                  extents: tuple[sympy.Expr, ...], var: Callable[[int], sympy.Symbol],
                  body: Callable[[], None]) -> None:
    """A peeled loop's elements outside its whole groups, an element at a time: the threads
    stride over them as over a row. Where the row is kept in registers, so are they."""
    rest = f"{flat}_rest"
    r.emit(f"const I {rest} = {count} - {flat}_groups * {plan.width};  // the head and the tail")
    r._unrolled(f"{rest}_at", rest, start, spacing, stride, "the head and the tail")
    r.emit(f"const I {flat} = {rest}_at < {flat}_head ? {rest}_at : {rest}_at + {flat}_groups * {plan.width};")
    r._decompose(flat, extents, var)
    for v in plan.values:
        key = (v.arg.buffer, str(v.arg.index))
        if v.kind != "load" or key not in r.tails:
            continue
        ctype, name = r.body.lang.storage[r.body.buffer_dtype[v.arg.buffer]], f"{r.body.name(v)}_e"
        load = f"{v.arg.buffer}[{index_expr(sympy.sympify(r.body.bound_index(v)))}]"  # (a gather's too)
        if r.first_loop[key] == r.loop:
            r.emit(f"const {ctype} {name} = {load};")
            r.emit(f"if (ember_cached) {r.tails[key]}[ember_u] = {name};")
        else:
            r.emit(f"const {ctype} {name} = ember_cached ? {r.tails[key]}[ember_u] : {load};")
        r.body.vector_access[id(v)] = name
    body()
    r.body.vector_access.clear()
    r.close(3)
