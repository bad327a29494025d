"""A 16-bit CPU product's gradient from its own result, as eager computes it.

ember leaves a float16 or bfloat16 ``prod`` on the CPU to ATen (aten_reductions.py), whose kernel
rounds at every step: over a few hundred terms near 1 its result is 10-20% off the exact
product, and float16 300 * 300 * 0.001 is inf. Eager's backward divides that same result by
each input (``grad * result / x`` where the tensor holds no zero), so ``log(x.prod())``'s
gradient stays right. AOTAutograd traces torch's other formula, the one for any values: an
exclusive product from each side, computed with float32 scans. That gradient belongs to the
exact product, so beside ATen's rounded one ``log(x.prod())`` got a gradient off by the
rounding (4-40% in a fuzzed program). ``prod_override()`` traces eager's choice instead, with
the data-dependent branch as a select: ``result / x`` when no element of the tensor is 0 (eager
tests the whole tensor, not the row), the two-sided product otherwise.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import DispatchKey

aten = torch.ops.aten


def _two_sided_product(grad: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """``grad`` times the product of every other element along ``dim`` (right at zeros)."""
    n = x.shape[dim]
    ones = torch.ones_like(grad)  # (size 1 along dim; a cat and a narrow also serve n = 0)
    before = torch.cat([ones, x], dim).narrow(dim, 0, n).cumprod(dim)
    after = torch.cat([ones, x.flip(dim)], dim).narrow(dim, 0, n).cumprod(dim).flip(dim)
    return grad * before * after


def prod_backward(grad: torch.Tensor, x: torch.Tensor, result: torch.Tensor, dim: int | None,
                  keepdim: bool, from_result: bool = True) -> torch.Tensor:
    """The gradient of ``result = x.prod(dim, keepdim)`` (all dims where ``dim`` is None):
    ``result / x`` where ``x`` holds no 0 and ``from_result``, else the two-sided product (the
    formula torch traces for any product)."""
    if x.ndim == 0:
        return grad
    x = x.to(grad.dtype)
    if x.is_complex():  # (eager's formula takes the conjugates)
        x, result = x.conj(), result.conj()
    if dim is None:
        flat = x.reshape(-1)
        safe = _two_sided_product(grad.reshape(1), flat, 0).reshape(x.shape)
    else:
        if not keepdim:
            grad, result = grad.unsqueeze(dim), result.unsqueeze(dim)
        safe = _two_sided_product(grad, x, dim)
    if not from_result:
        return safe
    return torch.where((x == 0).any(), safe, grad * (result / x))


class _Prod(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, dim: int | None, keepdim: bool, dtype: torch.dtype | None,
                from_result: bool) -> torch.Tensor:
        with torch._C._AutoDispatchBelowAutograd():
            if dim is None:
                return aten.prod.default(x, dtype=dtype)
            return aten.prod.dim_int(x, dim, keepdim, dtype=dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, ctx.dim, ctx.keepdim, _, ctx.from_result = inputs
        ctx.save_for_backward(x, output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        x, result = ctx.saved_tensors
        return prod_backward(grad, x, result, ctx.dim, ctx.keepdim, ctx.from_result), None, None, None, None


def _rounds_every_step(x: torch.Tensor, dtype: torch.dtype | None) -> bool:
    """Whether ATen computes this product (and ember leaves it to ATen): 16-bit on the CPU."""
    return x.device.type == "cpu" and (dtype or x.dtype) in (torch.float16, torch.bfloat16)


def _below_autograd(op: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args, **kwargs)


def prod(x: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``aten.prod`` at the Autograd key: eager's gradient for a 16-bit CPU product, torch's
    traced one for any other."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return _below_autograd(aten.prod.default, x, dtype=dtype)
    return _Prod.apply(x, None, False, dtype, _rounds_every_step(x, dtype))


def prod_dim(x: torch.Tensor, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``aten.prod.dim_int`` at the Autograd key, as ``prod``."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return _below_autograd(aten.prod.dim_int, x, dim, keepdim, dtype=dtype)
    return _Prod.apply(x, dim % max(x.ndim, 1), keepdim, dtype, _rounds_every_step(x, dtype))


def prod_override() -> list[tuple[Any, DispatchKey, Any]]:
    """The (op, key, kernel) pairs that give 16-bit CPU products eager's gradient while
    AOTAutograd traces (autograd_decomps.eager_decompositions)."""
    return [(aten.prod.default, DispatchKey.Autograd, prod),
            (aten.prod.dim_int, DispatchKey.Autograd, prod_dim)]
