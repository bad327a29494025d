"""Less common tensor ops (scatters into a slice, ...) compared with eager on awkward inputs."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember
from tests.helpers import assert_same, check


@pytest.mark.parametrize("src_dtype", [torch.float64, torch.int64])
@pytest.mark.parametrize("dynamic", [None, True])
def test_select_scatter_writes_src_in_the_dtype_of_self(src_dtype, dynamic):
    # eager copies src into self's dtype; the decomposition's where() promoted to src's dtype
    x = torch.randn(4, 5)
    src = torch.randint(-3, 3, (5,)).to(src_dtype) if src_dtype == torch.int64 else torch.randn(5, dtype=src_dtype)
    check(lambda x, s: torch.select_scatter(x, s, 0, 1) * 2, x, src, dynamic=dynamic)


def test_select_scatter_into_an_int_tensor_truncates_a_float_src():
    check(lambda x, s: torch.select_scatter(x, s, 1, -1) + 1, torch.randint(0, 9, (3, 4)), torch.randn(3) * 5)


@pytest.mark.parametrize("src_shape", [(1,), (), (1, 5)])
def test_select_scatter_rejects_a_src_that_only_broadcasts_to_the_slice(src_shape):
    # eager wants src exactly the slice's shape; ember broadcast a [1] or 0-d src over the slice
    # (and a [1, 5] one failed the trace: the whole graph ran eagerly with a warning)
    fn = lambda x, s: torch.select_scatter(x, s, 0, 0)  # noqa: E731
    x, src = torch.randn(4, 5), torch.randn(src_shape)
    with pytest.raises(RuntimeError, match="expected src to have a size equal to the slice"):
        fn(x, src)
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="expected src to have a size equal"):
        warnings.simplefilter("error", RuntimeWarning)
        ember.compile(fn)(x, src)


def test_select_scatter_gradients_with_a_src_of_another_dtype():
    x = torch.randn(4, 3, requires_grad=True)
    src = torch.randn(3, dtype=torch.float64, requires_grad=True)
    fn = lambda x, s: torch.select_scatter(x, s, 0, 2).sin()  # noqa: E731
    ref_x, ref_src = x.detach().clone().requires_grad_(), src.detach().clone().requires_grad_()
    expected = fn(ref_x, ref_src)
    expected.sum().backward()
    out = ember.compile(fn)(x, src)
    out.sum().backward()
    assert_same(out, expected)
    assert_same([x.grad, src.grad], [ref_x.grad, ref_src.grad])
