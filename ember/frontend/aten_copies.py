"""Lowerings of casts, copies and new tensors: convert_element_type, _to_copy, clone, alias,
copy, full, full_like, scalar_tensor and arange (an Op.IOTA).

A fill value is checked and rounded as ATen converts it (aten_scalars.py); a copy to another
device or layout runs through ATen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from ..ir import dtypes as dt
from ..ir.node import Node, SizeCheck
from ..ir.ops import Op
from .aten_scalars import _rounded_to, _symbolic, checked_scalar
from .context import Context, Unsupported, register, size_arg

aten = torch.ops.aten
prims = torch.ops.prims


@register(prims.convert_element_type.default)
def _convert(ctx: Context, x: Node, dtype: torch.dtype) -> Node:
    return ctx.cast(x, dt.from_torch(dtype) if dt.is_supported_torch(dtype) else _unsupported(dtype))


def _unsupported(what: Any) -> Any:
    raise Unsupported(str(what))


@register(aten._to_copy.default)
def _to_copy(ctx: Context, x: Node, *, dtype: Any = None, device: Any = None, layout: Any = None,
             pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> Node:
    if device is not None and torch.device(device) != ctx.out.device:
        raise Unsupported("device copy")
    if layout not in (None, torch.strided) or pin_memory:
        raise Unsupported("layout change")
    if not isinstance(x, Node):
        # a Python number, as nested vmap's graph casts a literal (``a * 2``): ATen wraps it in
        # a 0-d tensor and casts that, unchecked (a 16-bit float rounds)
        dtype = ctx.out_dtype
        return ctx.const(_rounded_to(x, dtype) if dtype.is_low_precision else x, dtype)
    if str(ctx.out.device) != x.device:
        raise Unsupported("device change")
    return ctx.cast(x, ctx.out_dtype)


@register(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _identity(ctx: Context, x: Node, **_: Any) -> Node:
    return x


@register(aten.copy.default)
def _copy(ctx: Context, dst: Node, src: Node, non_blocking: bool = False) -> Node:
    return ctx.operand(src, ctx.out_dtype, ctx.out_shape)


def _filled_with(value: Any, dtype: dt.DType) -> Any:
    """The value a new tensor of ``dtype`` holds: checked, and a 16-bit float's rounded (kernels
    compute 16-bit values in float32, so a literal 0.1001 would compare above the tensor's)."""
    value = checked_scalar(value, dtype)
    if dtype.is_low_precision:
        if _symbolic(value) is not None:
            raise Unsupported(f"a 16-bit tensor filled with the symbolic {_symbolic(value)}: ATen rounds it")
        value = _rounded_to(value, dtype)
    return value


@register(aten.full.default)
def _full(ctx: Context, size: Sequence[Any], value: Any, **_: Any) -> Node:
    return ctx.operand(_filled_with(value, ctx.out_dtype), ctx.out_dtype, ctx.out_shape)


@register(aten.full_like.default)
def _full_like(ctx: Context, x: Node, value: Any, **_: Any) -> Node:
    return ctx.operand(_filled_with(value, ctx.out_dtype), ctx.out_dtype, ctx.out_shape)


@register(aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default)
def _empty(ctx: Context, size: Sequence[Any], *_: Any, **__: Any) -> Node:
    # Its values are whatever memory held, so zeros are as good as any: a circular pad's
    # decomposition fills an empty tensor slice by slice, and an ATen call here kept the
    # fills out of the kernel. (empty_permuted is empty_like of a channels_last tensor: its
    # layout is the traced one, which outputs come back in.)
    return ctx.operand(0, ctx.out_dtype, ctx.out_shape)


@register(aten.scalar_tensor.default)
def _scalar_tensor(ctx: Context, value: Any, **kwargs: Any) -> Node:
    dtype = ctx.out_dtype
    device = torch.device(kwargs.get("device") or ctx.device)
    if (dtype.is_low_precision and device.type == "cpu" and isinstance(value, (int, float))
            and not isinstance(value, bool)):
        # ATen's CPU kernel rounds a number into a 16-bit float without full's overflow check
        # (float32 keeps it): where(mask, x, -1e9) of float16 scores fills -inf. Its CUDA kernel
        # checks, and eager's where raises there
        return ctx.const(_rounded_to(value, dtype), dtype)
    return ctx.const(_filled_with(value, dtype), dtype)


def _int_bound(value: Any) -> Any:
    """An arange bound that is an int: a Python int, or a SymInt's expression (arange(n - 1,
    -1, -1), a flip's positions); None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, Node) and value.op is Op.CONST and value.shape == () and value.dtype.is_int:
        return size_arg(value)
    return None


@register(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(ctx: Context, *args: Any, **_: Any) -> Node:
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    end = args[0] if len(args) == 1 else args[1]
    start, end, step = _int_bound(start), _int_bound(end), _int_bound(step)
    if start is None or step is None:
        raise Unsupported("non-integer arange bounds")  # float ranges round like ATen only there
    dtype = ctx.out_dtype
    if dtype.is_bool:
        raise Unsupported("arange of bools (ATen's NotImplementedError)")
    (length,) = ctx.out_shape
    if all(isinstance(b, int) for b in (start, end, step)) and _aten_length(start, end, step, dtype) is None:
        # the traced length is exact, where ATen's int64 count overflows (a range wider than
        # 2**63): eager raises "invalid size, possible overflow?", and so does ATen's call here.
        # (Where its count comes out another length without raising, the traced one is kept: an
        # ATen call's result must have the traced shape the kernels after it read.)
        raise Unsupported("an arange whose length ATen's int64 count overflows")
    if dtype is dt.int64 and end is not None:  # (a float end, arange(2.5), is a constant: its length is traced)
        _check_int64_count(ctx, start, end, step)
    return ctx.make(Op.IOTA, (), (length, start, step), dtype=dtype)


_INT64 = (-2**63, 2**63 - 1)


def _check_int64_count(ctx: Context, start: Any, end: Any, step: Any) -> None:
    """Where symbolic bounds may make ATen's int64 count (end - start + step - sign(step),
    compute_arange_size) leave int64, the host program checks it as eager does: the traced length
    is exact, the kernels' C loop bound would wrap (arange(0, 2**63 - 1, 2**62) gave 2 unwritten
    elements). Sizes alone decide it, so the check is a comparison on the host, never a sync."""
    if isinstance(step, int) or _known(ctx, sympy.sympify(step) > 0) or _known(ctx, sympy.sympify(step) < 0):
        sign = 1 if isinstance(step, int) and step > 0 or _known(ctx, sympy.sympify(step) > 0) else -1
    else:  # (Dynamo guards the step's sign while tracing the arange)
        return
    count = sympy.sympify(end - start + step - sign)
    if count.is_Integer or count.is_Symbol or _fits_int64(ctx, count):  # (a symbol holds an int64)
        return
    ctx.size_checks.append(SizeCheck(count, *_INT64, "RuntimeError",
                                     "arange: invalid size, possible overflow? (its int64 element count "
                                     "end - start + step - sign(step) leaves int64)"))


def _known(ctx: Context, fact: Any) -> bool:
    env = ctx._shape_env()
    try:
        return env is not None and env._maybe_evaluate_static(fact) == sympy.true
    except Exception:  # noqa: BLE001 -- a private torch API: unknown
        return False


def _fits_int64(ctx: Context, expr: sympy.Expr) -> bool:
    """Whether ``expr`` stays in int64 for every int64 value of its symbols in their ranges."""
    env = ctx._shape_env()
    ranges = {}
    for symbol in expr.free_symbols:
        known = env.var_to_range.get(symbol) if env is not None else None
        low, high = (known.lower, known.upper) if known is not None else _INT64
        ranges[symbol] = ValueRanges(max(low, _INT64[0]), min(high, _INT64[1]))
    try:
        bound = bound_sympy(expr, ranges)
    except Exception:  # noqa: BLE001 -- a torch helper over any expression: unknown
        return False
    return bool(bound.lower >= _INT64[0] and bound.upper <= _INT64[1])


def _aten_length(start: int, end: int, step: int, dtype: dt.DType) -> int | None:
    """The length ATen's arange gives (compute_arange_size), or None where it raises: int64
    counts in wrapping int64 arithmetic, other dtypes in doubles (arange(2**63 - 10, 2**63 - 1,
    dtype=float64) is empty there)."""
    if step == 0:
        return None
    if dtype is dt.int64:
        def wrap(v: int) -> int:
            return (v + 2**63) % 2**64 - 2**63
        sign = 1 if step > 0 else -1
        numerator = wrap(wrap(wrap(end - start) + step) - sign)
        size = abs(numerator) // abs(step) * (1 if (numerator >= 0) == (step > 0) else -1)  # C's division
    else:
        size = math.ceil((float(end) - float(start)) / float(step))
    return size if 0 <= size <= 2**63 - 1 else None
