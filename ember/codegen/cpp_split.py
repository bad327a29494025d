"""CPU loops split where a guard ``i < n`` turns false: padded and ragged rows skipped for real.

A guard (schedule/guards.py) lets a kernel skip the values only a ``where``'s untaken branch
needs. In a simd loop GCC if-converts the ``if (guard)`` blocks: every lane computes everything
and the guard only selects, so the padding costs as much as the data. The common guard of padded
and ragged code is a prefix of the row: ``position < length[row]`` (the backward of a ragged
gather into (B, N) places, ``arange(N) < lengths[:, None]`` masks). Where the innermost loop's
variable ``i`` is compared with a bound ``n`` that does not vary with it, the loop is split at
``n`` (index-set splitting):

    <n's values, computed once per row>
    i_split = clamp(n, 0, extent)
    for i in [0, i_split) (simd):       <the body, the guard the constant true>
    for i in [i_split, extent) (simd):  <the body, the guard the constant false>

(``i >= n`` and ``i > n`` alike, the constants the other way round.) A guard that does not vary
along the loop at all (a mask of the row, in a loop over its features) unswitches it instead:

    if (<the guard, computed once>) for i (simd): <the body, the guard true>
    else                            for i (simd): <the body, the guard false>

Each part is the same body with the guard a constant, which GCC folds: the first computes only
the taken branch, the second only the other (the zeros of the padding). Results are the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ..ir import dtypes as dt
from ..ir.ops import Op
from ..schedule.kernel_ir import Value

# comparison -> (split at n + 1 rather than n, whether the guard holds below the split), as
# i <op> n; n <op> i is i <the mirrored op> n
_FORMS = {Op.LT: (False, True), Op.LE: (True, True), Op.GT: (True, False), Op.GE: (False, False)}
_MIRRORED = {Op.LT: Op.GT, Op.LE: Op.GE, Op.GT: Op.LT, Op.GE: Op.LE}


@dataclass
class Split:
    guard: Value           # a guard: one truth below the split point, the other from it on
    hoisted: list[Value]   # what the bound (or the guard) is computed from: before the loops
    bound: Value | None    # n, which does not vary with the loop's variable; None: the guard
    #                        itself does not, and the loop is unswitched instead (if/else)
    inclusive: bool = False  # i <= n (or i > n): the split point is n + 1
    below: bool = True       # the guard's truth below the split point (i < n: true; i >= n: false)


def find_split(values: list[Value], var: sympy.Symbol) -> Split | None:
    """A guard among ``values`` (one loop's body over ``var``) that does not vary with ``var``, or
    else one that compares ``var`` with a bound that does not; None where there is neither."""
    guards = {id(v.guard) for v in values if v.guard is not None}
    varies = _varies(var)
    # a guard the same along the whole loop (a row's mask): unswitched. Not on a negation where
    # the guard it negates will do: the loops then compute the negation from a constant too
    for g in sorted(values, key=lambda v: v.arg is Op.NOT):
        if id(g) in guards and g.kind in ("alu", "load") and g.guard is None and not varies(g):
            return Split(g, [v for v in _closure(g, values) if v is not g], None)
    for g in values:
        if id(g) not in guards or g.kind != "alu" or len(g.srcs) != 2:
            continue
        a, b = g.srcs
        if g.arg in _FORMS and _is_var(a, var):
            bound, (inclusive, below) = b, _FORMS[g.arg]
        elif g.arg in _MIRRORED and _is_var(b, var):
            bound, (inclusive, below) = a, _FORMS[_MIRRORED[g.arg]]
        else:
            continue
        if bound.dtype.is_float or varies(bound):
            continue
        return Split(g, _closure(bound, values), bound, inclusive, below)
    return None


def _varies(var: sympy.Symbol) -> Callable[[Value], bool]:
    """Does a value vary along ``var`` (memoized)? Searches, stores and guarded values count as
    varying: they are never computed ahead of the loop."""
    varying: dict[int, bool] = {}

    def varies(v: Value) -> bool:
        if id(v) not in varying:
            if v.kind == "index":
                varying[id(v)] = var in sympy.sympify(v.arg).free_symbols
            elif v.kind == "const":
                varying[id(v)] = False
            elif v.kind in ("load", "alu", "checkindex") and v.guard is None:
                own = v.kind == "load" and var in v.arg.index.free_symbols
                varying[id(v)] = own or any(varies(s) for s in v.srcs)
            else:
                varying[id(v)] = True
        return varying[id(v)]

    return varies


def uniform_selects(values: list[Value], var: sympy.Symbol) -> set[int]:
    """Float selects (float32, and 16-bit floats, computed as float) in a simd loop over ``var``
    whose condition is the same along it (a padded pooling window's bounds): rendered as selects
    of bits (``ember_pick_bits``). GCC 12 left a loop with three such float selects beside
    bfloat16 loads scalar ("unsupported data-type float"); a select of bits it vectorizes."""
    varies = _varies(var)
    return {id(v) for v in values
            if v.kind == "alu" and v.arg is Op.WHERE and v.dtype in (dt.float32, dt.bfloat16, dt.float16)
            and not varies(v.srcs[0]) and (varies(v.srcs[1]) or varies(v.srcs[2]))}


def _is_var(v: Value, var: sympy.Symbol) -> bool:
    return v.kind == "index" and sympy.sympify(v.arg) == var and not v.dtype.is_float


def _closure(value: Value, values: list[Value]) -> list[Value]:
    """``value`` and the values it is computed from, in the kernel's order."""
    need: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if id(v) not in need:
            need.add(id(v))
            stack.extend(v.srcs)
    return [v for v in values if id(v) in need]
