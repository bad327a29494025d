"""Lowerings of reductions and normalizations: sum, prod, mean, amax/amin, max/min (values and
indices), argmax/argmin, any/all, var/std (and var_mean/std_mean), linalg_vector_norm, dist,
softmax/log_softmax and native_layer_norm.

16-bit inputs accumulate in float32; var and std take the corrected two-pass variance
(``_var``), which layer_norm shares. A reduction over a dim that may be empty where ATen raises
runs through ATen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Node, SizeCheck
from ..ir.ops import Op
from .context import Context, Unsupported, register

aten = torch.ops.aten


def _dims(dim: Any, rank: int) -> tuple[int, ...]:
    """Normalize a dim / dim list (None or [] meaning all) to sorted non-negative dims."""
    if dim is None:
        return tuple(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(rank))
    out = sorted({d % rank if rank else 0 for d in dim})
    return tuple(out) if rank else ()


def _keepdim_or_squeeze(ctx: Context, node: Node, dims: Sequence[int], keepdim: bool) -> Node:
    if keepdim:
        return node
    return ctx.reshape(node, [s for i, s in enumerate(node.shape) if i not in dims])


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------

def _reduce(ctx: Context, op: Op, x: Node, dims: tuple[int, ...], keepdim: bool) -> Node:
    if x.rank == 0:
        dims = ()
    if dims:
        node = ctx.make(op, (x,), dims)
    elif op in (Op.ARGMAX, Op.ARGMIN):
        node = ctx.operand(0, dt.int64, x.shape)  # the only position of a 0-d tensor
    elif op is Op.SUM:
        node = ctx.sum_of_one(x)  # (a 0-d tensor's -0.0 sums to 0.0, as in eager)
    else:
        node = x
    return _keepdim_or_squeeze(ctx, node, dims, keepdim)


def _count(x: Node, dims: Sequence[int]) -> sympy.Expr:
    return sh.numel([x.shape[d] for d in dims])


@register(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    x = ctx.cast(x, ctx.out_dtype)
    if x.dtype.is_bool:
        # a sum into bool is eager's "any element nonzero"; as a bool-typed sum, kernels added
        # bytes (an OpenMP + reduction's partials, 32 trues wrapping to 0) into invalid bools
        return _reduce(ctx, Op.ANY, x, _dims(dim, x.rank), keepdim)
    if x.dtype.is_low_precision:
        x = ctx.cast(x, dt.float32)  # accumulate wide; the result is cast back
    return _reduce(ctx, Op.SUM, x, _dims(dim, x.rank), keepdim)


@register(aten.prod.default, aten.prod.dim_int)
def _prod(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    if ctx.out_dtype.is_low_precision and ctx.device == "cpu":
        # eager's CPU kernel multiplies in the 16-bit type, rounding (and overflowing: float16
        # 300 * 300 is inf) at every step, where ember's would accumulate in float32
        raise Unsupported("a 16-bit product on the CPU (ATen rounds every step)")
    x = ctx.cast(x, dt.compute_dtype(ctx.out_dtype))
    return _reduce(ctx, Op.PROD, x, _dims(dim, x.rank), keepdim)


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    x = ctx.cast(x, dt.compute_dtype(ctx.out_dtype))
    dims = _dims(dim, x.rank)
    total = _reduce(ctx, Op.SUM, x, dims, keepdim)
    return ctx.make(Op.DIV, (total, ctx.operand(_count(x, dims), x.dtype, total.shape)))


@register(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def _amax_amin(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
    dims = _dims(dim, x.rank)
    if x.rank and not all(ctx.known_nonzero(x.shape[d]) for d in dims):
        # (only a reduced dim: eager's amax over the columns of a (0, 3) tensor is empty)
        raise Unsupported("max over an empty dim raises in ATen (its size may be 0)")
    op = Op.AMAX if ctx.aten in ("aten.amax", "aten.max") else Op.AMIN
    return _reduce(ctx, op, x, dims, keepdim)


@register(aten.max.dim, aten.min.dim)
def _max_dim(ctx: Context, x: Node, dim: int, keepdim: bool = False) -> tuple[Node, Node]:
    is_max = ctx.aten == "aten.max"
    dims = _dims(dim, x.rank)
    if x.rank and not ctx.known_nonzero(x.shape[dims[0]] if dims else 1):
        raise Unsupported("max over an empty dim raises in ATen (its size may be 0)")
    values = _reduce(ctx, Op.AMAX if is_max else Op.AMIN, x, dims, keepdim)
    indices = _reduce(ctx, Op.ARGMAX if is_max else Op.ARGMIN, x, dims, keepdim)
    return values, indices


@register(aten.argmax.default, aten.argmin.default)
def _argmax(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
    op = Op.ARGMAX if ctx.aten == "aten.argmax" else Op.ARGMIN
    if x.dtype.is_bool:
        raise Unsupported(f"ATen's {op.value} rejects bool")
    reduced = sh.numel(x.shape) if dim is None else x.shape[_dims(dim, x.rank)[0]] if x.rank else 1
    if not ctx.known_nonzero(reduced):
        raise Unsupported(f"{op.value} over no elements raises in ATen (the size may be 0)")
    if dim is None:
        flat = ctx.reshape(x, [sh.numel(x.shape)])
        out = _reduce(ctx, op, flat, (0,), True)
        return ctx.reshape(out, ctx.out_shape)
    return _reduce(ctx, op, x, _dims(dim, x.rank), keepdim)


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def _any_all(ctx: Context, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
    op = Op.ANY if ctx.aten == "aten.any" else Op.ALL
    x = ctx.cast(x, dt.bool_)
    if isinstance(dim, (list, tuple)) and not dim:  # any(b, ()): over no dims, as in ATen
        return x
    return _reduce(ctx, op, x, _dims(dim, x.rank), keepdim)


def _var(ctx: Context, x: Node, dims: tuple[int, ...], correction: Any, keepdim: bool) -> tuple[Node, Node]:
    """Corrected two-pass variance (Chan, Golub and LeVeque): a first mean m, then over the
    deviations d = x - m both sum(d * d) and sum(d), which repair the rounding of m: the mean is
    m + sum(d) / n and the variance (sum(d * d) - sum(d)^2 / n) / (n - correction). Both passes
    fuse into one kernel (the second loop reads what the first computed). Without the repair, a
    large mean rounded to float32 (to 0.008 at 1e5; a float32 sum of 1e5 such values is off by
    more) was squared into the variance: relative errors of 1e-5 to 5 where eager's are 1e-8."""
    if not x.dtype.is_float:
        raise Unsupported("ATen's var and std reject integer and bool inputs")
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    n = _count(x, dims)
    total = ctx.make(Op.SUM, (x,), dims)
    count = ctx.operand(n, x.dtype, total.shape)
    first = ctx.make(Op.DIV, (total, count))
    dev = ctx.make(Op.SUB, (x, ctx.expand_to(first, x.shape)))
    sq = ctx.make(Op.SUM, (ctx.make(Op.MUL, (dev, dev)),), dims)
    drift = ctx.make(Op.SUM, (dev,), dims)
    mean = ctx.make(Op.ADD, (first, ctx.make(Op.DIV, (drift, count))))
    # (sum(d)^2 / n is at most sum(d * d): the difference, rounded, is kept at 0 or above)
    sq = ctx.make(Op.MAX, (ctx.make(Op.SUB, (sq, ctx.make(Op.DIV, (ctx.make(Op.MUL, (drift, drift)), count)))),
                           ctx.operand(0, x.dtype, sq.shape)))
    corr = 1 if correction is None else correction
    corr = sympy.Integer(int(corr)) if float(corr).is_integer() else sympy.Float(float(corr))
    denom = ctx.make(Op.MAX, (ctx.operand(n - corr, x.dtype, sq.shape), ctx.operand(0, x.dtype, sq.shape)))
    var = ctx.make(Op.DIV, (sq, denom))
    return _keepdim_or_squeeze(ctx, var, dims, keepdim), _keepdim_or_squeeze(ctx, mean, dims, keepdim)


def _warn_no_degrees_of_freedom(ctx: Context, x: Node, dims: tuple[int, ...], correction: Any) -> None:
    """Eager's UserWarning where the count of each reduction (numel over output numel: 0 where
    there is no output) is at most the correction: the result is NaN or inf. Sizes decide it, so
    the host program checks them on each call (a comparison; none where they cannot fail)."""
    corr = 1 if correction is None else float(correction)
    low = math.floor(corr) + 1  # (counts are integers: count - correction > 0 from here on)
    if low <= 0 or not math.isfinite(corr):
        return
    kept = sh.numel([x.shape[d] for d in range(x.rank) if d not in dims])
    count = sympy.sympify(_count(x, dims) * sympy.Min(1, kept))
    fname = ctx.aten.split(".")[-1]
    ctx.size_checks.append(SizeCheck(count, low, 2**63 - 1, "UserWarning",
                                     f"{fname}(): degrees of freedom is <= 0. Correction should be strictly less "
                                     "than the reduction factor (input numel divided by output numel).", warn=True))


@register(aten.var.correction)
def _var_correction(ctx: Context, x: Node, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Node:
    var = _var(ctx, x, _dims(dim, x.rank), correction, keepdim)[0]
    _warn_no_degrees_of_freedom(ctx, x, _dims(dim, x.rank), correction)
    return var


@register(aten.var_mean.correction)
def _var_mean(ctx: Context, x: Node, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple[Node, Node]:
    out = _var(ctx, x, _dims(dim, x.rank), correction, keepdim)
    _warn_no_degrees_of_freedom(ctx, x, _dims(dim, x.rank), correction)
    return out


@register(aten.linalg_vector_norm.default)
def _vector_norm(ctx: Context, x: Node, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: Any = None) -> Node:
    """The 2-norm (F.normalize, cosine similarity, clip_grad_norm_), the 1-norm, the inf and -inf
    norms (the largest and smallest magnitude), the 0-"norm" (a count of nonzeros) and any other
    order p, sum(|x|^p)^(1/p), as reductions over the reduced dims, so they fuse with what reads
    them. A ``dtype`` casts the input first, as eager does."""
    if isinstance(ord, bool) or not isinstance(ord, (int, float)) or x.dtype is None or not x.dtype.is_float:
        raise Unsupported(f"vector_norm of order {ord!r} (dtype={dtype})")
    if dtype is not None:
        if not ctx.out_dtype.is_float:
            raise Unsupported(f"vector_norm with dtype={dtype}")
        x = ctx.cast(x, ctx.out_dtype)
    dims = _dims(dim, x.rank)
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    if ord < 0 or ord == math.inf:
        # (an empty reduced dim: ATen's "does not have an identity" error)
        if x.rank and not all(ctx.known_nonzero(x.shape[d]) for d in dims):
            raise Unsupported(f"the {ord} norm of no elements raises in ATen (the size may be 0)")
    if ord in (math.inf, -math.inf):
        op = Op.AMAX if ord > 0 else Op.AMIN
        return _reduce(ctx, op, ctx.make(Op.ABS, (x,)), dims, keepdim)
    if ord == 0:  # (a NaN counts, as in eager)
        nonzero = ctx.make(Op.NE, (x, ctx.operand(0, x.dtype, x.shape)))
        return _reduce(ctx, Op.SUM, ctx.cast(nonzero, x.dtype), dims, keepdim)
    if sh.is_one(sh.numel([x.shape[d] for d in dims])):
        # the norm of one element is its size, as eager's is (ATen takes abs there): its square
        # overflows past 1.8e19 in float32 (and goes subnormal below 1e-19)
        ord = 1
    if ord in (1, 2):
        terms = ctx.make(Op.MUL, (x, x)) if ord == 2 else ctx.make(Op.ABS, (x,))
        total = _reduce(ctx, Op.SUM, terms, dims, keepdim)
        return ctx.make(Op.SQRT, (total,)) if ord == 2 else total
    # ATen's NormOps: the order and its inverse rounded to the accumulation type (float32's
    # 1.0f / 3.0f), each term and the root a pow in that type
    acc = dt.to_torch(x.dtype)
    p = torch.tensor(float(ord), dtype=acc)
    inv = (torch.tensor(1.0, dtype=acc) / p).item()
    terms = ctx.make(Op.POW, (ctx.make(Op.ABS, (x,)), ctx.operand(p.item(), x.dtype, x.shape)))
    total = _reduce(ctx, Op.SUM, terms, dims, keepdim)
    return ctx.make(Op.POW, (total, ctx.operand(inv, x.dtype, total.shape)))


@register(aten.dist.default)
def _dist(ctx: Context, a: Node, b: Node, p: Any = 2) -> Node:
    """The p-norm of ``a - b`` (broadcast), as ATen computes it: the difference rounded to the
    result's dtype (a 16-bit one too), then ``linalg_vector_norm`` over every element."""
    dtype = ctx.out_dtype
    if not dtype.is_float:
        raise Unsupported("dist of integers (ATen's error)")
    shape = sh.broadcast(a.shape, b.shape)
    wide = dt.compute_dtype(dtype)
    diff = ctx.make(Op.SUB, (ctx.operand(a, wide, shape), ctx.operand(b, wide, shape)))
    return _vector_norm(ctx, ctx.cast(diff, dtype), p)


@register(aten.std.correction, aten.std_mean.correction)
def _std(ctx: Context, x: Node, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    """The root of a variance held in float64 until then, as eager's CPU kernel holds it: a
    float32 (or 16-bit) variance overflows for values past 1e19 and vanishes below 1e-23, where
    their standard deviation is finite."""
    if not x.dtype.is_float:
        raise Unsupported("ATen's var and std reject integer and bool inputs")
    wide = ctx.cast(x, dt.float64)
    var, mean = _var(ctx, wide, _dims(dim, x.rank), correction, keepdim)
    _warn_no_degrees_of_freedom(ctx, x, _dims(dim, x.rank), correction)
    std = ctx.cast(ctx.make(Op.SQRT, (var,)), x.dtype)
    return (std, ctx.cast(mean, x.dtype)) if ctx.aten == "aten.std_mean" else std


# ---------------------------------------------------------------------------------------------
# normalizations
# ---------------------------------------------------------------------------------------------

@register(aten._softmax.default, aten._log_softmax.default)
def _softmax(ctx: Context, x: Node, dim: int, half_to_float: bool = False) -> Node:
    log = ctx.aten == "aten._log_softmax"
    if not x.dtype.is_float:
        raise Unsupported("ATen's softmax rejects integer and bool inputs")  # (eager's error)
    if not -max(x.rank, 1) <= dim < max(x.rank, 1):
        raise Unsupported(f"softmax over dim {dim} of a {x.rank}-d tensor (ATen's IndexError)")
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    if x.rank == 0:
        return ctx.operand(0.0 if log else 1.0, x.dtype, ())
    dims = (dim % x.rank,)
    m = ctx.expand_to(ctx.make(Op.AMAX, (x,), dims), x.shape)
    # A row of -inf has max -inf; ATen then gives NaN, and x - m does too.
    shifted = ctx.make(Op.SUB, (x, m))
    e = ctx.make(Op.EXP, (shifted,))
    s = ctx.expand_to(ctx.make(Op.SUM, (e,), dims), x.shape)
    if log:
        return ctx.make(Op.SUB, (shifted, ctx.make(Op.LOG, (s,))))
    return ctx.make(Op.DIV, (e, s))


@register(aten.native_layer_norm.default)
def _layer_norm(ctx: Context, x: Node, normalized_shape: Sequence[Any], weight: Node | None,
                bias: Node | None, eps: float) -> tuple[Node, Node, Node]:
    out_dtype = ctx.out[0].dtype
    params = [p.dtype for p in (weight, bias) if p is not None]
    if any(p != x.dtype for p in params) and not (x.dtype.is_low_precision and all(p == dt.float32 for p in params)):
        # eager takes parameters of the input's dtype, or float32 ones with a 16-bit input
        raise Unsupported("layer_norm with parameters of another dtype (ATen's RuntimeError)")
    x = ctx.cast(x, dt.compute_dtype(x.dtype))
    dims = tuple(range(x.rank - len(normalized_shape), x.rank))
    var, mean = _var(ctx, x, dims, 0, True)
    rstd = ctx.make(Op.RSQRT, (ctx.make(Op.ADD, (var, ctx.operand(eps, x.dtype, var.shape))),))
    out = ctx.make(Op.MUL, (ctx.make(Op.SUB, (x, ctx.expand_to(mean, x.shape))), ctx.expand_to(rstd, x.shape)))
    if weight is not None:
        out = ctx.make(Op.MUL, (out, ctx.operand(weight, x.dtype, x.shape)))
    if bias is not None:
        out = ctx.make(Op.ADD, (out, ctx.operand(bias, x.dtype, x.shape)))
    del out_dtype  # _finish casts each result to what ATen returns
    return out, mean, rstd
