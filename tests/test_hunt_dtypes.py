"""Found by a dtype hunt (unusual dtypes and unusual tensor inputs, ember against eager): the
imaginary part of a conjugate is a view with ATen's negative bit (``_neg_view``), which kernels
read as plain memory, without the negation; Python ints past int64 passed to kernels wrapped;
in-place writes into complex or float8 inputs fell back with a warning."""

from __future__ import annotations

import pytest
import torch

import ember

from .conftest import DEVICE
from .helpers import check, run


def _complex() -> torch.Tensor:
    return torch.tensor([[1 + 2j, 3 - 4j, -0.5 + 0.25j], [2j, -3, 1 - 1j]], dtype=torch.complex64, device=DEVICE)


def test_the_imaginary_part_of_a_conjugate_is_negated_in_kernels():
    """``x.conj().imag`` traces to ``_neg_view(view_as_real(x))[..., 1]``: ember ran _neg_view
    through ATen and its kernel read the view's memory, the imaginary part without the sign."""
    def f(x, y):
        return x.conj().imag + 1, x.conj().imag.sum(1), x.conj().imag * y + x.real

    check(f, _complex(), torch.randn(2, 3, device=DEVICE))


@pytest.mark.filterwarnings("ignore:.*negative bit")
def test_an_input_with_the_negative_bit_is_read_negated():
    """An input that is such a view (``x.conj().imag``, its negative bit set): the graph runs
    through ATen, which reads it negated; ember's kernel read its memory as it is."""
    def f(a):
        return a * 2 + 1

    neg = _complex().conj().imag
    assert neg.is_neg()
    expected = f(neg)
    compiled = ember.compile(f)
    torch.testing.assert_close(compiled(neg), expected)
    # the same function over an ordinary tensor first, then the view: each gets its own graph
    plain = neg.clone()
    torch._dynamo.reset()
    compiled = ember.compile(f)
    torch.testing.assert_close(compiled(plain), f(plain))
    torch.testing.assert_close(compiled(neg), expected)


def test_a_python_int_past_int64_raises_eagers_overflow_error():
    """An int argument the graph takes as a size symbol (dynamic): ctypes passed it to the kernel
    as int64 silently wrapped (``x * 2**70`` gave zeros); eager's conversion to a Scalar raises
    OverflowError. Values in range, past an int8's included, still wrap as eager's."""
    def f(a, s):
        return a * s + 1

    x = torch.tensor([1, -2, 3], dtype=torch.int8, device=DEVICE)
    compiled = ember.compile(f, dynamic=True)
    for s in (3, 300, -(2**63), 2**63 - 1):
        torch.testing.assert_close(compiled(x, s), f(x, s))
    for s in (2**70, -(2**63) - 1, 2**64):
        with pytest.raises(OverflowError):
            f(x, s)
        with pytest.raises(OverflowError):
            compiled(x, s)
    y = x.half()
    compiled = ember.compile(f, dynamic=True)
    torch.testing.assert_close(compiled(y, 5), f(y, 5))
    with pytest.raises(OverflowError):
        compiled(y, 2**70)


@pytest.mark.parametrize("case", ["mul_", "real", "imag_copy", "float8_copy", "rows"])
def test_in_place_writes_into_inputs_of_a_dtype_without_kernels_compile(case):
    """ATen computes the value written (ember has no complex or float8 code), which the program
    copies into the input; the whole graph ran through ATen, with a warning."""
    c = _complex()
    r = torch.randn(2, 3, device=DEVICE)
    f8 = torch.zeros(2, 3, dtype=torch.float8_e4m3fn, device=DEVICE)
    fn, args = {"mul_": (lambda a: a.mul_(2j), (c,)),
                "real": (lambda a: a.real.mul_(2), (c,)),
                "imag_copy": (lambda a, x: a.imag.copy_(x), (c, r)),
                "float8_copy": (lambda a, x: a.copy_(x * 4), (f8, r)),
                "rows": (lambda a: a[1:].add_(1) * 2, (c,))}[case]
    expected = [a.clone() for a in args]
    got = [a.clone() for a in args]
    out, (result, report) = fn(*expected), run(fn, *got)
    assert not [g.error for g in report.graphs if g.error]
    for x, y in zip([result, *got], [out, *expected]):
        assert x.dtype == y.dtype and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
