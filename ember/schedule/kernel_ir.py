"""The loop-level kernel IR every backend renders.

A kernel iterates an *outer* domain (parallel: rows, or every element of a pointwise kernel) and,
inside each outer iteration, zero or more *inner loops* over the reduction domain:

    for o in outer:                      # o0, o1, ... (parallel)
        <outer values of stage 0>
        loop 1 over r: accumulate reductions of loop 1 (and inner stores of loop 1)
        <outer values of stage 1>        # may use loop-1 results
        loop 2 over r: ...
        <outer stores>

A *chunked* row kernel (``Kernel.chunks``) splits its rows into that many runs, each walked in
order by one program (or thread), so that it can also add up columns over its run: a ``chunksum``
accumulates its source per inner position over the run's rows, and its store, at ``CHUNK`` (the
run's index) and the inner position, writes the run's partial column sums (passes/chunks.py).

A row kernel can also reduce over its rows (a cross-entropy's mean over its per-row losses): a
``rowreduce`` accumulates an outer value over every row. Its result, and what is computed from it,
is at ``FINAL_STAGE``: after all rows, by the program (block, thread team) that finishes last.

A *scan* kernel (``Kernel.scans``) walks each row in order, in one loop: a ``scan`` value holds
its source accumulated over the iterations so far (inclusive), so the loop's stores can read it
(a cumsum and what is computed from it). The loop runs r0 from the row's end down when its
scans are reversed (``Kernel.scan_reverse``).

Values are SSA; each knows whether it varies with the inner index (``inner``) and, for outer
values, after which loop it is available (``stage``). A softmax is three loops (max, sum, store)
over each row; an RMSNorm two; a pointwise kernel none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.ops import Op


def outer_var(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"o{i}", integer=True, nonnegative=True)


def inner_var(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"r{i}", integer=True, nonnegative=True)


def indirect_var(i: int) -> sympy.Symbol:
    """An index position that holds a loaded value (a gather's index): the load that uses it lists
    the index value among its sources, and renderers print the value's name in its place."""
    return sympy.Symbol(f"ind{i}", integer=True, nonnegative=True)  # (checked or clamped in range)


# The inner extent of a segment kernel (a row of a ragged tensor): a value each outer iteration
# loads from the offsets (``Kernel.segment_length``), not a size the host knows.
SEGMENT_LENGTH = sympy.Symbol("ember_seglen", integer=True, nonnegative=True)


# The run of rows a chunked row kernel is walking (see ``Kernel.chunks``): its partial column sums
# are stored at this index.
CHUNK = sympy.Symbol("ember_chunk", integer=True, nonnegative=True)


# A thread's scratch row: the buffer a row kernel keeps a float32 (float64) value in between its
# loops when no output can hold it (schedule/loops.py: stash_recomputed), indexed by the flat
# inner position. Backends that keep one (the CPU's) give each thread its own.
SCRATCH_ROW = "ember_scratch"


# The stage of values computed after every row of a row kernel (from rowreduce results).
FINAL_STAGE = 1 << 20


def is_index_var(s: sympy.Symbol) -> bool:
    name = s.name
    return (name[0] in "or" and name[1:].isdigit()) or (name.startswith("ind") and name[3:].isdigit())


# the op each index check's error code (schedule/build_index.py: ``indirect``) stands for
_CHECKED_OPS = {2: "gather", 3: "index", 4: "index_add/scatter_add", 5: "nll_loss/cross_entropy target",
                6: "scatter", 7: "index_add", 8: "embedding", 9: "index_select", 10: "index_copy",
                11: "index_select", 12: "put"}


def index_error_message(check: Value) -> str:
    """What a GPU kernel's device-side assert says when a 'checkindex' value is out of range."""
    return f"ember: {_CHECKED_OPS.get(check.arg[2], 'indexing')}: index out of bounds"


def is_indirect_var(s: sympy.Symbol) -> bool:
    return s.name.startswith("ind") and s.name[3:].isdigit()


@dataclass(frozen=True)
class Access:
    buffer: str
    index: sympy.Expr  # element offset, in outer/inner vars and size symbols
    # indirect variables of ``index``: bindings[i] is the value of the load's srcs[i] (of a
    # store's srcs[i + 1]: its first source is the value stored)
    bindings: tuple[sympy.Symbol, ...] = ()
    # a store that adds into the buffer, atomically (index_put's +=), or combines with what it
    # holds by "amax" or "amin" (scatter_reduce's), atomically
    accumulate: bool | str = False


@dataclass(frozen=True)
class SearchArg:
    """A binary search over a sorted 1-d sequence held in ``buffer``: elements at
    ``start + i * stride`` for i < ``length``; ``right`` counts elements <= the value, else <."""
    buffer: str
    start: sympy.Expr
    stride: sympy.Expr
    length: sympy.Expr
    right: bool


@dataclass(frozen=True)
class ReduceArg:
    op: Op                     # SUM, PROD, AMAX, AMIN, ARGMAX, ARGMIN, ANY, ALL
    position: sympy.Expr       # flat position in the reduction domain (ARGMAX/ARGMIN report it)


@dataclass(eq=False)
class Value:
    """One SSA instruction.

    kind: 'load' (arg Access; a gather's load lists its index values as sources, bound to the
    ``ind<k>`` variables of its index), 'const' (number or size expression), 'index' (an index
    expression as a value), 'alu' (arg: the pointwise Op; CAST converts to ``dtype``), 'reduce'
    (arg ReduceArg; accumulates its single source over the inner domain), 'store' (arg Access;
    a write at indices lists the index values after the value, and may add instead of write),
    'checkindex' (arg: (bound, dim label, error code, whether only a segment row's elements
    read it); its source clamped into [0, bound), flagging the error code on the CPU when it was
    not, and stopping GPU kernels with a device-side assert), 'search' (arg SearchArg: the position of
    its source in a sorted sequence, searchsorted's answer), 'chunksum' (arg ReduceArg: adds its
    source over the rows of a chunked kernel's run, per inner position; only a store reads it, and
    writes the run's total when the run ends), 'rowreduce' (arg ReduceArg: reduces its outer
    source over all rows; available at FINAL_STAGE), 'dot' (a matmul's float32 sum over the inner
loop of the products of its two sources, loads of the operands at (o0, r0) and (r0, o1)), 'scan' (arg
ir.node.ScanArg: its source combined over the scan loop's iterations so far, up to and with this
one; an inner value of a scan kernel's one loop).

    ``guard``: a bool value; where it is false nothing uses this value (it feeds only the branch
    of a ``where`` that is not taken there), so renderers may skip loading and computing it
    (schedule/guards.py).
    """

    kind: str
    dtype: dt.DType
    srcs: tuple[Value, ...] = ()
    arg: Any = None
    inner: bool = False   # varies with the inner (reduction) index
    loop: int = 0         # reduce: the inner loop accumulating it; store: its loop (0 = outer)
    stage: int = 0        # outer values: the loop after which it can be computed
    guard: Value | None = None


def stage_needs() -> Callable[[Value], int]:
    """``needs(v)``: the latest stage of any outer value ``v`` uses (an outer value's own stage),
    memoized per inner value; an inner value can be computed in loops after that stage."""
    memo: dict[int, int] = {}

    def needs(v: Value) -> int:
        if not v.inner:
            return v.stage
        # sources before their users on an explicit stack: recursion went past Python's limit
        # on a chain of hundreds of inner values
        stack = [v]
        while stack:
            top = stack[-1]
            pending = [s for s in top.srcs if s.inner and id(s) not in memo]
            if pending:
                stack += pending
                continue
            stack.pop()
            memo[id(top)] = max((memo[id(s)] if s.inner else s.stage for s in top.srcs), default=0)
        return memo[id(v)]

    return needs


def reachable(values: list[Value]) -> set[int]:
    """Ids of ``values`` and of every value they read, their guards included."""
    seen: set[int] = set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        stack.extend(v.srcs)
        if v.guard is not None:
            stack.append(v.guard)
    return seen


@dataclass(frozen=True)
class Param:
    name: str
    dtype: dt.DType
    is_output: bool


@dataclass
class Kernel:
    name: str
    params: list[Param]
    sizes: list[sympy.Symbol]          # size symbols passed as int64 arguments
    outer: tuple[sympy.Expr, ...]
    inner: tuple[sympy.Expr, ...]
    values: list[Value]                # topological order
    n_loops: int = 0
    origins: list[str] = field(default_factory=list)  # ATen ops fused, in order, deduplicated
    # a segment kernel (inner == (SEGMENT_LENGTH,)): the outer value holding its row's length;
    # the inner loops run r0 over [0, length) and read the row at its start offset + r0
    segment_length: Value | None = None
    segment_hint: sympy.Expr | None = None  # the mean row length, for launch heuristics
    # a row kernel that also sums columns (chunksum values): its rows split into this many runs,
    # one per program or thread, each run's partial sums stored at CHUNK
    chunks: int | None = None
    # size symbols read on the device, each from a parameter at an element index: a ragged
    # total T from its offsets' last element (ir.node.ragged_totals). The host's value sizes the
    # grid only, so one launch (a CUDA graph) serves every T up to it.
    device_sizes: dict[sympy.Symbol, tuple[str, sympy.Expr]] = field(default_factory=dict)
    # a combination of independent pointwise kernels launched as one, each on programs of its
    # own (codegen/triton_combos.py); its params, sizes and values are theirs, together
    parts: list[Kernel] = field(default_factory=list)

    @property
    def inner_hint(self) -> sympy.Expr:
        """The inner extent as a size expression (the mean row length for a segment kernel)."""
        return self.segment_hint if self.segment_length is not None else sh.numel(self.inner)

    @property
    def stores(self) -> list[Value]:
        return [v for v in self.values if v.kind == "store"]

    @property
    def reductions(self) -> list[Value]:
        return [v for v in self.values if v.kind == "reduce"]

    @property
    def scans(self) -> list[Value]:
        """Running accumulations along the rows (a scan kernel: one loop, rows walked in order)."""
        return [v for v in self.values if v.kind == "scan"]

    @property
    def scan_reverse(self) -> bool:
        """Does a scan kernel's loop walk its rows from the end (its scans are reversed)?"""
        return any(v.arg.reverse for v in self.values if v.kind == "scan")

    @property
    def dots(self) -> list[Value]:
        """Matmul accumulations (a matmul kernel: outer (M, N), inner (K,))."""
        return [v for v in self.values if v.kind == "dot"]

    @property
    def row_reductions(self) -> list[Value]:
        """Reductions over all rows (their results, and what uses them, are at FINAL_STAGE)."""
        return [v for v in self.values if v.kind == "rowreduce"]

    def after_rows(self) -> tuple[list[Value], list[Value]]:
        """What comes after all rows: (values computed before it uses, row-independent ones such
        as constants, which renderers whose row loops scope them compute again; the values
        themselves, rowreduce results excluded)."""
        final = [v for v in self.values if v.stage == FINAL_STAGE and not v.inner and v.kind != "rowreduce"]
        before = [s for v in final for s in (*v.srcs, *((v.guard,) if v.guard is not None else ()))
                  if s.stage != FINAL_STAGE]
        needed = reachable(before)
        return [v for v in self.values if id(v) in needed], final

    @property
    def chunk_stores(self) -> list[Value]:
        """Stores of the runs' partial column sums (their source is a chunksum)."""
        return [v for v in self.values if v.kind == "store" and v.srcs[0].kind == "chunksum"]

    def loop_values(self, k: int) -> list[Value]:
        """Inner values that loop ``k`` must compute: what its reductions, stores and index
        checks need (a check that no load uses has a loop of its own: build.assign_loops)."""
        roots = [v for v in self.values if v.kind in ("reduce", "store", "chunksum", "dot", "checkindex")
                 and v.loop == k]
        needed: set[int] = set()
        stack = [s for r in roots for s in r.srcs] + [r for r in roots if r.kind == "checkindex"]
        while stack:
            v = stack.pop()
            if id(v) in needed or not v.inner:
                continue
            needed.add(id(v))
            stack.extend(v.srcs)
            if v.guard is not None:
                stack.append(v.guard)
        return [v for v in self.values if id(v) in needed]

    def __str__(self) -> str:
        return format_kernel(self)


def format_kernel(k: Kernel) -> str:
    names = {id(v): f"v{i}" for i, v in enumerate(k.values)}
    params = ", ".join(f"{'out ' if p.is_output else ''}{p.name}: {p.dtype.short}" for p in k.params)
    head = f"kernel {k.name}({params}; sizes {', '.join(map(str, k.sizes)) or '-'})"
    if k.parts:
        return "\n".join([head, f"  {len(k.parts)} independent kernels in one launch, each on programs of its own",
                          *(format_kernel(part) for part in k.parts)])
    lines = [head,
             f"  outer {sh.fmt(k.outer)}  inner {sh.fmt(k.inner)}  loops {k.n_loops}"
             + (f"  rows in {k.chunks} runs" if k.chunks else "")]
    lines += [f"  {s} = {name}[{index}] (read on the device in graphed steps)"
              for s, (name, index) in k.device_sizes.items()]
    for v in k.values:
        where = f"loop {v.loop}" if v.kind in ("reduce", "store", "chunksum", "dot") and v.loop else (
            "inner" if v.inner else "after all rows" if v.stage == FINAL_STAGE else f"stage {v.stage}")
        srcs = ", ".join(names[id(s)] for s in v.srcs)
        if v.kind in ("load", "store"):
            combine = v.arg.accumulate
            combine = f" {combine}=" if isinstance(combine, str) else " +=" if combine else ""
            detail = f"{v.arg.buffer}[{v.arg.index}]{combine}"
        elif v.kind == "checkindex":
            detail = f"< {v.arg[0]}"
        elif v.kind == "search":
            a = v.arg
            detail = f"{a.buffer}[{a.start} + i*{a.stride}, i < {a.length}] {'<=' if a.right else '<'}"
        elif v.kind == "alu":
            detail = v.arg.value
        elif v.kind == "dot":
            detail = "sum over r0 of products"
        elif v.kind in ("reduce", "chunksum", "rowreduce"):
            detail = v.arg.op.value
        elif v.kind == "scan":
            detail = f"{'reversed ' if v.arg.reverse else ''}{v.arg.combine}"
        else:
            detail = str(v.arg)
        if v.guard is not None:
            where += f", if {names[id(v.guard)]}"
        lines.append(f"  {names[id(v)]}: {v.dtype.short} = {v.kind} {detail}"
                     f"{' (' + srcs + ')' if srcs else ''}   [{where}]")
    return "\n".join(lines)
