"""How ATen takes the Python scalar arguments of an op (a fill value, clamp's bounds, add's
alpha, a pad value, a scalar operand): the overflow check it converts them with, symbolic
scalars it checks on each call, and the rounding of a number to a 16-bit float.

Shared by the lowerings (aten_pointwise.py, aten_copies.py, aten_views.py, aten_indexing.py) and
by the decomposition table (decompositions.py: masked_fill and index_fill of a value out of range are not
decomposed, so eager's overflow error is raised).

Decomposed ops convert their numbers with no check: ``range_checked_decompositions`` keeps the
op (ATen raises) for a number out of the range eager converts it to (float16's linspace to 7e4,
softplus' beta of 1e39 into float32).

A Python float Dynamo made symbolic (a value that changed between calls) reaches the graph as a
0-d float64 tensor input, which torch's pass that turns float arguments into tensors computes
with: nothing is left of the number an op converted with its overflow check. Where a
decomposition keeps such a float symbolic (add's alpha, optimizer_decomps.py; hardshrink's
lambd; the ops above), it passes its result, or the value, through ``ember::scalar_fits``
(``checked_symbolic``, ``checked_value``), which the lowering below turns into a check of the
input's value in the host program, made before any kernel runs (an out-of-range alpha raised
nothing: a float16 ``x.add(y, alpha=7e4)`` on the CPU gave inf where eager raises).
"""

from __future__ import annotations

import ctypes
import math
import struct
import sys
from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes, get_computation_dtype

from ..ir import dtypes as dt
from ..ir.node import Node, SizeCheck
from ..ir.ops import Op
from .aten_calls import extern_call
from .context import Context, Unsupported, register


def rounded_16(v: float, dtype: torch.dtype) -> float:
    """``v`` rounded to float16 or bfloat16 as eager's scalar conversion rounds it (through
    float32, to nearest even; beyond the range: inf), in Python: a torch.tensor made while
    AOTAutograd traces is a lift_fresh_copy and a detach_, which it refuses in a training graph
    (nan_to_num of a bfloat16 tensor needing grad ran the whole graph eagerly)."""
    f = ctypes.c_float(v).value  # (a C cast: beyond float32's range is inf)
    if math.isnan(f) or math.isinf(f):
        return f
    if dtype == torch.float16:
        try:
            return struct.unpack("<e", struct.pack("<e", f))[0]
        except OverflowError:  # (rounds past float16's largest value)
            return math.copysign(math.inf, f)
    bits = struct.unpack("<I", struct.pack("<f", f))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _rounded_to(x: Any, dtype: dt.DType) -> Any:
    """A Python number as the nearest value of a 16-bit float ``dtype`` (ints too: float16
    2048 == 2049 holds in eager); anything else as it is."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return rounded_16(float(x), dt.to_torch(dtype))
    return x


def checked_scalar(value: Any, dtype: dt.DType) -> Any:
    """A Python scalar argument ATen converts with an overflow check (clamp's bounds, a fill
    value, add's alpha): out of ``dtype``'s range, the op runs through ATen, which raises
    "value cannot be converted to type ... without overflow" as in eager."""
    if isinstance(value, (int, float)) and not scalar_fits(value, dt.to_torch(dtype)):
        raise Unsupported(f"{value} does not fit {dtype}: ATen raises")
    if _symbolic(value) is not None and _narrower_than_a_size(dtype):
        # a Python int Dynamo made symbolic: eager checks each call's value; ATen does here
        raise Unsupported(f"symbolic scalar {_symbolic(value)} may not fit {dtype}: ATen checks it")
    return value


def _symbolic(value: Any) -> sympy.Expr | None:
    """The expression of a scalar argument Dynamo made symbolic (a constant of a size symbol)."""
    if isinstance(value, Node) and value.op is Op.CONST:
        value = value.arg
    if isinstance(value, sympy.Basic) and not value.is_number:
        return value
    return None


def _narrower_than_a_size(dtype: dt.DType) -> bool:
    """Can an int64 size or Python int overflow ``dtype``? (Not float32/64 or bfloat16, whose
    ranges hold every int64; float16 tops out at 65504.)"""
    if dtype.is_bool:
        return False
    if dtype.is_float:
        return dtype == dt.float16
    return dtype.itemsize < 8 or dtype.kind == "u"


def scalar_fits(value: int | float, dtype: torch.dtype, wraps: bool = True) -> bool:
    """Does ATen convert the Python scalar ``value`` to ``dtype`` without its overflow error?
    (c10's rule: floats take inf and nan; an unsigned type takes negative ints down to minus
    its maximum, wrapped, unless ``wraps`` is False (constant_pad_nd's value), and no negative
    float; bool and complex take anything.)"""
    if isinstance(value, bool) or dtype == torch.bool or dtype.is_complex:
        return True
    if dtype.is_floating_point:
        return not math.isfinite(value) or abs(value) <= torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    lowest = -info.max if info.min == 0 and wraps and isinstance(value, int) else info.min
    return math.isfinite(value) and lowest <= value <= info.max


# ATen's names of the float types in its overflow error
_C10_NAMES = {torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16", torch.float32: "float"}


def overflow_message(op: str, what: str, dtype: torch.dtype) -> str:
    """Eager's overflow error, after the op and the argument it came from."""
    return (f"{op}: {what} (a Python float) is out of {str(dtype).removeprefix('torch.')}'s range: value "
            f"cannot be converted to type {_C10_NAMES.get(dtype, dtype)} without overflow")


@torch.library.custom_op("ember::scalar_fits", mutates_args=())
def scalar_fits_op(result: torch.Tensor, value: torch.Tensor, dtype: torch.dtype, message: str) -> torch.Tensor:
    """``result``, once ``value`` (a 0-d tensor holding a Python float) is known to fit ``dtype``
    as ATen converts it; out of range, eager's RuntimeError with ``message``. (Run where ember
    cannot read the value on the host: the check, and a copy of ``result``.)"""
    if not scalar_fits(value.item(), dtype):
        raise RuntimeError(message)
    return result.clone()


@scalar_fits_op.register_fake
def _scalar_fits_fake(result: torch.Tensor, value: torch.Tensor, dtype: torch.dtype, message: str) -> torch.Tensor:
    return torch.empty_like(result)


def checked_symbolic(result: torch.Tensor, value: Any, dtype: torch.dtype, op: str, what: str) -> torch.Tensor:
    """In a decomposition (below autograd): ``result``, of an op that converted the symbolic
    Python float ``value`` to ``dtype`` with ATen's overflow check, passed through
    ``ember::scalar_fits``, which checks the value each call (a dtype every Python float fits
    needs no check)."""
    if not isinstance(value, torch.SymFloat) or dtype not in _C10_NAMES:
        return result
    return torch.ops.ember.scalar_fits(result, held_tensor(value), dtype, overflow_message(op, what, dtype))


def checked_value(value: Any, dtype: torch.dtype, op: str, what: str) -> Any:
    """``value``, a symbolic Python float an op converts to ``dtype`` with ATen's overflow check,
    as a 0-d float64 tensor checked each call (for a decomposition that autograd sees: nothing
    that needs a gradient goes through the check); anything else as it is."""
    if not isinstance(value, torch.SymFloat) or dtype not in _C10_NAMES:
        return value
    held = held_tensor(value)
    return torch.ops.ember.scalar_fits(held, held, dtype, overflow_message(op, what, dtype))


def held_tensor(value: torch.SymFloat) -> torch.Tensor:
    """1.0 * ``value``: a 0-d float64 tensor of the float, which torch's pass computes from the
    graph's input."""
    return torch.ops.aten.mul.Tensor(torch.ops.aten.full.default([], 1.0, dtype=torch.float64), value)


def checked_value_symbol(fx_node: torch.fx.Node, val: Any) -> sympy.Symbol | None:
    """A symbol for a 0-d CPU float input (``fx_node``, traced as ``val``) whose value
    ``ember::scalar_fits`` checks, through 0-d tensor ops: the host program reads the input's
    ``.item()`` as it. None for any other input."""
    if not isinstance(val, torch.Tensor) or val.dim() != 0 or val.device.type != "cpu" or not val.is_floating_point():
        return None
    seen, todo = set(), [fx_node]
    while todo:
        node = todo.pop()
        for user in node.users:
            if user.target is torch.ops.ember.scalar_fits.default and user.args[1] is node:
                return sympy.Symbol(f"{fx_node.name}_item")
            meta = user.meta.get("val")
            if user not in seen and isinstance(meta, torch.Tensor) and meta.dim() == 0 and len(seen) < 32:
                seen.add(user)
                todo.append(user)
    return None


def _on_host(x: Node) -> sympy.Expr | None:
    """``x``'s value as an expression of what the host program reads before any kernel runs: a
    0-d input's ``.item()`` (its symbol), cast to float64 and negated (optimizer's ``-lr``), or
    multiplied by 1. None for anything else (no rounding on the way is spelled here)."""
    if x.op is Op.INPUT:
        return x.arg.item if x.arg.kind == "tensor" and x.dtype is not None and x.dtype.is_float else None
    if x.op is Op.CAST and x.dtype == dt.float64 and x.inputs[0].dtype in (dt.float32, dt.float64):
        return _on_host(x.inputs[0])
    if x.op is Op.NEG:
        inner = _on_host(x.inputs[0])
        return None if inner is None else -inner
    if x.op is Op.MUL:
        for one, other in (x.inputs, x.inputs[::-1]):
            if one.op is Op.CONST and not isinstance(one.arg, sympy.Basic) and one.arg in (1, -1):
                inner = _on_host(other)
                return None if inner is None else inner * int(one.arg)
    return None


@register(torch.ops.ember.scalar_fits.default)
def _scalar_fits(ctx: Context, result: Node, value: Node, dtype: torch.dtype, message: str) -> Node:
    """``result`` as it is, and the check of ``value`` in the host program, before any kernel
    writes, from the input's value read on the host (no sync on a GPU): among its checks of sizes
    (Graph.size_checks), as a test that is 1 only for a finite value beyond ``dtype``'s range; in
    a GPU graph, where those are made only of what the program binds from its inputs on the host
    (an input moved to the device is read before it moves), as a call of ``raise_unless_fits``
    made right after the inputs."""
    expr = _on_host(value)
    if expr is None:
        raise Unsupported("a checked value the host program does not read: the op checks it")
    limit, finite = torch.finfo(dtype).max, sys.float_info.max
    inputs = [n for n in ctx.nodes if n.op is Op.INPUT]
    if any(n.arg.kind == "tensor" and n.arg.to_device and n.arg.item in expr.free_symbols for n in inputs):
        args = (expr, limit, message)
        if not any(e.op is Op.EXTERN and e.arg.target is raise_unless_fits and e.arg.args == args for e in ctx.effects):
            call = extern_call(ctx, raise_unless_fits, args, {}, None, host_check=True)
            ctx.nodes.remove(call)
            ctx.nodes.insert(ctx.nodes.index(inputs[-1]) + 1, call)  # (steps run in graph order)
            ctx.effects.append(call)
        return result
    beyond = sympy.Or(sympy.And(expr > limit, expr <= finite), sympy.And(expr < -limit, expr >= -finite))
    check = SizeCheck(sympy.Piecewise((1, beyond), (0, True)), 0, 0, "RuntimeError", message)
    if check not in ctx.size_checks:  # (a list op's alpha, once for all its tensors)
        ctx.size_checks.append(check)
    return result


def raise_unless_fits(value: float, limit: float, message: str) -> None:
    """The host program's check of a Python float against a dtype's range (``limit``, its
    largest finite value; inf and NaN pass, as ATen converts them)."""
    if math.isfinite(value) and abs(value) > limit:
        raise RuntimeError(message)


# Decomposed ops whose Python numbers eager converts with its overflow check, and the dtype each
# is converted to: the result's (float16's linspace to 7e4, addr's alpha), or its op math type's
# (a 16-bit tensor's float32: softplus' beta of 1e39). Eager's tests decided each, on the CPU and
# on an H200 (the same, but for threshold's threshold).
def _spaced(start: Any, end: Any, steps: Any, *_: Any, dtype: torch.dtype | None = None, **__: Any) -> list[Any]:
    into = dtype or torch.get_default_dtype()
    return [("start", start, into), ("end", end, into)]


def _spaced_steps(start: Any, end: Any, steps: Any, *_: Any, dtype: torch.dtype | None = None,
                  **__: Any) -> list[Any]:
    # linspace and logspace: eager converts neither for no steps, and for one fills start (or
    # base ** start), unchecked (float16's 7e4 is inf; an integer linspace keeps the op:
    # linspace_decomps.py)
    return [] if steps == 0 or steps == 1 else _spaced(start, end, steps, dtype=dtype)


def _addr(x: torch.Tensor, vec1: torch.Tensor, vec2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> list[Any]:
    _, into = elementwise_dtypes(x, vec1, vec2, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return [("beta", beta, into), ("alpha", alpha, into)]


def _baddbmm(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> list[Any]:
    return [("beta", beta, get_computation_dtype(x.dtype)), ("alpha", alpha, get_computation_dtype(x.dtype))]


def _addc(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, *, value: Any = 1) -> list[Any]:
    _, into = elementwise_dtypes(x, t1, t2, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return [("value", value, get_computation_dtype(into))]


def _softplus(x: torch.Tensor, beta: Any = 1, threshold: Any = 20) -> list[Any]:
    return [("beta", beta, get_computation_dtype(x.dtype)), ("threshold", threshold, get_computation_dtype(x.dtype))]


def _threshold(x: torch.Tensor, threshold: Any, value: Any) -> list[Any]:
    # (the threshold: on GPUs to x's dtype, measured on an H200)
    into = get_computation_dtype(x.dtype) if x.device.type == "cpu" else x.dtype
    return [("threshold", threshold, into), ("value", value, x.dtype)]


def _celu(x: torch.Tensor, alpha: Any = 1.0) -> list[Any]:
    return [("alpha", alpha, get_computation_dtype(x.dtype))]


def range_checked_decompositions(table: dict[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    """``table``'s decompositions of the ops above, checking their numbers as eager converts them:
    a Python number out of range keeps the op (ATen raises eager's error, where the decompositions
    computed inf), and a symbolic float (a value that changed between calls) is checked each call
    (``checked_symbolic``). One converted to an integer type, or on a device other than the CPU or
    a CUDA GPU (whose rules were not read), keeps the op too: torch's pass then specializes it,
    and the number is checked as a number (but an integer linspace, which takes a symbolic float
    as a tensor: linspace_decomps.py)."""
    aten = torch.ops.aten
    scalars = {aten.linspace.default: _spaced_steps, aten.logspace.default: _spaced_steps, aten.addr.default: _addr,
               aten.baddbmm.default: _baddbmm, aten.addcmul.default: _addc, aten.addcdiv.default: _addc,
               aten.softplus.default: _softplus, aten.threshold.default: _threshold, aten.celu.default: _celu}
    return {op: _range_checked(table[op], op, of) for op, of in scalars.items() if op in table}


def _range_checked(decomposition: Callable[..., Any], op: Any, scalars: Callable[..., list[Any]]) -> Callable[..., Any]:
    name = op.overloadpacket.__name__

    def decompose(*args: Any, **kwargs: Any) -> Any:
        checks = scalars(*args, **kwargs)
        tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device = torch.device(tensor.device if tensor is not None else kwargs.get("device") or "cpu")
        for _, value, into in checks:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not scalar_fits(value, into):
                return NotImplemented
            if isinstance(value, torch.SymFloat) and not (into.is_floating_point and device.type in ("cpu", "cuda")):
                return NotImplemented
        out = decomposition(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            for what, value, into in checks:
                out = checked_symbolic(out, value, into, name, what)
        return out
    return decompose
