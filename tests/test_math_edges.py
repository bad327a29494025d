"""Pointwise math at the edges of its domain (infinities, NaN, values past a dtype's range), and
the errors eager raises for dtypes its kernels lack, against eager."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember

from .conftest import DEVICE
from .helpers import assert_same, on_the_interpreter, run


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_nan_to_num_takes_replacements_past_the_dtype_as_eager(dtype):
    # eager converts the replacements unchecked (float32 posinf=1e39 is inf); the decomposition's
    # scalar_tensor raised "value cannot be converted to type float without overflow"
    # Needing grad: the 16-bit replacements were rounded by a torch.tensor, which AOTAutograd
    # refuses in a training graph (it ran eagerly, with a warning)
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, -0.0], dtype=dtype, device=DEVICE,
                     requires_grad=True)
    fn = lambda x: [torch.nan_to_num(x, posinf=1e39), torch.nan_to_num(x, nan=-1e39, neginf=-1e39),  # noqa: E731
                    torch.nan_to_num(x, nan=1e6, posinf=3.4028235677973366e38)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, report = run(fn, x)
    ref = fn(x)
    for o, r in zip(out, ref):
        assert torch.equal(o.isnan(), r.isnan()) and torch.equal(o[~o.isnan()], r[~r.isnan()]), (o, r)
    grads = [torch.autograd.grad(sum(o.sum() for o in outs), x)[0] for outs in (out, ref)]
    assert torch.equal(grads[0], grads[1]), grads
    assert not [g.error for g in report.graphs if g.error] and not report.fallbacks


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_log_ndtr_of_16_bit_floats_raises_as_in_eager(dtype):
    # eager has no 16-bit log_ndtr kernel; the decomposition computed one
    x = torch.tensor([-3.0, 0.5], dtype=dtype, device=DEVICE)
    with pytest.raises(NotImplementedError):
        torch.special.log_ndtr(x)
    with pytest.raises(NotImplementedError):
        ember.compile(torch.special.log_ndtr)(x)
    assert_same(ember.compile(torch.special.log_ndtr)(x.float()), torch.special.log_ndtr(x.float()))


@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
def test_16_bit_erf_of_small_values_is_erf_rounded(target):
    # Triton's 16-bit erf (Abramowitz & Stegun 7.1.26) has an absolute error of 1.5e-7: float16
    # erf(1e-5) was 6 ulps off and erf(-0.0) +0.0 (eager's GPU erf is within an ulp; its CPU
    # vector erf flushes erf(1e-7) to 0: the reference is eager's float64 erf, rounded)
    x = torch.cat([torch.logspace(-7, 0.5, 600), -torch.logspace(-7, 0.5, 600), torch.tensor([0.0, -0.0])])
    x = x.to(torch.float16).to(DEVICE)
    out, report = run(torch.erf, x, options={"target": target} if target else None)
    assert report.kernels and not report.fallbacks
    expected = torch.erf(x.double()).half()
    assert torch.equal(out, expected), (x[out != expected][:4], out[out != expected][:4], expected[out != expected][:4])
    assert torch.equal(out.signbit(), x.signbit())


_EDGES = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, -8.0, 1e-7, 1e-3, 7.0,
          -7.3, 88.0, 3e38, -3e38, 0.999999]


@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_math_at_the_edges_of_its_domain(dtype, target):
    # the interpreter's Triton math (libdevice's stand-ins): atan2(inf, inf) was NaN, atan2(nan,
    # 0) 0, pow(-0.0, -1) inf, pow(-1, inf) NaN, atan(3e38) 0, erfc(7) 0, expm1 and log1p lost
    # x's low digits (2e-5 at 1e-3), tanh(1e-7) was 0.87e-7, and expm1(-0.0) and tanh(-0.0) +0.0;
    # asinh(-0.0) was +0.0, asinh(3e38) and acosh(3e38) inf, acosh(-3e38) inf (not NaN), and
    # asinh, sinh (1e-3) and acos (0.999999) 2e-5 off
    x = torch.tensor(_EDGES, dtype=dtype, device=DEVICE)
    a, b = x.repeat_interleave(len(_EDGES)), x.repeat(len(_EDGES))

    s = torch.tensor(-0.0, dtype=dtype, device=DEVICE)  # (a 0-d operand: a scalar in the kernel)

    def fn(x, a, b, s):
        return [torch.atan2(a, b), torch.pow(a, b), torch.atan(x), torch.erfc(x), torch.expm1(x), torch.log1p(x),
                torch.tanh(x), torch.nn.functional.elu(x), torch.pow(s, x), torch.atan2(s, x), torch.expm1(s) + x,
                torch.asinh(x), torch.acosh(x), torch.sinh(x), torch.cosh(x), torch.acos(x)]

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="ember")  # (no kernel may fall back to ATen)
        out, report = run(fn, x, a, b, s, options={"target": target} if target else None)
    assert not [g.error for g in report.graphs if g.error] and not report.fallbacks
    for i, (o, r) in enumerate(zip(out, fn(x, a, b, s))):
        assert_same(o, r)
        assert torch.equal(o.isnan(), r.isnan()), (i, o, r)
        assert torch.equal(o.signbit()[~r.isnan()], r.signbit()[~r.isnan()]), (i, o, r)


def test_logspace_of_a_negative_base_is_aten_alone():
    # torch's decomposition raises NotImplementedError for a negative base, which eager computes:
    # the whole graph ran eagerly, with a warning; now only the logspace runs through ATen
    fn = lambda x: torch.logspace(0, 3, 4, base=-2.0, device=x.device) * x  # noqa: E731
    x = torch.randn(4, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, report = run(fn, x)
    assert_same(out, fn(x))
    assert not [g.error for g in report.graphs if g.error] and report.fallbacks == ["aten.logspace"]


@pytest.mark.parametrize("dtype,eps", [(torch.bfloat16, 1e-3), (torch.float16, 1e-4)], ids=str)
def test_logit_clamps_to_bounds_rounded_to_the_dtype_as_eager(dtype, eps):
    # eager's kernels hold lo = eps and hi = 1 - lo in the input's dtype: in bfloat16 1 - 1e-3 is
    # 1.0, so logit(1.0, eps=1e-3) is inf (its gradient too), where the decomposition's float
    # bounds gave 6.9 (and a gradient of 0)
    x = torch.tensor([1.0, 0.9995, 0.001, 1e-4, 0.5, 0.0, 0.99609375, 2.0], dtype=dtype, device=DEVICE,
                     requires_grad=True)
    fn = lambda x: torch.logit(x, eps=eps)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, report = run(fn, x)
    ref = fn(x)
    assert torch.equal(out, ref), (out, ref)
    grads = [torch.autograd.grad(y.sum(), x)[0] for y in (out, ref)]
    assert torch.equal(grads[0], grads[1]), grads
    assert not [g.error for g in report.graphs if g.error] and not report.fallbacks


def test_rrelu_in_evaluation_is_generated_as_eagers_leaky_relu():
    # eager's rrelu out of training is leaky_relu(x, (lower + upper) / 2); it and its backward
    # ran through ATen
    x = torch.tensor([-3.0, -0.0, 0.0, 2.0, float("nan"), -float("inf"), 1e-40], device=DEVICE, requires_grad=True)
    fn = lambda x: torch.nn.functional.rrelu(x, lower=0.1, upper=0.7, training=False) * 2  # noqa: E731
    out, report = run(fn, x)
    ref = fn(x)
    assert torch.equal(out.nan_to_num(7.0), ref.nan_to_num(7.0)) and torch.equal(out.signbit(), ref.signbit())
    grads = [torch.autograd.grad(y.sum(), x)[0] for y in (out, ref)]
    assert torch.equal(grads[0].nan_to_num(7.0), grads[1].nan_to_num(7.0)), grads
    assert not [g.error for g in report.graphs if g.error] and not report.fallbacks, report.fallbacks


def test_logit_with_eps_past_one_half_clamps_as_eager():
    # eager's kernel takes x < lo ? lo : (x > hi ? hi : x); with eps > 0.5, lo > hi and clamp's
    # min(max(x, lo), hi) gave hi everywhere: logit(0, eps=0.7) was -0.85 where eager gives 0.85
    # (no NaN: its gradient is NaN in eager's scalar loop and 0 in its vectorized one)
    x = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0, -2.0, 0.3], requires_grad=True)
    fn = lambda x: torch.logit(x, eps=0.7)  # noqa: E731
    out, report = run(fn, x)
    ref = fn(x)
    assert_same(out, ref)
    grads = [torch.autograd.grad(y.sum(), x)[0] for y in (out, ref)]
    assert_same(grads[0], grads[1])
    assert not [g.error for g in report.graphs if g.error] and not report.fallbacks


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
def test_threshold_of_integers_truncates_the_threshold_as_eager(dtype):
    # eager's kernel holds the threshold in the integer type: -0.5 is 0, so threshold(0, -0.5, 2)
    # is 2 where the decomposition's 0 <= -0.5 kept 0; an unsigned dtype takes -1 as its maximum
    # (and refuses a negative float for it: an error in eager and ember alike)
    x = torch.tensor([0, 1, 3, 7, 200], dtype=dtype)
    for fn in (lambda x: torch.nn.functional.threshold(x, -0.5 if x.dtype.is_signed else 0.5, 2),
               lambda x: torch.nn.functional.threshold(x, 2.9, 5), lambda x: torch.nn.functional.threshold(x, -1, 9),
               lambda x: torch.nn.functional.threshold(x, -255, 9)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            out, report = run(fn, x)
        assert_same(out, fn(x))
        assert not [g.error for g in report.graphs if g.error] and not report.fallbacks


@pytest.mark.parametrize("eps", [None, 1e-3, -0.5], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_logit_rounds_each_16_bit_step_and_takes_a_negative_eps_as_none(dtype, eps):
    # eager's CPU kernels compute log(x / (1 - x)) and the gradient's x * (1 - x) in the 16-bit
    # dtype, each step rounded (10% of float16 logits were 2 to 4 ulps off); a negative eps is
    # no eps there, so outside [0, 1] the gradient is NaN (the decomposition clamped to eps)
    x = torch.cat([torch.linspace(0, 1, 2001), torch.tensor([-0.25, 1.25, -2.0])]).to(dtype).requires_grad_()
    fn = lambda x: torch.logit(x, eps)  # noqa: E731
    out, report = run(fn, x)
    ref = fn(x)
    grads = [torch.autograd.grad(y.sum(), x)[0] for y in (out, ref)]
    for o, r in ((out, ref), grads):
        assert torch.equal(o.isnan(), r.isnan()) and torch.equal(o[~o.isnan()], r[~r.isnan()]), (o, r)
    assert not [g.error for g in report.graphs if g.error] and not report.fallbacks
