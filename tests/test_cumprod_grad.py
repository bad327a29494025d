"""cumprod's gradient in scans (frontend/cumprod_grad.py), which ember gives torches before 2.13
while AOTAutograd traces: theirs is about ten ops per element of the scanned dim (a cumprod over
8200 elements traced for minutes on the H200's torch 2.11). Tested here with the override forced
on, against eager's gradients."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.frontend import cumprod_grad


def _with_zeros(shape, where, dtype=torch.float64, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    for index in where:
        x[index] = 0
    return x


CASES = [  # (shape, dim, zeros' positions)
    ((4, 9), 1, []),
    ((4, 9), 1, [(0, 0), (1, 4), (2, 3), (2, 6), (3, 8)]),  # first, middle, two in a row, last
    ((4, 9), 0, [(1, 2), (3, 2), (0, 5)]),
    ((3, 5, 7), -2, [(0, 1, 2), (2, 4, 6), (1, 0, 0), (1, 3, 0)]),
    ((6,), 0, [(2,)]),
    ((3, 1), 1, [(1, 0)]),
    ((), 0, []),
    ((3, 0), 1, []),
]


@pytest.mark.parametrize("shape,dim,zeros", CASES)
def test_formula_matches_eagers_gradient(shape, dim, zeros):
    x = _with_zeros(shape, zeros).requires_grad_()
    grad = torch.randn(shape, dtype=torch.float64)
    (expected,) = torch.autograd.grad(torch.cumprod(x, dim), x, grad)
    x0 = x.detach()
    got = cumprod_grad.cumprod_backward(grad, x0, torch.cumprod(x0, dim), dim)
    torch.testing.assert_close(got, expected)
    if x.numel():
        d = dim % max(x.ndim, 1)
        twice = cumprod_grad.cumprod_backward_twice_differentiable(grad, x0, d)
        torch.testing.assert_close(twice, expected)
        f = lambda t: cumprod_grad._Cumprod.apply(t, d, None)  # noqa: E731
        assert torch.autograd.gradcheck(f, (x,))
        assert torch.autograd.gradgradcheck(f, (x,))  # (the second derivative at zeros too)


def test_formula_keeps_eagers_dtypes_and_specials():
    x = torch.randn(3, 40)
    x[0, 5], x[1, 7], x[2, 9] = float("nan"), float("inf"), 0.0
    grad = torch.randn(3, 40, dtype=torch.float64)
    # (float32 in, float64 out: the gradient is float32. torch 2.11's eager raises in this
    # backward (masked_scatter of float64 into float32): the reference is float64's gradient)
    xg = x.double().requires_grad_()
    (expected,) = torch.autograd.grad(torch.cumprod(xg, 1), xg, grad)
    got = cumprod_grad.cumprod_backward(grad, x, torch.cumprod(x, 1, dtype=torch.float64), 1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected.float(), equal_nan=True)
    # complex: eager's formula of the conjugates
    z = torch.randn(3, 12, dtype=torch.complex128)
    z[0, 4], z[2, 0] = 0, 0
    zg = z.clone().requires_grad_()
    gz = torch.randn(3, 12, dtype=torch.complex128)
    (expected,) = torch.autograd.grad(torch.cumprod(zg, 1), zg, gz)
    (got,) = torch.autograd.grad(cumprod_grad._Cumprod.apply(zg, 1, None), zg, gz)
    torch.testing.assert_close(got, expected)
    assert torch.autograd.gradcheck(lambda t: cumprod_grad._Cumprod.apply(t, 1, None), (zg,))
    for dtype in (torch.bfloat16, torch.float16):
        h = (1 + 0.1 * torch.randn(2, 64)).to(dtype)
        h[1, 30] = 0
        hg = h.clone().requires_grad_()
        g = torch.randn(2, 64).to(dtype)
        (expected,) = torch.autograd.grad(torch.cumprod(hg, 1), hg, g)
        got = cumprod_grad.cumprod_backward(g, h, torch.cumprod(h, 1), 1)
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=1e-2)


@pytest.fixture
def forced(monkeypatch):
    """The override on, as under torch < 2.13; its kernel's calls counted."""
    calls = []
    original = cumprod_grad.cumprod

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(cumprod_grad, "_torch_traces_it_per_element", lambda: True)
    monkeypatch.setattr(cumprod_grad, "cumprod", counted)
    # (torch's AOTAutograd cache keys on its version, not on the override: a hit would skip it.
    # The config's own patch: under torch 2.11, monkeypatch's restore left the option unreadable,
    # and every later compile in the process ran eagerly)
    with torch._functorch.config.patch(enable_autograd_cache=False):
        yield calls


def _backward_nodes(report: ember.Report) -> int:
    (graph,) = [g for g in report.graphs if g.kind == "backward"]
    return graph.passes[0].nodes


def test_compiled_gradients_with_the_override(forced):
    def loss(x, w):
        return (torch.cumprod(1 + 0.1 * torch.tanh(x * w), -1) * w).sum()

    nodes = []
    for n in (16, 300):
        x = torch.randn(5, n, requires_grad=True)
        w = torch.randn(n, requires_grad=True)
        expected = torch.autograd.grad(loss(x, w), (x, w))
        report = ember.Report()
        got = torch.autograd.grad(ember.compile(loss, report=report, dynamic=False)(x, w), (x, w))
        torch.testing.assert_close(got, expected)
        assert not report.fallbacks
        nodes.append(_backward_nodes(report))
    assert forced, "the override was not traced"
    assert nodes[0] == nodes[1], nodes  # the same graph for any length (torch 2.11's grows with it)

    def with_zeros(x):  # a cumprod of values with zeros, their gradients routed to the first zero
        return (torch.cumprod(torch.relu(x) - 0.5 * (x < 0), 1) ** 2).sum()

    x = _with_zeros((4, 50), [(0, 3), (1, 0), (1, 9), (3, 49)], dtype=torch.float32).requires_grad_()
    (expected,) = torch.autograd.grad(with_zeros(x), x)
    (got,) = torch.autograd.grad(ember.compile(with_zeros)(x), x)
    torch.testing.assert_close(got, expected)

    def complex_loss(z):  # (complex: eager's formula of the conjugates)
        return torch.view_as_real(torch.cumprod(z, 1)).pow(2).sum()

    z = torch.randn(3, 12, dtype=torch.complex64)
    z[0, 4] = 0
    z.requires_grad_()
    (expected,) = torch.autograd.grad(complex_loss(z), z)
    (got,) = torch.autograd.grad(ember.compile(complex_loss)(z), z)
    torch.testing.assert_close(got, expected)
