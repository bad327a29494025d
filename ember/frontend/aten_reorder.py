"""Lowerings of ATen ops that move elements along a dim without computing them: flip, repeat,
unfold (sliding windows) and slice_scatter (``y[a:b:c] = v`` after functionalization).

Each is a read at computed positions (an INDEX of an arange), so it fuses into the kernel that
reads it, with symbolic sizes as everywhere else; before these, each ran as an ATen call that
wrote its whole result to memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node
from ..ir.ops import Op
from .aten_indexing import put_at, source_dtype_matches
from .context import Context, Unsupported, register, size_arg
from .lowering import storage_of

aten = torch.ops.aten


def _positions(ctx: Context, length: Any, start: Any, step: Any) -> Node:
    """The int64 arange start, start + step, ... of ``length`` elements."""
    return ctx.make(Op.IOTA, (), (sh.expr(length), sh.expr(start), sh.expr(step)), dtype=dt.int64)


@register(aten.flip.default)
def _flip(ctx: Context, x: Node, dims: Sequence[int]) -> Node:
    """x read backwards along each of ``dims``: out[.., i, ..] = x[.., n - 1 - i, ..]. One read
    at positions over the block of dims from the first flipped to the last (those between read
    in order), so flipping several dims is one lookup, fused with what reads it."""
    flipped = sorted({d % x.rank for d in dims} if x.rank else set())
    flipped = [d for d in flipped if not (sh.is_one(x.shape[d]) or sh.equal(x.shape[d], 0))]
    if not flipped:
        return x  # (a 0-d tensor, or only dims of 1 or no element: eager's result is x)
    lo, hi = flipped[0], flipped[-1]
    block = x.shape[lo:hi + 1]
    positions = []
    for d in range(lo, hi + 1):
        n = x.shape[d]
        along = _positions(ctx, n, n - 1, -1) if d in flipped else _positions(ctx, n, 0, 1)
        shape = [n if e == d else sympy.Integer(1) for e in range(lo, hi + 1)]
        positions.append(ctx.expand_to(ctx.reshape(along, shape), block))
    return ctx.make(Op.INDEX, (x, *positions), lo)


@register(aten.repeat.default)
def _repeat(ctx: Context, x: Node, repeats: Sequence[Any]) -> Node:
    """x tiled ``repeats[d]`` times along each dim d (new leading dims of size 1 first):
    out[.., i, ..] = x[.., i % n, ..]. Dims of size 1 broadcast; the others are one read at
    positions over the block of dims from the first tiled to the last, as flip's (instance
    norm's weight and running statistics, repeated per sample, ran through ATen)."""
    reps = [size_arg(r) for r in repeats]
    if len(reps) < x.rank:
        raise Unsupported("repeat with fewer repeats than dims (ATen raises eager's error)")
    out_shape = ctx.out_shape
    if any(sh.equal(n, 0) for n in out_shape):
        return ctx.operand(0, x.dtype, out_shape)  # nothing is read
    shape = [sympy.Integer(1)] * (len(reps) - x.rank) + list(x.shape)
    x = ctx.expand_to(ctx.reshape(x, shape), [m if sh.is_one(n) else n for n, m in zip(shape, out_shape)])
    tiled = [d for d, (r, n) in enumerate(zip(reps, shape)) if not sh.is_one(r) and not sh.is_one(n)]
    if not tiled:
        return x
    lo, hi = tiled[0], tiled[-1]
    block = out_shape[lo:hi + 1]
    positions = []
    for d in range(lo, hi + 1):
        along = _positions(ctx, out_shape[d], 0, 1)
        if d in tiled:
            along = ctx.make(Op.MOD, (along, ctx.operand(shape[d], dt.int64, (out_shape[d],))))
        positions.append(ctx.expand_to(ctx.reshape(along, [m if e == d else sympy.Integer(1)
                                                           for e, m in zip(range(lo, hi + 1), block)]), block))
    return ctx.make(Op.INDEX, (x, *positions), lo)


@register(aten.unfold.default)
def _unfold(ctx: Context, x: Node, dim: int, size: Any, step: Any) -> Node:
    """Windows of ``size`` elements every ``step`` along ``dim``, the window as a new last dim:
    out[.., w, .., j] = x[.., w * step + j, ..]."""
    if x.rank == 0:
        raise Unsupported("unfold of a 0-d tensor")
    if isinstance(ctx.out, torch.Tensor) and storage_of(ctx.out) in ctx.shared_output_storages:
        # returned beside another output over its memory (y and y.unfold(...)): eager's is a
        # view of it, where a write into one shows in the other; a gather would be a copy
        raise Unsupported("unfold returned beside another output over its memory: ATen's view")
    dim = dim % x.rank
    size, step = size_arg(size), size_arg(step)
    windows = ctx.out_shape[dim]  # (n - size) // step + 1, as the trace computed it
    if sh.equal(windows, 0) or sh.equal(size, 0):
        # no element is read: nothing can be out of range (the positions would be)
        return ctx.operand(0, x.dtype, ctx.out_shape)
    starts = ctx.reshape(_positions(ctx, windows, 0, step), [windows, 1])
    offsets = ctx.reshape(_positions(ctx, size, 0, 1), [1, size])
    at = ctx.make(Op.ADD, (ctx.expand_to(starts, (windows, size)), ctx.expand_to(offsets, (windows, size))))
    taken = ctx.make(Op.INDEX, (x, at), dim)  # x.shape[:dim] + (windows, size) + x.shape[dim + 1:]
    order = [d for d in range(x.rank + 1) if d != dim + 1] + [dim + 1]
    return ctx.make(Op.PERMUTE, (taken,), tuple(order)) if order != list(range(x.rank + 1)) else taken


@register(aten.slice_scatter.default)
def _slice_scatter(ctx: Context, x: Node, src: Node, dim: int = 0, start: Any = None, end: Any = None,
                   step: int = 1) -> Node:
    """x with ``src`` written over x[.., start:end:step, ..] along ``dim``: a select per element,
    out[p] = src[(p - start) / step] where p is one of the slice's positions, else x[p]."""
    if x.rank == 0 or not isinstance(src, Node) or src.rank != x.rank:
        raise Unsupported("slice_scatter of a 0-d tensor, or with a source of another rank")
    source_dtype_matches("slice_scatter", x, src)
    dim = dim % x.rank
    n, length = x.shape[dim], src.shape[dim]
    first, last, step = _bound(ctx, start, 0, n), _bound(ctx, end, n, n), size_arg(step)
    # (a symbolic step, y[::k] = v, is positive under the guards: the slice checked it)
    if not (int(step) >= 1 if step.is_Integer else _known(ctx, sympy.Ge(step, 1))):
        raise Unsupported("slice_scatter with a step that may not be positive")
    # src must be the slice's shape (the trace does not check it): else ATen raises eager's error
    span = last - first if _known(ctx, sympy.Ge(last, first)) else sympy.Max(0, last - first)
    covered = FloorDiv(span + step - 1, step)  # (torch's spelling of the slice's length)
    if not all(ctx.known_equal(s, covered if d == dim else m) for d, (s, m) in enumerate(zip(src.shape, x.shape))):
        raise Unsupported("slice_scatter with a source not shaped like the slice")
    if sh.equal(length, 0):
        return x
    if (ctx.known_equal(first, sympy.Integer(0)) and sh.equal(step, 1)
            and all(sh.equal(a, b) for a, b in zip(src.shape, x.shape))):
        return src  # (the whole of x: an outer dim's ``:`` of a slice written at dynamic sizes)
    if ctx.written_back and x.op is Op.INPUT and not _reads(src, x):
        # the result is written into x, an input (a KV cache's new entries, ``cache[:, :, t] = k``):
        # a write of src at the slice's positions, which the program makes into x itself
        # (codegen/input_writes.py); the select below reads and writes all of x. (A src that
        # reads x, a slice of a slice written, keeps the select: a write at indices whose kernel
        # reads the input is not made in place.)
        return put_at(ctx, x, dim, [_positions(ctx, length, first, step)], src, False, 3, x.dtype)
    # which positions along dim the slice covers, and (step > 1) where in src each one reads
    p = _positions(ctx, n, 0, 1)
    c = lambda v: ctx.operand(v, dt.int64, (n,))  # noqa: E731
    inside = ctx.make(Op.AND, (ctx.make(Op.GE, (p, c(first))), ctx.make(Op.LT, (p, c(first + step * length)))))
    if sh.equal(step, 1):
        # src padded to x's size along dim: read in place, no lookup
        pairs = tuple((first, n - first - length) if d == dim else (sympy.Integer(0), sympy.Integer(0))
                      for d in range(x.rank))
        placed = ctx.make(Op.PAD, (src, ctx.const(0, src.dtype)), pairs)
    else:
        rel = ctx.make(Op.SUB, (p, c(first)))
        inside = ctx.make(Op.AND, (inside, ctx.make(Op.EQ, (ctx.make(Op.MOD, (rel, c(step))), c(0)))))
        # (outside the slice the position read is clamped into src: read, then not selected)
        at = ctx.make(Op.MIN, (ctx.make(Op.MAX, (ctx.make(Op.FLOORDIV, (rel, c(step))), c(0))), c(length - 1)))
        placed = ctx.make(Op.INDEX, (src, at), dim)
    along = [n if d == dim else sympy.Integer(1) for d in range(x.rank)]
    inside = ctx.expand_to(ctx.reshape(inside, along), x.shape)
    return ctx.make(Op.WHERE, (inside, ctx.expand_to(placed, x.shape), x))


def _reads(node: Node, x: Node) -> bool:
    """Is ``x`` among what ``node`` is computed from?"""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n is x:
            return True
        if id(n) not in seen:
            seen.add(id(n))
            stack.extend(n.inputs)
    return False


def _bound(ctx: Context, bound: Any, default: sympy.Expr, size: sympy.Expr) -> sympy.Expr:
    """A slice's start or end as eager takes it: from the end where negative, clamped to
    [0, size]; a symbolic one whose sign and range the guards do not fix goes to ATen."""
    if bound is None:
        return default
    bound = size_arg(bound)
    if bound.is_Integer:
        if int(bound) >= 2**62:
            # (x[a:] ends at sys.maxsize: the size, which a symbolic Min would hide; no size
            # reaches 2^62, and the guards give sizes no upper bound)
            return size
        if int(bound) < 0:
            bound = size + bound
            if not _known(ctx, sympy.Ge(bound, 0)):
                bound = sympy.Max(0, bound)
        return bound if _known(ctx, sympy.Le(bound, size)) else sympy.Min(bound, size)
    if _known(ctx, sympy.Ge(bound, 0)) and _known(ctx, sympy.Le(bound, size)):
        return bound
    raise Unsupported("slice_scatter at a symbolic start or end that may be negative or past the size")


def _known(ctx: Context, fact: sympy.Basic) -> bool:
    """Whether a relation between size expressions holds on every call (from the guards)."""
    if fact == sympy.true:
        return True
    env = ctx._shape_env()
    try:
        return env is not None and env._maybe_evaluate_static(fact) == sympy.true
    except Exception:  # noqa: BLE001 -- a private torch API: unknown
        return False
