"""Which accesses of a CUDA kernel's strided loop move 16 bytes at once.

A thread of the scalar loops loads one element per access (2 bytes of a bf16 row), so a warp
moves 64 bytes per load instruction and the GPU needs many more loads in flight than a thread
holds to reach its copy bandwidth. The vector form of a loop gives each thread groups of V
consecutive elements instead: every access that steps by one element along the loop's fastest
dimension is one load (or store) of V elements, up to 16 bytes, into registers, and the group's
statements read them element by element.

That is right only where each group's first element is aligned to the vector's size, for every
such access, on every call: the buffer's address, and the index at the group's first element, a
multiple of V. Static parts of the index are decided here; symbolic sizes and the addresses are
conditions the kernel evaluates once per loop (the same in every thread), taking the scalar loop
where one fails. The fastest dimension's extent must be a multiple of V too, so that a group
never straddles two rows and every group is whole. Row kernels whose rows are not (999 or 50257
elements: most rows start mid-vector) are *peeled* instead: each row's groups start where the
row's accesses are aligned in memory, and the elements before the first group (the head) and
after the last (the tail) go one at a time.

A guarded load (a value only a ``where``'s taken branch needs: schedule/guards.py) goes a group
at a time too: its index is affine in the loop, so every address of the group is valid whatever
the guard (cat's and pad's loads are clamped into their inputs), and the group is loaded whole
while the work on it stays under the guard. A causal softmax's masked scores, loaded one at a
time where unmasked, took 2.3x Triton's time (H100, a GPT's attention); whole groups read the
masked half of each row too, and keep the row in registers for the later loops.

Accesses left scalar inside a vector loop: gathers whose index differs within a group (their
index is data), accumulating stores but float32 additions, the column sums' stores, stores to a
buffer another store of the loop writes too, and any access not unit-step along the fastest
dimension (a broadcast or transposed operand). A gather of whole rows (an embedding's, a bag's
rows) or a float32 scatter_add of them is a vector access: its row index is the same for every
element of a group, so a pointwise kernel computes such values once per group
(``group_invariant``).
Segment kernels (ragged rows, whose start comes from the offsets) keep the scalar loop.

Row kernels go further where a block's one iteration covers a row (``row_forms``): every thread
then takes the same groups in every loop of the row, so a load that later loops read again is
kept in registers from the first loop, and a chunked kernel's run partials (a norm's weight
gradient) add up in registers and are stored once per run.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..schedule.kernel_ir import CHUNK, Kernel, Value, inner_var, is_indirect_var, outer_var
from .cexpr import index_expr
from .layout import group_invariant

VECTOR_BYTES = 16   # the widest load a thread issues
MAX_WIDTH = 8       # elements per group at most (1-byte types: 8-byte vectors, not 16 statements)
# rows peeled only from this many groups: a head and a tail cost shorter rows more than their
# groups save (H100, cross-entropy over 1M rows of 10 classes: 148 us unpeeled, 236 peeled;
# rows of 100: 96 either way; of 999: 190 -> 116)
PEEL_GROUPS = 8


@dataclass(frozen=True)
class VectorPlan:
    """The vector form of one loop: ``width`` consecutive elements per group, ``values`` the
    loads and stores done a vector at a time, ``conditions`` the C tests (alignment,
    divisibility) under which the kernel may take that form; all true when empty."""

    width: int
    values: tuple[Value, ...]
    conditions: tuple[str, ...]
    # peeled form (row kernels): the C index of the values' element 0 in the row; the row's
    # first elements up to an aligned group (its head) and the elements after its last whole
    # group (its tail) are done an element at a time. Empty: groups start at the row's start.
    peel_from: str = ""


def plan_loop(kernel: Kernel, values: list[Value], extents: tuple[sympy.Expr, ...],
              inner: bool, peel: bool = False, most: int | None = None) -> VectorPlan | None:
    """The vector plan of a loop over ``extents`` (the kernel's inner domain when ``inner``, else
    its flattened outer domain) computing ``values``; None where no access would gain. ``peel``:
    a row kernel's loop, whose groups may start where the row's accesses are aligned rather than
    at its start (rows of 999 or 50257 elements: most rows start mid-vector), where that gains
    more accesses. ``most``: the widest group allowed (one width for every loop of a row)."""
    if not extents or kernel.segment_length is not None:
        return None
    var = (inner_var if inner else outer_var)(len(extents) - 1)
    candidates = _candidates(kernel, values, var)
    if not candidates:
        return None
    width = min(_width(kernel, candidates), most or MAX_WIDTH)
    if width < 2:
        return None
    exact = _exact_plan(kernel, candidates, extents, var, width)
    if not peel or len(extents) != 1 or kernel.chunks or kernel.chunk_stores:
        return exact  # (a chunked kernel's run partials belong to fixed positions in a group)
    peeled = _peeled_plan(kernel, candidates, extents[0], var, width)
    if peeled is None or exact is None:
        return peeled or exact
    # Only for more accesses in groups: a row that is aligned anyway runs 5-15% slower peeled
    # (its head, tail and their registers; H100, rows of 1000 and 1536 of a symbolic length)
    return peeled if len(peeled.values) > len(exact.values) else exact


def _candidates(kernel: Kernel, values: list[Value], var: sympy.Symbol) -> list[Value]:
    """The loop's loads and stores that step by one element along ``var``. A vector store lands
    after its group's statements: only where no other store of the loop writes the buffer (a
    scatter into a copied tensor), whose order it would change."""
    writes: dict[str, int] = {}
    for v in values:
        if v.kind == "store":
            writes[v.arg.buffer] = writes.get(v.arg.buffer, 0) + 1
    fixed = group_invariant(kernel, values, var)
    dtypes = {p.name: p.dtype for p in kernel.params}
    return [v for v in values if _vectorizable(v, var, fixed) and (v.kind == "load" or writes[v.arg.buffer] == 1)
            and not (v.kind == "store" and v.arg.accumulate and dtypes[v.arg.buffer] != dt.float32)]


def _width(kernel: Kernel, candidates: list[Value]) -> int:
    dtypes = {p.name: p.dtype for p in kernel.params}
    return min(MAX_WIDTH, VECTOR_BYTES // max(dtypes[v.arg.buffer].itemsize for v in candidates))


def _loop_vars(kernel: Kernel) -> set[sympy.Symbol]:
    loop_vars = {outer_var(i) for i in range(len(kernel.outer))} | {inner_var(i) for i in range(len(kernel.inner))}
    return loop_vars | {CHUNK}


def _aligned_pointer(kernel: Kernel, v: Value, width: int) -> str:
    nbytes = width * next(p.dtype for p in kernel.params if p.name == v.arg.buffer).itemsize
    return f"(((unsigned long long){v.arg.buffer}) & {nbytes - 1}ull) == 0"


def _peeled_plan(kernel: Kernel, candidates: list[Value], extent: sympy.Expr, var: sympy.Symbol,
                 width: int) -> VectorPlan | None:
    """Groups aligned in memory rather than to the row's start: the accesses whose element 0 lies
    a multiple of the width from the leader's go a group at a time; the leader's offset decides
    the row's head. The leader is the access with the most such partners that move with the row
    (a norm's input and output over a weight and a bias read by every row alike), then the most
    partners, then the first."""
    extent = sympy.sympify(extent)
    if extent.is_number and int(extent) < PEEL_GROUPS * width:
        return None
    loop_vars = _loop_vars(kernel)
    starts = [sympy.expand(sympy.sympify(v.arg.index).subs(var, 0)) for v in candidates]
    best: tuple[tuple[int, int], int, list[Value], list[str]] | None = None
    for i in range(len(candidates)):
        if any(is_indirect_var(x) for x in starts[i].free_symbols):
            continue  # (a gathered row's start is loaded in the loop: the head is computed before it)
        chosen, conditions, moving = [], [], 0
        for v, start in zip(candidates, starts):
            # (partners only where that holds for every size: no test of a size can fail)
            if _multiple_of(sympy.expand(start - starts[i]), width, loop_vars) == []:
                chosen.append(v)
                conditions.append(_aligned_pointer(kernel, v, width))
                moving += bool(start.free_symbols & loop_vars)
        if best is None or (moving, len(chosen)) > best[0]:
            best = ((moving, len(chosen)), i, chosen, conditions)
    if best is None:
        return None
    _, leader, chosen, conditions = best
    return VectorPlan(width, tuple(chosen), tuple(dict.fromkeys(conditions)), index_expr(starts[leader]))


def _exact_plan(kernel: Kernel, candidates: list[Value], extents: tuple[sympy.Expr, ...], var: sympy.Symbol,
                width: int) -> VectorPlan | None:
    """Groups from the start of the loop's domain: every chosen access aligned there."""
    loop_vars = _loop_vars(kernel)
    conditions: list[str] = []
    last = _multiple_of(sympy.sympify(extents[-1]), width, loop_vars)
    if last is None:
        return None
    conditions += last
    chosen: list[Value] = []
    for v in candidates:
        start = _multiple_of(sympy.expand(sympy.sympify(v.arg.index).subs(var, 0)), width, loop_vars)
        if start is None:  # some group's first element is never aligned: this access stays scalar
            continue
        conditions += [_aligned_pointer(kernel, v, width), *start]
        chosen.append(v)
    if not chosen:
        return None
    return VectorPlan(width, tuple(chosen), tuple(dict.fromkeys(conditions)))


def _vectorizable(v: Value, var: sympy.Symbol, fixed: set[int]) -> bool:
    """A load or store whose index is ``var`` plus terms without it: a plain access, or a gather
    (scatter) whose index values are the same across the group (``fixed``). Stores write, or add
    float32 (sm_90's vector atomics: ember_atomic_add_vec)."""
    if v.kind not in ("load", "store"):
        return False
    if v.arg.bindings and not all(id(s) in fixed for s in (v.srcs[1:] if v.kind == "store" else v.srcs)):
        return False
    if v.kind == "store" and (v.arg.accumulate not in (False, True) or v.srcs[0].kind == "chunksum"):
        return False
    index = sympy.expand(sympy.sympify(v.arg.index))
    if var not in index.free_symbols:
        return False
    try:
        return sympy.expand(index - index.subs(var, 0) - var) == 0
    except (TypeError, ValueError):
        return False


def _multiple_of(expr: sympy.Expr, width: int, loop_vars: set[sympy.Symbol]) -> list[str] | None:
    """Conditions (C) under which ``expr`` is a multiple of ``width`` for every value of the loop
    variables: [] when it always is, None when that cannot be known (or it never is). Each term
    is an integer coefficient times factors; factors of loop variables only are integers, so
    the coefficient times the factors of sizes only must be a multiple."""
    conditions: list[str] = []
    for term in sympy.Add.make_args(expr):
        coeff, factors = term.as_coeff_mul()
        if not (coeff.is_Integer or coeff == 0):
            return None
        if int(coeff) % width == 0:
            continue  # a multiple whatever its factors are
        sizes = sympy.Integer(coeff)
        for f in factors:
            free = f.free_symbols
            if any(is_indirect_var(x) for x in free):
                return None  # a loaded index: its alignment is not the same in every thread
            if free and free <= loop_vars:
                continue  # an integer of the loop's position
            if free & loop_vars:  # loop variables and sizes in one factor: not decided here
                return None
            sizes *= f
        if sizes.is_Integer:  # no sizes, and the coefficient is no multiple
            return None
        conditions.append(f"(({index_expr(sizes)}) % {width}) == 0")
    return conditions


# Bytes of one unrolled step's groups a row kernel keeps in registers for its later loops, at most:
# a thread holds EMBER_UNROLL steps, so 64 bytes (four bf16 groups of 8) take 64 of its registers.
MOST_KEPT_BYTES = 64


def reread_loads(plans: dict[int, VectorPlan]) -> dict[tuple[str, str], int]:
    """Vector loads that several loops of a row kernel read alike (the same buffer and index):
    (buffer, index) -> the first loop reading it. Where a thread takes one iteration of each loop
    (its block covers the row), its groups are the same in every loop, so the first loop can keep
    them in registers for the others instead of their reading the row again (softmax's three
    loops read it once). ``plans`` are of one width (``row_forms`` asks only then): groups of
    another width would be other elements."""
    seen: dict[tuple[str, str], list[int]] = {}
    per_row: dict[tuple[str, str], bool] = {}  # does the load's group change from row to row?
    size: dict[tuple[str, str], int] = {}  # bytes of one group
    for loop in sorted(plans):
        for v in plans[loop].values:
            if v.kind == "load":
                key = (v.arg.buffer, str(v.arg.index))
                loops = seen.setdefault(key, [])
                if loop not in loops:
                    loops.append(loop)
                per_row[key] = bool(v.srcs) or any(s.name.startswith("o") for s in v.arg.index.free_symbols)
                size[key] = plans[loop].width * v.dtype.itemsize
    reread = [key for key, loops in seen.items() if len(loops) > 1]
    # Within a budget of registers: past it the kernel spills or loses occupancy (a LayerNorm over
    # six summed bf16 inputs kept in registers took 122 us against 41 reading two of them again,
    # on an H200). The row's own loads first (a weight's groups are the same for every row, so
    # they come from L1), then those more loops read.
    reread.sort(key=lambda key: (not per_row[key], -len(seen[key])))
    kept, used = {}, 0
    for key in reread:
        if used + size[key] <= MOST_KEPT_BYTES:
            kept[key], used = seen[key][0], used + size[key]
    return kept


@dataclass(frozen=True)
class RowForms:
    """The vector forms of a row kernel's loops, and what its rows keep in registers where a
    block's one iteration covers a row (the flag ``ember_cached``, whose tests are
    ``flag_tests`` besides that): reread loads ((buffer, index) -> first loop reading them) and
    chunk stores' run partials (store id -> register array)."""

    plans: dict[int, VectorPlan]
    first_loop: dict[tuple[str, str], int]
    kept: dict[int, str]
    flag_tests: tuple[str, ...]


def row_forms(kernel: Kernel, plans: dict[int, VectorPlan], most_groups: int) -> RowForms:
    """A row kernel's loop plans. A loop that adds rows into a chunked kernel's run partials
    takes its vector form only with the partials in registers: in memory, each thread adding
    a group of consecutive partials per row scatters the block's accesses (2.5-3.6x slower
    than the scalar loop, measured on an H100). ``plans``: the loops' own plans (changed here);
    ``most_groups``: the groups the largest block's one iteration takes."""
    widths = {p.width for p in plans.values()}
    keepable = len(widths) == 1 and not _too_long_to_keep(kernel, min(widths), most_groups)
    flag_tests = tuple(dict.fromkeys(c for p in plans.values() for c in p.conditions))
    # full-precision float partials only: the same sums in the same order as in memory
    wide = {p.name for p in kernel.params if p.dtype in (dt.float32, dt.float64)}
    kept: dict[int, str] = {}
    for loop in sorted({v.loop for v in kernel.chunk_stores} & set(plans)):
        stores = [v for v in kernel.chunk_stores if v.loop == loop]
        if keepable and all(v.arg.buffer in wide for v in stores):
            kept.update({id(v): f"ember_part{len(kept) + i}" for i, v in enumerate(stores)})
            plans[loop] = VectorPlan(plans[loop].width, plans[loop].values, ("ember_cached",))
        else:
            del plans[loop]
    first_loop = reread_loads(plans) if keepable else {}
    if not first_loop and not kept:
        flag_tests = ()
    return RowForms(plans, first_loop, kept, flag_tests)


def _too_long_to_keep(kernel: Kernel, width: int, most_groups: int) -> bool:
    """Are the rows statically longer than the largest block's one iteration covers? Then no
    launch can keep them, and registers for it would only cost occupancy (CE's 32000 logits)."""
    inner = sh.numel(kernel.inner)
    return inner.is_number and int(inner) > most_groups * width
