"""CPU loops split at their guards' bounds (codegen/cpp_split.py: find_split, find_window) and the
padding around them, against eager: positions of a narrow integer type, which wrap, bound no
range of the loop; negative padding that takes more than the input holds raises as eager's; and
padded reads at strided positions (guards ``0 <= 2 * i - 1``), whose rows split into a guarded
head and tail and an unguarded interior, exactly eager's values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .helpers import assert_clean, check, compile_checked


def _input(shape, dtype):
    if not dtype.is_floating_point:
        return torch.randint(0 if dtype == torch.uint8 else -100, 100, shape, dtype=dtype)
    x = (torch.randn(shape) * 3).to(dtype)
    x.view(-1)[::7] = -float("inf")
    x.view(-1)[3] = float("nan")
    x.view(-1)[1] = float("inf")
    return x


def test_a_narrow_integer_position_bounds_no_split():
    """arange(300, dtype=int8) wraps at 128: ``i >= 3`` is false again from there (and ``i < 100``
    true), so the loop is not split at the comparison's bound."""
    x = torch.randn(2, 300)
    check(lambda x: torch.where(torch.arange(x.shape[1], dtype=torch.int8) >= 3, x * 2, 0.0), x)
    check(lambda x: torch.where(torch.arange(x.shape[1], dtype=torch.int8) < 100, x * 2, 0.0), x)


def test_a_narrow_integer_position_bounds_no_window():
    """The same for a window's affine bounds: 2 * i + 1 in int8 is negative from i = 64."""
    def fn(x):
        i = torch.arange(1, 2 * x.shape[1] + 1, 2, dtype=torch.int8)
        return torch.where(torch.logical_and(i >= 5, i >= 3), x * 2, 0.0)

    check(fn, torch.randn(2, 300))


@pytest.mark.parametrize("pad", [(-3, 5), (5, -3)])
def test_negative_padding_beyond_the_input_raises_like_eager(pad):
    fn = lambda x: F.pad(x, pad) * 2  # noqa: E731
    x = torch.randn(2, 3, 2)  # (the output has 4 elements a row; eager's narrow raises first)
    with pytest.raises(RuntimeError, match="narrow"):
        fn(x)
    compiled, _ = compile_checked(fn)
    with pytest.raises(RuntimeError, match="narrow"):
        compiled(x)


def test_negative_padding_of_a_symbolic_size_is_checked_on_the_host():
    fn = lambda x: F.pad(x, (-3, 5)) * 2  # noqa: E731
    compiled, report = compile_checked(fn, dynamic=True)
    for width in (7, 4, 3):
        x = torch.randn(2, width)
        assert torch.equal(compiled(x), fn(x))
    with pytest.raises(RuntimeError, match="narrow"):
        compiled(torch.randn(2, 2))
    assert_clean(report)
    assert len(report.graphs) == 1 and not report.fallbacks, report.fallbacks


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_padded_reads_at_strided_positions_match_eager(dtype):
    """Guards affine in the position with coefficients 2 and 3, negative padding, padding wider
    than the input, and rows whose interior is empty (widths 1 and 2)."""
    def fn(x):
        return (F.pad(x, (1, 2))[..., ::2] * 2, F.pad(x, (5, 1))[..., 1::3] + F.pad(x, (-1, 6))[..., ::3],
                F.pad(x, (1, 1, 2, 0))[..., ::2, ::3], F.pad(x, (3, 3))[..., ::2].sum(-1))

    for shape in ((2, 3, 1), (1, 2, 2), (2, 3, 17)):
        check(fn, _input(shape, dtype))


def test_padded_strided_reads_of_symbolic_widths():
    fn = lambda x: F.pad(x, (1, 2, 1, 0))[..., ::2] * 2 + F.pad(x, (0, 4, 0, 1))[..., 1::2]  # noqa: E731
    compiled, report = compile_checked(fn, dynamic=True)
    for width in (9, 2, 1, 24, 5):
        x = _input((2, 3, width), torch.float32)
        assert torch.equal(compiled(x).nan_to_num(), fn(x).nan_to_num())
        assert torch.equal(compiled(x).isnan(), fn(x).isnan())
    assert_clean(report)
    assert len(report.graphs) <= 2  # (a first static graph, then one symbolic for every width)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_padded_pooling_of_long_16_bit_rows(dtype):
    """Rows longer than a float16 strip (cpp_staging.STAGE): the interior's strips start at the
    window's lower bound; max pooling with its indices, -inf windows and NaN."""
    x = _input((1, 2, 3, 300), dtype)
    x[..., 0, :5] = -float("inf")
    with torch.no_grad():
        check(lambda x: (F.max_pool2d(x, 3, 1, 1) + x, F.max_pool2d(x, 3, 2, 1, return_indices=True),
                         F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)), x)
