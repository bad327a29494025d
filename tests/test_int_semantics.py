"""Integer, bitwise and dtype-promotion semantics of pointwise ops against eager: the errors
eager raises where its kernels have no implementation for a dtype, rounding to decimals."""

from __future__ import annotations

import pytest
import torch

import ember

from .conftest import DEVICE
from .helpers import on_the_interpreter, run

_BOOLS = torch.tensor([True, False, True])
_FLOATS = torch.tensor([1.5, -2.0, 3.0])
_INTS = torch.tensor([1, -2, 3])

# shifts of bools or floats (the promoted dtype), floor division and lcm of bools: torch's meta
# functions and references refuse them with a RuntimeError while tracing, eager's kernels with
# NotImplementedError ('"lshift_cpu" not implemented for 'Bool'')
_NO_KERNEL = {
    "bool << bool": lambda b, f, i: b << b,
    "bool >> bool": lambda b, f, i: b >> b,
    "float << int": lambda b, f, i: f << 1,
    "int >> float tensor": lambda b, f, i: i >> f,
    "int << float": lambda b, f, i: i << 1.5,
    "bool // bool": lambda b, f, i: b // b,
    "div floor bool": lambda b, f, i: torch.div(b, b, rounding_mode="floor"),
    "lcm of bools": lambda b, f, i: torch.lcm(b, b),
    "complex // int": lambda b, f, i: (f * 1j) // 2,  # (eager has no complex floor division)
    # float-only ops whose references refuse the dtype: elu's alpha cast to int, a bool
    # subtraction or negation (frac, logaddexp, log_sigmoid)
    "elu of ints": lambda b, f, i: torch.nn.functional.elu(i),
    "selu of bools": lambda b, f, i: torch.nn.functional.selu(b),
    "frac of bools": lambda b, f, i: torch.frac(b),
    "logsigmoid of bools": lambda b, f, i: torch.nn.functional.logsigmoid(b),
    "logaddexp of bools": lambda b, f, i: torch.logaddexp(b, b),
    "logaddexp2 of bools": lambda b, f, i: torch.logaddexp2(b, b),
}


@pytest.mark.parametrize("name", list(_NO_KERNEL))
def test_integer_ops_without_a_kernel_for_the_dtype_raise_eagers_not_implemented_error(name):
    fn = _NO_KERNEL[name]
    with pytest.raises(NotImplementedError):
        fn(_BOOLS, _FLOATS, _INTS)
    with pytest.raises(NotImplementedError, match="not implemented for"):
        ember.compile(fn)(_BOOLS, _FLOATS, _INTS)


def test_round_to_decimals_is_generated_and_equals_eager_bit_for_bit():
    # round(decimals=) ran as an ATen call; eager computes nearbyint(x * 10**d) / 10**d (or
    # nearbyint(x / 10**-d) * 10**-d) in its op math type, float32 for 16-bit floats
    x = torch.cat([torch.tensor([1.005, 2.675, 125.0, 150.0, -250.0, 0.125, -0.0, 0.05, -0.15, 3e38, 1e-40,
                                 float("nan"), float("inf")], dtype=torch.float64),
                   torch.randn(200, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 1000])
    fn = lambda a, b, c, d: [torch.round(t, decimals=n) for t in (a, b, c, d) for n in (2, -2, 0, 40)]  # noqa: E731
    args = (x, x.float(), x.half(), x.bfloat16())
    report = ember.Report()
    out = ember.compile(fn, report=report)(*args)
    assert report.kernels and not report.fallbacks, report.fallbacks
    for o, r in zip(out, fn(*args)):
        assert o.dtype == r.dtype and torch.equal(o.isnan(), r.isnan()), (o, r)
        assert torch.equal(o[~o.isnan()], r[~r.isnan()]), (o, r)
        assert torch.equal(o.signbit()[~o.isnan()], r.signbit()[~r.isnan()])  # (-0.0 kept)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_signed_overflow_wraps_without_relying_on_fwrapv(dtype):
    # signed overflow is undefined in C: NVRTC (no -fwrapv there) and g++ without it folded
    # (x + 1) > x to true and (x * 2) // 2 to x, and took |INT_MIN| as positive. Kernels do
    # int32/int64 arithmetic in unsigned types, so they wrap under any compiler flags
    info = torch.iinfo(dtype)
    x = torch.tensor([0, 1, -7, info.max, info.min, info.max - 1, info.min + 1], dtype=dtype)
    fn = lambda a: ((a + 1) > a, (a * 2) // 2, a - 1 < a, -a, (-a) < 0, a.abs() % 5, a.abs() < 0)  # noqa: E731
    flags = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off")  # (no -fwrapv)
    report = ember.Report()
    out = ember.compile(fn, options={"cxx_flags": flags}, report=report)(x)
    assert report.kernels and not report.fallbacks, report.fallbacks
    for o, r in zip(out, fn(x)):
        assert o.dtype == r.dtype and torch.equal(o, r), (o, r)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
def test_abs_of_the_minimum_stays_the_minimum(dtype, target):
    # |INT_MIN| wraps to INT_MIN in eager. ptxas takes the results of PTX's abs.s16/.s32/.s64 as
    # >= 0 (an H200): int16 abs(-32768) % 5 was 3 (eager's 2), CUDA C++'s floor division of
    # |INT_MIN| by 3 rounded toward zero, and Triton's int16 gcd(-32768, 32767) was 1 (eager's
    # -1). Both GPU backends now take integer abs in PTX that is not abs.
    info = torch.iinfo(dtype)
    x = torch.tensor([info.min, info.min + 1, -7, 0, 5, info.max], dtype=dtype, device=DEVICE)
    fn = lambda a: (a.abs() % 5, a.abs() < 0, a.abs() // 3, a.abs().to(torch.int64),  # noqa: E731
                    torch.gcd(a, a.flip(0)))
    out, report = run(fn, x, options={"target": target} if target else None)
    assert report.kernels and not report.fallbacks, report.fallbacks
    for o, r in zip(out, fn(x)):
        assert o.dtype == r.dtype and torch.equal(o, r), (o, r)
