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

Where no guard has either form, but guards conjoin comparisons of ``a * i + b`` with bounds that
do not vary along the loop (a padded window's reads inside the input: ``0 <= 2 * i - 1``,
``2 * i + 1 < W``), the loop splits where all of them hold (``find_window``):

    if (<the comparisons that do not vary along the loop, all true>) {
      for i in [0, lo) (simd):   <the body>
      for i in [lo, hi) (simd):  <the body, those comparisons the constant true, reads unclamped>
      for i in [hi, extent) (simd):  <the body>
    } else for i (simd): <the body>
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ..ir import dtypes as dt
from ..ir.ops import Op
from ..schedule.guards import RAISING_ALU, invariant_values
from ..schedule.kernel_ir import Value

# comparison -> (split at n + 1 rather than n, whether the guard holds below the split), as
# i <op> n; n <op> i is i <the mirrored op> n
_FORMS = {Op.LT: (False, True), Op.LE: (True, True), Op.GT: (True, False), Op.GE: (False, False)}
_MIRRORED = {Op.LT: Op.GT, Op.LE: Op.GE, Op.GT: Op.LT, Op.GE: Op.LE}
# Index values whose comparisons bound the loop's variable: a narrower integer wraps
# (arange(300, dtype=torch.int8) counts ..., 127, -128, ...: i >= 3 is false again from i = 128)
_WIDE = (dt.int32, dt.int64)


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


def row_invariants(values: list[Value], var: sympy.Symbol, keep: frozenset[int] = frozenset()) -> list[Value]:
    """The values of a simd loop over ``var`` (the innermost of several) that do not vary along
    it, computed once per row before the loop: loads at an index without ``var``, arithmetic of
    them, and the constants they read; hoistable as ``loop_invariants``'s are. ``keep``: ids
    left in the loop (a split's guard, made a constant there). A row's ``log(sum)`` in the loop
    left GCC's loop scalar, since logf has no vector form: the gradient of a cross-entropy over
    1024 x 4096 logits took 18 ms where 1.6 sufficed."""
    varies = _varies(var)
    same = _hoistable(values, lambda v: v.kind in ("const", "load", "alu") and id(v) not in keep and not varies(v))
    out = {id(v) for v in same if v.kind != "const"}
    out |= {id(s) for v in values if id(v) in out for s in v.srcs}  # (their constants)
    return [v for v in values if id(v) in out]


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
    return v.kind == "index" and v.dtype in _WIDE and sympy.sympify(v.arg) == var


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


@dataclass
class Window:
    """Where every bound of a loop's guards that is affine in its variable holds: a padded
    window's reads inside the input (``0 <= 2 * i - 1``, ``2 * i + 1 < W``), conjoined with
    conditions the same along the loop (the window's row inside the input)."""
    atoms: list[Value]    # comparisons all true for i in [lo, hi) where every uniform one holds
    uniform: list[Value]  # the comparisons that do not vary along the loop
    bounds: list[tuple[bool, Value, int, sympy.Expr, int]]  # (a lower bound?, n, a, b, m - n) each:
    #                        a * i + b >= m (lower) or <= m (upper), m = n + (m - n)
    hoisted: list[Value]  # what the bounds and the uniform comparisons are computed from
    facts: list[tuple[sympy.Expr, bool, sympy.Expr]]  # (e, e >= m?, m): index bounds that then hold
    # every uniform comparison compares indices with sizes (a window's rows), none a loaded
    # value (a ragged row's length, false on the padding rows, where an unswitch skips the work)
    positional: bool = True

    def true_values(self, values: list[Value]) -> list[Value]:
        """The atoms and the logical ands of values all true, among ``values``: true in the
        window's interior."""
        true = {id(v) for v in self.atoms}
        for v in values:
            if v.kind == "alu" and v.arg is Op.AND and v.guard is None and all(id(s) in true for s in v.srcs):
                true.add(id(v))
        return [v for v in values if id(v) in true]

    def drop_clamps(self, index: sympy.Expr) -> sympy.Expr:
        """``index`` with the clamps the facts make idle unwrapped: Min(31, 2*i + 1) where
        2*i + 1 <= 31 holds, Max(0, 2*i - 1) where 2*i - 1 >= 0 (a padded read's clamp into the
        input, which left GCC a gather where the read is a strided load)."""
        def bounded(e: sympy.Expr, at_least: bool, c: sympy.Expr) -> bool:
            for fe, fl, m in self.facts:
                if fl == at_least and sympy.expand(fe - e) == 0:
                    gap = sympy.expand(m - c if at_least else c - m)
                    if gap.is_number and gap >= 0:
                        return True
            return False

        def unwrap(x: sympy.Expr) -> sympy.Expr:
            if not isinstance(x, (sympy.Min, sympy.Max)):
                return x
            args = [a.replace(lambda y: isinstance(y, (sympy.Min, sympy.Max)), unwrap) for a in x.args]
            at_least = isinstance(x, sympy.Max)
            for e in args:
                if all(c is e or bounded(e, at_least, c) for c in args):
                    return e
            if all(a is b for a, b in zip(args, x.args)):
                return x  # (nothing unwrapped inside: sympy's Min and Max compare again when built)
            return x.func(*args)

        return index.replace(lambda y: isinstance(y, (sympy.Min, sympy.Max)), unwrap)


def find_window(values: list[Value], var: sympy.Symbol) -> Window | None:
    """The comparisons that guards among ``values`` (one loop's body over ``var``) conjoin (through
    logical ands) which either compare ``a * var + b`` with a bound that does not vary along the
    loop, or do not vary at all; None where none of them is of the first kind. Between the
    bounds of the first kind, where the second kind hold, all of them are true: the loop's
    middle then runs with its guards constant (``cpp.py``: the window's interior, its edges
    and the rows outside keeping the guarded loop). A padded 3 x 3 / 2 max pooling's nine
    guarded reads were scalar code slower than ATen's kernel."""
    varies = _varies(var)
    leaves: dict[int, Value] = {}
    stack = [v.guard for v in values if v.guard is not None]
    while stack:
        g = stack.pop()
        if id(g) in leaves:
            continue
        leaves[id(g)] = g
        if g.kind == "alu" and g.arg is Op.AND and g.guard is None:
            stack.extend(g.srcs)
    atoms, uniform, bounds = [], [], []
    for g in leaves.values():
        if g.kind != "alu" or g.arg not in _FORMS or len(g.srcs) != 2 or g.guard is not None:
            continue
        if any(s.dtype.is_float for s in g.srcs):
            continue
        if not varies(g):
            uniform.append(g)
            atoms.append(g)
            continue
        bound = _affine_bound(g, var, varies)
        if bound is not None:
            bounds.append(bound)
            atoms.append(g)
    if not bounds and len(uniform) < 2:  # (one uniform guard: find_split unswitches it)
        return None
    hoisted: set[int] = set()
    for v in uniform + [b[1] for b in bounds]:
        hoisted.update(id(u) for u in _closure(v, values))
    facts = [f for g in atoms if (f := _index_fact(g)) is not None]
    positional = all(_index_fact(g) is not None for g in uniform)
    return Window(atoms, uniform, bounds, [v for v in values if id(v) in hoisted], facts, positional)


def _index_fact(g: Value) -> tuple[sympy.Expr, bool, sympy.Expr] | None:
    """A comparison of an index expression with a constant or size expression as (e, e >= m?, m)."""
    op = g.arg
    e, n = g.srcs
    if e.kind != "index":
        e, n, op = n, e, _MIRRORED[op]
    if e.kind != "index" or e.dtype not in _WIDE or n.kind not in ("index", "const") or isinstance(n.arg, bool):
        return None
    try:
        m = sympy.sympify(n.arg)
    except (TypeError, sympy.SympifyError):
        return None
    if not (m.is_number and m.is_integer or not m.is_number):
        return None
    at_least = op in (Op.GT, Op.GE)
    return sympy.expand(sympy.sympify(e.arg)), at_least, sympy.expand(m + {Op.LT: -1, Op.GT: 1}.get(op, 0))


def _affine_bound(g: Value, var: sympy.Symbol, varies: Callable[[Value], bool]
                  ) -> tuple[bool, Value, int, sympy.Expr, int] | None:
    """``g`` (a comparison) as a bound on ``var``: a * var + b >= m or <= m, where a * var + b
    is an index expression and m = n + (m - n) does not vary along the loop."""
    op = g.arg
    e, n = g.srcs
    if not (e.kind == "index" and var in sympy.sympify(e.arg).free_symbols):
        e, n, op = n, e, _MIRRORED[op]
    if not (e.kind == "index" and e.dtype in _WIDE and not varies(n)):
        return None
    expr = sympy.expand(sympy.sympify(e.arg))
    a = expr.coeff(var)
    b = expr - a * var
    if not (a.is_Integer and a != 0) or var in b.free_symbols:
        return None
    # integers: e < n is e <= n - 1, e > n is e >= n + 1
    at_least = op in (Op.GT, Op.GE)
    shift = {Op.LT: -1, Op.GT: 1}.get(op, 0)
    # a * var >= m - b is a lower bound of var for a > 0, an upper one for a < 0 (and <= mirrored)
    return (at_least == (int(a) > 0), n, int(a), b, shift)


def loop_invariants(values: list[Value]) -> list[Value]:
    """The values a pointwise kernel computes once, before its loops: the same at every element
    (``invariant_values``: constants, loads at an index of no loop variable, arithmetic of them),
    unguarded, not an integer division (which may flag an error: raised only where an element
    computes it), nor a load of a buffer the kernel writes. A compiled optimizer's bias
    corrections (``pow(beta2, step)``, a square root, divisions, per parameter) were computed at
    every element: an Adam step over 8M floats took 70-100 ms on 2 cores, eager 22."""
    invariant = invariant_values(values)
    return _hoistable(values, lambda v: id(v) in invariant)


def _hoistable(values: list[Value], same: Callable[[Value], bool]) -> list[Value]:
    """The values ``same`` calls the same at every element of a loop that may be computed
    ahead of it: unguarded, from such values only, not an integer division (it may flag an
    error: raised only where an element computes it), nor a load of a buffer the kernel writes."""
    written = {v.arg.buffer for v in values if v.kind == "store"}
    out: set[int] = set()
    for v in values:
        if (same(v) and v.guard is None and all(id(s) in out for s in v.srcs)
                and not (v.kind == "alu" and v.arg in RAISING_ALU and not v.dtype.is_float)
                and not (v.kind == "load" and v.arg.buffer in written)):
            out.add(id(v))
    return [v for v in values if id(v) in out]
