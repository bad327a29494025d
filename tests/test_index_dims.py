"""Reads and writes at indices along any dim (index_select, index_add), and the exception type
eager's CPU kernels raise for a bad index, which depends on the dim they take."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same, check


def _eager_error(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.type


@pytest.mark.parametrize("dim, expected", [(1, IndexError), (-1, RuntimeError)], ids=["middle", "last"])
def test_index_add_bad_index_raises_eagers_type_for_its_dim(dim, expected):
    # eager scatter_adds (a RuntimeError) only along the first or last dim; a middle dim of a
    # 3-d self raised ember's RuntimeError where eager's is an IndexError
    fn = lambda x, i, s: x.index_add(dim, i, s) * 2  # noqa: E731
    x, bad = torch.zeros(4, 5, 6), torch.tensor([0, -1])
    src = torch.ones(4, 2, 6) if dim == 1 else torch.ones(4, 5, 2)
    assert _eager_error(fn, x, bad, src) is expected
    with pytest.raises(expected, match="index_add"):
        ember.compile(fn)(x, bad, src)


@pytest.mark.parametrize("dim, expected", [(1, RuntimeError), (-1, IndexError)], ids=["dim1", "last"])
def test_index_select_along_any_dim_is_generated_with_eagers_errors(dim, expected):
    # along a dim other than 0 index_select ran through ATen, forward and backward
    fn = lambda x, i: x.index_select(dim, i).sin()  # noqa: E731
    x = torch.randn(3, 5, 4, requires_grad=True)
    index = torch.tensor([0, 3, 3, -1 % x.shape[dim]])
    report = check(fn, x, index)
    assert report.fallbacks == []
    out = ember.compile(fn)(x, index)
    (grad,) = torch.autograd.grad(out.sum(), x)
    (expect,) = torch.autograd.grad(fn(x, index).sum(), x)
    assert_same(grad, expect)
    # eager's fast path along dim 1 raises a RuntimeError; its other paths an IndexError
    bad = torch.tensor([0, x.shape[dim]])
    assert _eager_error(fn, x.detach(), bad) is expected
    with pytest.raises(expected, match="index_select"):
        ember.compile(fn)(x.detach(), bad)


@pytest.mark.parametrize("fn", [
    lambda x, i: x.index_select(0, i) + 1, lambda x, i: F.embedding(i, x) + 1,
], ids=["index_select", "embedding"])
def test_a_bad_index_into_an_empty_tensor_raises_as_in_eager(fn):
    # (4, 0): the result has no element for the kernel to check the index at; eager checks
    # every index of an empty self with a RuntimeError
    x, bad = torch.zeros(4, 0), torch.tensor([0, 9])
    assert _eager_error(fn, x, bad) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(x, bad)


def test_index_tensors_on_dims_apart_are_generated_with_their_dims_first():
    # x[a, :, b] puts the broadcast index dims first in eager's result; it ran through ATen,
    # and so did its backward (an accumulating index_put with the values' index dims first)
    fn = lambda x, a, b: x[a, 1:4, b] * 2  # noqa: E731
    x = torch.randn(4, 5, 6, 3, requires_grad=True)
    a, b = torch.tensor([[0], [3], [-1]]), torch.tensor([1, 5, -6, 1])
    report = check(fn, x.detach(), a, b)
    assert report.fallbacks == []
    report = ember.Report()
    compiled = ember.compile(fn, report=report)
    (grad,) = torch.autograd.grad(compiled(x, a, b).sum(), x)
    (expect,) = torch.autograd.grad(fn(x, a, b).sum(), x)
    assert_same(grad, expect)  # duplicate positions (b's 1 twice) add up, as in eager
    assert report.fallbacks == []
    with pytest.raises(IndexError):
        compiled(x.detach(), a, b + 6)
