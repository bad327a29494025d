"""Decompositions of special functions that compute what eager's kernels compute.

* ``logit(x, eps)`` and its backward: eager's CPU kernels hold the bounds as values of the
  input's dtype, ``lo = eps`` and ``hi = 1 - lo``, each rounded to it (its CUDA kernels hold them
  in float32, as the decompositions do: measured on an H200). torch's decompositions clamp to
  the Python floats ``eps`` and ``1 - eps``: in bfloat16, ``1 - 1e-3`` rounds to 1.0, so eager's
  ``logit(1.0, eps=1e-3)`` is inf (and its gradient inf) where the decomposition gave 6.9 (and a
  gradient of 0); a bfloat16 ``x = 0.001`` (0.0010004) sits at eager's rounded ``lo`` and has a
  gradient there, where it was 0.
* ``rrelu`` in evaluation: eager's kernel is ``leaky_relu(x, (lower + upper) / 2)``; the op and
  its backward (whose decomposition torch has, as eager's formula) ran through ATen.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten


def _bounds(eps: Any, dtype: torch.dtype) -> tuple[float, float] | None:
    """eager's ``(lo, hi)`` for ``eps`` and a floating ``dtype``; None where they are not plain
    numbers (a symbolic eps: torch's decomposition handles it)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not dtype.is_floating_point:
        return None
    lo = _in_dtype(float(eps), dtype)
    return lo, _in_dtype(1.0 - lo, dtype)  # (1 - lo: a float32 subtraction, then rounded)


def _in_dtype(v: float, dtype: torch.dtype) -> float:
    if dtype == torch.float64:
        return v
    if dtype in (torch.float16, torch.bfloat16):
        from .dynamo import _rounded_16  # (dynamo.py imports this module)
        return _rounded_16(v, dtype)
    return ctypes.c_float(v).value


def _logit(original: Callable[..., Any]) -> Callable[..., Any]:
    def logit(x: torch.Tensor, eps: Any = None) -> torch.Tensor:
        bounds = None if eps is None or x.device.type != "cpu" else _bounds(eps, x.dtype)
        if bounds is None:
            return original(x, eps)
        x = torch.clamp(x, *bounds)
        return torch.log(x / (1 - x))
    return logit


def _logit_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def logit_backward(grad_output: torch.Tensor, x: torch.Tensor, eps: Any = None) -> torch.Tensor:
        bounds = None if eps is None or x.device.type != "cpu" else _bounds(eps, x.dtype)
        if bounds is None:
            return original(grad_output, x, eps)
        lo, hi = bounds
        return torch.where(torch.logical_and(x >= lo, x <= hi), grad_output / (x * (1.0 - x)), 0.0)
    return logit_backward


def rrelu_with_noise_functional(x: torch.Tensor, noise: torch.Tensor, lower: Any = 0.125, upper: Any = 1 / 3,
                                training: bool = False, generator: Any = None) -> Any:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lower, upper))
    if training or not numbers or not x.dtype.is_floating_point:
        return NotImplemented  # (random slopes, or what eager refuses: ATen)
    # (the noise is left as it was, as eager leaves it)
    return torch.nn.functional.leaky_relu(x, (float(lower) + float(upper)) / 2), noise.clone()


def special_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions above, by the ops they stand for."""
    torch_own = get_decompositions([aten.logit.default, aten.logit_backward.default,
                                    aten.rrelu_with_noise_backward.default])
    return {aten.rrelu_with_noise_backward.default: torch_own[aten.rrelu_with_noise_backward.default],
            aten.logit.default: _logit(torch_own[aten.logit.default]),
            aten.logit_backward.default: _logit_backward(torch_own[aten.logit_backward.default]),
            aten.rrelu_with_noise_functional.default: rrelu_with_noise_functional}
