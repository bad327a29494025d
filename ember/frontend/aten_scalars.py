"""How ATen takes the Python scalar arguments of an op (a fill value, clamp's bounds, add's
alpha, a pad value, a scalar operand): the overflow check it converts them with, symbolic
scalars it checks on each call, and the rounding of a number to a 16-bit float.

Shared by the lowerings (aten_pointwise.py, aten_copies.py, aten_views.py, aten_indexing.py) and
by the Dynamo backend (dynamo.py: masked_fill and index_fill of a value out of range are not
decomposed, so eager's overflow error is raised).
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch

from ..ir import dtypes as dt
from ..ir.node import Node
from ..ir.ops import Op
from .lowering import Unsupported


def _rounded_to(x: Any, dtype: dt.DType) -> Any:
    """A Python number as the nearest value of a 16-bit float ``dtype`` (ints too: float16
    2048 == 2049 holds in eager); anything else as it is."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(torch.tensor(float(x), dtype=dt.to_torch(dtype)))
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
