"""Strides of views: what a chain of permutes, expands, slices and reshapes over a strided
tensor looks like in memory, as torch computes a view's strides. Kernels read views of buffers
through these (schedule/), and passes ask them which layouts a kernel would get (a matmul operand
that TMA can read)."""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from . import shapes as sh
from .node import Node
from .ops import Op

Strided = tuple[tuple[sympy.Expr, ...], sympy.Expr]  # (strides, offset)

Groups = list[tuple[list[int], list[int]]]


def reshape_groups(out_shape: Sequence[sympy.Expr], in_shape: Sequence[sympy.Expr]) -> Groups | None:
    """Split a reshape into groups of output dims and input dims with equal element counts
    (e.g. [B*N, 4] <- [B, N, 4] is ([0], [0, 1]) and ([1], [2])). None when the products never
    line up symbolically."""
    n_out, n_in = len(out_shape), len(in_shape)
    if any(sh.equal(d, 0) for d in list(out_shape) + list(in_shape)):
        return None  # nothing is iterated; callers fall back to one flat group
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < n_out or j < n_in:
        outs: list[int] = []
        ins: list[int] = []
        p_out = p_in = sympy.Integer(1)
        if i < n_out:
            outs.append(i)
            p_out, i = p_out * out_shape[i], i + 1
        if j < n_in:
            ins.append(j)
            p_in, j = p_in * in_shape[j], j + 1
        while not sh.equal(p_out, p_in):
            if i < n_out and (_divides(p_out, p_in) or j >= n_in):
                outs.append(i)
                p_out, i = p_out * out_shape[i], i + 1
            elif j < n_in:
                ins.append(j)
                p_in, j = p_in * in_shape[j], j + 1
            else:
                return None
        groups.append((outs, ins))
    return groups


def _divides(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Does ``a`` divide ``b`` (so ``a`` is the side that must grow)?"""
    if a.is_Integer and b.is_Integer:
        return int(b) % int(a) == 0 if int(a) else False
    _num, den = sympy.fraction(sympy.cancel(b / a))
    return den == 1


def compose_strided(node: Node, base: Strided) -> Strided | None:
    """Strides and offset of view ``node`` given those of its input, or None when the view cannot
    be expressed with strides (a reshape across non-contiguous dims)."""
    strides, off = base
    x = node.inputs[0]
    if node.op is Op.PERMUTE:
        return tuple(strides[d] for d in node.arg), off
    if node.op is Op.EXPAND:
        if x.rank == 0:
            return tuple(sympy.Integer(0) for _ in node.shape), off
        return tuple(sympy.Integer(0) if sh.is_one(s) and not sh.is_one(n) else st
                     for s, n, st in zip(x.shape, node.shape, strides)), off
    if node.op is Op.SLICE:
        dim, start, step, _length = node.arg
        new = list(strides)
        new[dim] = strides[dim] * step
        return tuple(new), off + start * strides[dim]
    if node.op is Op.RESHAPE:
        groups = reshape_groups(node.shape, x.shape)
        if groups is None:
            return None
        out = [sympy.Integer(0)] * node.rank
        for outs, ins in groups:
            real = [j for j in ins if not sh.is_one(x.shape[j])]
            # the input dims of a group must be contiguous with each other
            for a, b in zip(real, real[1:]):
                if not sh.equal(strides[a], strides[b] * x.shape[b]):
                    return None
            inner_stride = strides[real[-1]] if real else sympy.Integer(0)
            for i, s in zip(outs, sh.contiguous_strides([node.shape[i] for i in outs])):
                out[i] = inner_stride * s
        return tuple(out), off
    raise AssertionError(node.op)
