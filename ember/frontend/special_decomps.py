"""Decompositions of special functions that compute what eager's kernels compute.

* ``logit(x, eps)`` and its backward: eager's CPU kernels hold the bounds as values of the
  input's dtype, ``lo = eps`` and ``hi = 1 - lo``, each rounded to it (its CUDA kernels hold them
  in float32, as the decompositions do: measured on an H200). torch's decompositions clamp to
  the Python floats ``eps`` and ``1 - eps``: in bfloat16, ``1 - 1e-3`` rounds to 1.0, so eager's
  ``logit(1.0, eps=1e-3)`` is inf (and its gradient inf) where the decomposition gave 6.9 (and a
  gradient of 0); a bfloat16 ``x = 0.001`` (0.0010004) sits at eager's rounded ``lo`` and has a
  gradient there, where it was 0. The CPU kernels round each step of a 16-bit ``x / (1 - x)``
  (and of the gradient's ``x * (1 - x)``) to the dtype: 10% of float16 results were 2 to 4 ulps
  off eager's. Both devices' kernels clamp as ``x < lo ? lo : (x > hi ? hi : x)`` (eps > 0.5 gives
  lo > hi, where clamp gave hi for all x) and take a negative eps as none (the decompositions
  clamped to it, and gave the gradient outside [0, 1] a value where eager's is NaN).
* ``threshold(x, threshold, value)``: eager's kernel holds ``threshold`` in the op math type (for
  integers, the integer type: -0.5 truncated to 0, so threshold(0, -0.5, 2) is 2 where the
  decomposition's ``x <= -0.5`` kept 0) and ``value`` in x's dtype, each converted with the
  overflow check (float16's 70000 raised in eager). It has no bool kernel. Such calls keep the op.
* ``celu(x, alpha=0)`` is eager's RuntimeError (the decomposition divided by 0): the op is kept,
  as for integer inputs.
* ``hardtanh_backward`` (relu6's and hardtanh's gradient) on the CPU: eager's vectorized kernel
  passes the gradient where ``min < x < max``, so a NaN input's gradient is 0; its scalar tail (the
  last elements, fewer than a vector) and eager's CUDA kernel zero it where ``x <= min or x >= max``,
  passing a NaN's on, as torch's decomposition does. On the CPU ember takes the vectorized kernel's
  (every element but a tail's): a relu6 after a matmul whose rows hold a NaN gave the other rows'
  inputs gradients eager's do not have (CPU fuzz seed 1065083899746). On GPUs, the CUDA kernel's
  (a NaN's passed on). Both compare a 16-bit x in float32, as eager's kernels do: torch 2.11's
  decomposition compared it in its own dtype, so a bfloat16 x of 0.7 (0.69921875) had no gradient
  under a max of 0.7 there, where eager's CUDA kernel gives one (H100).
* ``elu_backward`` (elu's, celu's and selu's gradient) and ``hardswish_backward`` on the CPU:
  eager's vectorized kernels choose the branch of a NaN input by ``x > 0`` (elu) and by
  ``x <= -3`` then ``x >= 3`` (hardswish), so it falls in the branch that computes with x, and its
  gradient is NaN; their scalar tails, eager's CUDA kernels and torch's decompositions (``x <= 0``,
  ``x < 3``) pass the gradient on. As for hardtanh, ember takes the vectorized kernels' on the CPU
  (fuzz seed 710178185456: an elu after a matmul over a row holding a NaN gave its weight's
  gradient finite values where eager's are NaN), the CUDA kernels' on GPUs.
* ``rrelu`` in evaluation: eager's kernel is ``leaky_relu(x, (lower + upper) / 2)``; the op and
  its backward (whose decomposition torch has, as eager's formula) ran through ATen.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import get_decompositions

from .aten_scalars import rounded_16, scalar_fits

aten = torch.ops.aten


def _bounds(eps: Any, x: torch.Tensor) -> tuple[float, float] | None:
    """eager's ``(lo, hi)`` for ``eps`` and a floating ``x``: on the CPU rounded to x's dtype, else
    the decomposition's floats; None where they are not plain numbers (a symbolic eps: torch's
    decomposition handles it)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not x.dtype.is_floating_point:
        return None
    if x.device.type != "cpu":
        return float(eps), 1.0 - float(eps)
    lo = _in_dtype(float(eps), x.dtype)
    return lo, _in_dtype(1.0 - lo, x.dtype)  # (1 - lo: a float32 subtraction, then rounded)


def _in_dtype(v: float, dtype: torch.dtype) -> float:
    if dtype == torch.float64:
        return v
    if dtype in (torch.float16, torch.bfloat16):
        return rounded_16(v, dtype)
    return ctypes.c_float(v).value


def _eps(eps: Any) -> Any:
    # (eager's kernels take a negative eps as none: no clamp, and a NaN gradient outside [0, 1])
    return None if isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps < 0 else eps


def _own_formula(x: torch.Tensor, eps: Any) -> tuple[bool, tuple[float, float] | None]:
    """Whether logit and its gradient take the formulas below over torch's decomposition, and the
    bounds they clamp to. On the CPU: bounds rounded to x's dtype, or 16-bit steps to round. On
    GPUs (float32 bounds) only bounds out of order: torch's decomposition computes the rest as
    eager's kernels do, where a clamp here would round float bounds to a 16-bit x's dtype
    (bfloat16 1 - 1e-3 is 1.0, and logit(1.0) inf where eager's GPU kernel gives 6.9)."""
    bounds = None if eps is None else _bounds(eps, x)
    if x.device.type != "cpu":
        return bounds is not None and bounds[0] > bounds[1], bounds
    return bounds is not None or (eps is None and _rounds_each_step(x)), bounds


def _rounds_each_step(x: torch.Tensor) -> bool:
    """Whether eager's kernel computes ``x``'s steps in its 16-bit dtype (the CPU's), each rounded."""
    return x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16)


def _logit(original: Callable[..., Any]) -> Callable[..., Any]:
    def logit(x: torch.Tensor, eps: Any = None) -> torch.Tensor:
        if isinstance(eps, (int, float)) and not scalar_fits(eps, x.dtype):
            return NotImplemented  # (eager converts it to x's dtype: float16's 7e4 raises in ATen)
        eps = _eps(eps)
        own, bounds = _own_formula(x, eps)
        if not own:
            return original(x, eps)
        if bounds is not None:
            lo, hi = bounds
            # (eager's kernel: x < lo ? lo : (x > hi ? hi : x); past eps = 0.5, lo > hi, and x below
            # lo takes lo, where clamp's min(max(x, lo), hi) gave hi to every x)
            x = torch.clamp(x, lo, hi) if lo <= hi else torch.where(x < lo, lo, torch.where(x > hi, hi, x))
        if _rounds_each_step(x):  # log(x / (1 - x)), each step rounded (casts round: ember keeps them)
            return torch.log((x.float() / (1 - x).float()).to(x.dtype).float()).to(x.dtype)
        return torch.log(x / (1 - x))
    return logit


def _logit_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def logit_backward(grad_output: torch.Tensor, x: torch.Tensor, eps: Any = None) -> torch.Tensor:
        eps = _eps(eps)
        own, bounds = _own_formula(x, eps)
        if not own:
            return original(grad_output, x, eps)
        # x * (1 - x), each step rounded where eager's kernel rounds it
        product = (x.float() * (1 - x).float()).to(x.dtype) if _rounds_each_step(x) else x * (1.0 - x)
        if bounds is None:
            return torch.where(torch.logical_and(x >= 0.0, x <= 1.0), grad_output / product, float("nan"))
        lo, hi = bounds
        return torch.where(torch.logical_and(x >= lo, x <= hi), grad_output / product, 0.0)
    return logit_backward


def _threshold(original: Callable[..., Any]) -> Callable[..., Any]:
    def threshold(x: torch.Tensor, threshold: Any, value: Any) -> Any:
        numbers = all(isinstance(v, (int, float)) for v in (threshold, value))
        if x.dtype == torch.bool or numbers and not scalar_fits(value, x.dtype):
            return NotImplemented  # (ATen raises eager's error)
        if numbers and not x.dtype.is_floating_point:
            if not scalar_fits(threshold, x.dtype):
                return NotImplemented
            threshold = int(threshold)  # (truncated toward 0; an unsigned type wraps a negative int)
            if threshold < 0 and torch.iinfo(x.dtype).min == 0:
                threshold += torch.iinfo(x.dtype).max + 1
        return original(x, threshold, value)
    return threshold


def _celu(original: Callable[..., Any]) -> Callable[..., Any]:
    def celu(x: torch.Tensor, alpha: Any = 1.0) -> Any:
        if not x.dtype.is_floating_point or not isinstance(alpha, (int, float)) or alpha == 0:
            # (no integer kernel, or alpha = 0: ATen raises eager's error; a symbolic alpha, a
            # float that changed between calls, may be 0 on a later call: ATen checks it each call)
            return NotImplemented
        return original(x, alpha)
    return celu


def _in_float32(*xs: torch.Tensor) -> list[torch.Tensor]:
    # (eager's kernels compute a 16-bit activation's gradient in float32, rounding once at the end)
    return [x.float() if x.dtype in (torch.float16, torch.bfloat16) else x for x in xs]


def _cpu_kernels_own(grad: torch.Tensor, x: torch.Tensor) -> bool:
    """Do the CPU kernels' branch order (elu, hardswish) stand for eager's here? A floating x on
    the CPU with a gradient of its dtype; elsewhere torch's decomposition, as the CUDA kernels."""
    return x.device.type == "cpu" and x.dtype.is_floating_point and grad.dtype == x.dtype


def _hardtanh_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def hardtanh_backward(grad: torch.Tensor, x: torch.Tensor, min_val: Any, max_val: Any) -> Any:
        if not x.dtype.is_floating_point or grad.dtype != x.dtype:
            return original(grad, x, min_val, max_val)
        # (16-bit x compared in float32 with the bounds as given, as eager's kernels compare it:
        # bfloat16's 0.7, 0.69921875, is below a max of 0.7)
        wide, = _in_float32(x)
        if x.device.type == "cpu":
            return torch.where((wide > min_val) & (wide < max_val), grad, 0.0)
        return torch.where((wide <= min_val) | (wide >= max_val), 0.0, grad)
    return hardtanh_backward


def _elu_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def elu_backward(grad: torch.Tensor, alpha: Any, scale: Any, input_scale: Any, is_result: bool,
                     x: torch.Tensor) -> Any:
        if not _cpu_kernels_own(grad, x):
            return original(grad, alpha, scale, input_scale, is_result, x)
        g, v = _in_float32(grad, x)
        negative = g * input_scale * (v + alpha * scale) if is_result else \
            g * input_scale * (alpha * scale) * torch.exp(v * input_scale)
        return torch.where(v > 0, g * scale, negative).to(x.dtype)
    return elu_backward


def _hardswish_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def hardswish_backward(grad: torch.Tensor, x: torch.Tensor) -> Any:
        if not _cpu_kernels_own(grad, x):
            return original(grad, x)
        g, v = _in_float32(grad, x)
        return torch.where(v <= -3, 0.0, torch.where(v >= 3, g, g * (v / 3 + 0.5))).to(x.dtype)
    return hardswish_backward


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
                                    aten.rrelu_with_noise_backward.default, aten.threshold.default,
                                    aten.celu.default, aten.hardtanh_backward.default,
                                    aten.elu_backward.default, aten.hardswish_backward.default])
    return {aten.rrelu_with_noise_backward.default: torch_own[aten.rrelu_with_noise_backward.default],
            aten.threshold.default: _threshold(torch_own[aten.threshold.default]),
            aten.celu.default: _celu(torch_own[aten.celu.default]),
            aten.hardtanh_backward.default: _hardtanh_backward(torch_own[aten.hardtanh_backward.default]),
            aten.elu_backward.default: _elu_backward(torch_own[aten.elu_backward.default]),
            aten.hardswish_backward.default: _hardswish_backward(torch_own[aten.hardswish_backward.default]),
            aten.logit.default: _logit(torch_own[aten.logit.default]),
            aten.logit_backward.default: _logit_backward(torch_own[aten.logit_backward.default]),
            aten.rrelu_with_noise_functional.default: rrelu_with_noise_functional}
