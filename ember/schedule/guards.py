"""Conditional execution: values only a ``where``'s untaken branch needs are not computed.

``torch.where(c, a, b)`` evaluates both branches in eager. Inside a fused kernel, the values that
feed only branch ``a`` are dead wherever ``c`` is false (and those feeding only ``b`` wherever it
is true): this analysis gives each such value a ``guard``, a bool value that must be true for it
to matter. Renderers then skip the work: C-style kernels compute guarded values inside
``if (guard) { ... }`` blocks, Triton masks their loads. The result is bit for bit the same, NaN
and inf included, because the skipped values are never selected.

Where a value feeds several guarded places, its guard is their union (an OR, up to
``MAX_GUARDS`` of them). A value stays unguarded when anything else uses it: a store, a
reduction, an index check (eager raises for an out-of-range index even in the untaken branch), an
integer division or remainder (eager raises for a zero divisor there too), or a where's
condition. The padded GIoU loss (``loss * mask``) becomes a where, and so gets skipped, through
``passes/masks.py`` when the ``skip_masked`` option asks for it.
"""

from __future__ import annotations

import heapq
import re

import sympy

from ..ir import dtypes as dt
from ..ir.ops import Op
from .kernel_ir import Kernel, Value, stage_needs

# More distinct guards than this over one value's users: computing it everywhere is cheaper than
# the OR chain deciding where.
MAX_GUARDS = 4

# Cheap to compute anywhere: never worth a guard.
_FREE_KINDS = frozenset({"const", "index"})
_NEVER_GUARDED = frozenset({"store", "reduce", "chunksum", "rowreduce", "checkindex", "scan"})
RAISING_ALU = frozenset({Op.FLOORDIV, Op.TRUNCDIV, Op.MOD, Op.FMOD})  # on integers, by zero


def guard_branches(kernel: Kernel) -> Kernel:
    """Set ``Value.guard`` on every value of ``kernel`` that only untaken ``where`` branches use.
    Adds the NOT and OR values the guards need (in place; returns the kernel)."""
    values = kernel.values
    if not any(v.kind == "alu" and v.arg is Op.WHERE for v in values):
        return kernel
    # order keys: original values (i, 0); a value added after original i gets (i, k), k > 0
    key = {id(v): (i, 0) for i, v in enumerate(values)}
    added: list[Value] = []
    made: dict[tuple, Value] = {}
    users: dict[int, list[tuple[Value, int]]] = {id(v): [] for v in values}
    for v in values:
        for i, s in enumerate(v.srcs):
            users[id(s)].append((v, i))

    def derived(op: Op, srcs: tuple[Value, ...]) -> Value:
        memo = (op, *(id(s) for s in srcs))
        if memo not in made:
            inner = any(s.inner for s in srcs)
            stage = max(s.stage for s in srcs)
            v = Value("alu", dt.bool_, srcs, op, inner=inner, stage=0 if inner else stage)
            last = max(key[id(s)] for s in srcs)
            key[id(v)] = (last[0], len(added) + 1)
            added.append(v)
            made[memo] = v
        return made[memo]

    def negation(c: Value) -> Value:
        if c.kind == "alu" and c.arg is Op.NOT:
            return c.srcs[0]
        return derived(Op.NOT, (c,))

    def wanted(v: Value) -> Value | None:
        """The condition under which anything uses ``v``, or None: always."""
        conds: list[Value] = []
        for u, i in users[id(v)]:
            if u.guard is not None:
                c = u.guard
            elif u.kind == "alu" and u.arg is Op.WHERE and i > 0:
                c = u.srcs[0] if i == 1 else negation(u.srcs[0])
            else:
                return None
            if all(c is not d for d in conds):
                conds.append(c)
        if not conds or len(conds) > MAX_GUARDS:
            return None
        if any(negation(c) in conds for c in conds if c.dtype.is_bool):
            return None  # both branches: always wanted
        guard = conds[0]
        for c in conds[1:]:
            guard = derived(Op.OR, (guard, c))
        return guard

    needs = stage_needs()
    invariant = invariant_values(values)
    for v in reversed(values):
        if v.kind in _NEVER_GUARDED or v.kind in _FREE_KINDS or v is kernel.segment_length:
            continue
        if id(v) in invariant:
            continue
        if v.kind == "alu" and v.arg in RAISING_ALU and not v.dtype.is_float:
            continue
        g = wanted(v)
        if g is None or not g.dtype.is_bool or _depends(g, v):
            continue
        if g.inner and not v.inner or not v.inner and g.stage > v.stage:
            continue  # an outer value cannot wait for a per-element or later condition
        if v.inner and needs(g) > needs(v):
            continue  # every inner loop computing the value must be able to compute the guard
        if not v.inner and any(u.inner or u.stage != v.stage for u, _ in users[id(v)]):
            continue  # outer values are guarded only within their own stage
        v.guard = g
    used = {id(v.guard) for v in values if v.guard is not None}
    needed = _closure([v for v in added if id(v) in used])
    kernel.values = _ordered(values + [v for v in added if id(v) in needed], key)
    return kernel


def invariant_values(values: list[Value]) -> set[int]:
    """Values the same at every element: constants, loads at an index of no loop variable (a
    scalar loss's gradient), arithmetic of them. A guard would save a few scalar ops, and a load
    inside the branch left GCC's loop scalar ("no vectype": a weight's masked gradient); the C++
    backend computes them once, before its loops (codegen/cpp_split.py: loop_invariants)."""
    out: set[int] = set()
    for v in values:
        if (v.kind == "const"
                or v.kind == "load" and not v.srcs and not any(_LOOP_VAR.fullmatch(s.name)
                                                               for s in sympy.sympify(v.arg.index).free_symbols)
                or v.kind == "alu" and v.srcs and all(id(s) in out for s in v.srcs)):
            out.add(id(v))
    return out


# the kernel IR's loop variables (schedule/kernel_ir.py): outer, inner, indirect, run, row length
_LOOP_VAR = re.compile(r"o\d+|r\d+|ind\d+|ember_chunk|ember_seglen")


def _edges(v: Value) -> tuple[Value, ...]:
    """What must be computed before ``v``: its sources and its guard."""
    return v.srcs if v.guard is None else (*v.srcs, v.guard)


def _closure(roots: list[Value]) -> set[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if id(v) not in seen:
            seen.add(id(v))
            stack.extend(_edges(v))
    return seen


def _depends(g: Value, v: Value) -> bool:
    """Does computing ``g`` need ``v`` (then ``g`` cannot decide whether to compute ``v``)?"""
    return id(v) in _closure([g])


def _ordered(values: list[Value], key: dict[int, tuple[int, int]]) -> list[Value]:
    """Topological order with guards counted as inputs, otherwise as close to ``key`` as can be:
    a guard may come later than the values it guards in the builder's order."""
    pending = {id(v): sum(1 for _ in _edges(v)) for v in values}
    users: dict[int, list[Value]] = {id(v): [] for v in values}
    for v in values:
        for s in _edges(v):
            users[id(s)].append(v)
    heap = [(key[id(v)], i, v) for i, v in enumerate(values) if pending[id(v)] == 0]
    heapq.heapify(heap)
    index = {id(v): i for i, v in enumerate(values)}
    out: list[Value] = []
    while heap:
        _, _, v = heapq.heappop(heap)
        out.append(v)
        for u in users[id(v)]:
            pending[id(u)] -= 1
            if pending[id(u)] == 0:
                heapq.heappush(heap, (key[id(u)], index[id(u)], u))
    assert len(out) == len(values), "guards formed a cycle"
    return out
