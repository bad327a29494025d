"""Kernel-IR loop transforms shared by every backend.

``collapse_dims`` merges adjacent loop dimensions that every access walks contiguously across
(o_i*stride_i + o_j*stride_j with stride_i == stride_j * size_j), the way Inductor merges
ranges: a contiguous [rows, cols] pointwise op becomes a single loop over rows*cols, and the
padded GIoU loss's [batch, boxes] reduction a single inner loop.
"""

from __future__ import annotations

import dataclasses

import sympy

from ..ir import shapes as sh
from .kernel_ir import Kernel, ReduceArg, Value, inner_var, outer_var


def _exprs(kernel: Kernel) -> list[sympy.Expr]:
    out: list[sympy.Expr] = []
    for v in kernel.values:
        if v.kind in ("load", "store"):
            out.append(v.arg.index)
        elif v.kind == "index":
            out.append(v.arg)
        elif v.kind == "reduce":
            out.append(v.arg.position)
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
        nv = dataclasses.replace(v, arg=arg, srcs=tuple(new[id(s)] for s in v.srcs))
        new[id(v)] = nv
        out.append(nv)
    return out


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
