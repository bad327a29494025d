"""Ops whose tracing refuses a dtype with a RuntimeError where eager's kernel, finding no
implementation for the dtype, raises NotImplementedError ('"lshift_cpu" not implemented for
'Bool''): shifts of bools or floats, floor division of bools or complex numbers, lcm of bools,
elu and selu of integers, frac, log_sigmoid and logaddexp of bools; leaky_relu and softshrink
of integers and bools, whose references raise ValueError (a float slope for an integer dtype)
and TypeError (torch.finfo of an integer dtype).

torch's meta functions and references check dtypes with ``torch._check`` (RuntimeError) while
Dynamo traces the program; eager only reaches its dispatch macro, which raises
NotImplementedError. The checks' frames hold the operands, so the dtype eager's kernel would
run in (the promoted one) can be read back and the error re-raised with eager's type.
"""

from __future__ import annotations

from types import FrameType

import torch

_SHIFT_KERNELS = {"lshift": "lshift", "rshift": "rshift"}
# Float-only ops whose references (or decompositions) compute in the operands' dtype and refuse
# an integer or bool one with a RuntimeError (elu's alpha cast to int, a bool subtraction or
# negation; leaky_relu's ValueError, softshrink's TypeError): their frame's name -> (eager's
# kernel, the operands' names). selu goes through elu.
_FLOAT_ONLY_REFS = {"elu": ("elu_cpu", ("a",)), "frac": ("frac_cpu", ("x",)),
                    "log_sigmoid_forward": ("log_sigmoid_cpu", ("self",)),
                    "logaddexp": ("logaddexp_cpu", ("a", "b")), "logaddexp2": ("logaddexp2_cpu", ("a", "b")),
                    "leaky_relu": ("leaky_relu_cpu", ("a",)), "softshrink": ("softshrink_check", ("a",)),
                    # (a float beta or alpha for an integer dtype: the references' ValueError)
                    "softplus": ("softplus_cpu", ("a",)), "celu": ("elu_cpu", ("a",))}


def traceback_frames(e: BaseException) -> list[FrameType]:
    """The frames of ``e``'s traceback, outermost first."""
    frames, tb = [], e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _in_torch(frame: FrameType, part: str) -> bool:
    return part in frame.f_code.co_filename.replace("\\", "/")


def _dtype_name(dtype: torch.dtype) -> str:
    # the name eager's dispatch macro prints: 'Bool', 'Float', 'Long', 'BFloat16'
    return {torch.bool: "Bool", torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
            torch.int8: "Char", torch.uint8: "Byte", torch.complex64: "ComplexFloat",
            torch.complex128: "ComplexDouble", torch.complex32: "ComplexHalf"}.get(dtype, str(dtype))


def _promoted(a: object, b: object) -> torch.dtype | None:
    try:
        return torch.result_type(a, b)  # type: ignore[arg-type]
    except (TypeError, RuntimeError):
        return None


def eager_kernel_refusal(e: BaseException) -> NotImplementedError | None:
    """eager's NotImplementedError for a RuntimeError ``e`` that torch's tracing raised where
    eager has no kernel for the operands' dtype (or a ValueError or TypeError of a float-only
    reference); None where eager computes a value or raises something else (a shift of bools by
    an integer runs in int64 in eager)."""
    if type(e) not in (RuntimeError, ValueError, TypeError):
        return None
    if type(e) is not RuntimeError:  # (only the float-only references raise these)
        return _float_only_refusal(e)
    for frame in traceback_frames(e):
        name, local = frame.f_code.co_name, frame.f_locals
        if name == "shift_dtype_check" and _in_torch(frame, "/torch/_meta_registrations"):
            # eager shifts in the promoted dtype and has kernels for integers only
            dtype = _promoted(local.get("self"), local.get("val"))
            if dtype is not None and (dtype.is_floating_point or dtype == torch.bool):
                kernel = _SHIFT_KERNELS.get(local.get("fn_name"), "shift")
                return NotImplementedError(f'"{kernel}_cpu" not implemented for \'{_dtype_name(dtype)}\'')
            return None
        if name in ("floor_divide", "lcm", "gcd") and _in_torch(frame, "/torch/_refs/"):
            a, b = local.get("a"), local.get("b")
            dtype = _promoted(a, b) if a is not None and b is not None else None
            if dtype == torch.bool or dtype is not None and dtype.is_complex:
                # (eager's integer kernels exclude bools; its floor division has no complex one)
                kernel = "div_floor" if name == "floor_divide" else name
                return NotImplementedError(f'"{kernel}_cpu" not implemented for \'{_dtype_name(dtype)}\'')
        if name in _FLOAT_ONLY_REFS and (_in_torch(frame, "/torch/_refs/") or _in_torch(frame, "/torch/_decomp/")):
            return _float_only_refusal(e)
    return None


def _float_only_refusal(e: BaseException) -> NotImplementedError | None:
    """eager's NotImplementedError where ``e`` was raised in a float-only reference
    (``_FLOAT_ONLY_REFS``) given operands of an integer or bool dtype."""
    for frame in traceback_frames(e):
        name, local = frame.f_code.co_name, frame.f_locals
        if name in _FLOAT_ONLY_REFS and (_in_torch(frame, "/torch/_refs/") or _in_torch(frame, "/torch/_decomp/")):
            kernel, names = _FLOAT_ONLY_REFS[name]
            operands = [local.get(n) for n in names]
            dtype = _promoted(*operands) if len(operands) == 2 else getattr(operands[0], "dtype", None)
            if isinstance(dtype, torch.dtype) and not (dtype.is_floating_point or dtype.is_complex):
                return NotImplementedError(f'"{kernel}" not implemented for \'{_dtype_name(dtype)}\'')
            return None
    return None
