"""cumprod's gradient in a fixed number of ops, for torches that trace it element by element.

torch before 2.13 computes ``cumprod``'s backward with a loop over the scanned dim when it cannot
look at the values (AOTAutograd's fake tensors): about ten ops per element, so a training graph
with a cumprod over 8192 elements traced for minutes (H200, torch 2.11: 2557 backward nodes for
256 elements, 77 for 8). torch 2.13 has a formula of scans; ``cumprod_override()`` gives older
torches the same one while AOTAutograd traces (autograd_decomps.eager_decompositions).

With ``y = cumprod(x)`` and ``g`` the incoming gradient, along the dim:

* before the first zero of ``x``: ``sum_{j >= i} g_j y_j / x_i`` (a reversed cumsum);
* at the first zero ``k``: ``y_{k-1} * sum_{j >= k, before the next zero} g_j prod_{k < i <= j} x_i``;
* after it: 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import DispatchKey

aten = torch.ops.aten


def _torch_traces_it_per_element() -> bool:
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major, minor) < (2, 13)


def cumprod_backward(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    """The gradient of ``y = cumprod(x, dim)`` (of complex ``x``: given the conjugates of ``x`` and
    ``y``, as eager's formula is), with ``grad`` that of ``y``, in ``x``'s dtype. Its own derivative
    leaves out terms a zero makes 0: a second backward takes the form below."""
    if x.ndim == 0 or x.shape[dim] <= 1:
        return grad.to(x.dtype)
    dim = dim % x.ndim
    grad = grad.to(x.dtype)  # (as eager's formula takes it)
    zeros = torch.cumsum((x == 0).to(torch.int64), dim)  # zeros up to and including each position
    before = zeros == 0
    # before the first zero: y / x is the product of the others, summed from the end
    weighted = torch.where(before, grad * y, 0)
    from_end = torch.flip(torch.cumsum(torch.flip(weighted, [dim]), dim), [dim])
    # (x is 1 where masked: a 0 there would make the second derivative NaN)
    out = torch.where(before, from_end / torch.where(before, x, 1), 0)
    # the first zero: where ``zeros`` first reaches 1 (argmax of a row with none is 0; masked below)
    one = zeros == 1
    first = torch.argmax(one.to(torch.uint8), dim, keepdim=True)
    positions = torch.arange(x.shape[dim], device=x.device).view([-1] + [1] * (x.ndim - 1 - dim))
    at_first = (positions == first) & one
    # x between the first zero and the next, 1 elsewhere: its cumprod is the product after the zero
    after = torch.cumprod(torch.where(one & ~at_first, x, 1), dim)
    summed = (after * torch.where(one, grad, 0)).sum(dim, keepdim=True)
    lead = torch.where(first == 0, 1, torch.gather(y, dim, (first - 1).clamp(min=0)))
    out = torch.where(at_first, summed * lead, out)
    return out.to(x.dtype)


def cumprod_backward_twice_differentiable(grad: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """The gradient of ``cumprod(x, dim)`` as products that leave each ``x_i`` out, so that its own
    derivative is right at zeros too (``cumprod_backward`` masks the terms a zero makes 0, and
    their derivatives with them). n x n values per row: only for a second backward, which
    AOTAutograd's compiled backward does not take."""
    if x.ndim == 0 or x.shape[dim] <= 1:
        return grad.to(x.dtype)
    dim = dim % x.ndim
    grad = grad.to(x.dtype)
    n = x.shape[dim]
    xs = torch.movedim(x, dim, -1).unsqueeze(-2).expand(*x.shape[:dim], *x.shape[dim + 1:], n, n)
    eye = torch.eye(n, dtype=torch.bool, device=x.device)
    # row i: the cumprod of x with x_i replaced by 1; the gradient sums g_j times it over j >= i
    without_i = torch.cumprod(torch.where(eye, 1, xs), -1)
    later = torch.ones(n, n, dtype=torch.bool, device=x.device).triu()
    g = torch.movedim(grad, dim, -1).unsqueeze(-2)
    return torch.movedim(torch.where(later, without_i * g, 0).sum(-1), -1, dim)


class _Cumprod(torch.autograd.Function):
    generate_vmap_rule = True  # (torch.func transforms of it, as of any op)

    @staticmethod
    def forward(x: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
        with torch._C._AutoDispatchBelowAutograd():
            return aten.cumprod.default(x, dim, dtype=dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, ctx.dim, _ = inputs
        ctx.save_for_backward(x, output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        x, y = ctx.saved_tensors
        if x.is_complex():  # (eager's formula takes the conjugates)
            x, y = x.conj(), y.conj()
        if torch.is_grad_enabled():  # (create_graph: a second derivative will be taken)
            return cumprod_backward_twice_differentiable(grad, x, ctx.dim), None, None
        return cumprod_backward(grad, x, y, ctx.dim), None, None


def cumprod(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``aten.cumprod`` at the Autograd key: the op, with the gradient above."""
    if not (torch.is_grad_enabled() and x.requires_grad):  # (integers never require it)
        with torch._C._AutoDispatchBelowAutograd():
            return aten.cumprod.default(x, dim, dtype=dtype)
    return _Cumprod.apply(x, dim % max(x.ndim, 1), dtype)


def cumprod_override(always: bool = False) -> list[tuple[Any, DispatchKey, Any]]:
    """The (op, key, kernel) that gives this torch the gradient above (none where torch's own
    is already scans, unless ``always``)."""
    if not (always or _torch_traces_it_per_element()):
        return []
    return [(aten.cumprod.default, DispatchKey.Autograd, cumprod)]
