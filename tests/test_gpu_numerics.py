"""Numerics of the GPU code generators that eager pins down to the bit: signed zeros, infinite
divisors, float -> narrow integer conversions. Triton kernels run under the interpreter (the CPU
test run); CUDA sources are read, since only a GPU runs them."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import ember

from .conftest import DEVICE, INTERPRETED_TRITON

TRITON = {"target": "triton"}
INF = float("inf")


def _same_bits(out, ref) -> bool:
    """Equal values, NaN where eager has NaN, and zeros of eager's sign."""
    return (torch.equal(out.isnan(), ref.isnan()) and torch.equal(out[~out.isnan()], ref[~ref.isnan()])
            and torch.equal(out.signbit() & ~out.isnan(), ref.signbit() & ~ref.isnan()))


@INTERPRETED_TRITON
def test_floor_division_rounding_and_remainders_keep_eagers_zeros_and_infinities():
    # a floor quotient of 0 takes the sign of a / b (eager's copysign): a select of the constants
    # -0.0 and 0.0 gave +0.0 for -0.0 // 2.5 (on the GPU too). The interpreter's own helpers took
    # fmod as a - trunc(a / b) * b (NaN for an infinite b: 0.5 % inf) and lost -0.0 in trunc and round
    a = torch.tensor([-0.0, 0.0, -1e-30, 0.5, -0.5, 0.5, 7.0, -7.0, -0.5, 2.5])
    b = torch.tensor([2.5, -2.5, 1e10, INF, INF, -INF, 2.0, 2.0, 3.0, -1.5])

    def fn(a, b):
        return (torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b), torch.fmod(a, b),
                a.trunc(), a.round())

    def both(a, b, a16, b16):  # float32 and bfloat16 (eager's algorithm rounds every step): one compile
        return fn(a, b) + fn(a16, b16)

    args = (a, b, a.bfloat16(), b.bfloat16())
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="ember", category=RuntimeWarning)  # (no fallback)
        out = ember.compile(both, options=TRITON)(*args)
    for i, (o, r) in enumerate(zip(out, both(*args))):
        assert _same_bits(o, r), (i, o, r)


# eager converts a float to uint8 through int64 (c10's static_cast_with_inter_type: -1.7 -> -1
# -> 255, 300 -> 44) and to int8 and int16 through int32 (a truncation); a direct conversion
# saturates on the GPU (cvt.rzi.u16.f32 in Triton, cvt.rzi.u32.f32 in CUDA C++: -1.7 -> 0)
_CASTS = (lambda x: (x.to(torch.uint8), x.to(torch.int8), x.to(torch.int16)))
_VALUES = [-1.7, -3.0, 300.0, 255.5, 0.5, 1000.0, -200.0, 40000.0, -40000.0, 4294967551.0]


@INTERPRETED_TRITON
def test_triton_float_to_narrow_integer_casts_go_through_eagers_intermediate_type():
    x = torch.tensor(_VALUES)
    (k,) = ember.explain(_CASTS, x, target="triton").kernels
    assert ".to(tl.int64).to(tl.uint8)" in k.source and ".to(tl.int32).to(tl.int8)" in k.source, k.source
    assert ".to(tl.int32).to(tl.int16)" in k.source
    out = ember.compile(_CASTS, options=TRITON)(x)
    for o, r in zip(out, _CASTS(x)):
        assert torch.equal(o, r), (o, r)


@pytest.mark.skipif(DEVICE != "cpu", reason="reads CUDA sources and runs the CPU backend")
def test_c_float_to_uint8_casts_go_through_int64():
    x = torch.tensor(_VALUES, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (k,) = ember.explain(_CASTS, x.float(), target="cuda").kernels
    assert "((uint8_t)(int64_t)v0)" in k.source, k.source
    # the CPU backend's conversion to int64 (x86's, as eager's): 2**32 + 255 as uint8 is 255,
    # where a conversion through int32 (out of range: INT32_MIN) gave 0
    out = ember.compile(_CASTS)(x)
    for o, r in zip(out, _CASTS(x)):
        assert torch.equal(o, r), (o, r)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_no_product_is_contracted_into_a_sum(backend):
    # eager computes the ops of a chain apart: x * y - x * y is 0, and a float16 product that
    # overflows is inf before the sum. Contracted into one fma (Triton's default, and nvcc's) it
    # was the product's rounding error, and fma(x, 100, -inf) = -inf where eager's is NaN. (On
    # the CPU both run the C++ backend, built with -ffp-contract=off; on a GPU each backend.)
    x, y = torch.randn(4099, device=DEVICE), torch.randn(4099, device=DEVICE)
    h = torch.tensor([1000.0, -3.0, 0.5, 700.0, -900.0], dtype=torch.float16, device=DEVICE)
    options = {"gpu_backend": backend}
    assert (ember.compile(lambda a, b: a * b - a * b, options=options)(x, y) == 0).all()
    out = ember.compile(lambda a: (a * 100 - a * 100).isnan(), options=options)(h)
    assert torch.equal(out, (h * 100 - h * 100).isnan())


def _quotients(a, b):
    return (a / b, torch.reciprocal(b), torch.div(a, b, rounding_mode="trunc"),
            torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b))


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_float32_quotients_are_correctly_rounded(backend):
    # eager divides as IEEE does; Triton's float32 / is div.full.f32 (2 ulp), under which
    # (2x + 1) // (|x| + 0.5), exactly 2 for x > 0, was 1 for some x, and a / b differed from
    # eager's bits in its last place (found by the fuzzer on an H100). The CUDA C++ backend
    # keeps div.full.f32 for a plain a / b and 1 / b (ember_div_full: IEEE division made its
    # bfloat16 softmax 8% slower on an H100), its rounding modes IEEE. On the CPU both backends
    # run the C++ one, so a GPU run decides this; test_triton_writes_float32_quotients_as_div_rn
    # reads the Triton source
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(65537, generator=gen).to(DEVICE)
    a, b = torch.randn(65537, generator=gen).to(DEVICE), torch.randn(65537, generator=gen).to(DEVICE)
    fn = ember.compile(lambda x, a, b: (torch.div(x * 2 + 1, x.abs() + 0.5, rounding_mode="trunc"),)
                       + _quotients(a, b), options={"gpu_backend": backend})
    out = fn(x, a, b)
    assert (out[0][x > 0] == 2).all()
    for i, (o, r) in enumerate(zip(out[1:], _quotients(a, b))):
        if backend == "cuda" and DEVICE == "cuda" and i < 2:  # (within div.full.f32's 2 ulp)
            torch.testing.assert_close(o, r, rtol=2.5e-7, atol=0)
        else:
            assert _same_bits(o, r), (i, (o != r).sum())


@INTERPRETED_TRITON
def test_triton_writes_float32_quotients_as_div_rn():
    a, b = torch.randn(4, 33), torch.randn(4, 33).abs() + 0.5
    source = str(ember.explain(_quotients, a, b, target="triton"))
    assert re.search(r"= tl\.math\.div_rn\(v\d+, v\d+\)", source) and "= tl.math.div_rn(1.0, v" in source
    assert not re.search(r"v\d+ / v\d+", source)  # (the rounding modes: eh.div_ieee in their helpers)
    assert "eh.truncdiv_float(" in source and "eh.floordiv_float(" in source
    # 16-bit quotients keep the approximate division: its 2 float32 ulps round away in 16 bits
    source16 = str(ember.explain(lambda a, b: a / b, a.bfloat16(), b.bfloat16(), target="triton"))
    assert "div_rn" not in source16 and "ieee_rounding=False" in source16
    out = ember.compile(_quotients, options=TRITON)(a, b)
    for o, r in zip(out, _quotients(a, b)):
        assert _same_bits(o, r)
