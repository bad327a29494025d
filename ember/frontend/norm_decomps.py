"""Batch norm's decompositions, as torch's (``native_batch_norm_helper``) but with eager's mean
in training on the CPU: eager's kernel takes it as ``sum / n``, inf for a channel holding +inf
(-inf for -inf). torch's decomposition takes it from ``var_mean``, whose corrected mean
``m + sum(x - m) / n`` is ``inf - inf = NaN`` there: the running and saved means were NaN. The
shared variance lowering stays as it is (eager's ``var_mean`` is a Welford mean, NaN unless the
inf comes last), and so does the GPU (eager's CUDA mean is inf or NaN by layout and position).
The variance, rstd and the output are NaN in both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._decomp.decompositions import _unsqueeze_to_dim, native_batch_norm_helper
from torch._prims_common import get_computation_dtype

aten = torch.ops.aten


def _helper(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
            running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
            momentum: float, eps: float, functional: bool) -> tuple[Any, ...]:
    """torch's ``native_batch_norm_helper``, the training branch's mean as eager's."""
    if not training:
        return native_batch_norm_helper(input, weight, bias, running_mean, running_var, training, momentum,
                                        eps, functional)
    dims = [0, *range(2, input.dim())]
    input_acc = input.to(dtype=get_computation_dtype(input.dtype))
    biased_var, mean = torch.var_mean(input_acc, dim=dims, correction=0, keepdim=True)
    if input.device.type == "cpu":
        # (the corrected mean elsewhere: it keeps a large mean's digits, a constant channel's is
        # exact. The plain sum is var_mean's first one, merged by CSE: no further pass.)
        plain = torch.mean(input_acc, dim=dims, keepdim=True)
        mean = torch.where(plain.isinf(), plain, mean)
    rstd = torch.rsqrt(biased_var + eps)
    output = (input - mean) * rstd
    save_mean = torch.squeeze(mean, dims)
    save_rstd = torch.squeeze(rstd, dims)
    new_running_mean, new_running_var = running_mean, running_var
    if running_mean is not None:
        new_running_mean = momentum * save_mean + (1 - momentum) * running_mean
        if not functional:
            running_mean.copy_(new_running_mean)
    if running_var is not None:
        n = input.numel() / input.shape[1]
        unbiased_var = torch.squeeze(biased_var, dims) * (n / (n - 1))
        new_running_var = momentum * unbiased_var + (1 - momentum) * running_var
        if not functional:
            running_var.copy_(new_running_var)
    if weight is not None:
        output = output * _unsqueeze_to_dim(weight.flatten(), input.dim() - 1)
    if bias is not None:
        output = output + _unsqueeze_to_dim(bias.flatten(), input.dim() - 1)
    if input.device.type == "cpu":
        save_mean = save_mean.to(dtype=input.dtype)
        save_rstd = save_rstd.to(dtype=input.dtype)
    return output.to(dtype=input.dtype), save_mean, save_rstd, new_running_mean, new_running_var


def _native_batch_norm(input: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                       training: bool, momentum: float, eps: float) -> tuple[Any, ...]:
    return _helper(input, weight, bias, running_mean, running_var, training, momentum, eps, False)[:3]


def _no_stats(input: torch.Tensor, weight: Any, bias: Any, training: bool, momentum: float,
              eps: float) -> tuple[Any, ...]:
    return _helper(input, weight, bias, None, None, training, momentum, eps, False)[:3]


def _functional(input: torch.Tensor, weight: Any, bias: Any, running_mean: torch.Tensor,
                running_var: torch.Tensor, training: bool, momentum: float, eps: float) -> tuple[Any, ...]:
    return _helper(input, weight, bias, running_mean, running_var, training, momentum, eps, True)


def batch_norm_decompositions() -> dict[Any, Callable[..., Any]]:
    return {
        aten.native_batch_norm.default: _native_batch_norm,
        aten._native_batch_norm_legit.default: _native_batch_norm,
        aten._native_batch_norm_legit.no_stats: _no_stats,
        aten._native_batch_norm_legit_functional.default: _functional,
    }
