"""A product's gradient (frontend/prod_grad.py). A 16-bit CPU product is ATen's, rounded at every
step, and eager's backward divides that rounded result by each input; ember's trace now does the
same where the tensor holds no 0, so ``log(x.prod())`` trains as in eager. Other products keep
the formula torch traces, now ember's own."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.frontend import prod_grad

from .conftest import DEVICE


def _grads(fn, x, compiled, create_graph=False):
    x = x.detach().clone().requires_grad_()
    out = (compiled or fn)(x)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype).to(out.device)
    (g,) = torch.autograd.grad(out, x, up, create_graph=create_graph)
    return out, g


def _log_prod(x):
    return torch.log(x.prod(-1).abs() + 1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_log_of_a_long_16_bit_product_trains_as_eager(dtype, dynamic):
    # 889 terms near 1: ATen's CPU product rounds each step and ends 10-20% off the exact one; the
    # traced formula's scans gave the exact product's gradient, 4-40% off eager's (a fuzz finding)
    compiled = ember.compile(_log_prod, dynamic=dynamic)
    for rows in (7, 5):
        x = 1 + 0.1 * torch.randn(rows, 889, generator=torch.Generator().manual_seed(rows))
        x = x.to(dtype).to(DEVICE)
        out, g = _grads(_log_prod, x, compiled)
        want_out, want = _grads(_log_prod, x, None)
        torch.testing.assert_close(out, want_out)
        ref = _grads(_log_prod, x.double(), None)[1]
        # (no further from float64 than eager's own rounding, with a 16-bit ulp of slack)
        assert (g.double() - ref).abs().max() <= 2 * (want.double() - ref).abs().max() + 2e-3
        torch.testing.assert_close(g, want, atol=4e-3, rtol=2e-2)


@pytest.mark.skipif(DEVICE != "cpu", reason="only the CPU's 16-bit product rounds every step")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_an_overflowing_16_bit_product_has_eagers_gradient(dtype):
    # float16 300 * 300 * 0.001 is inf in eager (bf16's range holds 90000, its rounding does not)
    fn = lambda x: x.prod(-1)  # noqa: E731
    x = torch.cat([torch.tensor([[300.0, 300.0, 0.001]]), torch.rand(4, 3) + 0.5]).to(dtype)
    out, g = _grads(fn, x, ember.compile(fn))
    want_out, want = _grads(fn, x, None)
    assert torch.equal(out, want_out)
    torch.testing.assert_close(g, want, atol=0, rtol=1e-2, equal_nan=True)


ZEROS = [  # (shape, dim, zeros' positions): eager's formula changes for the whole tensor at a 0
    ((4, 9), 1, []),
    ((4, 9), 1, [(1, 4)]),
    ((4, 9), 1, [(0, 0), (2, 3), (2, 6)]),
    ((4, 9), 0, [(1, 2), (3, 2), (0, 5)]),
    ((3, 5, 7), -2, [(0, 1, 2), (1, 3, 0)]),
    ((6,), None, [(2,)]),
    ((6,), None, [(2,), (4,)]),
    ((3, 1), 1, [(1, 0)]),
    ((), None, []),
    ((3, 0), 1, []),
    ((0, 3), None, []),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("keepdim", [False, True], ids=["squeezed", "keepdim"])
@pytest.mark.parametrize("shape,dim,zeros", ZEROS, ids=str)
def test_product_gradients_with_zeros_match_eager(shape, dim, zeros, keepdim, dtype):
    x = (torch.rand(shape, generator=torch.Generator().manual_seed(0)) + 0.5).to(dtype)
    for index in zeros:
        x[index] = 0
    x = x.to(DEVICE)
    fn = (lambda x: x.prod()) if dim is None else (lambda x: x.prod(dim, keepdim=keepdim))
    out, g = _grads(fn, x, ember.compile(fn))
    want_out, want = _grads(fn, x, None)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(g, want)


@pytest.mark.parametrize("shape,dim,zeros", ZEROS, ids=str)
@pytest.mark.parametrize("from_result", [False, True], ids=["two-sided", "from-result"])
def test_formula_matches_eagers_gradient_and_differentiates_twice(shape, dim, zeros, from_result):
    x = torch.rand(shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.5
    for index in zeros:
        x[index] = 0
    x.requires_grad_()
    op = (lambda t: t.prod()) if dim is None else (lambda t: t.prod(dim))
    out = op(x)
    grad = torch.randn(out.shape, dtype=torch.float64)
    (expected,) = torch.autograd.grad(out, x, grad)
    got = prod_grad.prod_backward(grad, x.detach(), out.detach(), dim if dim is None else dim % max(x.ndim, 1),
                                  False, from_result)
    torch.testing.assert_close(got, expected)
    if x.numel() and not zeros:  # (gradcheck's perturbations cross 0 where the tensor holds one)
        fn = lambda t: prod_grad._Prod.apply(t, None if dim is None else dim % max(t.ndim, 1), False, None,  # noqa: E731
                                             from_result)
        assert torch.autograd.gradgradcheck(fn, (x,))


def test_a_complex_products_gradient_takes_the_conjugates():
    x = torch.randn(3, 5, dtype=torch.complex128, generator=torch.Generator().manual_seed(4), requires_grad=True)
    out = x.prod(1)
    grad = torch.randn(3, dtype=torch.complex128)
    (expected,) = torch.autograd.grad(out, x, grad)
    for from_result in (False, True):
        got = prod_grad.prod_backward(grad, x.detach(), out.detach(), 1, False, from_result)
        torch.testing.assert_close(got, expected)


@pytest.mark.skipif(DEVICE != "cpu", reason="only the CPU's 16-bit product rounds every step")
def test_a_16_bit_product_of_float32_values_has_eagers_gradient():
    # prod(dtype=bfloat16) of float32 values: ATen casts them and multiplies in bfloat16
    fn = lambda x: torch.log(x.prod(-1, dtype=torch.bfloat16))  # noqa: E731
    x = 1 + 0.1 * torch.randn(3, 600, generator=torch.Generator().manual_seed(5))
    out, g = _grads(fn, x, ember.compile(fn))
    want_out, want = _grads(fn, x, None)
    assert g.dtype == torch.float32
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(g, want, atol=4e-3, rtol=2e-2)


def test_a_product_to_float32_of_16_bit_values_keeps_the_two_sided_formula():
    # prod(dtype=float32) of bf16 values is ember's own float32 product: the result is exact there
    fn = lambda x: x.prod(-1, dtype=torch.float32)  # noqa: E731
    x = (torch.rand(3, 40, generator=torch.Generator().manual_seed(3)) + 0.5).to(torch.bfloat16).to(DEVICE)
    out, g = _grads(fn, x, ember.compile(fn))
    want_out, want = _grads(fn, x, None)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(g, want)


def _prod_written_in_place(x):
    v = (1 + 0.1 * torch.tanh(x)).prod(dim=-1, keepdim=True)
    v.add_(0.5)  # (the backward needs v as the product returned it: eager's backward refuses)
    return v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_product_written_in_place_raises_in_the_backward_as_eager(dtype):
    # (CPU fuzz seed 120699484912) tracing the backward of ember's product raised autograd's
    # version error while compiling, as BackendCompilerFailed; eager's forward runs and its
    # backward raises. The graph now runs eagerly, with ember's warning.
    x = torch.randn(3, 5, device=DEVICE, dtype=dtype)
    want = _prod_written_in_place(x.clone().requires_grad_())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        want.sum().backward()
    xc = x.clone().requires_grad_()
    with pytest.warns(RuntimeWarning, match="ember: torch could not trace"):
        got = ember.compile(_prod_written_in_place)(xc)
    torch.testing.assert_close(got, want.detach())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        got.sum().backward()
