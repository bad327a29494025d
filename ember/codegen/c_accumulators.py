"""A C-style reduction's or scan's accumulator: its type, its neutral start, how one value folds
in and what it gives at the end. Shared by the CPU C++ and CUDA C++ renderers (cstyle.py's
statements and the backends' loop skeletons); only the ``Language`` table's names differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import dtypes as dt
from ..ir.ops import Op
from ..schedule.kernel_ir import Value

if TYPE_CHECKING:
    from .cstyle import Language

# ---- reductions -----------------------------------------------------------------------------

def acc_type(lang: Language, v: Value) -> str:
    op, src = v.arg.op, v.srcs[0].dtype
    ctype = lang.compute(src)
    if op in (Op.ANY, Op.ALL):
        return "bool"
    if op is Op.SUM and ctype == "float":
        return lang.sum_acc_f32
    if op in (Op.ARGMAX, Op.ARGMIN):
        return f"EmberArg<{ctype}>"
    return ctype


def acc_init(lang: Language, v: Value) -> str:
    op, src = v.arg.op, v.srcs[0].dtype
    ctype = lang.compute(src)
    if op is Op.SUM:
        return f"({acc_type(lang, v)})0"
    if op is Op.PROD:
        return f"({ctype})1"
    if op is Op.ANY:
        return "false"
    if op is Op.ALL:
        return "true"
    lowest = op in (Op.AMAX, Op.ARGMAX)
    if src.is_float:
        bound = f"-({ctype})INFINITY" if lowest else f"({ctype})INFINITY"
    elif src.is_bool:
        bound = "false" if lowest else "true"
    else:
        bound = f"ember_lowest(({ctype})0)" if lowest else f"ember_highest(({ctype})0)"
    if op in (Op.ARGMAX, Op.ARGMIN):
        return f"EmberArg<{ctype}>{{{bound}, INT64_MAX}}"
    return bound


def acc_update(v: Value, acc: str, x: str, position: str) -> str:
    """Statement folding value ``x`` (at flat reduce ``position``) into accumulator ``acc``."""
    op = v.arg.op
    if op is Op.SUM:
        return f"{acc} += {x};"
    if op is Op.PROD:
        return f"{acc} *= {x};"
    if op is Op.ANY:
        return f"{acc} = {acc} | {x};"  # (bitwise: GCC vectorizes no short circuit)
    if op is Op.ALL:
        return f"{acc} = {acc} & {x};"
    if op is Op.AMAX:
        return f"{acc} = ember_max({acc}, {x});"
    if op is Op.AMIN:
        return f"{acc} = ember_min({acc}, {x});"
    fn = "ember_argmax_step" if op is Op.ARGMAX else "ember_argmin_step"
    return f"{fn}({acc}, {x}, {position});"


def acc_result(lang: Language, v: Value, acc: str) -> str:
    if v.arg.op in (Op.ARGMAX, Op.ARGMIN):
        return f"{acc}.i"
    return f"(({lang.compute(v.dtype)}){acc})"


# ---- scans ----------------------------------------------------------------------------------

def scan_acc_type(lang: Language, v: Value) -> str:
    """A scan's accumulator: its compute type (float32 for 16-bit floats, as eager's kernels),
    float32 widened as sums are (double on the CPU, as eager's CPU kernel accumulates)."""
    ctype = lang.compute(v.dtype)
    return lang.sum_acc_f32 if ctype == "float" and not v.dtype.is_low_precision else ctype


def int_bound(dtype: dt.DType, top: bool) -> int:
    """An integer dtype's largest value (``top``) or its smallest."""
    bits = 8 * dtype.itemsize - (dtype.kind == "i")
    if top:
        return 2 ** bits - 1
    return -(2 ** bits) if dtype.kind == "i" else 0


def scan_init(lang: Language, v: Value) -> str:
    acc = scan_acc_type(lang, v)
    if v.arg.combine in ("max", "min"):  # (below or above every value of the dtype: the neutral)
        if v.dtype.is_float:
            return f"{'-' if v.arg.combine == 'max' else ''}({acc})INFINITY"
        bound = int_bound(v.dtype, v.arg.combine == "min")
        # (INT64_MIN has no literal: its negation overflows)
        return f"({acc})({bound + 1}LL - 1)" if bound < 0 else f"({acc}){bound}LL"
    return {"sum": f"({acc})0", "prod": f"({acc})1", "logsumexp": f"-({acc})INFINITY"}[v.arg.combine]


def scan_combine(v: Value, acc: str, x: str) -> str:
    """``acc`` (the scan so far) combined with ``x`` (the next element, or the next run's scan)."""
    if v.arg.combine == "sum":
        return f"{acc} + {x}"
    if v.arg.combine == "prod":
        return f"{acc} * {x}"
    if v.arg.combine in ("max", "min"):  # (cummax's rule: ember_scan_max in the preludes)
        return f"ember_scan_{v.arg.combine}({acc}, {x})"
    return f"ember_logaddexp({x}, {acc})"
