"""The CPU backend's float32 expm1 and log1p (``ember_expm1``, ``ember_log1p`` in
codegen/cpp_prelude.py; glibc's have no vector forms, and loops calling them ran one element at
a time): within their ulp bounds over every exponent, exact at their ends, and the activations
and losses built on them (ELU, SELU, CELU, softplus, Mish, log-sigmoid, BCE with logits)
against eager over dtypes and awkward shapes, with gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import DEVICE
from .helpers import assert_clean, assert_gradients_match, assert_same, every_exponent, run, ulps

needs_cpu = pytest.mark.skipif(DEVICE != "cpu", reason="the C++ backend's expm1 and log1p")

# tools/check_cpu_math.py over all 2^32 inputs: expm1 1.318 ulp at most, log1p 0.863
LIMITS = {torch.expm1: 1.35, torch.log1p: 0.9}


@needs_cpu
@pytest.mark.parametrize("fn, low, high", [(torch.expm1, -40.0, 88.7), (torch.log1p, -0.9999, 3e38)],
                         ids=["expm1", "log1p"])
def test_within_their_ulps_over_every_exponent(fn, low, high):
    x = every_exponent(low, high)
    out, report = run(fn, x)
    assert_clean(report)
    source = "\n".join(k.source for k in report.kernels)
    assert f"ember_{fn.__name__}(" in source and f"std::{fn.__name__}" not in source, source
    exact = fn(x.double())
    err = ulps(out, exact)
    assert err.max() <= LIMITS[fn], (err.max(), x[err.argmax()])


ENDS = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40,
        1e-30, -1e-30, 2.0 ** -25, -(2.0 ** -25), 3e-8, -3e-8, 0.34657, -0.34657, 0.41421354, 0.41421357,
        -0.29289323, -0.5, 1.0, 17.0, 17.3, -17.0, -17.5, -30.0, -104.0, -1e30, 88.72283, 88.7229, 89.0,
        100.0, 16777215.0, 16777216.0, 3e7, 3.4028235e38, -3.4028235e38, -1.0, -0.99999994, -1.5, -2.0]


@needs_cpu
@pytest.mark.parametrize("fn", [torch.expm1, torch.log1p], ids=["expm1", "log1p"])
def test_at_their_ends(fn):
    x = torch.tensor(ENDS)
    out, report = run(fn, x)
    assert_clean(report)
    exact = fn(x.double())
    nearest = exact.float()
    for xi, got, want, e in zip(ENDS, out.tolist(), nearest.tolist(), exact.tolist()):
        if math.isnan(want):
            assert math.isnan(got), (xi, got)
        elif math.isinf(want) or want == 0 or math.isinf(xi) or abs(xi) < 2.0 ** -24 or want == -1:
            assert got == want and math.copysign(1, got) == math.copysign(1, want), (xi, got, want)
        else:
            ulp = 2.0 ** (math.floor(math.log2(max(abs(want), 2.0 ** -126))) - 23)
            assert abs(got - e) <= LIMITS[fn] * ulp, (xi, got, e)


def _bce(x, y):
    return F.binary_cross_entropy_with_logits(x, y)


ACTIVATIONS = {
    "elu": F.elu,
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=0.7),
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=5.0),
    "mish": F.mish,
    "logsigmoid": F.logsigmoid,
    "expm1": torch.expm1,
    "log1p_abs": lambda x: torch.log1p(x.abs()),
}


@needs_cpu
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_activations_match_eager(name, dtype):
    fn = ACTIVATIONS[name]
    torch.manual_seed(0)
    x = (torch.randn(37, 65) * 6).to(dtype)
    x[0, :6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-30])
    out, report = run(fn, x)
    assert_clean(report)
    assert_same(out, fn(x))


@needs_cpu
@pytest.mark.parametrize("shape", [(0,), (1,), (0, 5), (5, 1, 3)], ids=str)
def test_activations_over_awkward_shapes(shape):
    x = torch.randn(shape) * 4
    x_t = torch.randn(tuple(reversed(shape))).permute(*reversed(range(len(shape)))) * 4
    for inp in (x, x_t):
        for name in ("softplus", "elu", "mish"):
            out, _ = run(ACTIVATIONS[name], inp)
            assert_same(out, ACTIVATIONS[name](inp))


@needs_cpu
def test_symbolic_sizes_match_eager():
    compiled = ember.compile(lambda x: F.softplus(x) + F.elu(x), dynamic=True)
    for n in (5, 33, 1, 0, 1000):
        x = torch.randn(n) * 5
        assert_same(compiled(x), F.softplus(x) + F.elu(x))


@needs_cpu
@pytest.mark.parametrize("name", ["elu", "softplus", "mish", "logsigmoid", "selu"])
def test_activation_gradients_match_eager(name):
    torch.manual_seed(1)
    assert_gradients_match(ACTIVATIONS[name], torch.randn(64, 33) * 5)


@needs_cpu
def test_bce_with_logits_and_its_gradient_match_eager():
    torch.manual_seed(2)
    x = (torch.randn(128, 40) * 8).requires_grad_()
    y = torch.rand(128, 40)
    ref_x = x.detach().clone().requires_grad_()
    out = ember.compile(_bce)(x, y)
    ref = _bce(ref_x, y)
    out.backward()
    ref.backward()
    assert_same(out, ref)
    assert_same(x.grad, ref_x.grad)
