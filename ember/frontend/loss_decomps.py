"""Loss backward decompositions that compute what eager's kernels compute.

torch's decompositions of these ops are the numerically tidier formulas, which differ from
ATen's kernels exactly at the edges a test of eager catches:

* ``smooth_l1_loss_backward``: torch's takes ``sign(x)`` outside ``|x| < beta``, so a NaN
  difference got a gradient of 0 (``sign(NaN)`` is 0); eager's kernel tests ``x <= -beta`` and
  ``x >= beta`` and passes NaN through ``x / beta``. (The op had run through ATen for that.)
* ``soft_margin_loss_backward``: torch's uses ``sigmoid``; eager's ``-t * z / (1 + z)`` with
  ``z = exp(-t * x)`` is NaN where ``z`` overflows (``|x|`` past 88 in float32, where the loss is
  inf), and ember gave those elements a gradient of +-1.
* ``binary_cross_entropy_backward``: eager divides by ``max(x * (1 - x), EPSILON)`` with
  EPSILON = 1e-12 *in the input's dtype*: 0 in float16, so an input of exactly 0 or 1 has a NaN
  or infinite gradient there, where torch's float32 epsilon gave a finite one.
* ``mse_loss_backward`` and ``huber_loss_backward``: torch's divide by the element count in
  Python, which raised for an empty batch; eager's kernels scale nothing there.
* ``nll_loss_backward`` and ``nll_loss2d_backward``: eager's kernels write each row's gradient
  into its target's entry only (``w[t] * -(g / total_weight)``, zeros elsewhere). torch's multiplies
  the one-hot row by ``g / total_weight * w`` broadcast over every class, so where that scale is
  inf or NaN (a weighted mean whose targets all weigh 0: ``total_weight`` is 0) every entry was
  NaN (``0 * inf``), where eager's are NaN at the targets and 0 elsewhere; and a negative scale
  gave the other entries (and an ignored row's first) -0.0, where eager's are 0.0.

Each computes in float32 for 16-bit inputs (torch's ``pw_cast_for_opmath``), as ember's kernels do.

``nll_loss_forward`` of one sample (a 1-d input) whose target is ignored, a mean: eager's CUDA
kernel gives 0 where its CPU kernel (and torch's decomposition) divide 0 by a total weight of 0.

Two forward losses, whose decompositions promote their result:

* ``huber_loss`` and ``soft_margin_loss``: eager's kernels write the elementwise loss into a
  tensor of the *input's* dtype (computed in the operands' common dtype), then reduce it: a
  float16 input with a float32 target gives a float16 loss, which torch's decompositions gave
  as float32 (and float64 for a float32 input with a float64 target).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table
from torch._decomp.decompositions import pw_cast_for_opmath

aten = torch.ops.aten
_TORCH_NLL_LOSS_FORWARD = decomposition_table[aten.nll_loss_forward.default]

_MEAN, _SUM = 1, 2  # torch's Reduction enum: 0 none, 1 mean, 2 sum


def _mean_norm(x: torch.Tensor, reduction: int, scale: float = 1.0) -> Any:
    """``scale`` over the mean's count of elements, taken as at least one: torch's divided by a
    count of 0 in Python (an empty ragged batch: ZeroDivisionError, and the training graph ran
    eagerly), where the gradient of no elements is empty whatever it is. No guard on the count:
    a batch of none keeps the graph of the others."""
    return scale / torch.sym_max(x.numel(), 1) if reduction == _MEAN else scale


@pw_cast_for_opmath
def smooth_l1_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                            reduction: int, beta: float) -> torch.Tensor:
    norm = _mean_norm(self, reduction)
    x = self - target
    norm_grad = norm * grad_output
    # (a NaN x fails both tests: its gradient is x / beta's NaN, as in eager)
    return torch.where(x <= -beta, -norm_grad, torch.where(x >= beta, norm_grad, norm_grad * x / beta))


@pw_cast_for_opmath
def soft_margin_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                              reduction: int = _MEAN) -> torch.Tensor:
    norm = _mean_norm(self, reduction)
    z = torch.exp(-target * self)
    return -norm * target * z / (z + 1) * grad_output


# eager's EPSILON is a scalar of the input's dtype (float16 rounds 1e-12 to 0); rounded here, at
# import (a tensor made while AOTAutograd traces would be a graph input it refuses)
_EPSILON = {dtype: torch.tensor(1e-12, dtype=dtype).item() for dtype in (torch.float16, torch.bfloat16)}


def binary_cross_entropy_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                                  weight: torch.Tensor | None = None, reduction: int = _MEAN) -> torch.Tensor:
    epsilon = _EPSILON.get(self.dtype, 1e-12)
    return _bce_backward(grad_output, self, target, weight, reduction, epsilon)


@pw_cast_for_opmath
def _bce_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                  weight: torch.Tensor | None, reduction: int, epsilon: float) -> torch.Tensor:
    result = grad_output * (self - target) / torch.clamp(self * (1 - self), min=epsilon)
    if weight is not None:
        result = result * weight
    if reduction == _MEAN:
        result = result / self.numel()
    return result


def nll_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                      weight: torch.Tensor | None, reduction: int, ignore_index: int,
                      total_weight: torch.Tensor) -> torch.Tensor:
    """torch's ``_nll_loss_backward`` with the product taken at the targets' entries only, as
    eager's kernels write them. The entries are picked by comparing positions with the target, not
    by torch's scatter of a one-hot: run ahead of the forward's kernel (the gradient-in-forward
    plan), ATen's scatter into 0 classes raised a RuntimeError where eager's bounds check raises
    IndexError (the forward's gather checks the targets, as eager does)."""
    channel_dim = 0 if self.dim() < 2 else 1
    if reduction == _MEAN:
        grad_output = grad_output / total_weight
    if self.dim() == 1 and target.dim() > 0:  # (eager's kernel reads target[0] only)
        target = target[0]
    target = target.unsqueeze(channel_dim)
    valid = target != ignore_index
    safe_target = torch.where(valid, target, 0)
    shape = [1] * self.dim()
    shape[channel_dim] = self.shape[channel_dim]
    hit = torch.arange(self.shape[channel_dim], device=self.device).reshape(shape) == safe_target
    if self.dim() > grad_output.dim() > 0:
        grad_output = grad_output.unsqueeze(channel_dim)
    if weight is not None:
        grad_output = grad_output * weight.reshape(shape)
    # (torch's mask of the ignored rows, as it is: the partitioner reads it, scale_nan.py)
    grad_output = torch.where(valid, grad_output, 0)
    return torch.where(hit & valid, -grad_output, 0)


def _one_sample_target(self: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The target of one sample (a 1-d input) as 0-d: eager's kernel takes it as a 1-d tensor of
    one element too (and refuses more with a ValueError), which torch's decomposition refused as a
    batch of another size (RuntimeError)."""
    if self.dim() == 1 and target.dim() == 1:
        if target.shape[0] != 1:  # (raised here: eager_errors.py makes torch._check_value's a RuntimeError)
            raise ValueError(f"For 1D input, 1D target must have size 1, but got target size: {target.shape[0]}")
        return target.reshape(())
    return target


def nll_loss_forward(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                     ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's decomposition, with a GPU's loss of one ignored sample 0 as eager's CUDA kernel
    writes it, and the target of one sample taken as eager's kernel takes it."""
    target = _one_sample_target(self, target)
    output, total_weight = _TORCH_NLL_LOSS_FORWARD(self, target, weight, reduction, ignore_index)
    if self.dim() == 1 and reduction == _MEAN and self.device.type == "cuda":
        output = torch.where(target.reshape(()) != ignore_index, output, 0)
    return output, total_weight


def mse_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                      reduction: int) -> torch.Tensor:
    """In the input's dtype, as eager's kernel writes it: with a target of another dtype, eager's
    CPU kernel computes in the operands' common dtype and rounds to the input's once."""
    return _mse_loss_backward(grad_output, self, target, reduction).to(self.dtype)


@pw_cast_for_opmath
def _mse_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                       reduction: int) -> torch.Tensor:
    return _mean_norm(self, reduction, 2.0) * (self - target) * grad_output


@pw_cast_for_opmath
def huber_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                        reduction: int, delta: float) -> torch.Tensor:
    norm = _mean_norm(self, reduction)
    x = self - target
    return torch.where(x < -delta, -norm * grad_output * delta,
                       torch.where(x > delta, norm * grad_output * delta, norm * x * grad_output))


def _opmath(input: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both operands in the dtype eager's kernel computes in: their common dtype, float32 for 16 bits."""
    common = torch.result_type(input, target)
    compute = torch.float32 if common in (torch.float16, torch.bfloat16) else common
    return input.to(compute), target.to(compute)


def _reduced_as_input(loss: torch.Tensor, input: torch.Tensor, reduction: int) -> torch.Tensor:
    """The elementwise ``loss`` held in ``input``'s dtype, as eager's output tensor holds it, reduced."""
    loss = loss.to(input.dtype)
    return loss.mean() if reduction == _MEAN else loss.sum() if reduction == _SUM else loss


def huber_loss(input: torch.Tensor, target: torch.Tensor, reduction: int = _MEAN, delta: float = 1.0) -> Any:
    if not input.dtype.is_floating_point:  # (ATen's kernel rejects it, as eager does)
        return NotImplemented
    torch._check(delta > 0, lambda: "huber_loss does not support non-positive values for delta.")
    x, t = _opmath(input, target)
    z = (x - t).abs()
    return _reduced_as_input(torch.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), input, reduction)


def soft_margin_loss(input: torch.Tensor, target: torch.Tensor, reduction: int = _MEAN) -> Any:
    if not input.dtype.is_floating_point:  # (eager's in-place steps refuse a float result in it)
        return NotImplemented
    x, t = _opmath(input, target)
    return _reduced_as_input(torch.log1p(torch.exp(-x * t)), input, reduction)


def loss_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions above, by the ops they stand for."""
    return {aten.huber_loss.default: huber_loss, aten.soft_margin_loss.default: soft_margin_loss,
            aten.smooth_l1_loss_backward.default: smooth_l1_loss_backward,
            aten.mse_loss_backward.default: mse_loss_backward,
            aten.huber_loss_backward.default: huber_loss_backward,
            aten.soft_margin_loss_backward.default: soft_margin_loss_backward,
            aten.binary_cross_entropy_backward.default: binary_cross_entropy_backward,
            aten.nll_loss_forward.default: nll_loss_forward,
            aten.nll_loss_backward.default: nll_loss_backward,
            aten.nll_loss2d_backward.default: nll_loss_backward}


def one_sample_targets_in_torch() -> None:
    """Give torch's decomposition of ``nll_loss_forward``, which Dynamo's fake tensors run before
    any backend is called, eager's reading of a one-sample target (``_one_sample_target``).
    Once per process."""
    op = aten.nll_loss_forward.default
    decomposition = decomposition_table.get(op)
    if decomposition is None or getattr(decomposition, "_ember_one_sample", False):
        return

    # (wraps: fake tensors run a table entry only where its name and module are torch's own)
    @functools.wraps(decomposition)
    def nll_loss_forward(self: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return decomposition(self, _one_sample_target(self, target), *args, **kwargs)

    nll_loss_forward._ember_one_sample = True  # type: ignore[attr-defined]
    decomposition_table[op] = nll_loss_forward


one_sample_targets_in_torch()
