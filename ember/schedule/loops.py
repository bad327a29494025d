"""Kernel-IR loop transforms shared by every backend.

``memory_ordered_dims`` puts a pointwise kernel's loops in the order of its output's memory: the
kernel builder walks the output's logical dims, and a channels_last output (its channels
innermost in memory, outermost but one logically) was written and read with a stride of C
between neighbouring iterations: a relu over a channels_last activation took 10x as long as
over a contiguous one on the CPU.

``collapse_dims`` merges adjacent loop dimensions that every access walks contiguously across
(o_i*stride_i + o_j*stride_j with stride_i == stride_j * size_j), the way Inductor merges
ranges: a contiguous [rows, cols] pointwise op becomes a single loop over rows*cols, and the
padded GIoU loss's [batch, boxes] reduction a single inner loop.

``simplify_with_ranges`` and ``split_inner_by_divisor`` (C++ kernels) take apart the quotients
and remainders a view's reshape leaves in an index, so a simd loop reads vectors, not gathers.
"""

from __future__ import annotations

import dataclasses

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.ops import TRANSCENDENTAL_OPS
from .kernel_ir import SCRATCH_ROW, Access, Kernel, ReduceArg, Value, inner_var, outer_var


def _exprs(kernel: Kernel) -> list[sympy.Expr]:
    out: list[sympy.Expr] = []
    for v in kernel.values:
        if v.kind in ("load", "store"):
            out.append(v.arg.index)
        elif v.kind == "index":
            out.append(v.arg)
        elif v.kind == "reduce":
            out.append(v.arg.position)
        elif v.kind == "search":  # (a batched search's row start moves with the loop variables)
            out.append(v.arg.start)
    return out


def _mergeable(exprs: list[sympy.Expr], a: sympy.Symbol, b: sympy.Symbol, size_b: sympy.Expr) -> bool:
    for e in exprs:
        e = sympy.expand(e)
        ca, cb = e.coeff(a), e.coeff(b)
        rest = sympy.expand(e - ca * a - cb * b)
        if rest.has(a) or rest.has(b) or ca.has(a, b) or cb.has(a, b):
            return False
        if not sh.equal(ca, cb * size_b):
            return False
    return True


def _rewrite(kernel: Kernel, mapping: dict[sympy.Symbol, sympy.Expr]) -> list[Value]:
    """Substitute loop variables in every index (values are rebuilt; sources re-linked)."""
    new: dict[int, Value] = {}
    out: list[Value] = []
    for v in kernel.values:
        arg = v.arg
        if v.kind in ("load", "store"):
            arg = dataclasses.replace(arg, index=sympy.expand(arg.index.xreplace(mapping)))
        elif v.kind == "index":
            arg = sympy.expand(arg.xreplace(mapping))
        elif v.kind == "reduce":
            arg = ReduceArg(arg.op, sympy.expand(arg.position.xreplace(mapping)))
        elif v.kind == "search":
            arg = dataclasses.replace(arg, start=sympy.expand(arg.start.xreplace(mapping)))
        nv = dataclasses.replace(v, arg=arg, srcs=tuple(new[id(s)] for s in v.srcs))
        new[id(v)] = nv
        out.append(nv)
    return out


def memory_ordered_dims(kernel: Kernel) -> Kernel:
    """A pointwise kernel (outer loops only) whose first output is written with a stride other
    than 1 by its last loop, and with stride 1 by another: its loops reordered by that output's
    strides, largest outermost (size-1 dims first; ties keep their order). Symbolic strides are
    ordered as they would be with every size 64 (sizes are 2 or more: Dynamo specializes 0 and
    1; an order only decides speed, never values). A store at an index not linear in the loop
    variables stays as built."""
    n = len(kernel.outer)
    if (n < 2 or kernel.inner or kernel.segment_length is not None or kernel.chunks
            or any(v.kind not in _POINTWISE_KINDS for v in kernel.values)):
        return kernel
    stores = [v for v in kernel.values if v.kind == "store"]
    if not stores or any(v.arg.bindings or v.arg.accumulate for v in stores):  # (scatters keep theirs)
        return kernel
    index = sympy.expand(stores[0].arg.index)
    variables = [outer_var(i) for i in range(n)]
    strides = [index.coeff(o) for o in variables]
    rest = sympy.expand(index - sum(c * o for c, o in zip(strides, variables)))
    if rest.has(*variables) or strides[-1] == 1 or not any(c == 1 for c in strides):
        return kernel
    typical = [c.xreplace({s: sympy.Integer(64) for s in c.free_symbols}) for c in strides]
    if not all(t.is_Integer for t in typical):
        return kernel
    # (a size-1 dim's stride is any number: outermost, where it is one iteration)
    order = sorted(range(n), key=lambda i: (kernel.outer[i] != 1, -int(typical[i]), i))
    mapping = {outer_var(old): outer_var(new) for new, old in enumerate(order)}
    return dataclasses.replace(kernel, values=_rewrite(kernel, mapping),
                               outer=tuple(kernel.outer[old] for old in order))


# the kinds of value a pointwise kernel holds (no reductions, scans, matmuls, searches)
_POINTWISE_KINDS = frozenset({"load", "store", "const", "alu", "index", "checkindex"})
# (and a row kernel's reductions over its inner loops: split_inner_by_divisor)
_SPLIT_KINDS = _POINTWISE_KINDS | {"reduce"}


def collapse_dims(kernel: Kernel) -> Kernel:
    if kernel.segment_length is not None:  # its row index (outer dim 0) addresses the offsets
        return kernel
    for which in ("outer", "inner"):
        var = outer_var if which == "outer" else inner_var
        changed = True
        while changed:
            changed = False
            dims = list(getattr(kernel, which))
            for i in range(len(dims) - 2, -1, -1):
                a, b = var(i), var(i + 1)
                if not _mergeable(_exprs(kernel), a, b, dims[i + 1]):
                    continue
                # o_i, o_{i+1} -> one variable over dims[i] * dims[i+1]; later vars shift down
                mapping: dict[sympy.Symbol, sympy.Expr] = {a: sympy.Integer(0), b: a}
                for j in range(i + 2, len(dims)):
                    mapping[var(j)] = var(j - 1)
                values = _rewrite(kernel, mapping)
                new_dims = dims[:i] + [dims[i] * dims[i + 1]] + dims[i + 2:]
                kernel = dataclasses.replace(kernel, values=values, **{which: tuple(new_dims)})
                changed = True
                break
    return kernel


def simplify_with_ranges(kernel: Kernel) -> Kernel:
    """Each index's remainders of remainders as one (``_unnested``), and the floor divisions and
    remainders that the loops' static extents decide: a quotient of a value below its divisor
    is 0, a remainder of one below its modulus the value itself. A head's columns ``64*h + d``
    (h < 4, d < 64) of a 256-wide row were read at ``(64*h + d) // 256`` and ``(64*h + d) % 256``:
    a division a lane, gathers, and loops that ``collapse_dims`` could not merge."""
    ranges = {outer_var(i): ValueRanges(0, int(n) - 1) for i, n in enumerate(kernel.outer) if _static(n)}
    ranges.update({inner_var(i): ValueRanges(0, int(n) - 1) for i, n in enumerate(kernel.inner) if _static(n)})
    if not ranges:
        return kernel
    mapping: dict[sympy.Expr, sympy.Expr] = {}
    for e in _exprs(kernel):
        for atom in e.atoms(FloorDiv, ModularIndexing):
            simpler = _unnested(atom)
            simpler = _within_range(simpler, ranges) if isinstance(simpler, (FloorDiv, ModularIndexing)) else simpler
            if simpler is not atom:
                mapping[atom] = simpler
    if not mapping:
        return kernel
    return dataclasses.replace(kernel, values=_rewrite(kernel, mapping))


def _static(n: sympy.Expr) -> bool:
    return isinstance(n, (int, sympy.Integer)) and int(n) >= 1


def _unnested(atom: sympy.Expr) -> sympy.Expr:
    """A quotient or remainder of a remainder ``(x // v) % m`` as one remainder of ``x``, where
    ``m`` is a multiple of the outer divisor or modulus ``k``: ``((x // v) % m) // k`` is
    ``(x // (v*k)) % (m/k)`` and ``((x // v) % m) % k`` is ``(x // v) % k``. (A reshape of a
    reshape wrote ``(o % 256) // 64``, which hid ``o``'s own divisors from the split below.)"""
    inner = atom.args[0]
    if not isinstance(inner, ModularIndexing) or not all(x.is_Integer for x in (*inner.args[1:], *atom.args[1:])):
        return atom
    x, v, m = inner.args
    if isinstance(atom, FloorDiv):
        k = atom.args[1]
        return ModularIndexing(x, v * k, m // k) if m % k == 0 else atom
    if atom.args[1] == 1 and m % atom.args[2] == 0:
        return ModularIndexing(x, v, atom.args[2])
    return atom


def _within_range(atom: sympy.Expr, ranges: dict) -> sympy.Expr:
    base, divisor = atom.args[0], atom.args[1]
    if not (base.free_symbols <= set(ranges) and divisor.is_Integer and int(divisor) > 0):
        return atom
    bound = bound_sympy(base, ranges)
    if not (bound.lower.is_number and bound.upper.is_number and bound.lower >= 0):
        return atom
    if bound.upper < divisor:
        return sympy.Integer(0)
    if isinstance(atom, ModularIndexing) and atom.args[2].is_Integer and bound.upper < divisor * atom.args[2]:
        return FloorDiv(base, divisor)
    return atom


# the shortest inner loop split_inner_by_divisor makes: 16 floats fill one AVX-512 register
_SHORTEST_SPLIT = 16


def split_inner_by_divisor(kernel: Kernel) -> Kernel:
    """A kernel whose last outer loop variable ``o`` is read through ``o // d`` and ``o % d``
    (a view's dims merged in the output, apart in an input: attention's heads ``(B, H, T, D)``
    written as ``(T*B, H*D)``) gets that loop split in two, ``o = d*a + b``, so the last loop
    walks ``b`` where every access is linear: a division and a gather a lane became a vector
    load, and guards on ``o // 256`` (a cat's which-input test) do not vary along it. Pointwise
    kernels and row kernels (the in-projection's bias gradient, the column sums of q, k and v's
    heads joined: its column tiles then take ``b``); not kernels that also reduce over all rows,
    scan, chunk or multiply matrices.

    Only where every quotient and remainder of ``o`` is of ``o`` plus multiples of ``d``, their
    divisors are multiples of ``d`` (the least of them), ``d`` divides the loop's static
    extent, and the split loop keeps at least ``_SHORTEST_SPLIT`` iterations."""
    n = len(kernel.outer)
    if (n == 0 or kernel.segment_length is not None or kernel.chunks or kernel.scans or kernel.dots
            or kernel.row_reductions or any(v.kind not in _SPLIT_KINDS for v in kernel.values)):
        return kernel
    extent = kernel.outer[-1]
    if not _static(extent):
        return kernel
    o = outer_var(n - 1)
    # (the planner simplified the kernel already: again only where clamps became remainders,
    # whose quotients and remainders nest)
    remainders = _clamps_as_remainders(kernel, o)
    split = _split(remainders if remainders is kernel else simplify_with_ranges(remainders), o, int(extent))
    return kernel if split is None else split


def _clamps_as_remainders(kernel: Kernel, o: sympy.Symbol) -> Kernel:
    """A cat's or a pad's read of its input at ``o - s`` clamped into [0, D) (build_index.clamped:
    its value counts only inside the segment, the clamp keeps the other reads in bounds), as
    ``o % D`` where ``s`` is a multiple of ``D``: equal inside, in bounds everywhere, and a
    remainder the split can take apart where a clamp was a gather."""
    mapping: dict[sympy.Expr, sympy.Expr] = {}
    for e in _exprs(kernel):
        for atom in e.atoms(sympy.Min):
            if not atom.has(o) or len(atom.args) != 2:
                continue
            top = next((x for x in atom.args if x.is_Integer), None)
            shifted = next((x for x in atom.args if x is not top), None)
            if top is None or int(top) < 0:
                continue
            size, start = int(top) + 1, -sympy.expand(shifted - o)
            if sympy.expand(shifted - o).has(o) or not start.is_Integer or int(start) % size:
                continue
            clamp = sympy.Max(0, atom) if int(start) > 0 else atom
            mapping[clamp] = ModularIndexing(o, 1, size)
    if not mapping:
        return kernel
    return dataclasses.replace(kernel, values=_rewrite(kernel, mapping))


def _split(kernel: Kernel, o: sympy.Symbol, extent: int) -> Kernel | None:
    n = len(kernel.outer)
    atoms = {a for e in _exprs(kernel) for a in e.atoms(FloorDiv, ModularIndexing) if a.has(o)}
    divisors = []
    for atom in atoms:
        base, divisor = atom.args[0], atom.args[1]
        modulus = atom.args[2] if isinstance(atom, ModularIndexing) else sympy.Integer(1)
        if sympy.expand(base - o).has(o) or not (divisor.is_Integer and modulus.is_Integer):
            return None
        # (o % m takes o apart at m; o // v and (o // v) % m at v)
        divisors.append(int(modulus) if divisor == 1 else int(divisor))
    d = min(divisors, default=0)
    if (d < _SHORTEST_SPLIT or d >= extent or extent % d
            or any(k % d for k in divisors) or any(not _multiple_of(sympy.expand(a.args[0] - o), d) for a in atoms)):
        return None
    # o = d*a + b in one simultaneous substitution (a, b stand-ins: a is o's own name after)
    a, b = (sympy.Symbol(f"_split_{x}", integer=True, nonnegative=True) for x in "ab")
    mapping: dict[sympy.Expr, sympy.Expr] = {o: d * a + b}
    for atom in atoms:
        rest = sympy.expand(atom.args[0] - o) / d
        if isinstance(atom, FloorDiv):
            mapping[atom] = FloorDiv(a + rest, int(atom.args[1]) // d)
        elif atom.args[1] == 1:  # (o + rest) % (k*d) = d * ((a + rest/d) % k) + b
            mapping[atom] = d * ModularIndexing(a + rest, 1, int(atom.args[2]) // d) + b
        else:
            mapping[atom] = ModularIndexing(a + rest, int(atom.args[1]) // d, atom.args[2])
    split = dataclasses.replace(kernel, values=_rewrite(kernel, mapping),
                                outer=(*kernel.outer[:-1], sympy.Integer(extent // d), sympy.Integer(d)))
    return dataclasses.replace(split, values=_rewrite(split, {a: o, b: outer_var(n)}))


def _multiple_of(e: sympy.Expr, d: int) -> bool:
    """Whether ``e``, a sum of terms, is a multiple of ``d`` whatever its symbols' values: every
    term's coefficient is (``2*s0*o0`` of a symbolic stride is not)."""
    return all(c.is_Integer and int(c) % d == 0 for c in sympy.expand(e).as_coefficients_dict().values())


def stash_recomputed(kernel: Kernel, stash_dtypes: frozenset, scratch: bool = False) -> Kernel:
    """A row kernel's last loop recomputes what an earlier loop computed (a softmax's
    exp(x - max): summed in loop 2, divided in loop 3). Where that costs a transcendental,
    the earlier loop also stores the value into the output element the last loop writes, and
    the last loop reads it back from there (the row was just written: it is in cache).

    Only for an output whose dtype is the value's and in ``stash_dtypes`` (those stored as they
    are computed, so the value reads back bit for bit), written once, at an inner index, by a
    plain store in the last loop; and only when no later loop reads another buffer at that
    index, so the kernel may still write its output over such an input (schedule/inplace.py).

    With ``scratch`` (the backend gives each thread a row of its own, SCRATCH_ROW), a value of a
    ``stash_dtypes`` dtype that no output can hold (a bf16 softmax's float32 exp) is kept there.
    So is a 16-bit value (a bf16 ``exp(x - max)`` written out as ops on bf16 tensors): C-style
    kernels compute it in float32, unrounded, and a float32 scratch row holds it bit for bit.
    """
    last = kernel.n_loops
    if last < 2 or kernel.dots or kernel.chunks:
        return kernel
    in_last = {id(v) for v in kernel.loop_values(last)}
    for store in [v for v in kernel.values if v.kind == "store" and v.inner and v.loop == last]:
        src, buffer = store.srcs[0], store.arg.buffer
        plain = not (store.arg.bindings or store.arg.accumulate or store.guard is not None)
        into_output = (plain and store.dtype in stash_dtypes
                       and sum(v.kind == "store" and v.arg.buffer == buffer for v in kernel.values) == 1)
        if not (into_output or scratch):  # (a scratch row serves any store: a segment row's too)
            continue
        for loop in range(last - 1, 0, -1):
            earlier = {id(v) for v in kernel.loop_values(loop)}
            value = _frontier(src, earlier, in_last)
            held_as = None if value is None else _held_as(value.dtype, stash_dtypes, scratch)
            if (value is None or held_as is None or value.guard is not None
                    or not any(v.kind == "alu" and v.arg in TRANSCENDENTAL_OPS for v in _walk(value, earlier)[0])):
                continue
            stashed = None
            if into_output and value.dtype == store.dtype == held_as:
                stashed = _rewired(kernel, store.arg, value, loop)
            if stashed is None and scratch:
                stashed = _rewired(kernel, Access(SCRATCH_ROW, _flat_inner(kernel)), value, loop, held_as)
            if stashed is not None:
                return stashed
    return kernel


def _held_as(dtype: dt.DType, stash_dtypes: frozenset, scratch: bool) -> dt.DType | None:
    """The dtype a stash holds a value of ``dtype`` in (None: it cannot be kept bit for bit)."""
    if dtype in stash_dtypes:
        return dtype
    if scratch and dtype.is_low_precision and dt.float32 in stash_dtypes:
        return dt.float32  # (computed in float32: only the scratch row, never the 16-bit output)
    return None


def _flat_inner(kernel: Kernel) -> sympy.Expr:
    """The flat position in a row: r0 * (the extents after it) + ... + the last r."""
    dims = kernel.inner
    return sympy.expand(sum(inner_var(i) * sh.numel(dims[i + 1:]) for i in range(len(dims))))


def _walk(start: Value, inside: set[int], stop: set[int] = frozenset()) -> tuple[list[Value], list[Value]]:
    """The values ``start`` is computed from within ``inside`` (ids): those walked through, and
    those in ``stop``, where the walk ends."""
    through: list[Value] = []
    stopped: list[Value] = []
    seen: set[int] = set()
    stack = [start]
    while stack:
        v = stack.pop()
        if id(v) in seen or id(v) not in inside:
            continue
        seen.add(id(v))
        if id(v) in stop:
            stopped.append(v)
            continue
        through.append(v)
        stack.extend(v.srcs)
    return through, stopped


def _frontier(src: Value, earlier: set[int], in_last: set[int]) -> Value | None:
    """The value, computed by the earlier loop too, that the last loop's cone of ``src`` is
    computed from; None when there are several (or none) besides loads and constants."""
    found = [v for v in _walk(src, in_last, earlier)[1] if v.kind not in ("load", "const")]
    return found[0] if len(found) == 1 else None


def _rewired(kernel: Kernel, access: Access, value: Value, loop: int,
             held_as: dt.DType | None = None) -> Kernel | None:
    """The kernel with ``value`` also stored at ``access`` (an output's element, or the thread's
    scratch row, as ``held_as``) in ``loop`` and read back from there by the last loop; None when
    that would not be safe or would save nothing."""
    last = kernel.n_loops
    elsewhere = {id(v) for j in range(1, last) for v in kernel.loop_values(j)}
    held_as = held_as or value.dtype
    reread = Value("load", held_as, arg=access, inner=True)
    new: dict[int, Value] = {}
    out: list[Value] = []
    for v in kernel.values:
        # only what the last loop alone computes reads the value back
        if v.kind in ("reduce", "store"):
            mine = v.loop == last and (v.inner or v.kind == "reduce")
        else:
            mine = v.inner and id(v) not in elsewhere
        srcs = tuple(reread if s is value and mine else new[id(s)] for s in v.srcs)
        if reread in srcs and reread not in out:
            out.append(reread)
        nv = v if srcs == v.srcs else dataclasses.replace(v, srcs=srcs)
        new[id(v)] = nv
        out.append(nv)
        if v is value:
            out.append(Value("store", held_as, (v,), access, inner=True, loop=loop))
    stashed = dataclasses.replace(kernel, values=out)
    if any(v is value for v in stashed.loop_values(last)):
        return None  # the last loop still computes it
    if access.buffer == SCRATCH_ROW:
        return stashed  # no input is written over by it
    index = sympy.expand(access.index)
    for j in range(loop + 1, last + 1):
        for v in stashed.loop_values(j):
            if v.kind == "load" and v is not reread and sympy.expand(v.arg.index) == index:
                return None  # the output may be written over this input, read after the stash
    return stashed
